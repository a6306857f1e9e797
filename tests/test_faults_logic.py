"""The fault paths' pure logic: the budget counts only blocked intervals and keeps a reserve, retries never wait
past their end and honour Retry-After, lock holders are named before their waiters, the guard's script restores the
source only past its deadline, and a rollback tries every compensation."""

from __future__ import annotations

import math
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

from orchestrator.database.mysql.session import Blocker, summarize_blockers
from orchestrator.engine.events import StepStarted
from orchestrator.engine.hooks import HookRunner
from orchestrator.engine.journal import Journal, RunStatus, StepState
from orchestrator.engine.machine import Engine, EngineConfig, Outcome
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.model import Retry
from orchestrator.retry import call_with_retry
from orchestrator.services import dns_where, guard
from orchestrator.services.probes import parse_last_start
from orchestrator.window import (
    BLOCKED_AGAIN_AT_KEY,
    BLOCKED_AT_KEY,
    LIFTED_AT_KEY,
    RESERVE_KEY,
    RESERVE_SAFETY,
    DowntimeWindow,
    estimate_reserve,
    journaled_intervals,
    reserve_from,
)
from tests.fakes import LocalHost


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def saved(key: str, value: Any) -> dict[str, Any]:
    return {"event": "step_saved", "step": "cutover", "key": key, "value": value}


def test_only_blocked_time_counts_and_the_reserve_is_kept_back() -> None:
    clock = Clock()
    window = DowntimeWindow(20.0, reserve=5.0, clock=clock)
    window.begin(1000.0)
    clock.now = 1003.0
    window.lift()
    clock.now = 1010.0  # seven seconds of writes flowing between lock tries: not counted
    assert not window.blocked_now and window.elapsed() == pytest.approx(3.0)
    window.begin()
    clock.now = 1012.0
    assert window.elapsed() == pytest.approx(5.0)
    assert window.remaining() == pytest.approx(20.0 - 5.0 - 5.0)
    clock.now = 1023.0
    with pytest.raises(StepError, match=r"more than cutover\.max_write_block"):
        window.check("flipping DNS")


def test_a_resumed_window_recalls_its_intervals_and_reserve_from_the_journal() -> None:
    events = [
        {"event": "run_started"},
        saved(RESERVE_KEY, {"seconds": 4.0, "basis": "estimated"}),
        saved(BLOCKED_AT_KEY, 100.0),
        saved(LIFTED_AT_KEY, 102.0),
        saved(BLOCKED_AGAIN_AT_KEY, 110.0),
    ]
    assert journaled_intervals(events) == [[100.0, 102.0], [110.0, None]]
    window = DowntimeWindow(30.0, clock=Clock(115.0)).bind(lambda: events)
    assert window.blocked_now and window.blocked_at == 100.0
    assert window.elapsed() == pytest.approx(7.0) and window.reserve == 4.0
    assert window.remaining() == pytest.approx(30.0 - 4.0 - 7.0)


def test_the_reserve_is_a_share_of_the_budget_within_bounds() -> None:
    assert estimate_reserve(60.0) == 15.0
    assert estimate_reserve(20.0) == 8.0
    assert estimate_reserve(4.0) == 2.0  # never more than half the budget
    assert estimate_reserve(3600.0) == 30.0


class Transient(Exception):
    transient = True

    def __init__(self, retry_after: float | None = None) -> None:
        super().__init__("try again")
        self.retry_after = retry_after


def test_a_retry_after_longer_than_what_is_left_stops_at_once() -> None:
    calls: list[float] = []

    def fail() -> None:
        calls.append(time.monotonic())
        raise Transient(retry_after=120)

    with pytest.raises(Transient):
        call_with_retry(fail, Retry(attempts=50, max_seconds=5, max_wait=1), what="edit")
    assert len(calls) == 1, "no wait may end past max_seconds"


def test_retries_never_start_a_wait_that_ends_past_the_end() -> None:
    calls: list[float] = []

    def fail() -> None:
        calls.append(time.monotonic())
        raise Transient(retry_after=0.3)

    with pytest.raises(Transient):
        call_with_retry(fail, Retry(attempts=50, max_seconds=1.0, max_wait=1), what="edit")
    # Tries at 0, 0.3, 0.6 and no more: after the try at 0.6+, a wait of 0.3 would end past 1.0.
    assert 2 <= len(calls) <= 4


