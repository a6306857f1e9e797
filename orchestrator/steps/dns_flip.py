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

Bounds: before the commit, every API call inside the downtime window (lookups, edits, read-backs) takes its
timeout from what is left of the write budget and its retries end with it (`ctx.window`).

Convergence: an edit whose answer never came (a timeout, a connection cut, an interruption) may still be applied
by the API later. Each edit is journaled before it is sent and when it is answered (`edits`); undo (and a resumed
flip) treat an unanswered edit as in flight: they re-apply the wanted content and keep reading until two reads
agree and the in-flight edit's time is up (twice `dns.timeout` plus a margin after it was sent), within a bound. Every
read-back is journaled (`records_now`), so `status` and the report say where every record points now. A flip whose
every edit was answered (nothing in flight) reads each record back once: an answered edit cannot land later.

Inside the window the records are handled side by side: their lookups, then (all old contents journaled first, in
one record) their edits, then their read-backs, each an API round trip of its own in a thread.

After a commit at the front door (steps/switch_traffic.py, a plan with `proxy.source`) this step is not the commit
point: it runs after the window, writes already flow, and every client reaches the target through the source's door.
Its calls then take the plan's own bounds, and the whole flip is tried again with backoff until the records point at
the target and read back so, within `dns.converge_timeout`; past it the run stays committed with DNS pending (exit 4,
one line), and `migrate apply` finishes it.

The rollback's order (no door, a flip that failed before its commit): undo fences the target again at once, the
steps before it make the source take writes again, and only then are the records put back (`settle_after_rollback`),
with their own patience: a slow API never keeps writes blocked past the budget.

A resumed flip reads where the records point at once: an edit that may still be in flight towards the content the
flip wants changes nothing it must wait for; only an edit in flight towards other content is waited out.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.model import Retry
from orchestrator.results import DnsFlipResult, RecordSnapshot
from orchestrator.retry import call_with_retry
from orchestrator.services import frontdoor
from orchestrator.steps import source_guard
from orchestrator.steps.common import TARGET_FENCE_LIFTED, lift_target_fence
from orchestrator.transports.ssh import TransportError

OLD_RECORDS = "old_records"
# Per record id: when its last edit was sent and whether an answer came back (no answer: it may be in flight).
EDITS = "edits"
# The last read of every record: {"at": ts, "records": {name: [contents]}} (what `status` and the report show).
RECORDS_NOW = "records_now"
# An unanswered edit is taken as landed or dead once twice the API timeout, plus this margin, has passed since it
# was sent: an API may apply an edit after the client gave up on it, even later than the client's own timeout.
IN_FLIGHT_MARGIN = 2.0
# Reads made while waiting for records to settle: the first ones this far apart (two reads that agree end most
# waits, inside the window too), then no more than SETTLE_READS_PER_SECOND API reads a second however many records:
# Cloudflare allows a token 1,200 requests per 5 minutes, then refuses every call for 5 minutes (the rollback's
# restore included); a wait of minutes at 0.25 s a record would reach it with 5 records.
SETTLE_POLL = 0.25
SETTLE_FAST_READS = 3
SETTLE_READS_PER_SECOND = 1.0
FENCE_COMMAND_TIMEOUT = 120.0
# API calls made side by side (one per record, at most this many at once).
MAX_PARALLEL_CALLS = 8
# After a commit at the front door: the pause between two tries of the whole flip, doubled each time up to the cap.
RETRY_PAUSE = 1.0
RETRY_PAUSE_MAX = 30.0

T = TypeVar("T")
R = TypeVar("R")


