"""The migration's steps, in the order the engine runs them.

Each step lives in its own module `orchestrator.steps.<name>` and is the one `Step` subclass there whose `name` is
the module's name; `build_steps` finds it by that name. Steps never import each other: what they share lives in
`orchestrator.steps.common` (and `orchestrator.services.probes`, `orchestrator.results`, `orchestrator.window`).

The cut-over is chosen by `cutover.mode`: each mode is an object (steps/modes) holding its sequence of steps
between the shared pre-sync of the file trees and the shared end (file delta, start, verify, DNS flip, finish), and
what the shared steps do in it: `build_steps` hands the run's mode to each step that takes one. `auto` is resolved
to one of them when the run starts (`orchestrator.run.compose.resolve_mode`), and the run's step list is journaled,
so a resumed run keeps the mode it began with.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from orchestrator.engine.step import Step
from orchestrator.plan.model import Plan
from orchestrator.steps import modes
from orchestrator.steps.modes import BEFORE_CUTOVER, COMMIT_AT_DOOR, SHARED_END, UNRESOLVED_MODE, mode_named, mode_of

__all__ = ["BEFORE_CUTOVER", "COMMIT_AT_DOOR", "SHARED_END", "UNRESOLVED_MODE", "build_steps", "step_class"]

# Each mode's own steps (between the pre-sync and the shared end), by name.
CUTOVER_MODES: dict[str, tuple[str, ...]] = {name: mode.own_steps for name, mode in modes.MODES.items()}
# The way back over the reverse replica (a reverse run in replicate mode): see modes/replicate.ReverseOverReplica.
REVERSE_OVER_REPLICA: tuple[str, ...] = modes.REVERSE_OVER_REPLICA.steps()


def step_order(mode: str, *, door_commits: bool = False) -> tuple[str, ...]:
    """Every step's name, in run order, for a cut-over mode (`door_commits`: the plan commits at the front door)."""
    return mode_named(mode).steps(door_commits=door_commits)


def door_commits(plan: Plan) -> bool:
    """Whether the plan's commit is made at the source's front door (it forwards stale clients to the target)."""
    return plan.proxy is not None and plan.proxy.source is not None


STEP_ORDER: tuple[str, ...] = step_order("shutdown")


def step_class(name: str) -> type[Step]:
    """The Step subclass named `name` in `orchestrator.steps.<name>`."""
    module = importlib.import_module(f"{__name__}.{name}")
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if issubclass(obj, Step) and not inspect.isabstract(obj) and getattr(obj, "name", None) == name:
            return obj
    raise LookupError(f"module {module.__name__} defines no step named {name!r}")


def plan_steps(plan: Plan) -> tuple[str, ...]:
    """The step names a plan runs: its cut-over mode's, or the way back over the reverse replica."""
    return mode_of(plan).steps(door_commits=door_commits(plan))


def build_steps(plan: Plan) -> list[Step]:
    """One instance of every step of the plan's cut-over mode, in run order (steps read the plan from the runtime);
    a step that takes a `mode` gets the run's. The DNS flip is the commit point unless the front door commits
    before it."""
    mode = mode_of(plan)
    names = mode.steps(door_commits=door_commits(plan))
    steps: list[Step] = []
    for name in names:
        make: Callable[..., Step] = step_class(name)
        kwargs: dict[str, object] = {"mode": mode} if "mode" in inspect.signature(make).parameters else {}
        if name == "dns_flip":
            kwargs["commits"] = COMMIT_AT_DOOR not in names
        steps.append(make(**kwargs))
    return steps