def test_the_idle_holder_is_named_not_the_inserts_waiting_behind_it() -> None:
    holder = Blocker(12, "cron", "Sleep", 40, "idle, holding a lock or an open transaction", "")
    waiting = [
        Blocker(30 + i, "app", "Query", 5, "Waiting for table metadata lock", "INSERT INTO reviews VALUES (...)")
        for i in range(4)
    ]
    text = summarize_blockers(waiting, ["coursereview.reviews"], holders=[holder])
    assert text.startswith("held by #12 cron Sleep for 40s")
    assert "INSERT" not in text and "4 session(s) waiting behind it" in text


def _guard(tmp_path: Path, deadline: float) -> tuple[guard.GuardPlan, Path]:
    log = tmp_path / "acts"
    plan = guard.GuardPlan(
        directory=str(tmp_path / "g"),
        deadline=deadline,
        db_start=f"echo start >> {log}",
        db_stop=f"echo stop >> {log}",
        fence_off=f"echo fence-off >> {log}",
    )
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "guard.sh").write_text(guard.script(plan))
    return plan, log


def test_the_guard_restores_a_read_only_source_past_its_deadline(tmp_path: Path) -> None:
    plan, log = _guard(tmp_path, time.time() - 1)
    (Path(plan.directory) / guard.READ_ONLY).touch()
    subprocess.run(["sh", f"{plan.directory}/guard.sh"], check=True, timeout=30)
    assert log.read_text().split() == ["stop", "start", "fence-off"]
    trace = (Path(plan.directory) / guard.TRACE).read_text().splitlines()
    assert guard.restored(trace) and "deadline passed" in trace[1]


def test_the_guard_leaves_a_committed_source_alone(tmp_path: Path) -> None:
    plan, log = _guard(tmp_path, time.time() + 600)
    (Path(plan.directory) / guard.COMMITTED).touch()
    subprocess.run(["sh", f"{plan.directory}/guard.sh"], check=True, timeout=30)
    assert not log.exists()
    # Left in peace, it took its directory with it: nothing piles up on the source, and a late marker (a rollback
    # after the commit) recreates nothing.
    assert not Path(plan.directory).exists()
    subprocess.run(["sh", "-c", guard.marker_command(plan.directory, guard.RELEASED)], check=True, timeout=30)
    assert not Path(plan.directory).exists()


class Recorded(Step):
    def __init__(self, name: str, actions: list[str], *, fail_run: bool = False, fail_undo: bool = False) -> None:
        self.name = name
        self.title = name
        self.actions = actions
        self.fail_run = fail_run
        self.fail_undo = fail_undo

    def describe(self, ctx: StepContext) -> list[str]:
        return [self.name]

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        self.actions.append(f"run {self.name}")
        if self.fail_run:
            raise StepError(f"{self.name} failed on purpose")
        return {}

    def undo(self, ctx: StepContext) -> None:
        self.actions.append(f"undo {self.name}")
        if self.fail_undo:
            raise StepError(f"the DNS API is unreachable ({self.name})")


def test_a_failing_compensation_does_not_stop_the_others(tmp_path: Path) -> None:
    actions: list[str] = []
    steps = [
        Recorded("cutover", actions),
        Recorded("start_target", actions),
        Recorded("dns_flip", actions, fail_run=True, fail_undo=True),
    ]
    journal = Journal(tmp_path / "journal.jsonl")
    log = structlog.get_logger("test")
    engine = Engine(
        steps,
        journal,
        config=EngineConfig(plan_path="p", plan_name="p", plan_sha256="h", plan_text=""),
        rt=None,
        hooks=HookRunner(None, timeout=10, base_env={}, log=log),
        confirm=lambda step: True,
        log=log,
    )
    engine.start_run()
    outcome = engine.forward()
    # The DNS restore failed, and the source was still brought back (its compensation ran after).
    assert actions[-3:] == ["undo dns_flip", "undo start_target", "undo cutover"]
    assert outcome == Outcome.NEEDS_ATTENTION
    state = journal.state()
    assert state is not None and state.status == RunStatus.ROLLBACK_FAILED
    assert state.step("cutover").state == StepState.UNDONE and state.step("dns_flip").state == StepState.UNDO_FAILED


