"""Prepare the target: stop its services and its database, so the copies land on a quiet datadir."""

from __future__ import annotations

from typing import Any

from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.results import PrepareTargetResult
from orchestrator.steps.common import COMMAND_TIMEOUT, run_services
from orchestrator.transports.ssh import TransportError


class PrepareTarget(Step):
    name = "prepare_target"
    title = "Stop the target's services and database"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        if not plan.services.stop_target_first:
            return ["leave the target as it is (services.stop_target_first is false)"]
        lines = [f"on the target ({plan.target.address}): stop service {s.name}: {s.stop}"
                 for s in reversed(plan.services.target)]  # fmt: skip
        lines.append(f"on the target: stop the database: {plan.database.target.stop}")
        return lines

    def check(self, ctx: StepContext) -> bool:
        rt = runtime(ctx)
        if not rt.plan.services.stop_target_first:
            return True
        return not rt.db_answers("target")

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        plan = rt.plan
        if not plan.services.stop_target_first:
            ctx.log.info("target_left_running", reason="services.stop_target_first is false")
            return PrepareTargetResult().journal()
        stopped = run_services(
            ctx, rt.target, reversed(plan.services.target), "stop", event="target_service_stopped",
            keep_going=False, kind="target service",
        )  # fmt: skip
        try:
            rt.target.run(plan.database.target.stop, timeout=COMMAND_TIMEOUT)
        except TransportError as exc:
            raise StepError(f"stopping the target failed: {exc}") from None
        if rt.db_answers("target"):
            raise StepError("the target database still answers after its stop command: check database.target.stop")
        ctx.log.info("target_database_stopped")
        return PrepareTargetResult(stopped=[*stopped.done, "database"]).journal()
