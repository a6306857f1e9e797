"""The commit at the front door: the target takes writes and the source's door forwards every client to it.

With a front door on the source, DNS is not what carries clients to the target at the commit: the source's door
does, whatever a client's DNS cache says (Vitess commits a switch by repointing its routing; cPanel's transfer
proxies the old server to the new one). So the commit is made here, inside the window, with only the hosts' own
round trips: the guard on the source told, the run journaled committed, the target's fence lifted, then the source's
door pointed at the target's and its held requests let go. The DNS flip follows after the window
(steps/dns_flip.py, no longer the commit point), with a patience of its own (`dns.converge_timeout`); a slow or
failing DNS API never holds writes, and never rolls back a committed run.

Order: the target's fence is lifted before the source's door forwards to it, so no forwarded request meets the
fence. Before the commit the step checks the source's door still holds (an HAProxy restarted mid-window forgot its
hold: one line, rollback); after it, every failure is finished forward by `migrate apply` (the step is re-entered:
each of its actions is idempotent).

When the source host can drive its own door (frontdoor.drivable_from_source, found before the window), the chain
runs there in one command (orchestrator/services/source_commit.py): the hold checked, the guard told, the commit
recorded on the source, the target's fence lifted over the hosts' hop and the door forwarded: the same facts in the
same order, one round trip instead of four. The journal says committed once its answer is back; the record on the
source is what a run that died in between reads first (`COMMIT_SENT` says it may be there): it finishes forward, and
its service served meanwhile (the command ends on the source whatever becomes of us).
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError, UndoRefused
from orchestrator.results import SwitchTrafficResult
from orchestrator.services import frontdoor
from orchestrator.steps import source_guard
from orchestrator.steps.common import TARGET_FENCE_LIFTED, lift_target_fence

# Journaled: when the run committed here (the target's fence lifted is journaled as steps.common says).
COMMITTED_AT = "committed_at"
# Journaled before the commit's one command on the source: where that command records the commit there.
COMMIT_SENT = frontdoor.COMMIT_SENT
FENCE_COMMAND_TIMEOUT = 120.0
NOT_FORWARDED = (
    "committed, but the source's front door could not be pointed at the target (see the log line above): its held "
    "requests go on at the hold's deadline; `migrate apply` points it again"
)


class SwitchTraffic(Step):
    name = "switch_traffic"
    title = "Commit at the front door: the target takes writes, the source's door forwards to it (the commit point)"
    commit_point = True

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        lines = ["the guard on the source is told of the commit, then the run is journaled committed"]
        fence = plan.services.target_fence
        if fence.enable and fence.disable:
            lines.append(f"lift the target's fence: {fence.disable} (the target takes writes from here)")
        source = frontdoor.section(ctx, "source")
        if source is not None:
            lines.append(
                f"the source's front door forwards to {source.forward_to.address}:{source.forward_to.port} and lets "
                "its held requests go: writes flow again, every client reaches the target whatever its DNS cache says"
            )
        lines.append("the DNS records are moved after this, outside the write budget (dns.converge_timeout)")
        return lines

    def check(self, ctx: StepContext) -> bool:
        # Re-entered after a crash, the step runs again: every action is idempotent, and its result carries the
        # moment writes flowed, which the report needs.
        return False

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        plan = runtime(ctx).plan
        committed_at = ctx.saved(COMMITTED_AT)
        reason = "the target is verified: its fence is lifted and the source's front door forwards to it"
        # When the commit on the source served the clients again, if it is found there (else: now).
        found_at = self._recorded_on_source(ctx) if committed_at is None else None
        if found_at is not None:
            # This run stopped after its commit on the source, before the journal heard of it: committed; finished
            # forward from here (the fence and the door again: both idempotent), the commit's own time journaled.
            ctx.log.warning("committed_on_source", record=ctx.saved(COMMIT_SENT), at=round(found_at, 3))
            source_guard.commit(ctx, reason, told=True)
            committed_at = found_at
            ctx.save(COMMITTED_AT, committed_at)
        # Driven from the source host when it can drive its own door (found before the window): one command there
        # instead of four round trips from here. A re-entered step (committed already) finishes from here.
        from_source = committed_at is None and frontdoor.drivable_from_source(ctx)
        outcome = None
        if committed_at is None:
            ctx.window.check("committing at the front door")
            timeout = ctx.window.timeout(FENCE_COMMAND_TIMEOUT)
            if from_source:
                record = frontdoor.commit_record(ctx)
                ctx.save(COMMIT_SENT, record)  # before: a run that dies now reads the record first
                guard_dir = source_guard.journaled_directory(ctx)
                outcome = frontdoor.commit_from_source(ctx, guard_dir, record, timeout=timeout)
                source_guard.commit(ctx, reason, told=True)
            else:
                frontdoor.check_source_hold(ctx)
                source_guard.commit(ctx, reason, timeout=timeout)
            committed_at = time.time()
            ctx.save(COMMITTED_AT, committed_at)
        if outcome is not None:
            lifted = self._lifted_and_forwarded(ctx, outcome)
        else:
            if plan.reverse_of is not None:
                # The way back: the old source's door forwarded to the target since the forward run; it serves its
                # own app again (whose fence is lifted next).
                frontdoor.serve_own_app(ctx, "target")
            lifted = self._lift_target_fence(ctx)
            if not frontdoor.forward_to_target(ctx):
                raise StepError(NOT_FORWARDED)
        flowing_at = found_at if found_at is not None else time.time()
        blocked_at = ctx.window.blocked_at
        return SwitchTrafficResult(
            committed_at=float(committed_at),
            writes_flow_at=flowing_at,
            target_fence_lifted=lifted,
            write_block_seconds=None if blocked_at is None else round(flowing_at - blocked_at, 3),
        ).journal()

    def settle_commit(self, ctx: StepContext) -> bool:
        """The commit sent to the source decided for good before the run is rolled back: recorded there (it
        happened, or goes on to happen: the command ends on the source whatever becomes of us), or cancelled now so
        that it never will. Nothing sent: no commit, no round trip."""
        record = ctx.saved(COMMIT_SENT)
        if not record:
            return False
        if ctx.saved(COMMITTED_AT) is not None:
            return True
        return frontdoor.settle_commit_on_source(ctx, str(record)) is not None

    def undo(self, ctx: StepContext) -> None:
        """Nothing to put back: what this step changes comes after its commit, and a committed run is finished
        forward, never rolled back (the way back is `migrate rollback`'s reverse run). The engine settles a commit
        sent to the source before any compensation (settle_commit); should one be recorded there all the same, the
        rollback stops here (the target serves, the source's door forwards to it) and says how to finish."""
        if ctx.saved(COMMITTED_AT) is None and self._recorded_on_source(ctx) is not None:
            raise UndoRefused(
                f"this run committed on the source ({ctx.saved(COMMIT_SENT)}) before it stopped: the target serves "
                "and the source's front door forwards to it; it is not rolled back: `migrate apply` finishes it"
            )

    def _recorded_on_source(self, ctx: StepContext) -> float | None:
        """When this step's commit on the source recorded itself (asked only when the command was sent)."""
        record = ctx.saved(COMMIT_SENT)
        return frontdoor.committed_on_source(ctx, str(record)) if record else None

    def _lifted_and_forwarded(self, ctx: StepContext, outcome: Any) -> bool:
        """What the commit's command did after the commit (a failure is finished forward by `migrate apply`):
        whether a fence was lifted."""
        if outcome.fence_lifted is False:
            raise StepError(
                f"committed, but lifting the target's fence failed ({outcome.fence_said}): it refuses writes until "
                "`migrate apply` lifts it"
            )
        if outcome.fence_lifted:
            ctx.save(TARGET_FENCE_LIFTED, True)
            ctx.log.info("target_fence_lifted", from_source=True)
        if outcome.door_error is not None:
            raise StepError(NOT_FORWARDED)
        return bool(outcome.fence_lifted)

    def _lift_target_fence(self, ctx: StepContext) -> bool:
        if ctx.saved(TARGET_FENCE_LIFTED):
            return True
        return lift_target_fence(ctx, committed_because="committed,")