# --- the guard's heartbeat ------------------------------------------------------------------------------------------


def _guard_with_stale(tmp_path: Path, deadline: float, stale: int) -> tuple[guard.GuardPlan, Path]:
    plan, log = _guard(tmp_path, deadline)
    plan = guard.GuardPlan(plan.directory, plan.deadline, plan.db_start, plan.db_stop, plan.fence_off, stale=stale)
    (Path(plan.directory) / "guard.sh").write_text(guard.script(plan))
    return plan, log


def test_the_guard_does_not_race_a_live_run_past_its_deadline_and_acts_once_its_heartbeat_stops(
    tmp_path: Path,
) -> None:
    # The deadline passed already (a slow rollback, say): only the heartbeat tells the guard the run is alive.
    stale, interval = 2, 0.2
    plan, log = _guard_with_stale(tmp_path, time.time() - 1, stale=stale)
    beat = guard.Heartbeat(LocalHost(), plan.directory, interval=interval).start()  # type: ignore[arg-type]
    proc = subprocess.Popen(["sh", f"{plan.directory}/guard.sh"])
    try:
        # The guard has been watching for longer than `stale` plus one of its polls once the run has beaten that
        # many times since it started (a count of beats, not a sleep: a slow machine only takes longer).
        enough = math.ceil((stale + guard.POLL + 1) / interval)
        limit = time.monotonic() + 120
        while beat.beats < enough and proc.poll() is None and time.monotonic() < limit:
            time.sleep(interval)
        assert beat.beats >= enough and beat.failures == 0, "the heartbeat did not go on"
        assert proc.poll() is None and not log.exists(), "the guard acted while the run's heartbeat went on"
        beat.stop()  # the run is gone
        proc.wait(timeout=30)
    finally:
        beat.stop()
        if proc.poll() is None:
            proc.kill()
    assert log.read_text().split() == ["fence-off"]  # nothing marked the database stopped or read-only
    trace = (Path(plan.directory) / guard.TRACE).read_text().splitlines()
    assert guard.restored(trace) and any("no heartbeat since" in line for line in trace), trace


def test_a_fresh_heartbeat_before_the_deadline_then_a_release_leaves_the_source_alone(tmp_path: Path) -> None:
    plan, log = _guard_with_stale(tmp_path, time.time() + 1, stale=1)
    proc = subprocess.Popen(["sh", f"{plan.directory}/guard.sh"])
    try:
        # The run released the source itself (rolled back) after its heartbeat stopped, before the deadline.
        time.sleep(0.3)
        (Path(plan.directory) / guard.RELEASED).touch()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not log.exists()
    assert not Path(plan.directory).exists(), "a guard that left in peace keeps no directory"


def test_keep_alive_starts_one_heartbeat_per_process_and_the_runtime_stops_it(tmp_path: Path) -> None:
    class Rt:
        source = LocalHost()
        heartbeat: Any = None

    (tmp_path / "g").mkdir()
    rt = Rt()
    first = guard.keep_alive(rt, str(tmp_path / "g"))
    try:
        assert guard.keep_alive(rt, str(tmp_path / "g")) is first and rt.heartbeat is first
        assert (tmp_path / "g" / guard.HEARTBEAT).exists()
    finally:
        first.stop()
    assert not first.alive


# --- where every DNS record points ---------------------------------------------------------------------------------


def _reading(records: dict[str, list[str]]) -> dns_where.Reading:
    return dns_where.Reading(0.0, records, source=["10.0.0.2"], target="10.0.0.3", origin="journal")


def test_records_at_different_hosts_are_a_split_whatever_the_outcome() -> None:
    split = _reading({"www": ["10.0.0.3"], "api": ["10.0.0.2"]})
    assert split.where == {"www": ["target"], "api": ["source"]}
    for serving in ("source", "target", None):
        found = dns_where.problem(split, serving)  # type: ignore[arg-type]
        assert found is not None and found.startswith("DNS split") and "api → source" in found


