"""DNS flip, the commit point: every record of the plan now points at the target, then the target takes writes.

Each record's old content (with its id, TTL and proxied flag) is journaled before it is edited, so a failure
mid-way, a crash or a later rollback can put back exactly what was there. Only the content changes: type,
TTL and proxying stay as the operator set them.

The target was fenced when it started (`services.target_fence.enable`): it serves reads but refuses writes while
the records move, so a flip failing half-way rolls back without losing anything. Once every record is flipped and
read back, the run is committed (journaled) and the target's fence is lifted: from that moment the target takes
writes. A plan without a target fence cannot be rolled back safely once any record points at the target (clients
following it may already have written there): such a partial flip commits the run instead, and `migrate apply`
finishes it.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator import frontdoor
from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.results import DnsFlipResult, RecordSnapshot
from orchestrator.retry import call_with_retry
from orchestrator.transports.ssh import TransportError

OLD_RECORDS = "old_records"
# Journaled once the target's fence is lifted: a resumed run that finds every record flipped still lifts it if not.
TARGET_FENCE_LIFTED = "target_fence_lifted"
FENCE_COMMAND_TIMEOUT = 120.0


def _snapshot(record: Any) -> dict[str, Any]:
    """A record as it is now, for the journal (what undo puts back)."""
    return RecordSnapshot(
        id=record.id, name=record.name, type=record.type, content=record.content, ttl=record.ttl,
        proxied=record.proxied,
    ).model_dump(mode="json")  # fmt: skip


class DnsFlip(Step):
    name = "dns_flip"
    title = "DNS flip: point every record at the target, then let it take writes (the commit point)"
    commit_point = True

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        dns = plan.dns
        new = plan.dns_content
        lines = [
            f"Cloudflare zone {dns.zone}: {dns.type} {name} → {new} (old content journaled first; "
            "type, TTL and proxying kept; read back to verify)"
            for name in dns.records
        ]
        unfence = plan.services.target_fence.disable
        if plan.services.target_fence.enable and unfence:
            lines.append(f"once every record points at the target: lift the target's fence: {unfence} (the commit)")
        else:
            lines.append(
                "the plan declares no target fence: once any record points at the target the run is committed "
                "(a failure then needs `migrate apply` to finish the flip, not a rollback)"
            )
        return [*frontdoor.describe(ctx, "target"), *lines]

    def check(self, ctx: StepContext) -> bool:
        plan = runtime(ctx).plan
        fence = plan.services.target_fence
        if fence.enable and fence.disable and not ctx.saved(TARGET_FENCE_LIFTED):
            return False  # the records may all be flipped, but the target still refuses writes
        zone_id = self._zone_id(ctx)
        return self._all_point_at(ctx, zone_id, plan.dns_content)

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        plan = rt.plan
        new = plan.dns_content
        fenced = plan.services.target_fence.enable is not None
        zone_id = self._zone_id(ctx)
        found: dict[str, list[Any]] = {}
        for name in plan.dns.records:
            found[name] = self._find(ctx, zone_id, name)
            if not found[name]:
                raise StepError(f"DNS record {name} ({plan.dns.type}) not found in zone {plan.dns.zone}")
        already = sorted({r.name for records in found.values() for r in records if r.content == new})
        if already:
            # A resumed flip: some records moved already, clients follow them. Finish the flip whatever the budget
            # says; rolling back now would only make things worse.
            ctx.log.warning("dns_flip.resuming_partial_flip", already=already)
            if not fenced:
                ctx.commit(self._partial_reason(already))
        else:
            ctx.window.check("flipping DNS")
            frontdoor.before_flip(ctx)
        old: dict[str, dict[str, Any]] = dict(ctx.saved(OLD_RECORDS) or {})
        flipped: list[str] = []
        try:
            for name in plan.dns.records:
                for record in found[name]:
                    if record.content == new:
                        continue  # already flipped (a re-run after a crash): its old content is journaled
                    # Journal first: whatever happens next, undo knows what to put back.
                    old.setdefault(record.id, _snapshot(record))
                    ctx.save(OLD_RECORDS, old)
                    self._set(ctx, zone_id, record, new)
                    flipped.append(record.name)
                    ctx.log.info("dns_flip.record", record=record.name, old=record.content, new=new)
            if not self._all_point_at(ctx, zone_id, new):
                raise StepError(f"DNS read back: not every record of {plan.dns.records} points at {new}")
        except BaseException:
            ctx.log.error("dns_flip.failed_midway", flipped=flipped)
            if not fenced and not already:
                moved = self._moved_after_failure(ctx, zone_id, new, flipped, attempted=bool(old))
                if moved:
                    ctx.commit(self._partial_reason(moved))
            # With a target fence the target took no write: the engine rolls back and undo restores the records.
            raise
        lifted = self._lift_target_fence(ctx)
        frontdoor.forward_to_target(ctx)
        flipped_at = time.time()
        blocked_at = ctx.window.blocked_at
        return DnsFlipResult(
            records=sorted({r["name"] for r in old.values()} | set(flipped) | set(already)),
            new_content=new,
            old=[RecordSnapshot.of(r) for r in old.values()],
            flipped_at=flipped_at,
            target_fence_lifted=lifted,
            write_block_seconds=None if blocked_at is None else round(flipped_at - blocked_at, 3),
        ).journal()

    def undo(self, ctx: StepContext) -> None:
        """Fence the target again (nothing more may be written there), then put back every record's old content."""
        rt = runtime(ctx)
        failures: list[str] = []
        fence = rt.plan.services.target_fence.enable
        if fence:
            try:
                rt.target.run(fence, timeout=FENCE_COMMAND_TIMEOUT)
                ctx.log.info("dns_flip.target_fenced_again")
            except TransportError as exc:
                failures.append(f"fencing the target again: {exc}")
        try:
            frontdoor.release_target(ctx)
        except StepError as exc:
            failures.append(str(exc))
        old: dict[str, dict[str, Any]] = ctx.saved(OLD_RECORDS) or {}
        if old:
            zone_id = self._zone_id(ctx)
            for saved in (RecordSnapshot.of(r) for r in old.values()):
                current = [r for r in self._find(ctx, zone_id, saved.name) if r.id == saved.id]
                if not current:
                    failures.append(f"cannot restore DNS record {saved.name}: record id {saved.id} is gone")
                    continue
                record = current[0]
                if record.content == saved.content:
                    continue
                try:
                    self._set(ctx, zone_id, record, saved.content)
                except Exception as exc:  # every record is tried; the rollback reports them all
                    failures.append(f"restoring DNS record {saved.name}: {exc}")
                    continue
                ctx.log.info("dns_flip.restored", record=saved.name, content=saved.content)
        if failures:
            raise StepError("; ".join(failures))

    # -- helpers

    @staticmethod
    def _partial_reason(moved: list[str]) -> str:
        return (
            f"DNS partly flipped ({', '.join(moved)} point at the target) and the plan declares no "
            "services.target_fence: the target may have taken writes, so the run is finished forward, not rolled back"
        )

    def _lift_target_fence(self, ctx: StepContext) -> bool:
        """The commit: journal it, then let the target take writes. False when the plan declares no target fence."""
        fence = runtime(ctx).plan.services.target_fence
        if not (fence.enable and fence.disable):
            return False
        # Committed before the command: if it fails (or half-works) the target may take writes, and a rollback
        # would lose them. `migrate apply` lifts it again.
        ctx.commit("every DNS record points at the target: lifting the target's fence")
        try:
            runtime(ctx).target.run(fence.disable, timeout=FENCE_COMMAND_TIMEOUT)
        except TransportError as exc:
            raise StepError(
                f"every DNS record points at the target but lifting its fence failed ({exc}): it refuses writes "
                "until `migrate apply` lifts it"
            ) from None
        ctx.save(TARGET_FENCE_LIFTED, True)
        ctx.log.info("dns_flip.target_fence_lifted")
        return True

    def _moved_after_failure(
        self, ctx: StepContext, zone_id: str, new: str, flipped: list[str], *, attempted: bool
    ) -> list[str]:
        """Records pointing at the target after a failed flip; when DNS cannot be read, assume the worst."""
        if flipped:
            return flipped
        if not attempted:
            return []
        plan = runtime(ctx).plan
        moved: list[str] = []
        try:
            for name in plan.dns.records:
                # One try each: the API just failed us, and an interrupted operator should not wait on retries.
                records = runtime(ctx).dns.find_records(zone_id, name, plan.dns.type)
                moved += [r.name for r in records if r.content == new]
        except Exception as exc:
            ctx.log.warning("dns_flip.read_back_failed", error=str(exc))
            return ["(unknown: DNS could not be read back after an edit was tried)"]
        return moved

    def _zone_id(self, ctx: StepContext) -> str:
        plan = runtime(ctx).plan
        return call_with_retry(lambda: runtime(ctx).dns.zone_id(plan.dns.zone), plan.retry, what="DNS zone lookup")

    def _find(self, ctx: StepContext, zone_id: str, name: str) -> list[Any]:
        plan = runtime(ctx).plan
        return call_with_retry(
            lambda: runtime(ctx).dns.find_records(zone_id, name, plan.dns.type), plan.retry, what=f"DNS lookup {name}"
        )

    def _all_point_at(self, ctx: StepContext, zone_id: str, content: str) -> bool:
        for name in runtime(ctx).plan.dns.records:
            records = self._find(ctx, zone_id, name)
            if not records or any(r.content != content for r in records):
                return False
        return True

    def _set(self, ctx: StepContext, zone_id: str, record: Any, content: str) -> Any:
        plan = runtime(ctx).plan
        updated = call_with_retry(
            lambda: runtime(ctx).dns.set_content(zone_id, record, content), plan.retry, what=f"DNS edit {record.name}"
        )
        if updated.content != content:
            raise StepError(f"DNS record {record.name} reads back {updated.content}, expected {content}")
        return updated
