"""What an unfinished run left behind when nobody holds its lock: is the downtime still on, how much of the write
budget is left, and what a resume would do now (`migrate status` after a crash)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from orchestrator.engine.journal import RunState, RunStatus, StepState
from orchestrator.engine.step import Step
from orchestrator.run.policy import next_action
from orchestrator.run.results import Interruption

UNFINISHED = (RunStatus.RUNNING, RunStatus.ROLLING_BACK, RunStatus.ROLLBACK_FAILED)


def interruption_of(
    state: RunState,
    events: list[dict[str, Any]],
    steps: Sequence[Step],
    budget: float,
    reverse: bool = False,
    now: float | None = None,
) -> Interruption | None:
    """What an unfinished run with no live process left behind: is the downtime still on, how much budget is left,
    and what a resume would do now. None when the run finished (or failed after its commit point: the target serves).
    """
    if state.status not in UNFINISHED:
        return None
    if state.status == RunStatus.RUNNING and events and events[-1].get("event") == "gate_declined":
        return None  # stopped on purpose before the downtime: nothing is blocked, `apply` asks again
    now = time.time() if now is None else now
    downtime = next((s for s in steps if s.begins_downtime), None)
    blocked_by: str | None = None
    blocked_since: float | None = None
    if downtime is not None and not state.committed:
        rec = state.step(downtime.name)
        if rec.state not in (StepState.PENDING, StepState.UNDONE):
            blocked_by = downtime.name
            blocked_since = _writes_blocked_at(events)
    left = None if blocked_since is None else budget - (now - blocked_since)
    if state.status != RunStatus.RUNNING:
        would = "resume the rollback (`migrate rollback` or `apply`)"
    elif left is not None and left <= 0:
        would = "roll back: the write budget is spent, so the step in the window fails its budget check"
    else:
        would = "continue: " + next_action(state, steps, reverse).removeprefix("`migrate apply` resumes: ")
        if left is not None:
            would += f", with {left:.1f} s of the write budget left"
    found = Interruption(blocked_since, blocked_by, budget, left, would)
    if state.status == RunStatus.ROLLBACK_FAILED:
        found.headline = "stopped: a compensation failed and no process holds the lock"
    return found


def _writes_blocked_at(events: list[dict[str, Any]]) -> float | None:
    """The journaled moment writes were blocked (saved by the step that blocks them, or in its result)."""
    found: float | None = None
    for event in events:
        if event.get("event") == "step_saved" and event.get("key") == "writes_blocked_at":
            found = _number(event.get("value"))
        elif event.get("event") == "step_completed":
            value = _number((event.get("result") or {}).get("writes_blocked_at"))
            found = value if value is not None else found
    return found


def _number(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