def test_records_at_the_host_that_does_not_serve_need_attention() -> None:
    at_target = _reading({"www": ["10.0.0.3"], "api": ["10.0.0.3"]})
    assert dns_where.problem(at_target, "target") is None
    rolled_back = dns_where.problem(at_target, "source")
    assert rolled_back is not None and "points at the target, which does not serve" in rolled_back
    assert dns_where.problem(at_target, None) is None  # unfinished: only a split is a verdict
    other = dns_where.problem(_reading({"www": ["192.0.2.9"]}), "source")
    assert other is not None and "neither host" in other


def test_the_last_journaled_reading_of_the_last_run_is_shown() -> None:
    value = {"at": 5.0, "records": {"www": ["10.0.0.3"]}, "source": ["10.0.0.2"], "target": "10.0.0.3", "end": True}
    events = [
        {"event": "run_started"},
        {"event": "step_saved", "step": "dns_flip", "key": dns_where.RECORDS_NOW, "value": {**value, "at": 1.0}},
        {"event": "step_saved", "step": "dns_flip", "key": dns_where.RECORDS_NOW, "value": value},
    ]
    reading = dns_where.journaled(events)
    assert reading is not None and reading.at == 5.0 and reading.end and reading.where == {"www": ["target"]}
    assert "the run's last reading" in reading.line() and "10.0.0.3 (target)" in reading.line()
    assert dns_where.journaled([*events, {"event": "run_started"}]) is None


# --- the rollback's reserve, measured -------------------------------------------------------------------------------


def test_the_reserve_is_the_measured_work_times_the_safety_factor_within_bounds() -> None:
    measured: dict[str, float | None] = {
        "ssh_source_s": 0.5, "ssh_target_s": 0.5, "db_round_trip_s": 0.1, "dns_read_s": 1.0, "db_start_s": 4.0,
    }  # fmt: skip
    seconds, basis = reserve_from(measured, 2, 120.0) or (0.0, "")
    work = 0.5 * 5 + 0.5 * 4 + 0.1 * 4 + 1.0 * 2 + 4.0
    assert seconds == pytest.approx(work * RESERVE_SAFETY) and basis.startswith("measured") and "error log" in basis
    # Bounded: never above half the budget, never below the floor a start nothing measured may need.
    assert (reserve_from(measured, 2, 20.0) or (0.0,))[0] == 10.0
    fast = {**measured, "ssh_source_s": 0.01, "ssh_target_s": 0.01, "dns_read_s": 0.01, "db_start_s": 1.0}
    assert (reserve_from(fast, 2, 120.0) or (0.0,))[0] == 8.0
    unknown_start = reserve_from({**fast, "db_start_s": None}, 2, 120.0)
    assert unknown_start is not None and "not measurable" in unknown_start[1]
    # Nothing measured: the caller keeps the estimate, saying so.
    assert reserve_from({**measured, "ssh_source_s": None}, 2, 120.0) is None


def test_the_database_s_last_start_is_read_from_its_error_log() -> None:
    log = "\n".join(
        [
            "2026-11-24 23:00:00 0 [Note] Starting MariaDB 10.11.19-MariaDB as process 1",
            "2026-11-24 23:00:09 0 [Note] /usr/sbin/mariadbd: ready for connections.",
            "2026-11-24 23:32:41 0 [Note] Starting MariaDB 10.11.19-MariaDB as process 2",
            "2026-11-24 23:32:43 0 [Note] /usr/sbin/mariadbd: ready for connections.",
            "2026-11-24 23:40:00 0 [Note] Starting MariaDB 10.11.19-MariaDB as process 3",  # still starting
        ]
    )
    assert parse_last_start(log) == 3.0  # the last complete start: 2 s, whole seconds counted up
    # MariaDB pads a one-digit hour with a space.
    padded = (
        "2026-11-25  0:59:30 0 [Note] Starting MariaDB 10.11\n"
        "2026-11-25  0:59:31 0 [Note] mariadbd: ready for connections."
    )
    assert parse_last_start(padded) == 2.0
    assert parse_last_start("") is None


class Observing(Recorded):
    """A step that looks at its outside effect when the run ends, and takes up what it left running on a resume."""

    def observe_at_end(self, ctx: StepContext) -> None:
        self.actions.append(f"observe {self.name}")
        ctx.save("records_now", {"at": time.time()})

    def reattach(self, ctx: StepContext) -> None:
        self.actions.append(f"reattach {self.name}")


