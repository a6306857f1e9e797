"""`migrate status` after a crash: interrupted (nobody holds the lock), what is blocked now, the budget left, and
what a resume would do now."""

from __future__ import annotations

import time

import pytest

from orchestrator.engine.journal import replay
from orchestrator.run import interruption_of
from tests.engine.harness import FileStep
from tests.engine.world import CRASHED, PLAN, World

BUDGET_PLAN = PLAN + "cutover:\n  max_write_block: 60\n"


def _crash_in_window(world: World, *, blocked_ago: float, crash_in: str = "start") -> None:
    world.plan.write_text(BUDGET_PLAN)
    res = world.run(
        "apply",
        str(world.plan),
        "--yes",
        HARNESS_BLOCK_WRITES="cutover",
        HARNESS_BLOCKED_AT=str(time.time() - blocked_ago),
        HARNESS_CRASH_INSIDE=crash_in,
    )
    assert res.returncode == CRASHED


def test_status_after_a_crash_in_the_window_says_what_is_blocked_and_what_a_resume_does(world: World) -> None:
    _crash_in_window(world, blocked_ago=5)
    text = " ".join(world.run("status", str(world.plan)).stdout.split())
    assert "interrupted: the run stopped without finishing and no process holds its lock" in text
    assert "writes blocked now: since" in text and "by step cutover; neither rolled back nor committed" in text
    assert "write budget (cutover.max_write_block 60 s):" in text and "s left" in text
    assert "a resume now would continue: re-enter step start (the start step), with" in text
    doc = world.status_json()["interrupted"]
    assert doc["blocked_by"] == "cutover" and doc["max_write_block"] == 60
    assert 0 < doc["budget_left"] <= 55
    assert doc["resume_would"].startswith("continue")


def test_status_after_a_crash_past_the_budget_says_a_resume_rolls_back(world: World) -> None:
    _crash_in_window(world, blocked_ago=100)
    text = " ".join(world.run("status", str(world.plan)).stdout.split())
    assert "write budget (cutover.max_write_block 60 s): spent" in text
    assert "a resume now would roll back: the write budget is spent" in text
    doc = world.status_json()["interrupted"]
    assert doc["budget_left"] <= -40 and doc["resume_would"].startswith("roll back")


def test_status_after_a_crash_before_the_downtime_blocks_nothing(world: World) -> None:
    world.plan.write_text(BUDGET_PLAN)
    assert world.run("apply", str(world.plan), "--yes", HARNESS_CRASH_INSIDE="copy").returncode == CRASHED
    text = " ".join(world.run("status", str(world.plan)).stdout.split())
    assert "interrupted" in text and "writes blocked" not in text and "write budget" not in text
    doc = world.status_json()["interrupted"]
    assert doc["writes_blocked_since"] is None and doc["resume_would"] == "continue: re-enter step copy (the copy step)"


def test_status_of_a_finished_run_is_not_interrupted(world: World) -> None:
    assert world.run("apply", str(world.plan), "--yes").returncode == 0
    assert world.status_json()["interrupted"] is None
    assert "interrupted" not in world.run("status", str(world.plan)).stdout


def _steps() -> list[FileStep]:
    return [FileStep("copy"), FileStep("cutover", downtime=True), FileStep("flip", commit=True)]


def _events(*tail: dict) -> list[dict]:
    head = [{"event": "run_started", "ts": 1000.0, "run_id": "r", "plan_sha256": "h", "plan_path": "p",
             "steps": ["copy", "cutover", "flip"]},
            {"event": "step_started", "ts": 1001.0, "step": "copy"},
            {"event": "step_completed", "ts": 1002.0, "step": "copy", "result": {}}]  # fmt: skip
    return head + list(tail)


STARTED_CUTOVER = {"event": "step_started", "ts": 1003.0, "step": "cutover"}
BLOCKED = {"event": "step_saved", "ts": 1004.0, "step": "cutover", "key": "writes_blocked_at", "value": 1004.0}
CUTOVER_DONE = {
    "event": "step_completed", "ts": 1010.0, "step": "cutover", "result": {"writes_blocked_at": 1004.0}
}  # fmt: skip
FLIP_STARTED = {"event": "step_started", "ts": 1011.0, "step": "flip"}
COMMITTED = {"event": "committed", "ts": 1012.0, "step": "flip", "reason": "one record moved"}
ROLLING = {"event": "rollback_started", "ts": 1013.0, "reason": "x"}
UNDO_CUTOVER = {"event": "undo_completed", "ts": 1014.0, "step": "cutover"}


@pytest.mark.parametrize(
    ("tail", "now", "blocked_since", "left", "would"),
    [
        ((), 1100.0, None, None, "continue: run step cutover"),
        ((STARTED_CUTOVER,), 1100.0, None, None, "continue: re-enter step cutover"),
        ((STARTED_CUTOVER, BLOCKED), 1024.0, 1004.0, 40.0, "continue: re-enter step cutover"),
        ((STARTED_CUTOVER, BLOCKED), 1070.0, 1004.0, -6.0, "roll back: the write budget is spent"),
        ((STARTED_CUTOVER, BLOCKED, CUTOVER_DONE, FLIP_STARTED), 1034.0, 1004.0, 30.0, "continue: re-enter step flip"),
        ((STARTED_CUTOVER, BLOCKED, CUTOVER_DONE, FLIP_STARTED, COMMITTED), 1100.0, None, None, "continue: re-enter"),
        ((STARTED_CUTOVER, BLOCKED, ROLLING), 1030.0, 1004.0, 34.0, "resume the rollback"),
        ((STARTED_CUTOVER, BLOCKED, ROLLING, UNDO_CUTOVER), 1030.0, None, None, "resume the rollback"),
    ],
)
def test_interruption_table(
    tail: tuple, now: float, blocked_since: float | None, left: float | None, would: str
) -> None:
    events = _events(*tail)
    state = replay(events)
    assert state is not None
    found = interruption_of(state, events, _steps(), 60.0, now=now)
    assert found is not None
    assert found.blocked_since == blocked_since
    assert found.budget_left == (None if left is None else pytest.approx(left))
    assert found.resume_would.startswith(would), found.resume_would
