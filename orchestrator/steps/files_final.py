"""The file trees' delta after writes stopped: no bandwidth limit, no nice, we are in the downtime window."""

from __future__ import annotations

from typing import Any

from orchestrator.engine.step import Step, StepContext
from orchestrator.runtime import WriteBudget
from orchestrator.steps.files_presync import sync_tree

# The shortest timeout given to an action inside the window: even an action started with a few milliseconds of
# budget left gets a real deadline (and fails on it) rather than a zero timeout that would mean "no wait".
MIN_TIMEOUT = 0.1


def blocked_since(ctx: StepContext) -> float | None:
    """When writes were blocked, as the cut-over step journaled it (for a run resumed in another process)."""
    value = ctx.output("cutover").get("writes_blocked_at")
    return float(value) if value is not None else None


class Window:
    """What is left of the write-block budget, for the actions a step runs while writes are blocked.

    Every action inside the window is bounded by `left()`; after one fails or times out, `check()` tells a spent
    budget (StepError naming cutover.max_write_block) from an ordinary failure.
    """

    def __init__(self, budget: WriteBudget, since: float | None) -> None:
        self.budget = budget
        self.since = since

    def check(self, what: str) -> None:
        self.budget.check(what, self.since)

    def left(self, cap: float | None = None) -> float | None:
        """Seconds the next action may take: what is left of the budget, at most `cap` (None: no bound)."""
        remaining = self.budget.remaining(self.since)
        if remaining is None:
            return cap
        bounded = max(remaining, MIN_TIMEOUT)
        return bounded if cap is None else min(cap, bounded)


class FilesFinal(Step):
    name = "files_final"
    title = "Copy the file trees' delta (writes blocked)"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = ctx.rt.plan
        if not plan.files:
            return ["no file trees in the plan"]
        return [
            f"on the source: rsync {t.source}/ → {plan.target.address}:{t.target}/ at full speed (delta only,"
            " nanosecond mtimes)"
            for t in plan.files
        ]

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        budget = ctx.rt.budget
        since = blocked_since(ctx)
        trees: dict[str, Any] = {}
        for tree in ctx.rt.plan.files:
            budget.check(f"starting the final copy of tree {tree.name}", since)
            remaining = budget.remaining(since)
            trees[tree.name] = sync_tree(
                ctx, tree, live=False, time_left=None if remaining is None else max(1.0, remaining)
            )
            budget.check(f"the final copy of tree {tree.name}", since)
        return {"trees": trees, "bytes": sum(t["bytes"] for t in trees.values())}