def _engine(steps: list[Step], journal: Journal) -> Engine:
    log = structlog.get_logger("test")
    return Engine(
        steps,
        journal,
        config=EngineConfig(plan_path="p", plan_name="p", plan_sha256="h", plan_text=""),
        rt=None,
        hooks=HookRunner(None, timeout=10, base_env={}, log=log),
        confirm=lambda step: True,
        log=log,
    )


def test_every_run_ends_with_a_look_at_its_outcome_and_a_resume_reattaches(tmp_path: Path) -> None:
    actions: list[str] = []
    journal = Journal(tmp_path / "done.jsonl")
    engine = _engine([Observing("cutover", actions), Observing("dns_flip", actions)], journal)
    engine.start_run()
    assert engine.forward() == Outcome.COMPLETED
    assert actions[-2:] == ["observe cutover", "observe dns_flip"]
    assert journal.events[-1]["key"] == "records_now"  # journaled after run_completed
    # A rolled-back run looks too, after every compensation; a step that never ran (pending) as well.
    actions.clear()
    journal = Journal(tmp_path / "rolled.jsonl")
    failing = [Observing("cutover", actions, fail_run=True), Observing("dns_flip", actions)]
    engine = _engine(failing, journal)
    engine.start_run()
    assert engine.forward() == Outcome.ROLLED_BACK
    assert actions == ["run cutover", "reattach cutover", "undo cutover", "observe cutover", "observe dns_flip"]
    # A process taking over an unfinished run: the steps that had started take up what they left running.
    actions.clear()
    journal = Journal(tmp_path / "resumed.jsonl")
    first = _engine([Observing("cutover", actions), Observing("dns_flip", actions, fail_run=True)], journal)
    first.start_run()
    first._append(StepStarted(step="cutover", title="cutover"))  # killed inside the cut-over
    actions.clear()
    second = _engine([Observing("cutover", actions), Observing("dns_flip", actions)], journal)
    second.resume_run()
    assert actions == ["reattach cutover"]


def test_after_a_way_back_the_source_serves_and_hosts_keep_their_forward_names() -> None:
    from types import SimpleNamespace

    completed, rolled_back = SimpleNamespace(status=RunStatus.COMPLETED), SimpleNamespace(status=RunStatus.ROLLED_BACK)
    assert dns_where.serving_host(completed) == "target"  # type: ignore[arg-type]
    # The forward run completed, then a reverse run moved the service back: the source serves.
    assert dns_where.serving_host(completed, moved_back=True) == "source"  # type: ignore[arg-type]
    # The reverse run's own view, in the forward plan's names: completed → the source; rolled back → the target.
    assert dns_where.serving_host(completed, reverse=True) == "source"  # type: ignore[arg-type]
    assert dns_where.serving_host(rolled_back, reverse=True) == "target"  # type: ignore[arg-type]
    # A reverse plan's source is the forward target (10.0.0.3), its target the old source (10.0.0.2): a record at
    # the old source is "source", as the operator knows that host, and no problem once the way back completed.
    back = dns_where.Reading(0.0, {"www": ["10.0.0.2"]}, source=["10.0.0.3"], target="10.0.0.2", origin="live",
                             reverse=True)  # fmt: skip
    assert back.where == {"www": ["source"]} and "10.0.0.2 (source)" in back.line()
    assert dns_where.problem(back, dns_where.serving_host(completed, reverse=True)) is None  # type: ignore[arg-type]


# --- what a run leaves on the hosts: named by its owner, ended by what it recorded ---------------------------------


