"""Signals are acted on only at safe points, and whether the run is committed is read from the journal.

Each case sends a real signal to this process at the narrowest moment there is: the instant a journal record is
durable on disk, before the engine has taken it into memory (tests/engine/world.py `after_record`). A real process
receiving SIGTERM/SIGHUP is in test_processes.py.
"""

from __future__ import annotations

import os
import signal

import pytest

from orchestrator import exit_codes
from orchestrator.engine.journal import Journal
from tests.engine.harness import STEP_NAMES
from tests.engine.world import World, after_record


def _signal(signum: int):  # type: ignore[no-untyped-def]
    return lambda: os.kill(os.getpid(), signum)


def _journal_agrees_with_itself(world: World) -> None:
    """What the file says is what a resume would see; no record is torn or missing."""
    state = Journal(world.state_dir / "journal.jsonl").state()
    durable = Journal(world.state_dir / "journal.jsonl").durable_state()
    assert state is not None and durable is not None and state.status == durable.status


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_right_after_the_commit_point_record_finishes_forward(
    world: World, monkeypatch: pytest.MonkeyPatch, signum: int
) -> None:
    with after_record(monkeypatch, "step_completed", "flip", _signal(signum)):
        res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    assert "the run finishes forward" in res.stderr
    assert not any(a.startswith("undo") for a in world.actions()), "a committed run is never rolled back"
    assert world.effects() == set(STEP_NAMES)
    status = world.status_json()["run"]
    assert status["status"] == "completed" and status["committed"] is True
    _journal_agrees_with_itself(world)


def test_a_signal_right_after_a_committed_record_midway_finishes_forward(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    with after_record(monkeypatch, "committed", "start", _signal(signal.SIGTERM)):
        res = world.run("apply", str(world.plan), "--yes", HARNESS_COMMIT_MIDWAY="start")
    assert res.returncode == exit_codes.OK, res.stderr
    assert not any(a.startswith("undo") for a in world.actions())
    assert world.effects() == set(STEP_NAMES)
    assert world.status_json()["run"]["status"] == "completed"


@pytest.mark.parametrize(
    ("event", "step", "ran", "undone"),
    [
        # Inside a step's run (a value it saved): the step stops there; the run rolls back.
        ("step_saved", "start", ["prepare", "copy", "cutover", "start"], ["start", "cutover", "copy", "prepare"]),
        # The engine between two steps: acted on at the next safe point, before the next step begins (that step
        # fails there without running, as when its before-step hook fails; its undo is safe without a run).
        ("step_completed", "copy", ["prepare", "copy"], ["cutover", "copy", "prepare"]),
        # Right after a step is journaled as started: it is failed before its work begins.
        ("step_started", "cutover", ["prepare", "copy"], ["cutover", "copy", "prepare"]),
        ("gate_confirmed", "cutover", ["prepare", "copy"], ["cutover", "copy", "prepare"]),
    ],
)
def test_a_signal_before_the_commit_point_rolls_back_at_a_safe_point(
    world: World, monkeypatch: pytest.MonkeyPatch, event: str, step: str, ran: list[str], undone: list[str]
) -> None:
    with after_record(monkeypatch, event, step, _signal(signal.SIGTERM)):
        res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.FAILED, res.stderr
    assert "interrupted by SIGTERM" in res.stderr
    assert world.actions() == [f"run {n}" for n in ran] + [f"undo {n}" for n in undone]
    assert world.effects() == set()
    status = world.status_json()["run"]
    assert status["status"] == "rolled_back" and status["committed"] is False
    _journal_agrees_with_itself(world)


def test_a_rollback_is_not_stopped_by_a_signal(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    with after_record(monkeypatch, "undo_started", "cutover", _signal(signal.SIGTERM)):
        res = world.run("apply", str(world.plan), "--yes", HARNESS_FAIL="start")
    assert res.returncode == exit_codes.FAILED, res.stderr
    assert world.actions()[-4:] == ["undo start", "undo cutover", "undo copy", "undo prepare"]
    assert world.status_json()["run"]["status"] == "rolled_back"
