"""Putting back the DNS TTLs the `lower_ttl` step journaled: shared by that step's undo and the finish step.

Kept apart from the steps (steps never import each other): the finish step calls `restore_original_ttls` after the
commit, once traffic has drained; `lower_ttl`'s undo calls `restore_ttls` on rollback. Both edit only the TTL.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.engine.step import StepContext, StepError
from orchestrator.engine.view import JournalView, Records
from orchestrator.retry import call_with_retry
from orchestrator.transports.dns import DnsRecord

LOWER_TTL_STEP = "lower_ttl"
ORIGINAL_TTLS = "original_ttls"  # record id → {id, name, type, ttl, proxied}, journaled before the first edit
RESTORED = "ttls_restored"  # saved by the step that put the original TTLs back after the commit
WAIT_UNTIL = "wait_until"  # saved by lower_ttl: when every answer cached with an old TTL has expired
PROGRESS_EVERY = 30.0  # seconds between "still waiting" lines


def old_ttl_expires_at(events: Records) -> float | None:
    """When the last run's lowered records stop being served from old caches (None: no TTL was lowered)."""
    until = JournalView.of(events).last_run().saved(LOWER_TTL_STEP, WAIT_UNTIL)
    return float(until) if until is not None else None


def wait_out_old_ttl(
    events: Records,
    log: Any,
    *,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Before the downtime begins: sleep until answers cached with the old TTL have expired, saying how long is left
    (interruptible: Ctrl-C ends it and the run rolls back, the TTLs put back). Returns the seconds waited."""
    until = old_ttl_expires_at(events)
    waited = 0.0
    while until is not None:
        left = until - clock()
        if left <= 0:
            break
        log.info("lower_ttl.waiting", seconds_left=round(left, 1),
                 why="answers cached with the old TTL are still valid: the cut-over waits")  # fmt: skip
        pause = min(left, PROGRESS_EVERY)
        sleep(pause)
        waited += pause
    return waited


def restore_original_ttls(ctx: StepContext) -> list[str]:
    """After the commit (the finish step, once traffic has drained): put back the TTLs `lower_ttl` journaled.

    Reads them from the `lower_ttl` step's result, edits only the TTL (the records now point at the target) and
    returns the names of the records put back. Safe to call again: a record already back is left alone.
    """
    result = ctx.output(LOWER_TTL_STEP)
    originals: dict[str, dict[str, Any]] = result.get("original_ttls") or {}
    if not originals or ctx.saved(RESTORED):
        return []
    zone_id = call_with_retry(
        lambda: runtime(ctx).dns.zone_id(runtime(ctx).plan.dns.zone), runtime(ctx).plan.retry, what="DNS zone lookup"
    )
    failures = restore_ttls(ctx, originals, zone_id)
    if failures:
        raise StepError("putting back the original DNS TTLs: " + "; ".join(failures))
    ctx.save(RESTORED, True)
    return sorted({o["name"] for o in originals.values() if not o["proxied"]})


def restore_ttls(ctx: StepContext, originals: dict[str, dict[str, Any]], zone_id: str) -> list[str]:
    failures: list[str] = []
    for record_id, original in originals.items():
        if original["proxied"]:
            continue
        try:
            current = call_with_retry(
                functools.partial(runtime(ctx).dns.get_record, zone_id, record_id),
                runtime(ctx).plan.retry,
                what=f"DNS read {original['name']}",
            )
            if current.ttl == original["ttl"]:
                continue
            set_ttl(ctx, zone_id, original, int(original["ttl"]))
        except Exception as exc:  # every record is tried; the caller reports them all
            failures.append(f"{original['name']}: {exc}")
            continue
        ctx.log.info("lower_ttl.restored", record=original["name"], ttl=original["ttl"])
    return failures


def set_ttl(ctx: StepContext, zone_id: str, original: dict[str, Any], ttl: int) -> None:
    record = DnsRecord(
        id=original["id"], name=original["name"], type=original["type"], content=original.get("content", ""),
        ttl=int(original["ttl"]), proxied=bool(original["proxied"]),
    )  # fmt: skip
    call_with_retry(
        lambda: runtime(ctx).dns.set_ttl(zone_id, record, ttl),
        runtime(ctx).plan.retry,
        what=f"DNS TTL of {record.name}",
    )
