"""A run's lifecycle: apply, rollback, status and describe (the dry-run), each returning a result object.

This is the composition root: it joins the plan, the steps, the runtime, the hooks and the engine, and holds the
policies around a run — the plan's lock, the plan-hash check, archiving finished runs, the reverse-run rules, the
postpone gate, rollback refusals and what the next action is. It prints nothing: the command line renders results
(progress lines go through the `say` callback) and maps them to exit codes.

- compose.py   which steps, runtime and hooks a plan gets (tests replace the factories)
- policy.py    the plan a command drives, reverse-run rules, secrets, next action, postpone gate, archiving
- commands.py  apply / rollback / status / describe
- reverse.py   a replicate run's reverse path after the flip: rollback over it, `migrate finish`, its status
- crash.py     what an interrupted run left behind (writes blocked, budget left, what a resume would do)
- results.py   the result objects
"""

from __future__ import annotations

from orchestrator.run.commands import apply, describe, rollback, status
from orchestrator.run.compose import Say
from orchestrator.run.crash import interruption_of
from orchestrator.run.policy import load, subject
from orchestrator.run.results import (
    ApplyEnd,
    ApplyResult,
    Description,
    Interruption,
    RollbackResult,
    RunError,
    StatusReport,
    StepRow,
)
from orchestrator.run.reverse import end_reverse_path, finish_when_due, rollback_route

__all__ = [
    "ApplyEnd",
    "ApplyResult",
    "Description",
    "Interruption",
    "RollbackResult",
    "RunError",
    "Say",
    "StatusReport",
    "StepRow",
    "apply",
    "describe",
    "end_reverse_path",
    "finish_when_due",
    "interruption_of",
    "load",
    "rollback",
    "rollback_route",
    "status",
    "subject",
]