def test_the_sweep_lists_and_ends_only_other_runs_things_of_this_plan(tmp_path: Path) -> None:
    import uuid

    from orchestrator.services import owned

    key, other_key = uuid.uuid4().hex[:10], uuid.uuid4().hex[:10]
    run_dir = tmp_path
    kept_tunnel = run_dir / f"{owned.TUNNEL_PREFIX}{key}-aaa111-fwd.ctl"
    old_tunnel = run_dir / f"{owned.TUNNEL_PREFIX}{key}-bbb222-rev.ctl"  # a socket nobody answers on: stale
    password = run_dir / f"{owned.RSYNC_CLIENT_PREFIX}{key}-bbb222.Xy12Ab"
    daemon = run_dir / f"{owned.RSYNC_DAEMON_PREFIX}{key}-bbb222.Zz34Cd"
    others = run_dir / f"{owned.RSYNC_CLIENT_PREFIX}{other_key}-bbb222.Qq56Ef"  # another plan's
    for directory in (password, daemon, others):
        directory.mkdir()
    (password / "password").write_text("secret\n")
    kept_tunnel.touch()
    old_tunnel.touch()
    # The daemon's pid file names a process whose command line names its configuration; another pid file's process
    # does not (a reused pid): only the first is ended.
    ours = subprocess.Popen(["sh", "-c", "sleep 60", f"{daemon}/rsyncd.conf"])
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        (daemon / "pid").write_text(f"{ours.pid}\n")
        listed = owned.parse_sweep(
            subprocess.run(
                owned.sweep_command(key, ("aaa111",), end=False, base=str(tmp_path)),
                shell=True,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        assert sorted((found.kind, found.tag, found.state) for found in listed) == [
            ("rsync-daemon", "bbb222", "running"),
            ("rsync-password", "bbb222", "stale"),
            ("tunnel", "bbb222", "stale"),
        ]
        assert all(found.path for found in listed) and "run …bbb222 on the source" in listed[0].line("source")
        assert ours.poll() is None  # listing ends nothing
        subprocess.run(owned.sweep_command(key, ("aaa111",), end=True, base=str(tmp_path)), shell=True, check=True)
        assert ours.wait(timeout=10) is not None
        assert not password.exists() and not daemon.exists() and not old_tunnel.exists()
        assert kept_tunnel.exists() and others.exists()  # this run's, and another plan's, untouched
        (daemon).mkdir()
        (daemon / "pid").write_text(f"{stranger.pid}\n")
        subprocess.run(owned.sweep_command(key, end=True, base=str(tmp_path)), shell=True, check=True)
        assert stranger.poll() is None and not daemon.exists() and not kept_tunnel.exists()
    finally:
        for proc in (ours, stranger):
            proc.kill()
            proc.wait()
        for path in (kept_tunnel, old_tunnel):
            path.unlink(missing_ok=True)
        for directory in (password, daemon, others):
            subprocess.run(["rm", "-rf", str(directory)], check=False)


def test_a_commit_record_left_by_a_run_that_never_finished_goes_with_the_next_sweep_and_a_runs_own_stays(
    tmp_path: Path,
) -> None:
    """A run killed after its commit and never resumed leaves its record (and the answer beside it) in /tmp on the
    source: the next run's sweep deletes them; a rollback's sweep (which ends this run's own things too) keeps this
    run's record, which is what tells `migrate apply` that this run committed."""
    import uuid

    from orchestrator.services import owned, source_commit

    key = uuid.uuid4().hex[:10]
    old = Path(source_commit.commit_record(str(tmp_path), f"{key}-bbb222"))
    old_out = Path(f"{old}.out")
    mine = Path(source_commit.commit_record(str(tmp_path), f"{key}-aaa111"))
    try:
        for path in (old, old_out, mine):
            path.touch()
        listed = owned.parse_sweep(
            subprocess.run(
                owned.sweep_command(key, ("aaa111",), end=False, base=str(tmp_path)),
                shell=True,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        assert sorted((f.kind, f.tag, f.state) for f in listed) == [("commit-record", "bbb222", "left")] * 2
        assert old.exists() and old_out.exists()  # listing ends nothing
        # The rollback's sweep: nothing of this run kept but its record.
        subprocess.run(
            owned.sweep_command(key, end=True, base=str(tmp_path), keep_records=("aaa111",)), shell=True, check=True
        )
        assert not old.exists() and not old_out.exists() and mine.exists()
        subprocess.run(owned.sweep_command(key, end=True, base=str(tmp_path)), shell=True, check=True)
        assert not mine.exists()
    finally:
        for path in (old, old_out, mine):
            path.unlink(missing_ok=True)


def test_a_run_tag_and_owner_are_short_and_tell_plans_and_runs_apart(tmp_path: Path) -> None:
    from orchestrator.services import owned

    plan = tmp_path / "plan.yaml"
    assert owned.run_tag("20261127-011446-3fa9c2") == "3fa9c2"
    first = owned.owner("site", plan, "20261127-011446-3fa9c2")
    assert first != owned.owner("site", plan, "20261127-011446-77aa00")  # another run
    assert first != owned.owner("site-reverse", plan, "20261127-011446-3fa9c2")  # the reverse plan
    assert first != owned.owner("site", tmp_path / "other.yaml", "20261127-011446-3fa9c2")  # another file
    # A control socket's path (plus the 17 characters ssh adds while it binds) stays under the 108 of sun_path.
    assert len(owned.tunnel_socket("/var/lib/migrate", first, "fwd")) + 17 < 108


# --- the target's database start: an undo waits for an interrupted start command ------------------------------------


def test_an_undo_waits_for_the_start_command_it_undoes(tmp_path: Path) -> None:
    from orchestrator.steps.start_target import held_while_running, wait_for_start_command

    lock, ended = tmp_path / "start.lock", tmp_path / "ended"
    start = subprocess.Popen(["sh", "-c", held_while_running(str(lock), f"sleep 1; touch {ended}")])
    try:
        deadline = time.monotonic() + 10
        while not lock.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        subprocess.run(["sh", "-c", wait_for_start_command(str(lock), 30)], check=True, timeout=60)
        assert ended.exists()  # the wait returned only once the start command had ended
        assert not lock.exists()
        assert start.wait(timeout=10) == 0
        # A start command that ended removes its lock itself, and keeps its exit status.
        failing = subprocess.run(["sh", "-c", held_while_running(str(lock), "exit 3")], timeout=30)
        assert failing.returncode == 3 and not lock.exists()
    finally:
        start.kill()
        start.wait()


def test_another_runs_waiting_guard_is_listed_never_ended_and_a_new_run_refuses_beside_it(tmp_path: Path) -> None:
    import uuid

    from orchestrator.services import owned
    from orchestrator.steps.run_owned import waiting_guards

    key = uuid.uuid4().hex[:10]
    waiting = Path(guard.guard_dir(f"{key}-aaa111", str(tmp_path)))
    acted = Path(guard.guard_dir(f"{key}-bbb222", str(tmp_path)))
    for directory in (waiting, acted):
        directory.mkdir()
    (waiting / "guard.sh").write_text("sleep 60\n")
    (acted / guard.TRACE).write_text("1.0 guarding\n2.0 lift the fence: done\n3.0 restored\n")
    proc = subprocess.Popen(["sh", str(waiting / "guard.sh")])
    try:
        (waiting / guard.PID).write_text(f"{proc.pid}\n")
        sweep = owned.sweep_command(key, ("ccc333",), end=True, base=str(tmp_path))
        done = subprocess.run(sweep, shell=True, capture_output=True, text=True, check=True)
        found = owned.parse_sweep(done.stdout)
        assert sorted((f.kind, f.tag, f.state) for f in found) == [("guard", "aaa111", "waiting"),
                                                                   ("guard", "bbb222", "acted")]  # fmt: skip
        assert proc.poll() is None and waiting.exists() and acted.exists()  # a guard is never ended by the sweep
        (problem,) = waiting_guards(found)
        assert "run …aaa111 waits on the source to restore it" in problem and str(waiting) in problem
        proc.kill()
        proc.wait()
        found = owned.parse_sweep(
            subprocess.run(
                owned.sweep_command(key, end=False, base=str(tmp_path)), shell=True, capture_output=True, text=True
            ).stdout
        )
        assert ("guard", "aaa111", "gone") in [(f.kind, f.tag, f.state) for f in found] and not waiting_guards(found)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for directory in (waiting, acted):
            subprocess.run(["rm", "-rf", str(directory)], check=False)


def test_a_front_doors_hold_outlives_the_guards_deadline_and_restore() -> None:
    """Nobody left to decide (the run died in its window): the source's front door must still hold requests when
    the guard restores the source, never release them onto the fence to be refused in between."""
    from orchestrator.services import frontdoor

    blocked_at, budget = 1000.0, 60.0
    hold_ends = blocked_at + budget + frontdoor.HOLD_MARGIN  # what is left of the budget + the margin, from the block
    assert hold_ends >= guard.deadline(blocked_at, budget, None) + guard.RESTORE_ALLOWANCE
    # The guard's bound is the documented one: the budget and the margin, whatever the lock tries' backoffs.
    assert guard.deadline(blocked_at, budget, None) == blocked_at + budget + guard.MARGIN
