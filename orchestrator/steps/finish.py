"""Finish: the source stays fenced (or its services stop), traffic drains, and the run report is written.

Each source service is journaled before it is stopped, so undo (`migrate rollback --discard-target-writes`) starts
exactly those again: the source then serves as before, once the cut-over's undo has started its database and
lifted its fence.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator import frontdoor
from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.model import Service
from orchestrator.report import build_report
from orchestrator.results import FinishResult
from orchestrator.steps.common import run_services

# Names of the source services this run stopped (or was about to stop), journaled before each stop.
STOPPED_SERVICES = "source_services_stopped"


class Finish(Step):
    name = "finish"
    title = "Finish: leave the source fenced or stopped, drain, write the report"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        if plan.finish.source == "stop":
            lines = [f"on {plan.source.address}: stop {s.name}: {s.stop}" for s in plan.services.source]
        else:
            lines = [f"the source {plan.source.address} stays fenced (refuses writes)"]
        if plan.finish.drain_seconds:
            lines.append(f"wait {plan.finish.drain_seconds:g} s for traffic to leave the source")
        if plan.proxy is not None and plan.proxy.source is not None:
            lines.append("the source's front door keeps forwarding to the target; count the requests that still came")
        lines.append("write the run report beside the journal")
        return lines

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        plan = rt.plan
        if plan.finish.drain_seconds:
            # Clients with a cached DNS answer still reach the source for up to the record's TTL.
            ctx.log.info("finish.drain", seconds=plan.finish.drain_seconds)
            time.sleep(plan.finish.drain_seconds)
        forwarding = frontdoor.forwarding_report(ctx)
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
        # The full report (this step included) is written by the command line once the run has ended.
        report = build_report(ctx.history(), now=time.time())
        return FinishResult(
            source=plan.finish.source,
            source_services_stopped=stopped,
            write_block_seconds=report.get("write_block_seconds"),
            bytes_moved=report.get("bytes_moved"),
            **forwarding,
        ).journal()

    def undo(self, ctx: StepContext) -> None:
        """Start again, in the plan's order, the source services this run stopped; every start is tried."""
        rt = runtime(ctx)
        stopped = set(ctx.saved(STOPPED_SERVICES) or [])
        started = run_services(
            ctx, rt.source, [s for s in rt.plan.services.source if s.name in stopped], "start",
            event="finish.source_service_started", keep_going=True,
        )  # fmt: skip
        if started.failures:
            raise StepError("starting the source's services again failed: " + "; ".join(started.failures))
