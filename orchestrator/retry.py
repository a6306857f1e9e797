"""Retry policies (tenacity) built from the plan's `retry` section.

Only transient failures are retried: an exception is transient when it carries `transient = True` (our
transport errors do). Permanent failures (a host key that does not verify, a refused login) surface at once:
retrying them only delays the operator's fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import structlog
import tenacity

from orchestrator.plan.model import Retry

T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    return bool(getattr(exc, "transient", False))


def retrying(policy: Retry, *, what: str) -> tenacity.Retrying:
    """A tenacity controller: at most `attempts` tries within `max_seconds`, jittered exponential waits."""
    log = structlog.get_logger()

    def _log_retry(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning(
            "retrying",
            what=what,
            attempt=state.attempt_number,
            of=policy.attempts,
            wait_s=round(wait, 2),
            error=str(exc) if exc is not None else None,
        )

    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.attempts) | tenacity.stop_after_delay(policy.max_seconds),
        wait=tenacity.wait_exponential_jitter(multiplier=0.5, max=policy.max_wait),
        retry=tenacity.retry_if_exception(is_transient),
        before_sleep=_log_retry,
        reraise=True,
    )


def call_with_retry(fn: Callable[[], T], policy: Retry, *, what: str) -> T:
    """Call `fn` until it succeeds, fails permanently, or the policy gives up (the last error is raised)."""
    for attempt in retrying(policy, what=what):
        with attempt:
            return fn()
    raise AssertionError("unreachable: tenacity reraises the last error")  # pragma: no cover
