"""The fault paths' pure logic: the budget counts only blocked intervals and keeps a reserve, retries never wait
past their end and honour Retry-After, lock holders are named before their waiters, the guard's script restores the
source only past its deadline, and a rollback tries every compensation."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

from orchestrator import guard
from orchestrator.engine.hooks import HookRunner
from orchestrator.engine.journal import Journal, RunStatus, StepState
from orchestrator.engine.machine import Engine, EngineConfig, Outcome
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.model import Retry
from orchestrator.retry import call_with_retry
from orchestrator.transports.mysql import Blocker, summarize_blockers
from orchestrator.window import (
    BLOCKED_AGAIN_AT_KEY,
    BLOCKED_AT_KEY,
    LIFTED_AT_KEY,
    RESERVE_KEY,
    DowntimeWindow,
    estimate_reserve,
    journaled_intervals,
)


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
    assert not guard.restored((Path(plan.directory) / guard.TRACE).read_text().splitlines())


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
