"""The cut-over modes as objects (`CutoverMode`): each supplies its step sequence and what the shared steps do in
it. `mode_of(plan)` is the one a plan's run uses (`cutover.mode: auto` resolved beforehand by run/compose.py)."""

from __future__ import annotations

from orchestrator.plan.model import Plan, static_mode
from orchestrator.steps.modes.base import BEFORE_CUTOVER, COMMIT_AT_DOOR, SHARED_END, CutoverMode, with_door
from orchestrator.steps.modes.replicate import Replicate, ReverseOverReplica
from orchestrator.steps.modes.shutdown import Shutdown

SHUTDOWN = Shutdown()
REPLICATE = Replicate()
REVERSE_OVER_REPLICA = ReverseOverReplica()
MODES: dict[str, CutoverMode] = {"shutdown": SHUTDOWN, "replicate": REPLICATE}
# `auto` before it is resolved (a dry-run or a status without a run): the replicate steps, the default where possible.
UNRESOLVED_MODE = "replicate"


def mode_named(name: str) -> CutoverMode:
    """The mode `cutover.mode` names (`auto` unresolved: the replicate mode, what a dry-run shows)."""
    try:
        return MODES[UNRESOLVED_MODE if name == "auto" else name]
    except KeyError:
        raise LookupError(f"no steps for cutover.mode {name!r}") from None


def mode_of(plan: Plan) -> CutoverMode:
    """The mode a plan's run uses: its cut-over mode's, or the way back over the reverse replica (a reverse run in
    the replicate mode)."""
    if plan.reverse_of is not None and plan.cutover.mode == "replicate":
        return REVERSE_OVER_REPLICA
    return mode_named(static_mode(plan))


__all__ = [
    "BEFORE_CUTOVER",
    "COMMIT_AT_DOOR",
    "MODES",
    "REPLICATE",
    "REVERSE_OVER_REPLICA",
    "SHARED_END",
    "SHUTDOWN",
    "UNRESOLVED_MODE",
    "CutoverMode",
    "mode_named",
    "mode_of",
    "with_door",
]
