"""The journal and its replay: the run's state is what the history says, whatever point it stopped at."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.engine.journal import Journal, RunStatus, StepState, replay

START = {"event": "run_started", "ts": 1.0, "run_id": "r1", "plan_sha256": "h", "plan_path": "p", "steps": ["a", "b"]}


def ev(event: str, step: str | None = None, **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"event": event, "ts": 2.0, **fields}
    if step is not None:
        record["step"] = step
    return record


@pytest.mark.parametrize(
    ("history", "status", "committed", "a", "b"),
    [
        ([], RunStatus.RUNNING, False, StepState.PENDING, StepState.PENDING),
        ([ev("step_started", "a")], RunStatus.RUNNING, False, StepState.RUNNING, StepState.PENDING),
        ([ev("step_started", "a"), ev("step_completed", "a")], RunStatus.RUNNING, False, StepState.DONE,
         StepState.PENDING),
        ([ev("step_started", "a"), ev("step_failed", "a", error="x"), ev("rollback_started", reason="a failed")],
         RunStatus.ROLLING_BACK, False, StepState.FAILED, StepState.PENDING),
        ([ev("step_started", "a"), ev("step_failed", "a"), ev("rollback_started"), ev("undo_started", "a")],
         RunStatus.ROLLING_BACK, False, StepState.UNDOING, StepState.PENDING),
        ([ev("step_started", "a"), ev("step_failed", "a"), ev("rollback_started"), ev("undo_started", "a"),
          ev("undo_completed", "a"), ev("rollback_completed")],
         RunStatus.ROLLED_BACK, False, StepState.UNDONE, StepState.PENDING),
        ([ev("step_started", "a"), ev("step_failed", "a"), ev("rollback_started"), ev("undo_started", "a"),
          ev("undo_failed", "a", error="y")],
         RunStatus.ROLLBACK_FAILED, False, StepState.UNDO_FAILED, StepState.PENDING),
        ([ev("step_started", "a"), ev("step_completed", "a", commit_point=True)],
         RunStatus.RUNNING, True, StepState.DONE, StepState.PENDING),
        ([ev("step_started", "a"), ev("committed", "a", reason="half"), ev("step_failed", "a", error="z")],
         RunStatus.FAILED_AFTER_COMMIT, True, StepState.FAILED, StepState.PENDING),
        ([ev("step_started", "a"), ev("committed", "a"), ev("step_failed", "a"), ev("run_resumed")],
         RunStatus.RUNNING, True, StepState.FAILED, StepState.PENDING),
        ([ev("step_started", "a"), ev("step_completed", "a", commit_point=True), ev("step_started", "b"),
          ev("step_completed", "b"), ev("run_completed")],
         RunStatus.COMPLETED, True, StepState.DONE, StepState.DONE),
    ],
)  # fmt: skip
def test_replay_table(
    history: list[dict[str, Any]], status: RunStatus, committed: bool, a: StepState, b: StepState
) -> None:
    state = replay([START, *history])
    assert state is not None
    assert (state.status, state.committed, state.step("a").state, state.step("b").state) == (status, committed, a, b)


def test_replay_of_an_empty_journal_is_no_run() -> None:
    assert replay([]) is None


def test_saved_values_and_results_survive_the_replay(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    journal.append("run_started", run_id="r1", plan_path="p", plan_sha256="h", plan_text="", steps=["a"])
    journal.append("step_started", step="a")
    journal.append("step_saved", step="a", key="old_content", value="192.0.2.1")
    state = Journal(tmp_path / "journal.jsonl").state()
    assert state is not None and state.step("a").saved == {"old_content": "192.0.2.1"}
    assert state.step("a").attempts == 1
    assert Journal(tmp_path / "journal.jsonl").durable_state() == state


def test_an_in_memory_journal_writes_nothing(tmp_path: Path) -> None:
    journal = Journal(None)
    journal.append("run_started", run_id="r1", plan_path="p", plan_sha256="h", plan_text="", steps=["a"])
    assert journal.state() is not None and journal.durable_state() == journal.state()
    assert list(tmp_path.iterdir()) == []


def test_a_torn_last_journal_line_is_ignored(tmp_path: Path) -> None:
    """kill -9 in the middle of an append leaves half a line: the action it announced never began."""
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.append("run_started", run_id="r1", plan_path="p", plan_sha256="h", plan_text="", steps=["a", "b"])
    journal.append("step_started", step="a")
    journal.append("step_completed", step="a", result={"n": 1})
    with path.open("ab") as f:
        f.write(b'{"seq":4,"ts":1.0,"event":"step_sta')
    state = Journal(path).state()
    assert state is not None and state.status == RunStatus.RUNNING
    assert state.step("a").result == {"n": 1} and state.step("b").state.value == "pending"


def test_an_append_after_a_torn_line_is_not_lost(tmp_path: Path) -> None:
    """The records written after a crash mid-append must be readable: the torn tail is cut before appending."""
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.append("run_started", run_id="r1", plan_path="p", plan_sha256="h", plan_text="", steps=["a"])
    with path.open("ab") as f:
        f.write(b'{"seq":2,"ts":1.0,"event":"step_sta')
    resumed = Journal(path)
    resumed.append("step_started", step="a")
    resumed.append("step_completed", step="a", result={}, commit_point=True)
    resumed.append("run_completed")
    state = Journal(path).state()
    assert state is not None and state.status == RunStatus.COMPLETED and state.committed
