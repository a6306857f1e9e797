"""Prepare the target: stop its services and its database, so the copies land on a quiet datadir."""

from __future__ import annotations

from typing import Any

from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.transports.ssh import TransportError

STOP_TIMEOUT = 300.0


class PrepareTarget(Step):
    name = "prepare_target"
    title = "Stop the target's services and database"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = ctx.rt.plan
        if not plan.services.stop_target_first:
            return ["leave the target as it is (services.stop_target_first is false)"]
        lines = [f"on the target ({plan.target.address}): stop service {s.name}: {s.stop}"
                 for s in reversed(plan.services.target)]  # fmt: skip
        lines.append(f"on the target: stop the database: {plan.database.target.stop}")
        return lines

    def check(self, ctx: StepContext) -> bool:
        if not ctx.rt.plan.services.stop_target_first:
            return True
        return not ctx.rt.db_answers("target")

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = ctx.rt
        plan = rt.plan
        if not plan.services.stop_target_first:
            ctx.log.info("target_left_running", reason="services.stop_target_first is false")
            return {"stopped": []}
        stopped = []
        try:
            for service in reversed(plan.services.target):
                rt.target.run(service.stop, timeout=STOP_TIMEOUT)
                ctx.log.info("target_service_stopped", service=service.name)
                stopped.append(service.name)
            rt.target.run(plan.database.target.stop, timeout=STOP_TIMEOUT)
        except TransportError as exc:
            raise StepError(f"stopping the target failed: {exc}") from None
        if rt.db_answers("target"):
            raise StepError("the target database still answers after its stop command: check database.target.stop")
        ctx.log.info("target_database_stopped")
        return {"stopped": [*stopped, "database"]}
