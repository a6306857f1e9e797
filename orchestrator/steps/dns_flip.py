"""DNS flip, the commit point: every record of the plan now points at the target.

Each record's old content (with its id, TTL and proxied flag) is journaled before it is edited, so a failure
mid-way, a crash or a later rollback can put back exactly what was there. Only the content changes: type,
TTL and proxying stay as the operator set them.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.retry import call_with_retry

OLD_RECORDS = "old_records"


def _record_dict(record: Any) -> dict[str, Any]:
    return {
        "id": record.id,
        "name": record.name,
        "type": record.type,
        "content": record.content,
        "ttl": record.ttl,
        "proxied": record.proxied,
    }


class DnsFlip(Step):
    name = "dns_flip"
    title = "DNS flip: point every record at the target (the commit point)"
    commit_point = True

    def describe(self, ctx: StepContext) -> list[str]:
        dns = ctx.rt.plan.dns
        new = ctx.rt.plan.dns_content
        return [
            f"Cloudflare zone {dns.zone}: {dns.type} {name} → {new} (old content journaled first; "
            "type, TTL and proxying kept; read back to verify)"
            for name in dns.records
        ]

    def check(self, ctx: StepContext) -> bool:
        zone_id = self._zone_id(ctx)
        new = ctx.rt.plan.dns_content
        for name in ctx.rt.plan.dns.records:
            records = self._find(ctx, zone_id, name)
            if not records or any(r.content != new for r in records):
                return False
        return True

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = ctx.rt
        plan = rt.plan
        new = plan.dns_content
        rt.budget.check("flipping DNS", started_at=self._blocked_at(ctx))
        zone_id = self._zone_id(ctx)
        old: dict[str, dict[str, Any]] = dict(ctx.saved(OLD_RECORDS) or {})
        flipped: list[str] = []
        try:
            for name in plan.dns.records:
                records = self._find(ctx, zone_id, name)
                if not records:
                    raise StepError(f"DNS record {name} ({plan.dns.type}) not found in zone {plan.dns.zone}")
                for record in records:
                    if record.content == new:
                        continue  # already flipped (a re-run after a crash): its old content is journaled
                    # Journal first: whatever happens next, undo knows what to put back.
                    old.setdefault(record.id, _record_dict(record))
                    ctx.save(OLD_RECORDS, old)
                    self._set(ctx, zone_id, record, new)
                    flipped.append(record.name)
                    ctx.log.info("dns_flip.record", record=record.name, old=record.content, new=new)
        except Exception:
            # The run fails before the commit point: the engine rolls back and undo restores what was flipped.
            ctx.log.error("dns_flip.failed_midway", flipped=flipped)
            raise
        flipped_at = time.time()
        blocked_at = self._blocked_at(ctx)
        result: dict[str, Any] = {
            "records": sorted({r["name"] for r in old.values()} | set(flipped)),
            "new_content": new,
            "old": list(old.values()),
            "flipped_at": flipped_at,
        }
        if blocked_at is not None:
            result["write_block_seconds"] = round(flipped_at - blocked_at, 3)
        return result

    def undo(self, ctx: StepContext) -> None:
        old: dict[str, dict[str, Any]] = ctx.saved(OLD_RECORDS) or {}
        if not old:
            return
        zone_id = self._zone_id(ctx)
        for saved in old.values():
            current = [r for r in self._find(ctx, zone_id, saved["name"]) if r.id == saved["id"]]
            if not current:
                raise StepError(f"cannot restore DNS record {saved['name']}: record id {saved['id']} is gone")
            record = current[0]
            if record.content == saved["content"]:
                continue
            self._set(ctx, zone_id, record, saved["content"])
            ctx.log.info("dns_flip.restored", record=saved["name"], content=saved["content"])

    # -- helpers

    @staticmethod
    def _blocked_at(ctx: StepContext) -> float | None:
        value = ctx.output("cutover").get("writes_blocked_at")
        return float(value) if value is not None else None

    def _zone_id(self, ctx: StepContext) -> str:
        plan = ctx.rt.plan
        return call_with_retry(lambda: ctx.rt.dns.zone_id(plan.dns.zone), plan.retry, what="DNS zone lookup")

    def _find(self, ctx: StepContext, zone_id: str, name: str) -> list[Any]:
        plan = ctx.rt.plan
        return call_with_retry(
            lambda: ctx.rt.dns.find_records(zone_id, name, plan.dns.type), plan.retry, what=f"DNS lookup {name}"
        )

    def _set(self, ctx: StepContext, zone_id: str, record: Any, content: str) -> Any:
        plan = ctx.rt.plan
        updated = call_with_retry(
            lambda: ctx.rt.dns.set_content(zone_id, record, content), plan.retry, what=f"DNS edit {record.name}"
        )
        if updated.content != content:
            raise StepError(f"DNS record {record.name} reads back {updated.content}, expected {content}")
        return updated
