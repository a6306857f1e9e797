"""The migration's steps, in the order the engine runs them.

Each step lives in its own module `orchestrator.steps.<name>` and is the one `Step` subclass there whose `name` is
the module's name; `build_steps` finds it by that name. Steps never import each other: what they share lives in
`orchestrator.steps.common` (and `orchestrator.probes`, `orchestrator.results`, `orchestrator.window`).

The cut-over is chosen by `cutover.mode`: each mode is a sibling sequence of steps between the shared pre-sync of
the file trees and the shared end (file delta, start, verify, DNS flip, finish). `auto` is resolved to one of them
when the run starts (`orchestrator.run.compose.resolve_mode`), and the run's step list is journaled, so a resumed
run keeps the mode it began with; the shared steps ask `repl_common.replicate_run(ctx)` which one it is.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from orchestrator.engine.step import Step
from orchestrator.plan.model import Plan, static_mode

BEFORE_CUTOVER: tuple[str, ...] = ("preflight", "lower_ttl", "prepare_target", "files_presync")
CUTOVER_MODES: dict[str, tuple[str, ...]] = {
    # Pre-sync the live datadir, stop the source database cleanly under the lock, copy its quiet datadir's delta.
    "shutdown": ("db_presync", "cutover", "db_final"),
    # Seed the target with a hot backup, keep it a GTID replica through an SSH tunnel, compare and catch up before
    # the window; inside it, read_only on the source, the replica's last transactions, the promotion with proof.
    "replicate": ("repl_seed", "repl_replica", "repl_catchup", "repl_switch"),
}
# `auto` before it is resolved (a dry-run or a status without a run): the replicate steps, the default where possible.
UNRESOLVED_MODE = "replicate"
# `audit` (after the commit): the shutdown mode's row counts and checksums of every table, kept out of the window.
AFTER_CUTOVER: tuple[str, ...] = ("files_final", "start_target", "verify_target", "dns_flip", "audit", "finish")
# With a front door on the source the commit is made there (`switch_traffic`: the target's fence lifted, the source's
# door forwarding to the target's), and the DNS flip follows after the window, with all the patience a slow API
# needs: every client reaches the target through the source's door whatever its DNS cache says.
COMMIT_AT_DOOR = "switch_traffic"
# The way back over the reverse replica (a reverse run in replicate mode): the old source already replicates from
# the target and runs (read-only, fenced), so nothing is stopped, seeded or set up; the comparison ran forward.
# The uploads are pre-synced back (their change trackers started), the lag gate and the switch run with the roles
# swapped, and the shared end carries the uploads' delta and points DNS back.
REVERSE_OVER_REPLICA: tuple[str, ...] = (
    "preflight", "lower_ttl", "files_presync", "repl_catchup", "repl_switch", *AFTER_CUTOVER,
)  # fmt: skip


def step_order(mode: str, *, door_commits: bool = False) -> tuple[str, ...]:
    """Every step's name, in run order, for a cut-over mode (`door_commits`: the plan commits at the front door)."""
    try:
        return BEFORE_CUTOVER + CUTOVER_MODES[UNRESOLVED_MODE if mode == "auto" else mode] + after_cutover(door_commits)
    except KeyError:
        raise LookupError(f"no steps for cutover.mode {mode!r}") from None


def after_cutover(door_commits: bool) -> tuple[str, ...]:
    """The shared end of every mode: with a door that commits, the switch at the door comes before the DNS flip."""
    if not door_commits:
        return AFTER_CUTOVER
    at = AFTER_CUTOVER.index("dns_flip")
    return (*AFTER_CUTOVER[:at], COMMIT_AT_DOOR, *AFTER_CUTOVER[at:])


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
    door = door_commits(plan)
    if plan.reverse_of is not None and plan.cutover.mode == "replicate":
        return (*REVERSE_OVER_REPLICA[: -len(AFTER_CUTOVER)], *after_cutover(door))
    return step_order(static_mode(plan), door_commits=door)


def build_steps(plan: Plan) -> list[Step]:
    """One instance of every step of the plan's cut-over mode, in run order (steps read the plan from the runtime).
    The DNS flip is the commit point unless the front door commits before it."""
    names = plan_steps(plan)
    steps: list[Step] = []
    for name in names:
        make: Callable[..., Step] = step_class(name)
        steps.append(make(commits=COMMIT_AT_DOOR not in names) if name == "dns_flip" else make())
    return steps
