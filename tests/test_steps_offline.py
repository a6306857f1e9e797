"""Steps and their parts without a host: probes parsed from fixture output, the downtime window, the typed results,
the cut-over mode's step sequence, and steps driven against a recording host (commands recorded, fixture output
returned). Pure logic: what these steps do on real hosts is proven on the lab (test_cutover, test_window,
test_steps_live, test_e2e).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.database.mysql.session import blockers_from_rows
from orchestrator.engine.step import StepError
from orchestrator.plan.model import Plan, Retry
from orchestrator.results import AuditResult, CutoverResult, DbPresyncResult, FilesResult, VerifyResult, result_of
from orchestrator.services import probes
from orchestrator.steps import CUTOVER_MODES, STEP_ORDER, build_steps, door_commits, step_class, step_order
from orchestrator.steps.audit import Audit
from orchestrator.steps.cutover import Cutover
from orchestrator.steps.db_final import DbFinal
from orchestrator.steps.finish import STOPPED_SERVICES, Finish
from orchestrator.steps.modes import REPLICATE, REVERSE_OVER_REPLICA, SHUTDOWN, CutoverMode, mode_of
from orchestrator.steps.preflight import Preflight
from orchestrator.steps.prepare_target import PrepareTarget
from orchestrator.steps.start_target import StartTarget
from orchestrator.steps.verify_target import VerifyTarget
from orchestrator.transports.ssh import TransportError
from orchestrator.window import DowntimeWindow, journaled_blocked_at
from tests.fakes import OfflineRuntime, RecordingHost, context, plan

# --- probes: each parse from fixtures -------------------------------------------------------------------------


def test_probe_parses_sizes_free_space_and_versions() -> None:
    assert probes.parse_du("4096\t/var/lib/mysql\n12\t/srv/uploads\ngarbage\n") == {
        "/var/lib/mysql": 4096,
        "/srv/uploads": 12,
    }
    df = "/dev/sda1 10737418240 5368709120 5368709120 50% /srv\n"
    assert probes.parse_df(df) == ("/srv", 5368709120)
    with pytest.raises(TransportError, match="unexpected df output for /x"):
        probes.free_space("/x").parse("nonsense")
    version = probes.database_server_version()
    assert version.parse("\nmariadbd  Ver 10.11.6-MariaDB-0+deb12u1 for debian-linux-gnu\n").startswith("mariadbd")
    assert version.parse("") == "" and version.check is False
    assert probes.has_program("rsync").parse("yes\n") is True
    assert probes.has_program("rsync").parse("no\n") is False
    assert "command -v rsync" in probes.has_program("rsync").command


def test_probe_parses_paths_links_clock_and_changed_files() -> None:
    assert probes.real_path("/var/lib/mysql").parse("/data/mysql\n") == "/data/mysql"
    assert probes.real_path("/var/lib/mysql").parse("") == "/var/lib/mysql"  # readlink said nothing: as given
    resolved = probes.resolved_paths(["/a", "/b"])
    assert resolved.command == "readlink -m -- /a /b"
    assert resolved.parse("/x\n/y\n") == ["/x", "/y"]
    with pytest.raises(TransportError, match="unexpected readlink output for 2 paths"):
        resolved.parse("/x\n")
    links = probes.links_in("/var/lib/my sql", 5)
    assert "'/var/lib/my sql'" in links.command and "head -n 6" in links.command
    assert links.parse("/var/lib/mysql/a.isl\n") == ["/var/lib/mysql/a.isl"]
    assert probes.clock().parse("1700000000.123456789\n") == pytest.approx(1700000000.123456789)
    changed = probes.files_changed_since("/var/lib/mysql", 1700000000.5)
    assert "-newermt @1700000000.500" in changed.command
    assert changed.parse("./ibdata1\0./db/t.ibd\0") == ["./ibdata1", "./db/t.ibd"]
    assert "-newermt" not in probes.files_changed_since("/d", None).command
    assert probes.directory_exists("/srv/up loads").parse("yes\n") is True


def test_clock_offset_is_taken_against_the_middle_of_the_round_trip() -> None:
    ahead = RecordingHost([("date", f"{time.time() + 100:.6f}\n")])
    assert probes.clock_offset(ahead) == pytest.approx(100, abs=1.0)  # type: ignore[arg-type]


def test_innodb_files_seen_or_the_reason_they_cannot_be() -> None:
    seen = RecordingHost([("find /proc", "/proc/41/fd /d/ibdata1\n")])
    assert probes.innodb_files_visible(seen, "/d") == ({41}, None)  # type: ignore[arg-type]
    blind = probes.innodb_files_visible(RecordingHost(), "/d")  # type: ignore[arg-type]
    assert blind[0] == set() and blind[1] is not None and "could not prove the source database has stopped" in blind[1]


def test_blockers_from_processlist_rows_are_masked() -> None:
    rows = [(9, "app", "Query", 31, "User sleep", "UPDATE users SET password = PASSWORD('hunter2') WHERE id=1")]
    (blocker,) = blockers_from_rows(rows)
    assert blocker.seconds == 31 and "hunter2" not in blocker.query and blocker.summary().startswith("#9 app Query")


# --- the downtime window --------------------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_write_budget_uses_the_journaled_start_and_names_the_action() -> None:
    idle = DowntimeWindow(30)
    idle.check("idle")  # writes are not blocked: nothing to count
    spent = DowntimeWindow(30)
    spent.begin(time.time() - 31)
    with pytest.raises(StepError, match=r"more than cutover.max_write_block 30 s \(while copying uploads\)"):
        spent.check("copying uploads")
    recent = DowntimeWindow(30)
    recent.begin(time.time() - 5)
    recent.check("copying uploads")
    older = DowntimeWindow(30)
    older.begin(time.time() - 40)
    with pytest.raises(StepError, match="writes blocked for 4"):
        older.check("starting the target")


def test_window_counts_only_time_blocked_and_keeps_the_rollback_reserve() -> None:
    clock = Clock()
    window = DowntimeWindow(10, reserve=2, clock=clock)
    assert window.remaining() is None and window.blocked_at is None
    window.begin()
    clock.now += 3
    window.lift()  # writes flow again (e.g. between lock attempts): this time is not counted
    clock.now += 100
    assert window.elapsed() == 3
    window.begin()
    assert window.blocked_at == 1_000.0  # the first moment writes were blocked
    clock.now += 4
    assert window.elapsed() == 7 and window.remaining() == 1  # 10 - 2 reserved - 7
    window.check("inside the budget")
    clock.now += 1.5
    assert window.timeout() == probes_floor() and window.timeout(0.05) == 0.05
    with pytest.raises(StepError, match=r"writes blocked for 8\.5 s"):
        window.check("past the budget less the reserve")


def probes_floor() -> float:
    from orchestrator.window import FLOOR

    return FLOOR


def test_window_bounds_a_retry_policy_by_what_is_left() -> None:
    clock = Clock()
    window = DowntimeWindow(30, clock=clock)
    policy = Retry(attempts=5, max_seconds=120, max_wait=10)
    assert window.bounded(policy) is policy  # writes flow: the plan's policy as it is
    window.begin()
    clock.now += 26
    assert window.bounded(policy).max_seconds == 4 and window.bounded(policy).attempts == 5


def test_a_resumed_run_counts_from_the_journaled_moment_of_its_own_run() -> None:
    history = [
        {"event": "run_started", "run_id": "old"},
        {"event": "step_saved", "step": "cutover", "key": "writes_blocked_at", "value": 10.0},
        {"event": "run_started", "run_id": "new"},
        {"event": "step_started", "step": "cutover"},
        {"event": "step_saved", "step": "cutover", "key": "writes_blocked_at", "value": 500.0},
    ]
    assert journaled_blocked_at(history) == 500.0
    assert journaled_blocked_at(history[:3]) is None
    completed = [{"event": "step_completed", "step": "cutover", "result": {"writes_blocked_at": 42.0}}]
    assert journaled_blocked_at(completed) == 42.0
    # A step's context carries the runtime's window, bound to the run's journal.
    rt = OfflineRuntime(plan())
    ctx = context(rt, "files_final", history=history)
    assert ctx.window is rt.window and ctx.window.blocked_at == 500.0


# --- typed results --------------------------------------------------------------------------------------------


def test_results_round_trip_through_the_journal_and_tolerate_skipped_steps() -> None:
    cut = CutoverResult.of(
        {"mode": "shutdown", "writes_blocked_at": 5.0, "binlog": {"file": "b.000001", "position": 4},
         "row_counts": {"a.b": 3}, "unknown_key": 1}
    )  # fmt: skip
    assert cut.binlog is not None and cut.binlog.position == 4
    assert CutoverResult.of(cut.journal()) == cut
    assert "unknown_key" not in cut.journal() and "checksums" not in cut.journal()
    assert CutoverResult.of({"already_in_place": True}).row_counts is None
    rounds = DbPresyncResult.of({"rounds": [{"round": 1, "bytes": 10}, {"round": 2, "bytes": 5}]})
    assert rounds.bytes_moved() == 15
    assert result_of("files_final", {"bytes": 7}).bytes_moved() == 7
    assert result_of("preflight", {"source_version": "10.11"}).bytes_moved() == 0
    assert VerifyResult.of({"row_counts": {"tables": 2, "compared": 2}}).journal()["row_counts"]["compared"] == 2
    assert FilesResult.of({"trees": {"uploads": {"bytes": 3}}}).trees["uploads"].bytes == 3


# --- which steps run, and who imports whom ----------------------------------------------------------------------


def test_the_cutover_mode_chooses_the_steps_between_the_shared_ones() -> None:
    assert step_order("shutdown") == STEP_ORDER
    assert STEP_ORDER.index("cutover") < STEP_ORDER.index("db_final") < STEP_ORDER.index("files_final")
    for mode, names in CUTOVER_MODES.items():
        assert [step_class(name).name for name in names] == list(names), mode
    replicate = step_order("replicate")
    assert replicate[: replicate.index("repl_seed")] == STEP_ORDER[: STEP_ORDER.index("db_presync")]
    assert replicate.index("repl_switch") < replicate.index("files_final") and "cutover" not in replicate
    assert step_order("auto") == replicate  # unresolved: what a dry-run shows
    with pytest.raises(LookupError, match="sideways"):
        step_order("sideways")


def in_mode(p: Plan, mode: str, *, reverse_of: str | None = None) -> Plan:
    """The plan with another cut-over mode (a reverse run's when `reverse_of`), unvalidated: enough to build its
    steps."""
    moved = p.model_copy(update={"cutover": p.cutover.model_copy(update={"mode": mode})})
    moved._reverse_of = reverse_of
    return moved


def test_each_mode_runs_only_the_steps_that_act_in_it() -> None:
    # The replicate mode's target runs (fenced) since its replica step: no start_target in its sequence. The way back
    # over the reverse replica keeps it: it starts the old source's services again when the forward finish stopped
    # them.
    assert "start_target" in SHUTDOWN.steps() and "start_target" not in REPLICATE.steps()
    assert "start_target" in REVERSE_OVER_REPLICA.steps()
    for mode in (SHUTDOWN, REPLICATE, REVERSE_OVER_REPLICA):
        for door in (False, True):
            names = mode.steps(door_commits=door)
            assert len(set(names)) == len(names) and names[-2:] == ("audit", "finish"), names
            assert ("switch_traffic" in names) == door and names.index("verify_target") < names.index("dns_flip")
            assert all(step_class(name).name == name for name in names)


def test_build_steps_hands_the_plans_mode_to_every_step_that_differs_by_mode() -> None:
    p = plan()
    cases: list[tuple[Plan, CutoverMode]] = [
        (in_mode(p, "shutdown"), SHUTDOWN),
        (in_mode(p, "replicate"), REPLICATE),
        (in_mode(p, "auto"), SHUTDOWN),  # auto without a replication section can only be shutdown
        (in_mode(p, "replicate", reverse_of="shop"), REVERSE_OVER_REPLICA),
        (in_mode(p, "shutdown", reverse_of="shop"), SHUTDOWN),
    ]
    for built, mode in cases:
        assert mode_of(built) is mode
        steps = build_steps(built)
        assert [s.name for s in steps] == list(mode.steps(door_commits=door_commits(built)))
        given = {s.name: getattr(s, "mode", None) for s in steps if hasattr(s, "mode")}
        shared = {"preflight", "start_target", "verify_target", "audit", "finish"} & {s.name for s in steps}
        assert set(given) == shared and all(m is mode for m in given.values()), (mode, given)


def test_the_shared_steps_act_as_their_mode_says_whatever_the_journal_lists() -> None:
    p = plan()
    replicating = [{"event": "run_started", "steps": list(REPLICATE.steps())}]
    # Handed the shutdown mode, start_target fences and starts the target even in a run whose journal lists the
    # replicate steps: the step follows its mode, never the journal.
    rt = OfflineRuntime(p)
    rt.window.begin(time.time())
    StartTarget(mode=SHUTDOWN).run(context(rt, "start_target", history=replicating))
    assert rt.target.commands[0] == p.services.target_fence.enable and len(rt.target.commands) > 2
    # The replicate mode starts nothing inside the window (the replica step did, before it) and undoes nothing.
    quiet = OfflineRuntime(p)
    quiet.window.begin(time.time())
    outputs = {"repl_replica": {"services": ["app"]}}
    result = StartTarget(mode=REPLICATE).run(context(quiet, "start_target", outputs=outputs))
    StartTarget(mode=REPLICATE).undo(context(quiet, "start_target", outputs=outputs))
    assert quiet.target.commands == [] and result is not None
    assert result["services"] == ["app"] and result["db_ready_seconds"] == 0.0
    # The way back over the reverse replica to an old source whose services the forward finish stopped: they start.
    stopped = p.model_copy(update={"finish": p.finish.model_copy(update={"source": "stop"})})
    back = OfflineRuntime(stopped)
    back.window.begin(time.time())
    StartTarget(mode=REVERSE_OVER_REPLICA).run(context(back, "start_target", outputs=outputs))
    assert back.target.commands == [service.start for service in stopped.services.target]


def test_each_mode_describes_its_own_part_of_the_shared_steps() -> None:
    rt = OfflineRuntime(plan())

    def lines(step: Any) -> str:
        return " ".join(step.describe(context(rt, step.name)))

    assert "GTID positions" in lines(VerifyTarget(mode=REPLICATE)) and "GTID" not in lines(VerifyTarget())
    assert "in chunks" in lines(Audit(mode=REPLICATE)) and "stopped source" in lines(Audit(mode=SHUTDOWN))
    assert "reverse replication" in lines(Finish(mode=REPLICATE)) and "reverse" not in lines(Finish())
    assert "replicate mode" in lines(StartTarget(mode=REVERSE_OVER_REPLICA))
    assert "start the database" in lines(StartTarget(mode=SHUTDOWN))
    assert "enough free space" in lines(Preflight(mode=REPLICATE))
    assert "enough free space" not in lines(Preflight(mode=REVERSE_OVER_REPLICA))  # no datadir moves back
    # The audit off (database.verify asks for neither): the method still says which mode's audit it would be.
    p = plan()
    off = p.model_copy(update={"database": p.database.model_copy(update={"verify": p.database.verify.model_copy(
        update={"row_counts": False, "checksum": False})})})  # fmt: skip
    for mode, method in ((SHUTDOWN, "figures"), (REPLICATE, "chunks")):
        result = AuditResult.of(Audit(mode=mode).run(context(OfflineRuntime(off), "audit")))
        assert result.status == "off" and result.method == method


@pytest.mark.parametrize(
    "first",
    [
        "orchestrator.steps.modes",
        "orchestrator.services.estimates",
        "orchestrator.steps.finish",
        "orchestrator.cli.commands",
    ],
)
def test_the_modes_load_whichever_module_is_imported_first(first: str) -> None:
    # The modes use what the steps share (and the estimate's arithmetic, which imports steps/common.py): under
    # steps/, the package's __init__ is always loaded first, so no import order meets a half-loaded module.
    subprocess.run([sys.executable, "-c", f"import {first}"], check=True, timeout=120)


def test_no_shared_step_asks_which_mode_it_is_in() -> None:
    # The run's journaled step list is the engine's; the shared steps get their mode's behaviour at construction.
    steps_dir = Path(__file__).parents[1] / "orchestrator" / "steps"
    asking = [path.name for path in sorted(steps_dir.glob("*.py")) if "replicate_run(" in path.read_text()]
    assert asking == []


def test_no_step_imports_another_step() -> None:
    steps_dir = Path(__file__).parents[1] / "orchestrator" / "steps"
    step_modules = {f"orchestrator.steps.{name}" for names in (STEP_ORDER, *CUTOVER_MODES.values()) for name in names}
    for path in sorted(steps_dir.glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        own = f"orchestrator.steps.{path.stem}"
        assert not (imported & step_modules) - {own}, f"{path.name} imports {sorted(imported & step_modules)}"


# --- steps against a recording host ----------------------------------------------------------------------------

RSYNC_STATS = (
    "Number of regular files transferred: 2\nTotal file size: 1,000\nTotal transferred file size: 300\n"
    "Literal data: 120\n"
)


def _sums(*names: str, differ: str | None = None) -> str:
    """cksum output for `names` (the one named `differ` with another checksum)."""
    return "".join(f"{2 if n == differ else 1} 4096 {n}\n" for n in names)


COPIED = ("db/other.ibd", "db/t.ibd", "ibdata1")


def test_db_final_forces_files_changed_since_the_presync_then_pushes_the_delta_within_the_window() -> None:
    p = plan()
    # rsync itemizes what it received: one file beyond the forced ones (and a pid file the pass never copies).
    itemized = ">f.st...... db/other.ibd\n>f..t...... ibdata1\n" + RSYNC_STATS
    source = RecordingHost([("find \\.", "./ibdata1\0./db/t.ibd\0./mysqld.pid\0"), ("rsync", itemized),
                            ("cksum", _sums(*COPIED))])  # fmt: skip
    target = RecordingHost([("cksum", _sums(*COPIED))])
    rt = OfflineRuntime(p, source=source, target=target)
    rt.window.begin(time.time() - 5)
    history = [{"event": "run_started"}, {"event": "step_started", "step": "db_presync", "ts": 1_700_000_000.0}]
    # Both datadirs are symbolic links on their hosts: the pass acts on the directories preflight resolved there.
    real = {"source": "/disk1/mysql", "target": "/disk2/mysql"}
    outputs = {"cutover": {"source_clock_offset": 10.0}, "preflight": {"datadirs": real}}
    result = DbFinal().run(context(rt, "db_final", outputs=outputs, history=history))
    assert result == {
        "final_pass_bytes": 120,
        "final_pass_files_size": 300,
        "final_pass_forced_files": 3,
        "final_pass_seconds": result["final_pass_seconds"],  # type: ignore[index]
        "verified_files": 3,
        "verify_seconds": result["verify_seconds"],  # type: ignore[index]
    }
    # Listed on the source from the pre-sync's start on its clock (offset journaled by the cut-over, less margin).
    assert "-newermt @1700000008.000" in source.commands[0]
    # Forced on the target by mtime, names given on stdin, never in the command line.
    assert "touch -c -m -d @0" in target.calls[0]["command"]
    assert target.calls[0]["input"] == "./ibdata1\0./db/t.ibd\0./mysqld.pid\0"
    push = next(c for c in source.calls if "rsync" in c["command"])
    assert "--no-whole-file" in push["command"] and "--modify-window=-1" in push["command"]
    assert "--itemize-changes" in push["command"] and "bwlimit" not in push["command"]
    assert f" {real['source']}/ " in push["command"] and push["command"].endswith(f":{real['target']}/")
    assert "cd /disk1/mysql && find . -type f" in source.commands[0]
    assert target.calls[0]["command"].startswith("cd /disk2/mysql && ")
    # Resolved once, by preflight: nothing asks the hosts again inside the window.
    assert not [c for c in source.commands + target.commands if "readlink" in c]
    left = p.cutover.max_write_block - 5
    assert push["timeout"] is not None and 0 < push["timeout"] <= left
    # Inside the window, O(changes): only the copied files are checksummed, on both hosts, names on stdin.
    for host, datadir in ((source, real["source"]), (target, real["target"])):
        (sums,) = [c for c in host.calls if "cksum" in c["command"]]
        assert sums["command"].startswith(f"cd {datadir} && ") and sums["input"] == "\0".join(COPIED) + "\0"
        assert sums["timeout"] is not None and 0 < sums["timeout"] <= left


def test_db_final_fails_in_the_window_when_a_copied_file_differs_between_the_hosts() -> None:
    p = plan()
    source = RecordingHost([("find \\.", "./ibdata1\0./db/t.ibd\0"), ("rsync", ">f.st...... db/other.ibd\n"
                            + RSYNC_STATS), ("cksum", _sums(*COPIED))])  # fmt: skip
    # A copied file that differs, and one missing on the target: both named (the run rolls back).
    target = RecordingHost([("cksum", _sums("db/other.ibd", "ibdata1", differ="ibdata1"))])
    rt = OfflineRuntime(p, source=source, target=target)
    rt.window.begin(time.time() - 5)
    history = [{"event": "step_started", "step": "db_presync", "ts": 1_700_000_000.0}]
    with pytest.raises(StepError, match=r"2 file\(s\) the final datadir pass copied differ .*db/t\.ibd, ibdata1"):
        outputs = {"cutover": {"source_clock_offset": 0.0}, "preflight": {"datadirs": {"source": "/s", "target": "/t"}}}
        DbFinal().run(context(rt, "db_final", outputs=outputs, history=history))


def test_db_final_past_the_budget_copies_nothing() -> None:
    rt = OfflineRuntime(plan())
    rt.window.begin(time.time() - rt.plan.cutover.max_write_block - 1)
    with pytest.raises(StepError, match=r"more than cutover\.max_write_block .*starting the final datadir pass"):
        DbFinal().run(context(rt, "db_final"))
    assert rt.source.commands == [] and rt.target.commands == []


def test_prepare_target_stops_services_in_reverse_then_the_database() -> None:
    p = plan()
    rt = OfflineRuntime(p)
    result = PrepareTarget().run(context(rt, "prepare_target"))
    services = list(reversed(p.services.target))
    assert rt.target.commands == [s.stop for s in services] + [p.database.target.stop]
    assert result == {"stopped": [s.name for s in services] + ["database"]}
    still_up = OfflineRuntime(p)
    still_up.answers["target"] = True
    with pytest.raises(StepError, match="still answers after its stop command"):
        PrepareTarget().run(context(still_up, "prepare_target"))


def test_finish_journals_each_source_service_before_stopping_it_and_undo_starts_exactly_those() -> None:
    p = plan()
    p = p.model_copy(update={"finish": p.finish.model_copy(update={"source": "stop", "drain_seconds": 0})})
    assert p.services.source, "the example plan has a source service"
    first = p.services.source[0]
    rt = OfflineRuntime(p, source=RecordingHost(fail=re.escape(first.stop)))
    journal: dict[str, Any] = {}
    with pytest.raises(StepError, match=f"stopping source service {first.name}"):
        Finish().run(context(rt, "finish", saved=journal, history=[]))
    assert journal[STOPPED_SERVICES] == [first.name], "journaled before the stop was tried"
    rt.source.fail = None
    Finish().undo(context(rt, "finish", saved=journal))
    assert rt.source.commands[-1] == first.start


# The datadir resolved on the source (a step run without preflight's journaled figure asks the host once).
RESOLVED_DATADIR = ("readlink -m", "n y /var/lib/mysql\n")


def test_cutover_fences_locks_reads_figures_then_stops_and_waits_for_the_files_to_be_released() -> None:
    p = plan()
    holders = "/proc/41/fd /var/lib/mysql/ibdata1\n"
    source = RecordingHost(
        [
            RESOLVED_DATADIR,
            ("^date", f"{time.time():.6f}\n"),
            # Seen while the server runs, still held once after the stop command, then released.
            ("^find /proc", [holders, holders, ""]),
            ("guard.sh", "4242\n"),
        ]
    )
    rt = OfflineRuntime(p, source=source)
    journal: dict[str, Any] = {}

    def _stop(command: str) -> None:
        if command.endswith(p.database.source.stop):
            rt.session.server_running = False

    source.effect = _stop

    result = Cutover().run(context(rt, "cutover", saved=journal))
    assert result is not None
    fence, stop = p.services.fence.enable, p.database.source.stop
    commands = source.commands
    stop = next(c for c in commands if c.endswith(stop))
    # The guard on the source learns the database is stopped before the stop begins.
    assert stop.index("/db_stopped") < stop.index(p.database.source.stop)
    assert commands.index(next(c for c in commands if "guard.sh" in c)) < commands.index(fence)
    assert commands.index(fence) < commands.index(stop)
    # The server's pid, seen before the stop, is followed until it has exited.
    assert "/proc/41/stat" in [c for c in commands if c.startswith("find /proc")][-1]
    statements = rt.session.statements
    assert statements[0].startswith("SET SESSION lock_wait_timeout")
    assert statements.index("FLUSH TABLES WITH READ LOCK") < statements.index("SHOW BINLOG STATUS")
    # Under the lock: the binary log position and the list of tables, no row read (O(1), O(tables)); the rows are
    # the after-commit audit's.
    locked = statements[statements.index("FLUSH TABLES WITH READ LOCK") :]
    assert not [s for s in locked if "COUNT(" in s.upper() or s.upper().startswith("CHECKSUM")], locked
    assert result["tables"] == ["app.reviews", "app.users"] and "row_counts" not in result
    assert result["binlog"] == {"file": "binlog.000003", "position": 1234, "gtid": "0-1-42"}
    assert rt.session.closed, "the lock's session is closed (the lock released) once the database stopped"
    # Journaled in order, each before the action it protects.
    assert list(journal) == [
        "rollback_reserve",
        "guard",
        "writes_blocked_at",
        "fenced",
        "source_read_only",
        "final_state",
        "source_db_stopped",
    ]
    assert journal["final_state"]["tables"] == result["tables"]
    assert journal["final_state"]["binlog"] == result["binlog"], "what a resume re-proves"
    assert rt.window.blocked_at == journal["writes_blocked_at"] == result["writes_blocked_at"]

    # Re-entered after the shutdown began: no new lock, the journaled figures, the stop again.
    # The figures stand: the binary log ends where it ended under the lock, but for the shutdown's stop event.
    binlog_unchanged = ("^cd /var/lib/mysql && stat", "1257\n3\n./binlog.000003\n")
    again = OfflineRuntime(p, source=RecordingHost([RESOLVED_DATADIR, ("^date", "0\n"), binlog_unchanged]))
    again.answers["source"] = False
    resumed = Cutover().run(context(again, "cutover", saved=journal))
    assert resumed is not None and resumed["tables"] == result["tables"] and resumed["binlog"] == result["binlog"]
    assert resumed["writes_blocked_at"] == result["writes_blocked_at"]
    assert fence not in again.source.commands and any(c.endswith(p.database.source.stop) for c in again.source.commands)
    # Written to since (a write acknowledged once the lock died with our session): the figures do not stand.
    for moved, why in [("2480\n3\n./binlog.000003\n", "ends at 2480"), ("256\n4\n./binlog.000004\n", "moved on")]:
        changed = OfflineRuntime(p, source=RecordingHost([RESOLVED_DATADIR, ("^date", "0\n"), ("^cd /var/lib", moved)]))
        changed.answers["source"] = False
        with pytest.raises(StepError, match=why):
            Cutover().run(context(changed, "cutover", saved=journal))


@pytest.mark.parametrize("records", [1, 2, 5, 20, 50])
def test_a_long_settle_stays_well_under_cloudflares_rate_limit(records: int) -> None:
    """Cloudflare allows a token 1,200 requests in 5 minutes, then refuses every call (the rollback's restore too)
    for 5 minutes. Five minutes of settling (after an edit that timed out, say) cost at most a third of that,
    however many records, while the first reads stay quick (two that agree end most waits)."""
    from orchestrator.steps.dns_flip import SETTLE_POLL, settle_pause

    elapsed, requests, reads = 0.0, 0, 0
    while elapsed < 300:
        requests += records  # one read of every record
        reads += 1
        elapsed += settle_pause(reads, records)
    assert requests <= 400, (records, requests)
    assert settle_pause(1, records) == settle_pause(2, records) == SETTLE_POLL
