"""Start the target: its database (waiting until it answers), then its services, in the plan's order, then lift the
target's own fence when the plan declares one (a host fenced before, like the old source in a reverse run, takes
writes again)."""

from __future__ import annotations

import time
from typing import Any

from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.steps.files_final import blocked_since
from orchestrator.transports import mysql
from orchestrator.transports.ssh import TransportError

COMMAND_TIMEOUT = 300.0
DB_READY_TIMEOUT = 120.0
POLL_INTERVAL = 0.5


def wait_db_answers(ctx: StepContext, timeout: float) -> float:
    """Seconds until the target database answered; StepError when it does not within `timeout`."""
    started = time.monotonic()
    while True:
        try:
            conn = ctx.rt.db("target", retry=False, read_timeout=10.0)
            ctx.rt.release(conn)
            return time.monotonic() - started
        except mysql.DbError as exc:
            if exc.server_answered:
                # It runs but refuses us: waiting will not help.
                raise StepError(f"the target database answers but refuses the connection: {exc}") from None
        if time.monotonic() - started > timeout:
            raise StepError(
                f"the target database did not answer within {timeout:.0f} s of its start command: see its error log"
            )
        time.sleep(POLL_INTERVAL)


class StartTarget(Step):
    name = "start_target"
    title = "Start the target's database and services"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = ctx.rt.plan
        lines = [f"on the target ({plan.target.address}): start the database: {plan.database.target.start},"
                 " then wait until it answers"]  # fmt: skip
        lines += [f"on the target: start service {s.name}: {s.start}" for s in plan.services.target]
        if plan.services.target_fence.disable:
            lines.append(f"on the target: lift its fence: {plan.services.target_fence.disable}")
        return lines

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = ctx.rt
        plan = rt.plan
        since = blocked_since(ctx)
        rt.budget.check("starting the target database", since)
        try:
            rt.target.run(plan.database.target.start, timeout=COMMAND_TIMEOUT)
        except TransportError as exc:
            raise StepError(f"starting the target database: {exc}") from None
        remaining = rt.budget.remaining(since)
        wait_limit = DB_READY_TIMEOUT if remaining is None else max(1.0, min(DB_READY_TIMEOUT, remaining))
        ready_seconds = wait_db_answers(ctx, wait_limit)
        ctx.log.info("target_database_ready", seconds=round(ready_seconds, 3))
        rt.budget.check("waiting for the target database", since)
        started = []
        for service in plan.services.target:
            try:
                rt.target.run(service.start, timeout=COMMAND_TIMEOUT)
            except TransportError as exc:
                raise StepError(f"starting target service {service.name}: {exc}") from None
            ctx.log.info("target_service_started", service=service.name)
            started.append(service.name)
            rt.budget.check(f"starting target service {service.name}", since)
        unfence = plan.services.target_fence.disable
        if unfence:
            try:
                rt.target.run(unfence, timeout=COMMAND_TIMEOUT)
            except TransportError as exc:
                raise StepError(f"lifting the target's fence: {exc}") from None
            ctx.log.info("target_fence_lifted")
        return {"db_ready_seconds": round(ready_seconds, 3), "services": started, "fence_lifted": bool(unfence)}

    def undo(self, ctx: StepContext) -> None:
        """Stop the services (reverse order), then the database; every stop is tried even if one fails.

        A lifted target fence is not put back: with its services stopped the target takes no writes anyway.
        """
        rt = ctx.rt
        plan = rt.plan
        failures = []
        for service in reversed(plan.services.target):
            try:
                rt.target.run(service.stop, timeout=COMMAND_TIMEOUT)
                ctx.log.info("target_service_stopped", service=service.name)
            except TransportError as exc:
                failures.append(f"service {service.name}: {exc}")
        try:
            rt.target.run(plan.database.target.stop, timeout=COMMAND_TIMEOUT)
            ctx.log.info("target_database_stopped")
        except TransportError as exc:
            failures.append(f"database: {exc}")
        if failures:
            raise StepError("stopping the target failed: " + "; ".join(failures))
