"""The replicate cut-over on the lab, through `migrate apply` as an operator runs it.

Success under `migrate lab load` (clients caching DNS for 5 s, so some keep talking to the old server after the
flip): nothing acknowledged is lost, no request fails (the front door holds them through the window and forwards
the stale-DNS clients to the target), the longest write stall stays within the window + 1 s, replication is torn
down on both sides at the end. The budget spent while the front door holds: a rollback, and still no request
fails. Failures, each breaking one thing: a replica error before the window, a replica that never catches up
(bounded wait), a difference planted on the replica, kill -9 during the seed and inside the window. Each failure
before the window rolls back to a source that never stopped serving (never fenced, never read-only); each kill
resumes to a completed run with 0 lost. Then `migrate rollback` after the flip over the reverse replica:
nothing acknowledged is lost on the way there or back (a stopped reverse replica first makes that rollback refuse,
changing nothing); killed with kill -9 inside its window, `migrate rollback` again resumes it, 0 lost.

Faults are planted by the plan's own hooks (a `before-step` hook fires at a known point of the run), so nothing
here waits on timing. Every test starts and ends with the source live and writable, no replication, no tunnel.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
from ruamel.yaml import YAML

from migrate_lab.state import HostState, LabState
from migrate_lab.verify import main_verify
from orchestrator import exit_codes
from orchestrator.database.mysql import gtid, replica
from orchestrator.database.mysql import switch as mysql_switch
from orchestrator.plan.model import ROOT_RUN_DIR
from orchestrator.services import owned
from orchestrator.services.frontdoor import SOURCE_HOLD
from tests.test_e2e import (
    PLAN_NAMES,
    assert_source_serves_and_dns_unchanged,
    cf_control,
    dns_contents,
    migrate_apply,
    outcome,
    plan_name,
    restore_source_live,
    run_report,
    start_load,
    wait_for_load_ack,
    wait_for_load_acks_on,
)
from tests.test_frontdoor_e2e import (
    CLIENT_DNS_CACHE,
    journal_of,
    no_failed_requests,
    requests_sent,
    saved,
    stall_bound,
    stop_load,
    wait_for,
)
from tests.test_frontdoor_e2e import start_load as start_door_load

pytestmark = pytest.mark.lab

MIGRATE = Path(sys.executable).with_name("migrate")
TIMEOUT = 600.0


# --- the lab, driven from outside ------------------------------------------------------------------------------


def connect(state: LabState, host: HostState, database: str | None = None) -> pymysql.Connection:
    return pymysql.connect(
        host=host.address, port=host.db_port, user=state.migrate_user, password=state.secrets()[state.db_password_env],
        database=database, autocommit=True, connect_timeout=10, read_timeout=60,
    )  # fmt: skip


def source_is_plain_and_writable(state: LabState) -> tuple[bool, object]:
    conn = connect(state, state.source)
    try:
        return not mysql_switch.is_read_only(conn), replica.replica_status(conn)
    finally:
        conn.close()


def tunnels_down(state: LabState, names: list[str]) -> None:
    """End the tunnels runs left (their control sockets are the runs', in the private directory)."""
    for name in names:
        for control in tunnel_sockets(name):
            subprocess.run(["ssh", "-o", f"ControlPath={control}", "-O", "exit", "x"], capture_output=True, timeout=30)
            control.unlink(missing_ok=True)


def tunnel(plan: Path, kind: str) -> str:
    """What the tunnels of `kind` ("fwd" or "rev") of every run of the plan file `plan` are named after: the plan's
    key and the direction (each run's tag between them)."""
    return f"{owned.plan_key(plan_name(plan), plan)}*-{kind}"


def tunnel_sockets(name: str) -> list[Path]:
    return sorted(Path(ROOT_RUN_DIR).glob(f"{owned.TUNNEL_PREFIX}{name}.ctl"))


def lab_tunnels(state: LabState) -> list[str]:
    """Every tunnel a run of one of this lab's plan files may have left (this lab's only: not another lab's)."""
    plans = [state.plan_file, *state.path.glob("plan-*.yaml")]
    return [tunnel(plan, kind) for plan in plans if plan.exists() for kind in ("fwd", "rev")]


def tunnel_running(name: str) -> bool:
    """A tunnel of that name (any run's) answers on its control socket."""
    for control in tunnel_sockets(name):
        check = subprocess.run(
            ["ssh", "-o", f"ControlPath={control}", "-O", "check", "x"], capture_output=True, timeout=30
        )
        if check.returncode == 0:
            return True
    return False


def assert_replication_torn_down(state: LabState, plan: Path, events: list[dict[str, Any]]) -> None:
    """finish set reverse replication up (healthy) and tore it down on both sides: no replica, no master.info (it
    held the password), no tunnel; the old source stays read-only (and fenced) as finish leaves it."""
    finish = next(ev["result"] for ev in events if ev.get("event") == "step_completed" and ev["step"] == "finish")
    assert finish["reverse_replication"]["healthy"] is True, finish
    assert finish["reverse_replication"]["torn_down"] is True
    for host in (state.source, state.target):
        conn = connect(state, host)
        try:
            assert replica.replica_status(conn) is None, host.name
        finally:
            conn.close()
        assert not (Path(str(host.datadir)) / "master.info").exists(), host.name
    writable, _ = source_is_plain_and_writable(state)
    assert not writable
    for kind in ("fwd", "rev"):
        assert not tunnel_running(tunnel(plan, kind))


def restore(state: LabState) -> None:
    """The source plain and writable (no replication, read_only off), no tunnel, then the e2e restore."""
    tunnels_down(state, lab_tunnels(state))
    with contextlib.suppress(pymysql.MySQLError):
        conn = connect(state, state.source)
        try:
            replica.forget_replication(conn)
            mysql_switch.set_read_only(conn, False, lock_wait_timeout=5)
        finally:
            conn.close()
    restore_source_live(state)


@pytest.fixture
def live(lab: LabState) -> Iterator[LabState]:
    restore(lab)
    try:
        yield lab
    finally:
        restore(lab)


def replicate_plan(state: LabState, suffix: str, hooks: dict[str, str] | None = None, **replication: Any) -> Path:
    """A copy of the lab's plan (cutover.mode auto: it must resolve to replicate here) with its own name, hooks
    directory and replication settings."""
    yaml = YAML()
    data = yaml.load(state.plan_file.read_text())
    data["name"] = f"{data['name']}-{suffix}"
    data["cutover"]["mode"] = replication.pop("mode", "auto")
    if "max_write_block" in replication:
        data["cutover"]["max_write_block"] = replication.pop("max_write_block")
    for key, value in replication.items():
        data["replication"][key] = value
    hooks_dir = state.path / f"hooks-{suffix}"
    hooks_dir.mkdir(exist_ok=True)
    for old in hooks_dir.iterdir():
        old.unlink()
    for name, body in (hooks or {}).items():
        path = hooks_dir / name
        path.write_text("#!/bin/bash\nset -u\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    data["hooks"] = {"dir": str(hooks_dir), "pass_env": [state.db_password_env]}
    PLAN_NAMES.add(str(data["name"]))
    path = state.path / f"plan-{suffix}.yaml"
    with path.open("w") as out:
        yaml.dump(data, out)
    return path


WINDOW_READ_CHECK = "a read through the source's front door"


def with_window_read_check(state: LabState, plan: Path) -> Path:
    """The plan with a health check that runs inside the window only, once writes are held: a read sent to the
    source's front door. Held like a write, it would wait for the commit, which waits for the checks: it would time
    out (5 s a try) and be tried again, or fail the run."""
    yaml = YAML()
    data = yaml.load(plan.read_text())
    data["health"]["checks"].append({
        "kind": "http", "name": WINDOW_READ_CHECK, "when": "window", "timeout": 5,
        "url": f"http://{state.source.address}:{state.source.app_port}/reviews?limit=1", "expect_status": 200,
    })  # fmt: skip
    with plan.open("w") as out:
        yaml.dump(data, out)
    return plan


def sql_on(state: LabState, host: HostState, statements: str) -> str:
    """A hook line running SQL on a lab host as the migration's account (password from the hook's environment)."""
    argv = ["mariadb", "--no-defaults", f"--socket={host.db_socket}", "-u", state.migrate_user, state.db_name]
    return f'MYSQL_PWD="${state.db_password_env}" {shlex.join(argv)} -e {shlex.quote(statements)}\n'


def on_step(step: str, body: str) -> str:
    return f'[ "$MIGRATE_STEP" = {shlex.quote(step)} ] || exit 0\n{body}'


@contextlib.contextmanager
def writer(state: LabState, prefix: str) -> Iterator[list[str]]:
    """A client committing rows on the source back to back (paced), the ids it got acknowledged."""
    acked: list[str] = []
    stop = threading.Event()

    def _run() -> None:
        conn: pymysql.Connection | None = None
        n = 0
        while not stop.is_set():
            try:
                if conn is None:
                    conn = connect(state, state.source, state.db_name)
                n += 1
                row = f"{prefix}-{n:08d}"
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO reviews (id, author, course, rating, body) VALUES (%s, 'w', 'c', 3, 'b')",
                                (row,))  # fmt: skip
                acked.append(row)
            except pymysql.MySQLError:
                with contextlib.suppress(Exception):
                    if conn is not None:
                        conn.close()
                conn = None
            stop.wait(0.02)
        if conn is not None:
            conn.close()

    thread = threading.Thread(target=_run, daemon=True)
    thread.start()
    try:
        yield acked
    finally:
        stop.set()
        thread.join(timeout=30)


def journal_events(state: LabState, plan: Path) -> list[dict[str, Any]]:
    directory = state.path / ".migrate" / plan_name(plan)
    events: list[dict[str, Any]] = []
    for path in [*sorted((directory / "history").glob("*.jsonl")), directory / "journal.jsonl"]:
        if path.exists():
            events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return events


def writes_were_blocked(events: list[dict[str, Any]]) -> bool:
    return any(ev.get("event") == "step_saved" and ev.get("key") == "writes_blocked_at" for ev in events)


def assert_rolled_back_before_the_window(state: LabState, plan: Path, result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == exit_codes.FAILED, outcome(result)
    events = journal_events(state, plan)
    # The source never stopped serving: never fenced, never read-only; and now plain and writable.
    assert not writes_were_blocked(events), "the window began"
    writable, status = source_is_plain_and_writable(state)
    assert writable and status is None
    assert_source_serves_and_dns_unchanged(state)
    # Nothing left on the target: no seeded datadir in place of its own, no staging copy, no tunnel.
    datadir = Path(str(state.target.datadir))
    assert not Path(f"{datadir}.seed").exists() and not Path(f"{datadir}.before-seed").exists()
    assert not tunnel_running(tunnel(plan, "fwd"))


# --- success under load -----------------------------------------------------------------------------------------


def test_replicate_under_load_loses_nothing_fails_no_request_and_tears_replication_down(
    live: LabState, tmp_path: Path
) -> None:
    state = live
    # A file written between the last pass before the window and the window: the final pass has it to copy, whatever
    # the load wrote in those moments.
    late = state.source.uploads / f"written-after-the-pre-window-pass-{uuid.uuid4().hex[:8]}"
    hook = on_step("repl_switch", f"echo late > {shlex.quote(str(late))}\n")
    plan = with_window_read_check(state, replicate_plan(state, "repl", {"before-step": hook}))
    journal = journal_of(state, plan)
    load_dir = tmp_path / "load"
    load = start_door_load(state, load_dir, journal)
    try:
        acks = load_dir / "acks.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (acks.exists() and acks.read_text().count("\n") >= 10):
            time.sleep(0.05)  # writes flowing to the source before the migration begins
        result = migrate_apply(state, plan, timeout=TIMEOUT)
        assert result.returncode == exit_codes.OK, outcome(result)
        # Clients with a cached answer reach the old address until their cache expires: its front door forwards them.
        flipped = requests_sent(load_dir)
        time.sleep(CLIENT_DNS_CACHE + 1)
        wait_for(lambda: requests_sent(load_dir) > flipped + 20, "requests after the caches expired")
    finally:
        stop_load(load)

    assert dns_contents(state) == {name: state.target.address for name in state.records}
    report = run_report(state, plan_name(plan))
    assert report["status"] == "completed"
    events = journal_events(state, plan)
    steps = next(ev["steps"] for ev in events if ev.get("event") == "run_started")
    assert "repl_switch" in steps and "cutover" not in steps, steps  # auto chose replicate on the lab
    preflight = next(ev["result"] for ev in events if ev.get("event") == "step_completed" and ev["step"] == "preflight")
    assert preflight["cutover_mode"] == "replicate" and preflight["mode_reason"].startswith("replicate")
    switch = report["replicate"]
    assert switch["final_gtid"] and gtid.same_position(
        gtid.GtidPosition.parse(switch["final_gtid"]), gtid.GtidPosition.parse(switch["executed_gtid"])
    )

    # The health checks passed before the window (against the fenced replica) and again inside it; the window's
    # parts are in the report, the switch's own among them.
    assert {(c["check"], c["where"]) for c in report["checks"]} >= {
        ("health checks", "before"),
        ("health checks", "inside"),
    }
    # With the front door the commit is made there: DNS moves after the window.
    parts = set(report["window_parts"])
    assert {"repl_switch", "files_final", "verify_target", "switch_traffic"} <= parts, parts
    # The fence: its own part, or within the window's first command when the source drives its door (`auto`
    # chooses that by measuring, so the machine's load decides which).
    assert "switch: fence" in parts or any(p.startswith("switch: journal, then hold, drain and fence") for p in parts)
    assert "dns_flip" not in parts, parts
    # Every part of the window says what it cost in round trips (the switch's SQL, the door's admin commands).
    trips = report["window_round_trips"]
    assert trips["repl_switch"].get("sql", 0) > 0 and trips["switch_traffic"].get("haproxy", 0) > 0, trips
    # The uploads moved by rsync as in the shutdown mode: inside the window, the paths their final pass copied or
    # deleted were compared on both hosts.
    trees = [c for c in report["checks"] if c["where"] == "inside" and c["check"].startswith("tree uploads")]
    assert trees and trees[0]["differing"] == 0, report["checks"]
    # Through the rsync daemon opened before the window: no SSH session started on the target inside it.
    assert report["final_pass_trees"]["uploads"]["route"] == "daemon", report["final_pass_trees"]
    assert (state.target.uploads / late.name).read_text() == "late\n"

    verify = main_verify(state, host="target", load_dir=load_dir, journal=journal)
    assert verify.window is not None
    window = float(verify.window["to"]) - float(verify.window["from"])
    print(f"replicate: window parts {report['window_parts']}")
    print(
        f"replicate: window {window:.2f} s, writes blocked (report) {report['write_block_seconds']} s; switch "
        f"{switch.get('switch_seconds')} s (read_only {switch.get('read_only_seconds')} s, wait "
        f"{switch.get('wait_seconds')} s); longest write stall {verify.longest_write_stall_s} s; failed "
        f"{verify.requests_failed}; latency {verify.latency}; steps "
        f"{[(step['name'], step['duration']) for step in report['steps']]}"
    )
    assert verify.error is None, verify.error
    assert verify.reviews_acknowledged > 0 and verify.uploads_acknowledged > 0
    assert verify.acknowledged_lost == 0, verify.lost
    # The front door held the requests of the window (none refused by the fence or read_only) and forwarded to the
    # target every client whose DNS cache still held the old address: no request failed, and the DNS cache does
    # not add to the longest write stall.
    assert [v for v in saved(journal, SOURCE_HOLD) if v and "deadline" in v], "the source's front door never held"
    no_failed_requests(verify)
    bound = stall_bound(load_dir, (float(verify.window["from"]), float(verify.window["to"])))
    assert verify.longest_write_stall_s is not None and verify.longest_write_stall_s <= bound, bound
    assert set(verify.per_server) == {state.source.address, state.target.address}, verify.per_server
    # Only writes were held (the lab plan's `hold: writes`): the source serves reads through the window. The plan's
    # window-only check read through the source's front door once the hold was up, and was answered on its first try
    # (a held read would have timed out and been retried, or failed the run).
    assert saved(journal, SOURCE_HOLD)[-1]["writes_only"] is True
    switched = next(
        ev["result"] for ev in events if ev.get("event") == "step_completed" and ev["step"] == "repl_switch"
    )
    assert switched["health_tries"].get(WINDOW_READ_CHECK) == 1, switched["health_tries"]

    # After the commit, outside the window: every table of the source, frozen at the final position, equal to the
    # target's snapshot taken at the promotion (the target took the load's writes since: outside the snapshot).
    audit = report["audit"]
    assert audit["status"] == "equal" and audit["method"] == "chunks" and not audit["differences"], audit
    assert audit["rows"] > 0 and audit["at_gtid"] == switch["final_gtid"], audit
    assert "audit" not in report["window_parts"]
    print(f"replicate audit: {audit['tables']} tables, {audit['rows']} rows, {audit['chunks']} chunks, "
          f"{audit['seconds']} s")  # fmt: skip

    # Replication is over on both sides: no replica, no master.info (it held the password), no tunnel; the old source
    # stays read-only (and fenced) as finish leaves it.
    finish = next(s for s in report["steps"] if s["name"] == "finish")
    assert finish["state"] == "done"
    assert_replication_torn_down(state, plan, events)


# --- failures before the window: the source never stopped serving ----------------------------------------------


def test_a_replica_error_before_the_window_stops_the_run_in_the_replicas_words(live: LabState) -> None:
    state = live
    row = f"conflict-{os.getpid()}"
    plant = sql_on(state, state.target, f"SET sql_log_bin = 0; INSERT INTO reviews (id, author) VALUES ('{row}', 'x')")
    then = sql_on(state, state.source, f"INSERT INTO reviews (id, author) VALUES ('{row}', 'source')")
    plan = replicate_plan(state, "replerr", {"before-step": on_step("repl_catchup", plant + then)}, compare=False)
    result = migrate_apply(state, plan, timeout=TIMEOUT)
    assert "Duplicate entry" in result.stdout + result.stderr and row in result.stdout + result.stderr, outcome(result)
    assert_rolled_back_before_the_window(state, plan, result)


def test_a_replica_that_never_catches_up_stops_after_the_bounded_wait(live: LabState) -> None:
    state = live
    # The replica applies nothing younger than an hour: under writes, it never reaches the source's position.
    delay = sql_on(state, state.target, "STOP SLAVE; CHANGE MASTER TO MASTER_DELAY = 3600; START SLAVE")
    # Meanwhile an operator asks where the run stands: the replica's lag, read live.
    seen = state.path / "status-repllag.json"
    asked = f"{shlex.quote(str(MIGRATE))} status {shlex.quote(str(state.path / 'plan-repllag.yaml'))} --json"
    ask = f"{asked} > {shlex.quote(str(seen))}\n"
    plan = replicate_plan(
        state, "repllag", {"before-step": on_step("repl_catchup", ask + delay)}, compare=False, max_lag=0.5,
        lag_wait=3,
    )  # fmt: skip
    with writer(state, f"lag-{os.getpid()}") as acked:
        result = migrate_apply(state, plan, timeout=TIMEOUT)
    text = result.stdout + result.stderr
    assert "replication.max_lag 0.5 s" in text and "replication.lag_wait 3 s" in text, outcome(result)
    assert "nothing was changed" in text
    assert_rolled_back_before_the_window(state, plan, result)
    status = json.loads(seen.read_text())
    assert status["replication"].startswith("replica: ") and " behind " in status["replication"], status
    # Every write the source acknowledged meanwhile is there: it never stopped taking them.
    conn = connect(state, state.source, state.db_name)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM reviews WHERE id LIKE %s", (f"lag-{os.getpid()}-%",))
            assert cur.fetchone()[0] == len(acked) > 0
    finally:
        conn.close()


def test_the_comparison_finds_a_difference_planted_on_the_replica(live: LabState) -> None:
    state = live
    plant = sql_on(
        state, state.target, "SET sql_log_bin = 0; UPDATE reviews SET rating = rating + 1 ORDER BY id LIMIT 1"
    )
    plan = replicate_plan(state, "repldiff", {"before-step": on_step("repl_catchup", plant)}, chunk_rows=50)
    result = migrate_apply(state, plan, timeout=TIMEOUT)
    text = result.stdout + result.stderr
    assert f"{state.db_name}.reviews chunk 0 " in text and "contents differ" in text, outcome(result)
    assert_rolled_back_before_the_window(state, plan, result)


# --- after the commit: the audit ---------------------------------------------------------------------------------


def test_a_change_on_the_replica_after_the_comparison_is_found_by_the_audit_after_the_commit(live: LabState) -> None:
    state = live
    # After repl_catchup's comparison, before the window: a row changed on the replica with the binary log off. No
    # GTID carries it, so the switch's proof (the replica executed exactly the source's final position) holds.
    plant = sql_on(
        state, state.target, "SET sql_log_bin = 0; UPDATE reviews SET rating = rating + 1 ORDER BY id LIMIT 1"
    )
    plan = replicate_plan(state, "replaudit", {"before-step": on_step("repl_switch", plant)}, chunk_rows=50)
    result = migrate_apply(state, plan, timeout=TIMEOUT)
    text = result.stdout + result.stderr
    assert result.returncode == exit_codes.NEEDS_ATTENTION, outcome(result)
    assert f"{state.db_name}.reviews chunk 0 " in text and "contents differ" in text, outcome(result)
    # Committed (the audit never rolls back): the target serves, the report says what the audit read and cost.
    assert dns_contents(state) == {name: state.target.address for name in state.records}
    report = run_report(state, plan_name(plan))
    audit = report["audit"]
    assert report["status"] == "completed" and audit["status"] == "differs" and audit["method"] == "chunks", audit
    assert [d for d in audit["differences"] if d.startswith(f"{state.db_name}.reviews chunk 0 ")], audit
    assert audit["rows"] > 0 and audit["chunks"] >= 1 and audit["seconds"] is not None, audit
    assert audit["at_gtid"] == report["replicate"]["final_gtid"]
    assert "audit: differs: " in result.stdout and " chunk(s) in " in result.stdout, outcome(result)
    # `migrate status` names the table and the chunk.
    status = subprocess.run([str(MIGRATE), "status", str(plan), "--json"], capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert f"{state.db_name}.reviews chunk 0 " in (json.loads(status.stdout).get("audit") or ""), status.stdout
    print(f"replicate audit (altered replica): {audit['rows']} rows, {audit['chunks']} chunks, {audit['seconds']} s")


# --- kill -9: the run resumes and loses nothing -----------------------------------------------------------------


def run_killed(state: LabState, plan: Path) -> None:
    """`migrate apply` until one of the plan's hooks kills it with SIGKILL."""
    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY")}
    command = [str(MIGRATE), "apply", str(plan), "--yes", "--env-file", str(state.env_file)]
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert first.returncode == -signal.SIGKILL, outcome(first)


def resumed_under_load(state: LabState, plan: Path, load_dir: Path, killed_by: str) -> dict[str, Any]:
    load = start_load(state, load_dir, 300)
    try:
        acks = load_dir / "acks.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (acks.exists() and acks.read_text().count("\n") >= 10):
            time.sleep(0.05)
        run_killed(state, plan)
        Path(killed_by).unlink(missing_ok=True)
        result = migrate_apply(state, plan, timeout=TIMEOUT)
        assert result.returncode == exit_codes.OK, outcome(result)
        assert "resuming" in result.stdout + result.stderr, outcome(result)
        wait_for_load_acks_on(load_dir, state.target.address, since=time.time())
    finally:
        load.send_signal(signal.SIGTERM)
        load.communicate(timeout=60)
    verify = main_verify(state, host="target", load_dir=load_dir)
    assert verify.error is None, verify.error
    assert verify.reviews_acknowledged > 0
    assert verify.acknowledged_lost == 0, verify.lost
    report = run_report(state, plan_name(plan))
    assert report["status"] == "completed"
    assert dns_contents(state) == {name: state.target.address for name in state.records}
    return report


def test_killed_during_the_seed_resumes_and_loses_nothing(live: LabState, tmp_path: Path) -> None:
    state = live
    staging = f"{state.target.datadir}.seed"
    # Once the stream has begun landing on the target, the run is killed (the watcher outlives this hook).
    killer = (
        f"( while [ ! -d {shlex.quote(staging)} ]; do sleep 0.01; done; kill -9 $PPID ) >/dev/null 2>&1 &\n"
    ).replace("$PPID", "$MIGRATE_PID")
    body = "MIGRATE_PID=$PPID\n" + killer
    plan = replicate_plan(state, "replkill1", {"before-step": on_step("repl_seed", body)}, compare=False)
    hook = state.path / "hooks-replkill1" / "before-step"
    report = resumed_under_load(state, plan, tmp_path / "load", str(hook))
    seed = next(s for s in report["steps"] if s["name"] == "repl_seed")
    assert seed["attempts"] == 2


def test_killed_inside_the_window_resumes_and_loses_nothing(live: LabState, tmp_path: Path) -> None:
    state = live
    # Inside the window: the source read-only and fenced, the target promoted (the switch done), the uploads' delta
    # done beside it, DNS not flipped yet (the replicate mode runs no start_target: verify_target comes next).
    plan = replicate_plan(state, "replkill2", {"before-step": on_step("verify_target", "kill -9 $PPID\n")})
    hook = state.path / "hooks-replkill2" / "before-step"
    report = resumed_under_load(state, plan, tmp_path / "load", str(hook))
    events = journal_events(state, plan)
    assert writes_were_blocked(events)
    assert next(s for s in report["steps"] if s["name"] == "repl_switch")["attempts"] == 1
    # replication.keep_reverse 0: finish set up reverse replication and tore it down on both sides: no replica, no
    # master.info (it held the password), no tunnel; the old source stays read-only (and fenced).
    assert_replication_torn_down(state, plan, events)


def kills_once(pid_file: Path, command: str, *, before: bool) -> str:
    """`command` (a fence's), and, the first time only, a kill -9 of the run whose pid is in `pid_file` (before or
    after the command): the file is moved aside, so the resumed run's command does not kill it again."""
    used = shlex.quote(f"{pid_file}.used")
    kill = f"if mv {shlex.quote(str(pid_file))} {used} 2>/dev/null; then kill -9 $(cat {used}); fi"
    return f"{kill}; {command}" if before else f"{command} && {kill}; true"


def test_killed_inside_the_first_command_on_the_source_resumes_and_loses_nothing(
    live: LabState, tmp_path: Path
) -> None:
    """The source's side driven from the source host (commit_from: source): the window's first command holds, fences,
    then starts the uploads' final pass in the background and stops the database's writes with the local client.
    The run is killed by its own fence (once), inside that command: the command goes on there without it (read_only
    set, the pass run). The resume re-enters the switch and runs the first command again, the stop in it (each part
    harmless twice; the uploads' pass goes apart: the resumed run has no rsync route of the window's), and
    completes: nothing lost."""
    state = live
    pid_file = state.path / "replkill-first.pid"
    used = f"{pid_file}.used"
    # Once: the resumed run's switch finds the first kill done and writes no pid.
    once = f"[ -e {shlex.quote(used)} ] || echo $PPID > {shlex.quote(str(pid_file))}\n"
    hooks = {"before-step": on_step("repl_switch", once)}
    plan = replicate_plan(state, "replkill-first", hooks)
    yaml = YAML()
    data = yaml.load(plan.read_text())
    data["proxy"]["source"]["commit_from"] = "source"
    data["services"]["fence"]["enable"] = kills_once(pid_file, data["services"]["fence"]["enable"], before=True)
    with plan.open("w") as out:
        yaml.dump(data, out)
    report = resumed_under_load(state, plan, tmp_path / "load", str(pid_file))
    assert Path(used).exists(), "the fence did not kill the run"
    assert next(s for s in report["steps"] if s["name"] == "repl_switch")["attempts"] == 2
    journal = state.path / ".migrate" / plan_name(plan) / "journal.jsonl"
    logged = [
        json.loads(line) for log in journal.parent.glob("run-*.log.jsonl") for line in log.read_text().splitlines()
    ]
    assert any(r.get("event") == "repl.switch.source_read_only" and r.get("on_host") for r in logged)


def test_killed_at_the_door_commit_then_while_dns_converges_resumes_committed(live: LabState, tmp_path: Path) -> None:
    """The commit at the front door, killed twice under load. First kill -9 inside the commit's one command on the
    source, after the commit is recorded there and the target's fence lifted, before its answer (the journal does not
    say committed yet): that command ends without the run, and the service serves at once, nobody resuming: writes
    are acknowledged by the target through the source's door, DNS still on the source (not split). The resume reads
    the record and finishes forward (SIGTERM right after its commit step is only noted: a committed run is finished,
    never rolled back) until, the DNS API answering slowly, kill -9 again while the DNS flip after the window waits
    on it. The last resume re-reads where the records point and completes: DNS on the target, nothing lost, no
    rollback."""
    state = live
    pid_file = state.path / "replkill-door.pid"
    hooks = {
        "after-step": on_step("verify_target", f"echo $PPID > {shlex.quote(str(pid_file))}\n")
        + "\n"
        + on_step("switch_traffic", "kill -TERM $PPID\n"),
    }
    plan = replicate_plan(state, "replkill-door", hooks)
    yaml = YAML()
    data = yaml.load(plan.read_text())
    used = f"{pid_file}.used"
    # The commit driven from the source host (on loopback `auto` finds the source's own work dearer than two round
    # trips from here, and drives it from here): its crash is the one proven here.
    data["proxy"]["source"]["commit_from"] = "source"
    # Once: the fence goes down, then the run that lifted it is killed (the resume lifts it again, harmlessly).
    data["services"]["target_fence"]["disable"] = kills_once(
        pid_file, data["services"]["target_fence"]["disable"], before=False
    )
    with plan.open("w") as out:
        yaml.dump(data, out)
    journal = state.path / ".migrate" / plan_name(plan) / "journal.jsonl"
    load_dir = tmp_path / "load"
    load = start_load(state, load_dir, 300)
    try:
        acks = load_dir / "acks.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (acks.exists() and acks.read_text().count("\n") >= 10):
            time.sleep(0.05)
        run_killed(state, plan)
        killed_at = time.time()
        assert Path(used).exists(), "the fence command did not kill the run"
        # Nobody resumes yet: the commit's command ended on the source without the run, and the service serves:
        # writes are acknowledged again while the source's database is still read-only (by the target, through the
        # source's door: the clients still connect to the source's address), DNS not split.
        assert not any(e.get("event") == "committed" for e in journal_events(state, plan))
        wait_for_load_ack(
            load_dir, lambda ack: float(ack.get("ack_ts", 0)) > killed_at + 1, "no write acknowledged after the kill",
            30,
        )  # fmt: skip
        writable, _ = source_is_plain_and_writable(state)
        assert not writable, "the source's database is read-only: the acknowledged writes are the target's"
        assert dns_contents(state) == {name: state.source.address for name in state.records}
        cf_control(state, "faults", {"mode": "slow", "delay": 2, "count": -1, "methods": ["PATCH", "PUT"]})
        resumed = subprocess.Popen(
            [str(MIGRATE), "apply", str(plan), "--yes", "--env-file", str(state.env_file)],
            env={k: v for k, v in os.environ.items() if k not in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY")},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + TIMEOUT
        while not any(
            e.get("event") == "step_saved" and e.get("step") == "dns_flip" and e.get("key") == "edits"
            for e in journal_events(state, plan)
        ):
            assert resumed.poll() is None, f"the resumed run ended (exit {resumed.returncode}) before its DNS edits"
            assert time.monotonic() < deadline, "no DNS edit sent"
            time.sleep(0.02)
        resumed.kill()
        resumed.wait(timeout=60)
        cf_control(state, "faults", {"mode": "none"})
        result = migrate_apply(state, plan, timeout=TIMEOUT)
        assert result.returncode == exit_codes.OK, outcome(result)
        wait_for_load_acks_on(load_dir, state.target.address, since=time.time())
    finally:
        cf_control(state, "faults", {"mode": "none"})
        load.send_signal(signal.SIGTERM)
        load.communicate(timeout=60)
    verify = main_verify(state, host="target", load_dir=load_dir, journal=journal)
    assert verify.error is None, verify.error
    assert verify.acknowledged_lost == 0, verify.lost
    assert dns_contents(state) == {name: state.target.address for name in state.records}
    events = journal_events(state, plan)
    resumes = [i for i, e in enumerate(events) if e.get("event") == "run_resumed"]
    assert len(resumes) == 2, "resumed twice"
    # Committed on the source before the first kill, in the journal by the first resume: every resume went forward
    # (no rollback), the commit step re-entered once.
    assert not any(e.get("event") == "committed" for e in events[: resumes[0]])
    assert any(e.get("event") == "committed" for e in events[resumes[0] : resumes[1]])
    assert not any(e.get("event") == "rollback_started" for e in events)
    report = run_report(state, plan_name(plan))
    assert report["status"] == "completed"
    assert next(s for s in report["steps"] if s["name"] == "switch_traffic")["attempts"] == 2
    # The window closed at the door, before any DNS edit was sent.
    switched = next(e for e in events if e.get("event") == "step_completed" and e.get("step") == "switch_traffic")
    first_edit = next(e for e in events if e.get("step") == "dns_flip" and e.get("key") == "edits")
    assert switched["ts"] < first_edit["ts"]
    assert report["committed_at_door"] is not None and report["dns_flipped_at"] > report["committed_at_door"]
    # The first run's commit was driven from the source host, as the plan asked.
    logged = [
        json.loads(line) for log in journal.parent.glob("run-*.log.jsonl") for line in log.read_text().splitlines()
    ]
    assert any(r.get("event") == "frontdoor.local_door" and r.get("commit_from_source") for r in logged)
    assert any(r.get("event") == "committed_on_source" for r in logged)
    # So was the window's first command, with the database's stop (a local client) and the uploads' final pass
    # started in it once the fence was up.
    assert any(r.get("event") == "repl.switch.source_read_only" and r.get("on_host") for r in logged)
    assert any(r.get("event") == "final_pass_started_early" for r in logged)


def test_killed_inside_the_window_and_resumed_too_late_rolls_back_to_a_writable_source(
    live: LabState, tmp_path: Path
) -> None:
    """The budget spent while nobody ran: the resume rolls back; the source is writable again (read_only is global
    and survived the kill: the rollback clears it), the target read-only and stopped, DNS unchanged, 0 lost."""
    state = live
    budget = 8.0
    # Killed as verify_target begins: inside the window, once the switch ended (read_only set, whichever way the
    # switch set it: files_final starts beside the switch, possibly before its read_only when the source drives its
    # door and the stop does not ride its first command).
    plan = replicate_plan(
        state, "replkill3", {"before-step": on_step("verify_target", "kill -9 $PPID\n")}, max_write_block=budget
    )
    load_dir = tmp_path / "load"
    load = start_load(state, load_dir, 300)
    try:
        acks = load_dir / "acks.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (acks.exists() and acks.read_text().count("\n") >= 10):
            time.sleep(0.05)
        run_killed(state, plan)
        (state.path / "hooks-replkill3" / "before-step").unlink()
        writable, _ = source_is_plain_and_writable(state)
        assert not writable  # the kill left the source read-only
        blocked_at = next(
            float(ev["value"]) for ev in journal_events(state, plan)
            if ev.get("event") == "step_saved" and ev.get("key") == "writes_blocked_at"
        )  # fmt: skip
        while time.time() <= blocked_at + budget:  # the budget runs out while nobody runs
            time.sleep(0.1)
        result = migrate_apply(state, plan, timeout=TIMEOUT)
        assert result.returncode == exit_codes.FAILED, outcome(result)
        # Why it rolled back, in one line: the budget spent, or, when this resume took longer to start than the
        # guard's margin past the budget (a busy machine), the source the guard restored has taken writes since.
        said = result.stdout + result.stderr
        assert "cutover.max_write_block" in said or "has taken writes since" in said, outcome(result)
        wait_for_load_acks_on(load_dir, state.source.address, since=time.time())
    finally:
        load.send_signal(signal.SIGTERM)
        load.communicate(timeout=60)
    writable, status = source_is_plain_and_writable(state)
    assert writable and status is None
    assert_source_serves_and_dns_unchanged(state)
    verify = main_verify(state, host="source", load_dir=load_dir)
    assert verify.error is None, verify.error
    assert verify.reviews_acknowledged > 0
    assert verify.acknowledged_lost == 0, verify.lost


def test_budget_spent_while_the_front_door_holds_rolls_back_and_no_request_fails(
    live: LabState, tmp_path: Path
) -> None:
    """Inside the window (the source read-only and fenced, its front door holding, the target promoted) the budget
    runs out: the rollback keeps holding until the source takes writes again, then lets the held requests through to
    it. Under load: 0 failed requests, 0 lost."""
    state = live
    budget = 3.0
    plan = replicate_plan(
        state, "repldoorbudget", {"before-step": on_step("files_final", f"sleep {budget + 1:g}\n")},
        mode="replicate", compare=False, max_write_block=budget,
    )  # fmt: skip
    journal = journal_of(state, plan)
    load_dir = tmp_path / "load"
    load = start_door_load(state, load_dir, journal)
    try:
        wait_for(lambda: requests_sent(load_dir) > 20, "requests flowing to the source before the migration")
        result = migrate_apply(state, plan, timeout=TIMEOUT)
        assert result.returncode == exit_codes.FAILED, outcome(result)
        assert "cutover.max_write_block" in result.stdout + result.stderr, outcome(result)
        assert "rolled back" in result.stdout + result.stderr, outcome(result)
        after = requests_sent(load_dir)
        wait_for(lambda: requests_sent(load_dir) > after + 20, "requests after the rollback")
    finally:
        stop_load(load)

    events = journal_events(state, plan)
    assert any(ev.get("event") == "step_completed" and ev.get("step") == "repl_switch" for ev in events)
    held = saved(journal, SOURCE_HOLD)
    assert [v for v in held if v and "deadline" in v], "the source's front door never held"
    assert held[-1] is None, "the rollback did not release the hold"
    writable, status = source_is_plain_and_writable(state)
    assert writable and status is None
    assert_source_serves_and_dns_unchanged(state)
    verify = main_verify(state, host="source", load_dir=load_dir, journal=journal)
    print(f"replicate rollback: window {verify.window}, failed {verify.requests_failed}, latency {verify.latency}")
    assert verify.error is None, verify.error
    assert verify.reviews_acknowledged > 0
    assert verify.acknowledged_lost == 0, verify.lost
    no_failed_requests(verify)


# --- the way back after the flip: a reverse cut-over over the reverse replica -----------------------------------


def migrate(state: LabState, *args: str) -> subprocess.CompletedProcess[str]:
    """A `migrate` command with the lab's secrets in its environment (status reads the servers with them)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY")}
    env.update(state.secrets())
    return subprocess.run([str(MIGRATE), *args], env=env, capture_output=True, text=True, timeout=TIMEOUT)


def test_replicate_under_load_then_rollback_after_the_flip_over_the_reverse_replica_loses_nothing(
    live: LabState, tmp_path: Path
) -> None:
    """A replicate migration (auto resolves to it on the lab) under load keeps its reverse path; clients write to
    the target; `migrate rollback` (no flag) is a reverse cut-over: the service back on the source with every write
    either server acknowledged, DNS at the source. Before it, the same rollback with the reverse replica stopped
    refuses in one line and changes nothing."""
    state = live
    plan = replicate_plan(state, "replback", keep_reverse=3600)
    name = plan_name(plan)
    load_dir = tmp_path / "load"
    load = start_load(state, load_dir, 400)
    try:
        acks = load_dir / "acks.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (acks.exists() and acks.read_text().count("\n") >= 10):
            time.sleep(0.05)
        forward = migrate_apply(state, plan, timeout=TIMEOUT)
        assert forward.returncode == exit_codes.OK, outcome(forward)
        assert "reverse replication kept until" in forward.stdout, outcome(forward)
        assert dns_contents(state) == {n: state.target.address for n in state.records}
        wait_for_load_acks_on(load_dir, state.target.address, since=time.time())  # clients follow DNS there
        shown = migrate(state, "status", str(plan), "--json")
        assert shown.returncode == exit_codes.OK, outcome(shown)
        line = json.loads(shown.stdout)["replication"]
        assert line.startswith("reverse replication: the old source ") and " behind the target" in line, line
        assert f"migrate finish {plan}" in line, line

        # Broken reverse replication: one line naming the two ways that remain, exit 3, nothing changed.
        old_source = connect(state, state.source)
        try:
            replica.stop_replica(old_source)
            refused = migrate(state, "rollback", str(plan), "--yes", "--env-file", str(state.env_file))
            replica.start_replica(old_source)
        finally:
            old_source.close()
        assert refused.returncode == exit_codes.REFUSED, outcome(refused)
        said = refused.stderr.strip()
        assert "\n" not in said and "reverse replication is broken" in said, outcome(refused)
        assert "--reverse" in said and "--discard-target-writes" in said, outcome(refused)
        assert dns_contents(state) == {n: state.target.address for n in state.records}
        assert not (state.path / ".migrate" / f"{name}-reverse").exists()

        back = migrate(state, "rollback", str(plan), "--yes", "--env-file", str(state.env_file))
        assert back.returncode == exit_codes.OK, outcome(back)
        assert "reverse replication is healthy: moving back through it" in back.stdout, outcome(back)
        wait_for_load_acks_on(load_dir, state.source.address, since=time.time())  # clients leave the target
    finally:
        load.send_signal(signal.SIGTERM)
        load.communicate(timeout=60)

    assert dns_contents(state) == {n: state.source.address for n in state.records}
    # The forward run: replicate (auto's choice), the target promoted at exactly the source's final position, the
    # reverse path kept after it.
    events = journal_events(state, plan)
    forward_steps = next(ev["steps"] for ev in events if ev.get("event") == "run_started")
    assert "repl_switch" in forward_steps and "cutover" not in forward_steps, forward_steps
    preflight = next(ev["result"] for ev in events if ev.get("event") == "step_completed" and ev["step"] == "preflight")
    assert preflight["cutover_mode"] == "replicate" and preflight["mode_reason"].startswith("replicate")
    there = run_report(state, name)["replicate"]
    assert there["final_gtid"] and gtid.same_position(
        gtid.GtidPosition.parse(there["final_gtid"]), gtid.GtidPosition.parse(there["executed_gtid"])
    )
    kept = next(ev["result"] for ev in events if ev.get("event") == "step_completed" and ev["step"] == "finish")
    assert kept["reverse_replication"]["healthy"] is True and kept["reverse_replication"]["kept_until"]
    report = run_report(state, f"{name}-reverse")
    assert report["status"] == "completed"
    steps = next(ev["steps"] for ev in reversed(journal_events_of(state, f"{name}-reverse")) if ev.get("event") ==
                 "run_started")  # fmt: skip
    assert "repl_switch" in steps and "cutover" not in steps and "prepare_target" not in steps, steps
    verify = main_verify(state, host="source", load_dir=load_dir)
    switch = report["replicate"]
    print(
        f"reverse cut-over: writes blocked (report) {report['write_block_seconds']} s; switch "
        f"{switch.get('switch_seconds')} s (read_only {switch.get('read_only_seconds')} s, wait "
        f"{switch.get('wait_seconds')} s); the whole rollback {report['duration']} s; steps "
        f"{[(step['name'], step['duration']) for step in report['steps']]}; longest write stall "
        f"{verify.longest_write_stall_s} s; failed write attempts {verify.write_attempts_failed}"
    )
    assert verify.error is None, verify.error
    assert verify.reviews_acknowledged > 0 and verify.uploads_acknowledged > 0
    assert verify.acknowledged_lost == 0, verify.lost
    # The target took acknowledged writes between the flip and the rollback: they are on the source now.
    assert set(verify.per_server) == {state.source.address, state.target.address}, verify.per_server
    # The old source is a plain writable primary again; the target read-only; no replication, no tunnel.
    writable, status = source_is_plain_and_writable(state)
    assert writable and status is None
    conn = connect(state, state.target)
    try:
        assert mysql_switch.is_read_only(conn) and replica.replica_status(conn) is None
    finally:
        conn.close()
    for host in (state.source, state.target):
        assert not (Path(str(host.datadir)) / "master.info").exists(), host.name
    for kind in ("fwd", "rev"):
        assert not tunnel_running(tunnel(plan, kind))
    # `status` after the way back: the source serves, in both views (the forward run's and the reverse run's), and
    # each host is named as the forward plan names it (the old source is "source", never the reverse plan's
    # "target"); nothing of either run is left on the hosts.
    for view in ((), ("--reverse",)):
        shown = migrate(state, "status", str(plan), "--json", "--env-file", str(state.env_file), *view)
        assert shown.returncode == exit_codes.OK, outcome(shown)
        doc = json.loads(shown.stdout)
        assert doc["dns_problem"] is None, (view, doc["dns_problem"])
        where = {n: [r["points_at"] for r in rs] for n, rs in doc["dns"]["records"].items()}
        assert where == {n: ["source"] for n in state.records}, (view, where)
        assert doc["left_by_other_runs"] == [], (view, doc["left_by_other_runs"])
    # The detached `migrate finish --when-due` the forward apply started sees the way back and exits.
    finisher = state.path / ".migrate" / name / "reverse-finish.log"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "moved the service back" not in finisher.read_text():
        time.sleep(0.2)
    assert "moved the service back" in finisher.read_text()


def journal_events_of(state: LabState, name: str) -> list[dict[str, Any]]:
    path = state.path / ".migrate" / name / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_killed_inside_the_reverse_window_resumes_and_loses_nothing(live: LabState, tmp_path: Path) -> None:
    """`migrate rollback` after the flip goes back over the reverse replica; kill -9 inside its window (the target
    fenced and read-only, the old source being promoted, DNS still at the target): `migrate rollback` again resumes
    the way back to its end, under load, and nothing either server acknowledged is lost."""
    state = live
    # Only the way back's run is killed (its plan is named <name>-reverse); the forward run passes the same hook.
    body = '[[ "$MIGRATE_PLAN_NAME" == *-reverse ]] || exit 0\nkill -9 $PPID\n'
    plan = replicate_plan(state, "replbackkill", {"before-step": on_step("files_final", body)}, keep_reverse=3600)
    name = plan_name(plan)
    hook = state.path / "hooks-replbackkill" / "before-step"
    rollback = ["rollback", str(plan), "--yes", "--env-file", str(state.env_file)]
    load_dir = tmp_path / "load"
    load = start_load(state, load_dir, 400)
    try:
        acks = load_dir / "acks.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (acks.exists() and acks.read_text().count("\n") >= 10):
            time.sleep(0.05)
        forward = migrate_apply(state, plan, timeout=TIMEOUT)
        assert forward.returncode == exit_codes.OK, outcome(forward)
        assert "reverse replication kept until" in forward.stdout, outcome(forward)
        wait_for_load_acks_on(load_dir, state.target.address, since=time.time())  # clients follow DNS there

        killed = migrate(state, *rollback)
        assert killed.returncode == -signal.SIGKILL, outcome(killed)
        back_events = journal_events_of(state, f"{name}-reverse")
        assert writes_were_blocked(back_events), "killed before the reverse window began"
        assert not any(ev.get("event") == "committed" for ev in back_events), "killed after the reverse flip"
        assert dns_contents(state) == {n: state.target.address for n in state.records}
        hook.unlink()

        resumed = migrate(state, *rollback)
        assert resumed.returncode == exit_codes.OK, outcome(resumed)
        assert "resuming it" in resumed.stdout + resumed.stderr, outcome(resumed)
        wait_for_load_acks_on(load_dir, state.source.address, since=time.time())  # clients leave the target
    finally:
        load.send_signal(signal.SIGTERM)
        load.communicate(timeout=60)

    assert dns_contents(state) == {n: state.source.address for n in state.records}
    report = run_report(state, f"{name}-reverse")
    assert report["status"] == "completed"
    print(
        f"reverse cut-over killed inside its window and resumed: writes blocked (report) "
        f"{report['write_block_seconds']} s; steps {[(s['name'], s['attempts']) for s in report['steps']]}"
    )
    verify = main_verify(state, host="source", load_dir=load_dir)
    assert verify.error is None, verify.error
    assert verify.reviews_acknowledged > 0 and verify.uploads_acknowledged > 0
    assert verify.acknowledged_lost == 0, verify.lost
    # Writes acknowledged by the target between the flip and the way back are on the source now.
    assert set(verify.per_server) == {state.source.address, state.target.address}, verify.per_server
    # The old source a plain writable primary again; the target read-only; no replication, no tunnel.
    writable, status = source_is_plain_and_writable(state)
    assert writable and status is None
    conn = connect(state, state.target)
    try:
        assert mysql_switch.is_read_only(conn) and replica.replica_status(conn) is None
    finally:
        conn.close()
    for kind in ("fwd", "rev"):
        assert not tunnel_running(tunnel(plan, kind))
