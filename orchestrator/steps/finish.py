"""Finish: the source stays fenced (or its services stop), traffic drains, and the run report is written."""

from __future__ import annotations

import time
from typing import Any

from orchestrator.engine.step import Step, StepContext
from orchestrator.report import build_report


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
        stopped: list[str] = []
        if plan.finish.source == "stop":
            for service in plan.services.source:
                rt.source.run(service.stop, timeout=300)
                stopped.append(service.name)
                ctx.log.info("finish.source_service_stopped", service=service.name)
        # The full report (this step included) is written by the command line once the run has ended.
        report = build_report(ctx.history(), now=time.time())
        return {
            "source": plan.finish.source,
            "source_services_stopped": stopped,
            "write_block_seconds": report.get("write_block_seconds"),
            "bytes_moved": report.get("bytes_moved"),
        }
