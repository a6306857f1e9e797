"""Finish: the source stays fenced (or its services stop), traffic drains, and the run report is written.

Each source service is journaled before it is stopped, so undo (`migrate rollback --discard-target-writes`) starts
exactly those again: the source then serves as before, once the cut-over's undo has started its database and
lifted its fence.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.report import build_report
from orchestrator.transports.ssh import TransportError

COMMAND_TIMEOUT = 300.0
# Names of the source services this run stopped (or was about to stop), journaled before each stop.
STOPPED_SERVICES = "source_services_stopped"


class Finish(Step):
    name = "finish"
    title = "Finish: leave the source fenced or stopped, drain, write the report"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = ctx.rt.plan
        if plan.finish.source == "stop":
            lines = [f"on {plan.source.address}: stop {s.name}: {s.stop}" for s in plan.services.source]
        else:
            lines = [f"the source {plan.source.address} stays fenced (refuses writes)"]
        if plan.finish.drain_seconds:
            lines.append(f"wait {plan.finish.drain_seconds:g} s for traffic to leave the source")
        lines.append("write the run report beside the journal")
        return lines

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = ctx.rt
        plan = rt.plan
        if plan.finish.drain_seconds:
            # Clients with a cached DNS answer still reach the source for up to the record's TTL.
            ctx.log.info("finish.drain", seconds=plan.finish.drain_seconds)
            time.sleep(plan.finish.drain_seconds)
        stopped: list[str] = list(ctx.saved(STOPPED_SERVICES) or [])
        if plan.finish.source == "stop":
            for service in plan.services.source:
                if service.name not in stopped:
                    # Journal first: a crash during the stop must still let undo start it again.
                    stopped.append(service.name)
                    ctx.save(STOPPED_SERVICES, stopped)
                try:
                    rt.source.run(service.stop, timeout=COMMAND_TIMEOUT)
                except TransportError as exc:
                    raise StepError(f"stopping source service {service.name}: {exc}") from None
                ctx.log.info("finish.source_service_stopped", service=service.name)
        # The full report (this step included) is written by the command line once the run has ended.
        report = build_report(ctx.history(), now=time.time())
        return {
            "source": plan.finish.source,
            "source_services_stopped": stopped,
            "write_block_seconds": report.get("write_block_seconds"),
            "bytes_moved": report.get("bytes_moved"),
        }

    def undo(self, ctx: StepContext) -> None:
        """Start again, in the plan's order, the source services this run stopped; every start is tried."""
        rt = ctx.rt
        stopped = set(ctx.saved(STOPPED_SERVICES) or [])
        failures: list[str] = []
        for service in rt.plan.services.source:
            if service.name not in stopped:
                continue
            try:
                rt.source.run(service.start, timeout=COMMAND_TIMEOUT)
                ctx.log.info("finish.source_service_started", service=service.name)
            except TransportError as exc:
                failures.append(f"service {service.name}: {exc}")
        if failures:
            raise StepError("starting the source's services again failed: " + "; ".join(failures))