def _side_by_side(work: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """`work` on each item in threads (carrying the log context), results in the items' order; the first failure
    is raised once every call has ended (none is left running behind the caller)."""
    items = list(items)
    if len(items) < 2:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(len(items), MAX_PARALLEL_CALLS), thread_name_prefix="dns") as pool:
        futures = [pool.submit(contextvars.copy_context().run, work, item) for item in items]
        for future in futures:
            future.exception()  # wait for all of them
    return [future.result() for future in futures]


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

    def __init__(self, *, commits: bool = True) -> None:
        # The journaled `edits` are read, changed and saved again by edits made side by side: one at a time.
        self._edits_lock = threading.Lock()
        # False: the front door committed before this step (switch_traffic); DNS follows outside the window.
        self.commit_point = commits
        if not commits:
            self.title = "DNS flip: point every record at the target (after the commit at the front door)"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        dns = plan.dns
        new = plan.dns_content
        lines = [
            f"Cloudflare zone {dns.zone}: {dns.type} {name} → {new} (old content journaled first; "
            "type, TTL and proxying kept; read back to verify)"
            for name in dns.records
        ]
        if not self.commit_point:
            return [
                *lines,
                f"after the window (writes flow): tried again with backoff until every record points at the target, "
                f"within dns.converge_timeout {dns.converge_timeout:g} s; past it the run stays committed with DNS "
                "pending (exit 4) and `migrate apply` finishes it",
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
        if not self.commit_point:
            # After a commit at the door the flip is re-entered: reading where the records point is all it costs when
            # they moved already, and its result says when DNS was seen converged (forwarding is due from then).
            return False
        plan = runtime(ctx).plan
        fence = plan.services.target_fence
        if self.commit_point and fence.enable and fence.disable and not ctx.saved(TARGET_FENCE_LIFTED):
            return False  # the records may all be flipped, but the target still refuses writes
        zone_id = self._zone_id(ctx)
        return self._all_point_at(ctx, zone_id, plan.dns_content)

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        if not self.commit_point:
            return self._after_commit(ctx)
        rt = runtime(ctx)
        plan = rt.plan
        new = plan.dns_content
        fenced = plan.services.target_fence.enable is not None
        zone_id = self._zone_id(ctx)
        fresh = not ctx.saved(OLD_RECORDS)  # no record edited by this run yet
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="doors") as pool:
            # A fresh flip readies the front doors (the source still holds, the target's door holds) while the
            # records are looked up: both round trips come before any edit.
            doors = pool.submit(contextvars.copy_context().run, self._before_flip, ctx) if fresh else None
            try:
                read = _side_by_side(lambda name: self._find(ctx, zone_id, name), plan.dns.records)
            finally:
                doors_failed = doors.exception() if doors is not None else None
        found = dict(zip(plan.dns.records, read, strict=True))
        for name in plan.dns.records:
            if not found[name]:
                raise StepError(f"DNS record {name} ({plan.dns.type}) not found in zone {plan.dns.zone}")
        already = sorted({r.name for records in found.values() for r in records if r.content == new})
        if doors_failed is not None:
            raise doors_failed
        if already:
            # A resumed flip: some records moved already, clients follow them. Finish the flip whatever the budget
            # says; rolling back now would only make things worse.
            ctx.log.warning("dns_flip.resuming_partial_flip", already=already)
            if not fenced:
                self._commit(ctx, self._partial_reason(already))
        elif not fresh:
            self._before_flip(ctx)
        old: dict[str, dict[str, Any]] = dict(ctx.saved(OLD_RECORDS) or {})
        flipped: list[str] = []
        attempted: list[str] = []
        try:
            # Already flipped ones (a re-run after a crash) have their old content journaled.
            to_edit = [r for name in plan.dns.records for r in found[name] if r.content != new]
            if to_edit:
                # Journal first, every record at once: whatever happens next, undo knows what to put back.
                for record in to_edit:
                    old.setdefault(record.id, _snapshot(record))
                ctx.save(OLD_RECORDS, old)
                attempted += [r.name for r in to_edit]

            def _edit(record: Any) -> None:
                # A resumed partial flip finishes whatever the budget says (see above).
                self._set(ctx, zone_id, record, new, bounded=not already)
                flipped.append(record.name)
                ctx.log.info("dns_flip.record", record=record.name, old=record.content, new=new)

            _side_by_side(_edit, to_edit)
            wanted = {r.id: new for records in found.values() for r in records}
            # Every edit answered: nothing can land later, one read-back of each record says where it points.
            stuck = self._converge(ctx, zone_id, wanted, bounded=not already, once=self._all_answered(ctx, wanted))
            if stuck:
                raise StepError(f"DNS read back: not every record of {plan.dns.records} points at {new}: {stuck[0]}")
        except BaseException:
            # Which records the API holds at the target now: an edit that failed may still have been applied.
            now = self._read_once(ctx, zone_id)
            moved = sorted(n for n, contents in (now or {}).items() if new in contents)
            ctx.log.error(
                "dns_flip.failed_midway",
                flipped=moved if now is not None else flipped,
                edits_sent=attempted,
                records_now=now if now is not None else "(could not be read)",
            )
            if not fenced and not already:
                moved = self._moved_after_failure(ctx, zone_id, new, flipped, attempted=bool(old))
                if moved:
                    self._commit(ctx, self._partial_reason(moved))
            # With a target fence the target took no write: the engine rolls back and undo restores the records.
            raise
        if plan.reverse_of is not None:
            # The way back: the old source's door forwarded to the target since the forward run; it serves its own
            # app again from the moment that app takes writes (its fence is lifted next).
            frontdoor.serve_own_app(ctx, "target")
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

    def _after_commit(self, ctx: StepContext) -> dict[str, Any]:
        """The flip after a commit at the front door: the whole flip tried again with backoff until every record
        points at the target and reads back so, within `dns.converge_timeout` (plus the try under way); past it,
        one line, and the run stays committed (the source's door forwards every client meanwhile)."""
        plan = runtime(ctx).plan
        deadline = time.monotonic() + plan.dns.converge_timeout
        pause, tries = RETRY_PAUSE, 0
        while True:
            tries += 1
            try:
                return self._flip_after_commit(ctx)
            except Exception as exc:
                left = deadline - time.monotonic()
                error = " ".join(str(exc).split()) or type(exc).__name__
                if left <= pause:
                    raise StepError(
                        f"committed, DNS pending: the records {', '.join(plan.dns.records)} do not all point at "
                        f"{plan.dns_content} after {tries} tries within dns.converge_timeout "
                        f"{plan.dns.converge_timeout:g} s (last: {error}); the source's front door forwards every "
                        "client to the target meanwhile; `migrate apply` finishes the flip"
                    ) from None
                ctx.log.warning("dns_flip.retrying_after_commit", error=error, pause=pause, left_s=round(left, 1))
                time.sleep(pause)
                pause = min(pause * 2, RETRY_PAUSE_MAX)

    def _flip_after_commit(self, ctx: StepContext) -> dict[str, Any]:
        """One try: look every record up, journal the old contents, edit what differs, read back until settled.
        The calls take the plan's own bounds (the window has ended)."""
        plan = runtime(ctx).plan
        new = plan.dns_content
        zone_id = self._zone_id(ctx, bounded=False)
        read = _side_by_side(lambda name: self._find(ctx, zone_id, name, bounded=False), plan.dns.records)
        found = dict(zip(plan.dns.records, read, strict=True))
        for name in plan.dns.records:
            if not found[name]:
                raise StepError(f"DNS record {name} ({plan.dns.type}) not found in zone {plan.dns.zone}")
        old: dict[str, dict[str, Any]] = dict(ctx.saved(OLD_RECORDS) or {})
        to_edit = [r for name in plan.dns.records for r in found[name] if r.content != new]
        if to_edit:
            for record in to_edit:
                old.setdefault(record.id, _snapshot(record))
            ctx.save(OLD_RECORDS, old)
            _side_by_side(lambda record: self._set(ctx, zone_id, record, new, bounded=False), to_edit)
        wanted = {r.id: new for records in found.values() for r in records}
        stuck = self._converge(ctx, zone_id, wanted, bounded=False, once=self._all_answered(ctx, wanted))
        if stuck:
            raise StepError(f"DNS read back: not every record of {plan.dns.records} points at {new}: {stuck[0]}")
        ctx.log.info("dns_flip.records_point_at_target", records=plan.dns.records, edited=[r.name for r in to_edit])
        return DnsFlipResult(
            records=sorted({r.name for records in found.values() for r in records}),
            new_content=new,
            old=[RecordSnapshot.of(r) for r in old.values()],
            flipped_at=time.time(),
        ).journal()

    def _before_flip(self, ctx: StepContext) -> None:
        ctx.window.check("flipping DNS")
        frontdoor.before_flip(ctx)

    def undo(self, ctx: StepContext) -> None:
        """Fence the target again (nothing more may be written there) and send its door's requests back to the
        source's; the records are put back after the whole rollback (`settle_after_rollback`)."""
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
        # The records are put back once the source takes writes again (settle_after_rollback): the target is
        # fenced now, so a client that follows a moved record meets its fence (or its door, forwarding to the
        # source's), and no write is blocked while a slow API answers.
        if failures:
            raise StepError("; ".join(failures))

    def settle_after_rollback(self, ctx: StepContext) -> None:
        """After the whole rollback (the source takes writes again): put back every record's old content, waiting
        out any edit that may still be in flight and re-applying the old content over it, until the records hold
        it and stay so (within a bound)."""
        old: dict[str, dict[str, Any]] = ctx.saved(OLD_RECORDS) or {}
        if not old:
            return
        try:
            zone_id = self._zone_id(ctx, bounded=False)
            failures = self._converge(ctx, zone_id, self._restore_wanted(ctx), bounded=False)
        except Exception as exc:  # the API unreachable: say which records could not be put back
            names = sorted({RecordSnapshot.of(r).name for r in old.values()})
            failures = [f"restoring DNS records {', '.join(names)}: {exc}"]
        if failures:
            raise StepError("; ".join(failures))

    # -- convergence

    def _restore_wanted(self, ctx: StepContext) -> dict[str, str]:
        old: dict[str, dict[str, Any]] = ctx.saved(OLD_RECORDS) or {}
        return {saved.id: saved.content for saved in (RecordSnapshot.of(r) for r in old.values())}

    def _all_answered(self, ctx: StepContext, wanted: dict[str, str]) -> bool:
        """No edit of this run towards other content than `wanted` may still be in flight: every such one sent got
        its answer (one towards the wanted content, landing late, changes nothing)."""
        return not _in_flight_until(ctx.saved(EDITS) or {}, 0.0, wanted)

    def _converge(
        self,
        ctx: StepContext,
        zone_id: str,
        wanted: dict[str, str],
        *,
        bounded: bool,
        settle: bool = True,
        once: bool = False,
    ) -> list[str]:
        """Make every record id in `wanted` hold its content and stay so: re-apply what differs, and read until
        two reads in a row agree and every edit that may be in flight has had its time. Failures, one per record.
        `once`: nothing is in flight (the caller checked), so a first read that agrees is enough.
        """
        plan = runtime(ctx).plan
        edits: dict[str, dict[str, Any]] = ctx.saved(EDITS) or {}
        settle_until = _in_flight_until(edits, plan.dns.timeout, wanted)
        if not settle:
            settle_until = 0.0
        deadline = max(settle_until, time.time()) + 2 * (plan.dns.timeout + IN_FLIGHT_MARGIN) + plan.retry.max_seconds
        failures: dict[str, str] = {}
        previous: dict[str, str] | None = None
        reads = 0
        while True:
            current = self._read_ids(ctx, zone_id, wanted, bounded=bounded)
            reads += 1
            failures = {}
            for record_id, record in current.items():
                want = wanted[record_id]
                if record is None:
                    failures[record_id] = f"cannot restore DNS record id {record_id}: it is gone"
                elif record.content != want:
                    try:
                        self._set(ctx, zone_id, record, want, bounded=bounded)
                        ctx.log.info("dns_flip.record_set", record=record.name, old=record.content, new=want)
                    except Exception as exc:  # every record is tried; the caller reports them all
                        failures[record_id] = f"setting DNS record {record.name} to {want}: {exc}"
            contents = {i: r.content for i, r in current.items() if r is not None}
            agreed = once or previous == contents
            settled = not failures and contents == wanted and agreed and time.time() >= settle_until
            if settled:
                ctx.log.info("dns_flip.records_converged", records=self._names(current))
                return []
            if self._windowed(bounded):
                ctx.window.check("waiting for the DNS records to settle")
            if time.time() >= deadline:
                stuck = list(failures.values()) or [
                    f"DNS records did not settle on {sorted(set(wanted.values()))} within the bound: "
                    f"{self._names(current)}"
                ]
                return stuck
            previous = contents if contents == wanted else None
            once = False  # something differed or failed: settle the usual way from here
            edits = ctx.saved(EDITS) or {}
            if settle:
                settle_until = max(settle_until, _in_flight_until(edits, plan.dns.timeout, wanted))
            time.sleep(settle_pause(reads, len(wanted)))

    @staticmethod
    def _names(current: dict[str, Any]) -> dict[str, str]:
        return {r.name: r.content for r in current.values() if r is not None}

    def _read_ids(self, ctx: StepContext, zone_id: str, wanted: dict[str, str], *, bounded: bool) -> dict[str, Any]:
        """The records with these ids as the API holds them now (None: gone), journaled as `records_now`."""
        plan = runtime(ctx).plan
        by_id: dict[str, Any] = dict.fromkeys(wanted)
        read = _side_by_side(lambda name: self._find(ctx, zone_id, name, bounded=bounded), plan.dns.records)
        for records in read:
            for record in records:
                if record.id in by_id:
                    by_id[record.id] = record
        self._journal_now(ctx, [r for r in by_id.values() if r is not None])
        return by_id

    def _read_once(self, ctx: StepContext, zone_id: str) -> dict[str, list[str]] | None:
        """Every record's contents, one bounded try each (journaled), or None when the API cannot say."""
        plan = runtime(ctx).plan
        timeout = self._call_timeout(ctx)
        try:
            read = _side_by_side(
                lambda name: runtime(ctx).dns.find_records(zone_id, name, plan.dns.type, timeout=timeout),
                plan.dns.records,
            )
            records = [r for found in read for r in found]
        except Exception as exc:
            ctx.log.warning("dns_flip.read_back_failed", error=str(exc))
            return None
        return self._journal_now(ctx, records)

    def _journal_now(self, ctx: StepContext, records: list[Any], *, end: bool = False) -> dict[str, list[str]]:
        """Journal a reading (with what the source's and the target's contents are, so it can be told where each
        record points without the plan). An unchanged reading is journaled again at most every 5 s."""
        plan = runtime(ctx).plan
        now: dict[str, list[str]] = {}
        for record in records:
            now.setdefault(record.name, []).append(record.content)
        old: dict[str, dict[str, Any]] = ctx.saved(OLD_RECORDS) or {}
        source = sorted({plan.source.dns_content} | {str(r.get("content")) for r in old.values()})
        value: dict[str, Any] = {
            "at": time.time(),
            "records": {n: sorted(c) for n, c in now.items()},
            "source": source,
            "target": plan.dns_content,
            "end": end,
        }
        previous = ctx.saved(RECORDS_NOW) or {}
        if end or previous.get("records") != value["records"] or time.time() - float(previous.get("at", 0)) > 5:
            ctx.save(RECORDS_NOW, value)
        return value["records"]

    def observe_at_end(self, ctx: StepContext) -> None:
        """The run's last word on DNS: every record read once more at its end (after the commit and the finish, or
        after the rollback and its settling), journaled, so the report and `status` show where each points.
        One bounded try per call; a failure is logged, never raised (the run's outcome is decided already)."""
        plan = runtime(ctx).plan
        try:
            zone_id = runtime(ctx).dns.zone_id(plan.dns.zone, timeout=plan.dns.timeout)
            records = [
                r
                for name in plan.dns.records
                for r in runtime(ctx).dns.find_records(zone_id, name, plan.dns.type, timeout=plan.dns.timeout)
            ]
        except Exception as exc:
            ctx.log.warning("dns_flip.end_read_failed", error=str(exc))
            return
        now = self._journal_now(ctx, records, end=True)
        ctx.log.info("dns_flip.records_at_end", records=now)

    # -- helpers

    def _commit(self, ctx: StepContext, reason: str) -> None:
        source_guard.commit(ctx, reason, timeout=FENCE_COMMAND_TIMEOUT)

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
        self._commit(ctx, "every DNS record points at the target: lifting the target's fence")
        return lift_target_fence(ctx, committed_because="every DNS record points at the target")

    def _moved_after_failure(
        self, ctx: StepContext, zone_id: str, new: str, flipped: list[str], *, attempted: bool
    ) -> list[str]:
        """Records pointing at the target after a failed flip; when DNS cannot be read, assume the worst."""
        if flipped:
            return flipped
        if not attempted:
            return []
        plan = runtime(ctx).plan
        # One try each: the API just failed us, and an interrupted operator should not wait on retries.
        now = self._read_once(ctx, zone_id)
        if now is None:
            return ["(unknown: DNS could not be read back after an edit was tried)"]
        return sorted(name for name in plan.dns.records if new in now.get(name, []))

    # Before the commit, inside the downtime window, every call and its retries are bounded by what is left of the
    # write budget; undo and a committed run use the plan's own bounds.

    def _windowed(self, bounded: bool) -> bool:
        """Whether a call is bounded by the write budget: asked inside the window, and this step is the commit (after
        a commit at the front door the window has ended before this step begins)."""
        return bounded and self.commit_point

    def _policy(self, ctx: StepContext, bounded: bool) -> Retry:
        plan = runtime(ctx).plan
        return ctx.window.bounded(plan.retry) if self._windowed(bounded) else plan.retry

    def _call_timeout(self, ctx: StepContext, bounded: bool = True) -> float:
        cap = runtime(ctx).plan.dns.timeout
        return (ctx.window.timeout(cap) or cap) if self._windowed(bounded) else cap

    def _zone_id(self, ctx: StepContext, *, bounded: bool = True) -> str:
        plan = runtime(ctx).plan
        return call_with_retry(
            lambda: runtime(ctx).dns.zone_id(plan.dns.zone, timeout=self._call_timeout(ctx, bounded)),
            self._policy(ctx, bounded),
            what="DNS zone lookup",
        )

    def _find(self, ctx: StepContext, zone_id: str, name: str, *, bounded: bool = True) -> list[Any]:
        plan = runtime(ctx).plan
        return call_with_retry(
            lambda: runtime(ctx).dns.find_records(
                zone_id, name, plan.dns.type, timeout=self._call_timeout(ctx, bounded)
            ),
            self._policy(ctx, bounded),
            what=f"DNS lookup {name}",
        )

    def _all_point_at(self, ctx: StepContext, zone_id: str, content: str) -> bool:
        for name in runtime(ctx).plan.dns.records:
            records = self._find(ctx, zone_id, name)
            if not records or any(r.content != content for r in records):
                return False
        return True

    def _set(self, ctx: StepContext, zone_id: str, record: Any, content: str, *, bounded: bool = True) -> Any:
        """One record's edit, journaled before it is sent and once answered (no answer: it may be in flight)."""

        def _note(entry: dict[str, Any] | None = None, *, answered: bool = False) -> None:
            """This record's entry in the journaled `edits` (the others' are kept as they are now)."""
            with self._edits_lock:
                edits: dict[str, dict[str, Any]] = dict(ctx.saved(EDITS) or {})
                if entry is not None:
                    edits[record.id] = entry
                elif record.id in edits:
                    edits[record.id] = {**edits[record.id], "answered": answered}
                else:
                    return
                ctx.save(EDITS, edits)

        def _edit() -> Any:
            if self._windowed(bounded):
                ctx.window.check(f"editing DNS record {record.name}")
            _note({"name": record.name, "content": content, "sent_at": time.time(), "answered": False})
            try:
                return runtime(ctx).dns.set_content(zone_id, record, content, timeout=self._call_timeout(ctx, bounded))
            except Exception as exc:
                # An API that answered (an HTTP status) did not leave the edit in flight; a timeout or a cut did.
                if _answered(exc):
                    _note(answered=True)
                raise

        updated = call_with_retry(_edit, self._policy(ctx, bounded), what=f"DNS edit {record.name}")
        _note(answered=True)
        if updated.content != content:
            raise StepError(f"DNS record {record.name} reads back {updated.content}, expected {content}")
        return updated


def settle_pause(reads: int, records: int) -> float:
    """Seconds before the next read of `records` records, `reads` reads into a settle (see SETTLE_POLL)."""
    if reads < SETTLE_FAST_READS:
        return SETTLE_POLL
    return max(SETTLE_POLL, records / SETTLE_READS_PER_SECOND)


def _in_flight_until(edits: dict[str, dict[str, Any]], api_timeout: float, wanted: dict[str, str]) -> float:
    """Until when an unanswered edit towards other content than `wanted` may still land (0: none in flight). An
    edit in flight towards the wanted content is no reason to wait: landing late, it changes nothing."""
    pending = [
        float(e["sent_at"])
        for record_id, e in edits.items()
        if not e.get("answered") and e.get("content") != wanted.get(record_id)
    ]
    return max(pending) + 2 * api_timeout + IN_FLIGHT_MARGIN if pending else 0.0


def _answered(exc: BaseException) -> bool:
    """Did the API answer (an HTTP status), as opposed to a timeout or a cut connection (an edit maybe in flight)?"""
    text = str(exc)
    return "HTTP " in text or "success: false" in text
