"""What an unfinished run left behind when nobody holds its lock: is the downtime still on, how much of the write
budget is left, and what a resume would do now (`migrate status` after a crash)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from orchestrator.engine.events import GateDeclined, StepCompleted, StepSaved
from orchestrator.engine.journal import RunState, RunStatus, StepState
from orchestrator.engine.step import Step
from orchestrator.engine.view import JournalView, Records
from orchestrator.run.policy import next_action
from orchestrator.run.results import Interruption
from orchestrator.window import blocked_seconds, journaled_intervals, journaled_reserve

UNFINISHED = (RunStatus.RUNNING, RunStatus.ROLLING_BACK, RunStatus.ROLLBACK_FAILED)


def interruption_of(
    state: RunState,
    records: Records,
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
    events = JournalView.of(records)
    if state.status == RunStatus.RUNNING and isinstance(events.last(), GateDeclined):
        return None  # stopped on purpose before the downtime: nothing is blocked, `apply` asks again
    now = time.time() if now is None else now
    downtime = next((s for s in steps if s.begins_downtime), None)
    blocked_by: str | None = None
    blocked_since: float | None = None
    left: float | None = None
    if downtime is not None and not state.committed:
        rec = state.step(downtime.name)
        intervals = journaled_intervals(events)
        if rec.state not in (StepState.PENDING, StepState.UNDONE):
            blocked_by = downtime.name
            # Blocked now only while the last journaled interval is open (a fence lifted between lock tries is not).
            if intervals and intervals[-1][1] is None:
                blocked_since = intervals[-1][0]
            elif not intervals:
                blocked_since = _writes_blocked_at(events)
        if blocked_by is not None and intervals:
            left = budget - (journaled_reserve(events) or 0.0) - blocked_seconds(intervals, now)
        elif blocked_by is not None and blocked_since is not None:
            left = budget - (now - blocked_since)
    if state.status != RunStatus.RUNNING:
        would = "resume the rollback (`migrate rollback` or `apply`)"
    elif left is not None and left <= 0:
        would = "roll back: the write budget is spent, so the step in the window fails its budget check"
    else:
        would = "continue: " + next_action(state, steps, reverse).removeprefix("`migrate apply` resumes: ")
        if left is not None:
            would += f", with {left:.1f} s of the write budget left"
    found = Interruption(blocked_since, blocked_by, budget, left, would, dns_now=dns_now(events))
    if blocked_by is not None:
        found.guard = guard_line(events, now)
    if state.status == RunStatus.ROLLBACK_FAILED:
        found.headline = "stopped: a compensation failed and no process holds the lock"
    return found


def guard_line(events: Records, now: float) -> str | None:
    """What the guard on the source will do, from what the run journaled of it (None: no guard was started)."""
    value = JournalView.of(events).last_run().saved(None, "guard")
    saved: dict[str, Any] | None = value if isinstance(value, dict) else None
    if not saved or saved.get("deadline") is None:
        return None
    deadline = float(saved["deadline"])
    when = time.strftime("%H:%M:%S", time.localtime(deadline))
    where = f"{saved.get('dir')}/trace"
    if deadline > now:
        return (
            f"the guard on the source restores it at {when} (in {deadline - now:.0f} s) unless a resume beats its "
            f"heartbeat again; its trace: {where}"
        )
    return f"the guard on the source was due at {when}: with no heartbeat since, it restored the source (see {where})"


def dns_now(events: Records) -> dict[str, Any] | None:
    """Where every DNS record pointed at the run's last journaled read: {"at": ts, "records": {name: [contents]}}."""
    readings = [v for v in JournalView.of(events).last_run().saved_values(None, "records_now") if v]
    return readings[-1] if readings else None


def _writes_blocked_at(events: JournalView) -> float | None:
    """The journaled moment writes were blocked (saved by the step that blocks them, or in its result)."""
    found: float | None = None
    for event in events:
        if isinstance(event, StepSaved) and event.key == "writes_blocked_at":
            found = _number(event.value)
        elif isinstance(event, StepCompleted):
            value = _number(event.result.get("writes_blocked_at"))
            found = value if value is not None else found
    return found


def _number(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
