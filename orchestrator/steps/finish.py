"""Finish: the source stays fenced (or its services stop), traffic drains, and the run report is written.

Each source service is journaled before it is stopped, so undo (`migrate rollback --discard-target-writes`) starts
exactly those again: the source then serves as before, once the cut-over's undo has started its database and
lifted its fence.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.model import Service
from orchestrator.report.build import build_report
from orchestrator.results import FilesResult, FinishResult
from orchestrator.services import frontdoor
from orchestrator.services.dns_ttl import restore_original_ttls
from orchestrator.services.tracking import ChangeTracker
from orchestrator.steps.common import run_services
from orchestrator.steps.modes import SHUTDOWN, CutoverMode
from orchestrator.steps.repl_common import (
    FORWARD_TUNNEL,
    REPLICA_STEP,
    REVERSE_KEPT,
    REVERSE_TUNNEL,
    SWITCH_STEP,
    TORN_DOWN,
    TunnelFacts,
    close_tunnel,
    end_tunnels,
    forget_replication_on,
    open_tunnel,
    replica_source,
    replication,
    saved_from,
    server_access,
)
from orchestrator.transports.ssh import TransportError

# Names of the source services this run stopped (or was about to stop), journaled before each stop.
STOPPED_SERVICES = "source_services_stopped"
# Replicate mode: the old source pointed at the target (journaled first); TORN_DOWN and REVERSE_KEPT (until when
# the reverse path is kept) live in repl_common: `migrate finish`, status and the reverse run read them.
REVERSE_POINTED = "reverse_pointed"
REVERSE_CATCH_UP = 60.0


def peak_rss_mib() -> float:
    """This process's peak resident memory, in MiB.

    On Linux, VmHWM of /proc/self/status: getrusage's ru_maxrss survives execve, so a `migrate` started by a large
    process (a test runner, a shell wrapper holding much) would report its parent's size instead of its own."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(peak / (1 << 20) if sys.platform == "darwin" else peak / 1024, 1)


def stop_trackers(ctx: StepContext) -> list[str]:
    """Stop (only our verified pid) and remove the trees' change trackers files_presync started on the source.

    A tracker that cannot be reached is logged, not fatal: the migration is done, and the tracker exits with
    its tree (or is found by its state directory, named in the log)."""
    rt = runtime(ctx)
    presync = FilesResult.of(ctx.output("files_presync"))
    stopped: list[str] = []
    for tree in rt.plan.files:
        figures = presync.trees.get(tree.name)
        ref = figures.tracker if figures else None
        if ref is None:
            continue
        tracker = ChangeTracker(rt.source, tree.source, ref.state_dir, name=ref.name)
        try:
            tracker.stop()
            tracker.remove()
        except TransportError as exc:
            ctx.log.warning("tracking_not_stopped", tree=tree.name, state_dir=tracker.dir, error=str(exc))
            continue
        ctx.log.info("tracking_stopped", tree=tree.name)
        stopped.append(tree.name)
    return stopped


