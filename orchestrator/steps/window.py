"""The downtime window, as the steps inside it see it: since when writes are blocked and what is left of the budget."""

from __future__ import annotations

from orchestrator.engine.step import StepContext
from orchestrator.plan.model import Retry
from orchestrator.runtime import WriteBudget

# The shortest timeout given to an action inside the window: even an action started with a few milliseconds of
# budget left gets a real deadline (and fails on it) rather than a zero timeout that would mean "no wait".
MIN_TIMEOUT = 0.1


def bounded_retry(policy: Retry, time_left: float | None) -> Retry:
    """The plan's retry policy, with its tries ending when `time_left` does (retries included in the budget)."""
    return policy if time_left is None else policy.model_copy(update={"max_seconds": time_left})


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
