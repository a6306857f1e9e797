"""Lower the DNS records' TTL well before the window, and wait out the old TTL before the cut-over may begin.

A resolver that cached a record just before the flip keeps the old address for up to the record's TTL: with the
TTL an operator usually runs (300 s to a day), clients reach the fenced source for that long after the flip. This
step lowers the TTL of every record the flip will move to `dns.lower_ttl_to` seconds and journals when every answer
cached with the old TTL will have expired (`wait_until`); the cut-over may begin only then, so that after the flip
clients follow within the low TTL. The step itself does not wait: the pre-syncs run meanwhile, and the gate before
the downtime (`orchestrator.services.dns_ttl.wait_out_old_ttl`, called by the run before the step that begins it) waits
what is left.

- The original TTLs are journaled before any edit, once: a resumed run never mistakes its own lowered value for
  the original.
- The wait counts from the moment the last record was lowered (journaled), so a run resumed after a crash waits
  only what is left; Ctrl-C during the wait rolls back like any interruption before the downtime (the TTLs are
  put back).
- Proxied records are answered by Cloudflare's edge with its own addresses and an automatic TTL: there is nothing to
  lower or wait for, so they are skipped and the run says so. A record with the automatic TTL (1) that is not proxied
  is cached for 300 s; it is lowered like the others and put back to automatic.
- The original TTLs are put back after the commit (`orchestrator.services.dns_ttl.restore_original_ttls`, called by the
  finish step once the traffic has drained) and by `undo` on rollback. Both edit only the TTL, never the content.

Plan fields (section `dns`): `lower_ttl_to` (seconds; unset: the step changes nothing), `lower_ttl_wait` (seconds
to wait instead of the longest original TTL, e.g. 0 when the TTL was lowered by hand long before).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.retry import call_with_retry
from orchestrator.services.dns_ttl import ORIGINAL_TTLS, WAIT_UNTIL, restore_ttls, set_ttl

LOWERED_AT = "lowered_at"  # when the last record was lowered: the wait counts from here
AUTOMATIC_TTL = 1  # Cloudflare's "automatic"
AUTOMATIC_TTL_SECONDS = 300  # what resolvers are told for a non-proxied record with the automatic TTL


def lowered_to(plan: Any) -> int | None:
    value = getattr(plan.dns, "lower_ttl_to", None)
    return int(value) if value is not None else None


def configured_wait(plan: Any) -> float | None:
    value = getattr(plan.dns, "lower_ttl_wait", None)
    return float(value) if value is not None else None


def cached_for(record: dict[str, Any]) -> int:
    """How long a resolver may keep an answer of this record (its TTL; 300 s for the automatic one)."""
    ttl = int(record["ttl"])
    return AUTOMATIC_TTL_SECONDS if ttl == AUTOMATIC_TTL else ttl


class LowerTtl(Step):
    name = "lower_ttl"
    title = "Lower the DNS records' TTL (service live; the cut-over waits out the old one)"

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        target = lowered_to(plan)
        if target is None:
            return ["the plan sets no dns.lower_ttl_to: the records keep their TTL (clients may reach the old "
                    "server for up to that long after the DNS flip)"]  # fmt: skip
        wait = configured_wait(plan)
        waiting = (
            "then wait out the longest original TTL (read when the step runs) before the cut-over may begin"
            if wait is None
            else f"then wait {wait:g} s (dns.lower_ttl_wait) before the cut-over may begin"
        )
        return [
            f"Cloudflare zone {plan.dns.zone}: {plan.dns.type} {name}: TTL → {target} s (original TTL journaled "
            "first; proxied records skipped: their TTL is automatic)"
            for name in plan.dns.records
        ] + [waiting, "the original TTLs are put back after the commit (finish) and on rollback"]

    def check(self, ctx: StepContext) -> bool:
        """In place once every record was lowered (the wait itself is the gate's, before the downtime)."""
        if lowered_to(runtime(ctx).plan) is None:
            return True
        if ctx.saved(LOWERED_AT) is None:
            return False
        originals: dict[str, dict[str, Any]] = ctx.saved(ORIGINAL_TTLS) or {}
        zone_id = self._zone_id(ctx)
        target = lowered_to(runtime(ctx).plan)
        return all(
            runtime(ctx).dns.get_record(zone_id, record_id).ttl == target
            for record_id, original in originals.items()
            if _to_lower(original, target)
        )

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        plan = runtime(ctx).plan
        target = lowered_to(plan)
        if target is None:
            ctx.log.info("lower_ttl.not_configured", hint="set dns.lower_ttl_to to lower the TTL before the flip")
            return {"lowered_to": None}
        zone_id = self._zone_id(ctx)
        originals: dict[str, dict[str, Any]] | None = ctx.saved(ORIGINAL_TTLS)
        if originals is None:
            originals = {}
            for name in plan.dns.records:
                records = self._find(ctx, zone_id, name)
                if not records:
                    raise StepError(f"DNS record {name} ({plan.dns.type}) not found in zone {plan.dns.zone}")
                for record in records:
                    originals[record.id] = _record_dict(record)
            ctx.save(ORIGINAL_TTLS, originals)  # before any edit: undo puts back exactly these
        skipped = sorted({o["name"] for o in originals.values() if o["proxied"]})
        for name in skipped:
            ctx.log.info("lower_ttl.proxied_skipped", record=name,
                         reason="proxied: Cloudflare answers with its own addresses and an automatic TTL")  # fmt: skip
        lowered_at = ctx.saved(LOWERED_AT)
        if lowered_at is None:
            for original in originals.values():
                if _to_lower(original, target):
                    self._set_ttl(ctx, zone_id, original, target)
                    ctx.log.info("lower_ttl.lowered", record=original["name"], ttl=target, was=original["ttl"])
            lowered_at = self.clock()
            wait = configured_wait(plan)
            if wait is None:  # answers cached before the edit live for the longest of the old TTLs
                wait = max((cached_for(o) for o in originals.values() if _to_lower(o, target)), default=0)
            # In this order: a crash between the two saves leaves no LOWERED_AT, and the resumed run redoes both.
            ctx.save(WAIT_UNTIL, lowered_at + wait)
            ctx.save(LOWERED_AT, lowered_at)
        until = float(ctx.saved(WAIT_UNTIL))
        ctx.log.info("lower_ttl.wait_begins", seconds=round(max(until - self.clock(), 0.0), 1),
                     why="the cut-over waits for answers cached with the old TTL to expire")  # fmt: skip
        return {
            "lowered_to": target,
            "original_ttls": originals,
            "proxied_skipped": skipped,
            "lowered_at": lowered_at,
            "wait_until": until,
        }

    def undo(self, ctx: StepContext) -> None:
        """Put back every original TTL this run journaled (each record tried; the failures reported together)."""
        originals: dict[str, dict[str, Any]] = ctx.saved(ORIGINAL_TTLS) or {}
        failures = restore_ttls(ctx, originals, self._zone_id(ctx) if originals else "")
        if failures:
            raise StepError("; ".join(failures))

    # -- helpers

    def _zone_id(self, ctx: StepContext) -> str:
        plan = runtime(ctx).plan
        return call_with_retry(lambda: runtime(ctx).dns.zone_id(plan.dns.zone), plan.retry, what="DNS zone lookup")

    def _find(self, ctx: StepContext, zone_id: str, name: str) -> list[Any]:
        plan = runtime(ctx).plan
        return call_with_retry(
            lambda: runtime(ctx).dns.find_records(zone_id, name, plan.dns.type), plan.retry, what=f"DNS lookup {name}"
        )

    def _set_ttl(self, ctx: StepContext, zone_id: str, original: dict[str, Any], ttl: int) -> None:
        set_ttl(ctx, zone_id, original, ttl)


def _to_lower(original: dict[str, Any], target: int | None) -> bool:
    return target is not None and not original["proxied"] and cached_for(original) > target


def _record_dict(record: Any) -> dict[str, Any]:
    return {
        "id": record.id,
        "name": record.name,
        "type": record.type,
        "content": record.content,
        "ttl": record.ttl,
        "proxied": record.proxied,
    }