class Finish(Step):
    name = "finish"
    title = "Finish: leave the source fenced or stopped, drain, write the report"

    def __init__(self, *, mode: CutoverMode = SHUTDOWN) -> None:
        self.mode = mode

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        if plan.finish.source == "stop":
            lines = [f"on {plan.source.address}: stop {s.name}: {s.stop}" for s in plan.services.source]
        else:
            lines = [f"the source {plan.source.address} stays fenced (refuses writes)"]
        if plan.finish.drain_seconds:
            lines.append(f"wait {plan.finish.drain_seconds:g} s for traffic to leave the source")
        if plan.reverse_of is not None:
            lines.append("the forward run's replication ends on both sides (RESET SLAVE ALL) and its tunnels "
                         f"(plan {plan.reverse_of}'s, on the old source) are ended")  # fmt: skip
        else:
            lines += self.mode.describe_finish(plan)
        lines += [f"stop and remove the change tracker of tree {t.name} on the source" for t in plan.files]
        if plan.proxy is not None and plan.proxy.source is not None:
            lines.append("the source's front door keeps forwarding to the target; count the requests that still came")
        lines.append("write the run report beside the journal")
        return lines

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        plan = rt.plan
        reverse: dict[str, Any] | None = None
        if plan.reverse_of is not None:
            self._end_forward_replication(ctx)
        else:
            reverse = self.mode.reverse_path(ctx, self)
        if plan.finish.drain_seconds:
            # Clients with a cached DNS answer still reach the source for up to the record's TTL.
            ctx.log.info("finish.drain", seconds=plan.finish.drain_seconds)
            time.sleep(plan.finish.drain_seconds)
        forwarding = frontdoor.forwarding_report(ctx)
        if plan.reverse_of is None:
            self.mode.end_reverse_path(ctx, self, reverse)
        stopped: list[str] = list(ctx.saved(STOPPED_SERVICES) or [])

        def _journal_first(service: Service) -> None:
            # A crash during the stop must still let undo start it again.
            if service.name not in stopped:
                stopped.append(service.name)
                ctx.save(STOPPED_SERVICES, stopped)

        if plan.finish.source == "stop":
            run_services(
                ctx, rt.source, plan.services.source, "stop", event="finish.source_service_stopped",
                keep_going=False, kind="source service", before=_journal_first,
            )  # fmt: skip
        trackers = stop_trackers(ctx)
        frontdoor.forget_commit_record(ctx)
        # The full report (this step included) is written by the command line once the run has ended.
        report = build_report(ctx.history(), now=time.time())
        return FinishResult(
            source=plan.finish.source,
            source_services_stopped=stopped,
            write_block_seconds=report.get("write_block_seconds"),
            bytes_moved=report.get("bytes_moved"),
            reverse_replication=reverse,
            peak_rss_mib=peak_rss_mib(),
            round_trips=runtime(ctx).round_trips.by_step(),
            trackers_stopped=trackers,
            **forwarding,
        ).journal() | {"ttls_restored": restore_original_ttls(ctx)}

    # -- replicate mode

    def reverse_replication(self, ctx: StepContext) -> dict[str, Any] | None:
        """The old source becomes a replica of the target at the switch's final position (the same GTID position
        both stand at), through an `ssh -L` tunnel; proven by catching up with the target's position.

        Committed already: a reverse path that cannot be set up is logged, never fails the run.
        """
        rt = runtime(ctx)
        final = ctx.output(SWITCH_STEP).get("final_gtid")
        if not final:
            return None
        try:
            rep = replication(rt)
            tunnel = open_tunnel(ctx, "local", REVERSE_TUNNEL)
            target = rt.db("target")
            source = None
            try:
                if rep.source_stops and not ctx.saved(REVERSE_POINTED) and not rt.db_answers("source"):
                    # The switch stopped the old source cleanly: it starts again as a replica of the target.
                    ctx.save(REVERSE_POINTED, True)
                    rep.follow(None, replica_source(rt, tunnel.port), rep.parse_position(str(final)), seeded=False,
                               server=server_access(rt, "source"), primary=target)  # fmt: skip
                source = rt.db("source")
                status = rep.replica_status(source)
                if not (ctx.saved(REVERSE_POINTED) and status is not None and status.master_port == tunnel.port):
                    ctx.save(REVERSE_POINTED, True)
                    rep.follow(source, replica_source(rt, tunnel.port), rep.parse_position(str(final)), seeded=False,
                               server=server_access(rt, "source"), primary=target)  # fmt: skip
                rep.start_replica(source)
                waited = rep.wait_for_position(source, rep.write_position(target), REVERSE_CATCH_UP)
            finally:
                if source is not None:
                    rt.release(source)
                rt.release(target)
        except Exception as exc:  # committed: say it, go on
            ctx.log.warning("finish.reverse_replication_failed", error=str(exc))
            return {"healthy": False, "error": str(exc)}
        healthy = waited.outcome == "reached"
        ctx.log.info("finish.reverse_replication", healthy=healthy, tunnel=tunnel.name, port=tunnel.port,
                     at=str(waited.position), error=waited.error)  # fmt: skip
        return {"healthy": healthy, "tunnel": tunnel.name, "port": tunnel.port, "position": str(waited.position),
                "error": waited.error}  # fmt: skip

    def keep_reverse(self, ctx: StepContext, keep: float) -> dict[str, Any]:
        """The reverse path outlives the run (journaled until when): the forward tunnel is no longer needed."""
        rt = runtime(ctx)
        until = float(ctx.saved(REVERSE_KEPT) or time.time() + keep)
        ctx.save(REVERSE_KEPT, until)
        close_tunnel(ctx, FORWARD_TUNNEL, TunnelFacts.of(saved_from(ctx, REPLICA_STEP, FORWARD_TUNNEL)))
        plan_path = getattr(rt, "plan_path", "PLAN")
        ctx.log.info(
            "finish.reverse_kept",
            seconds=keep,
            until=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(until)),
            rollback=f"`migrate rollback {plan_path}` moves back through it, losing nothing, writes blocked ~1 s",
            lag=f"`migrate status {plan_path}`",
            end_now=f"`migrate finish {plan_path}` (or replication.keep_reverse: 0 for the next run)",
        )
        return {"kept_seconds": keep, "kept_until": until}

    def _end_forward_replication(self, ctx: StepContext) -> None:
        """The reverse run: the forward run's replication is over on both sides (the old source was promoted; a
        shutdown-mode way back restarted it on a copy) and its tunnels end. Committed: a failure is logged."""
        rt = runtime(ctx)
        plan = rt.plan
        assert plan.reverse_of is not None
        # The old source runs (promoted, or restarted on a copy); the target's database runs only in replicate mode
        # (the shutdown mode stopped it).
        failures = forget_replication_on(rt, self.mode.forward_replication_on, retry=False)
        tunnels: list[str] = []
        try:
            # Started on the old source (this plan's target), in its private directory.
            ended = end_tunnels(rt.target, plan.reverse_of, rt.plan_path, plan.target.private_dir)
            tunnels = [found.path for found in ended if found.kind == "tunnel"]
        except TransportError as exc:
            failures.append(f"tunnels: {exc}")
        if failures:
            ctx.log.warning("finish.forward_replication_not_ended", errors=failures)
            return
        ctx.save(TORN_DOWN, True)
        ctx.log.info("finish.forward_replication_ended", tunnels=tunnels)

    def tear_down(self, ctx: StepContext) -> None:
        """Replication forgotten on both sides (RESET SLAVE ALL deletes master.info and its clear-text password),
        both tunnels ended."""
        rt = runtime(ctx)
        failures = forget_replication_on(rt, ("source", "target"))
        close_tunnel(ctx, REVERSE_TUNNEL)
        close_tunnel(ctx, FORWARD_TUNNEL, TunnelFacts.of(saved_from(ctx, REPLICA_STEP, FORWARD_TUNNEL)))
        if failures:
            raise StepError("tearing replication down: " + "; ".join(failures))
        ctx.save(TORN_DOWN, True)
        ctx.log.info("finish.replication_torn_down")

    def undo(self, ctx: StepContext) -> None:
        """Start again, in the plan's order, the source services this run stopped; every start is tried."""
        rt = runtime(ctx)
        if rt.plan.reverse_of is None:
            self.mode.undo_finish(ctx, self)  # replicate: the old source stops following the target first
        stopped = set(ctx.saved(STOPPED_SERVICES) or [])
        started = run_services(
            ctx, rt.source, [s for s in rt.plan.services.source if s.name in stopped], "start",
            event="finish.source_service_started", keep_going=True,
        )  # fmt: skip
        if started.failures:
            raise StepError("starting the source's services again failed: " + "; ".join(started.failures))
