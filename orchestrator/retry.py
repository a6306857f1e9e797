"""Retry policies (tenacity) built from the plan's `retry` section.

Only transient failures are retried: an exception is transient when it carries `transient = True` (our
transport errors do). Permanent failures (a host key that does not verify, a refused login) surface at once:
retrying them only delays the operator's fix.

`max_seconds` is a hard end, not a hint: no wait is started that would end past it (a tenacity
`stop_after_delay` only looks after a try, so its last wait could overrun), and a server's `Retry-After`
(carried as `retry_after` on the error) is honoured, or the retries stop at once when it asks for more time than
is left. Inside the downtime window the policy comes from `window.bounded`, so retries end with the budget.
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


def _retry_after(exc: BaseException | None) -> float | None:
    value = getattr(exc, "retry_after", None)
    return float(value) if isinstance(value, int | float) else None


def retrying(policy: Retry, *, what: str) -> tenacity.Retrying:
    """A tenacity controller: at most `attempts` tries, no wait ending past `max_seconds`, jittered exponential
    waits (or the server's Retry-After when it gave one)."""
    log = structlog.get_logger()
    backoff = tenacity.wait_exponential_jitter(multiplier=0.5, max=policy.max_wait)

    def _wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        asked = _retry_after(exc)
        return asked if asked is not None else backoff(state)

    def _stop(state: tenacity.RetryCallState) -> bool:
        if state.attempt_number >= policy.attempts:
            return True
        # The next try would begin after the wait: past the end, there is no next try.
        wait = state.upcoming_sleep or 0.0
        return (state.seconds_since_start or 0.0) + wait >= policy.max_seconds

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
        stop=_stop,
        wait=_wait,
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
