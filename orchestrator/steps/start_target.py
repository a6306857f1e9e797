"""Start the target: fence it first (when the plan says how), then its database (waiting until it answers), then
its services in the plan's order.

The target's fence stays up: health checks are reads and pass, but no client write is acknowledged on the target
before every DNS record points at it. The DNS flip lifts the fence once the last record is read back — that is
the commit point. Were the target to take writes earlier, a flip failing half-way would roll back and lose them.

Every command runs inside the downtime window, so its timeout is bounded by what is left of the write-block budget.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.steps.window import blocked_since
from orchestrator.transports import mysql
from orchestrator.transports.ssh import TransportError

COMMAND_TIMEOUT = 300.0
DB_READY_TIMEOUT = 120.0
POLL_INTERVAL = 0.5
# Journaled before the target's fence goes up, so a rollback or the DNS flip knows it was put there by this run.
TARGET_FENCED = "target_fenced"


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


def window_timeout(ctx: StepContext, since: float | None, limit: float = COMMAND_TIMEOUT) -> float:
    """`limit`, cut to what is left of the write-block budget (at least 1 s) while writes are blocked."""
    remaining = ctx.rt.budget.remaining(since)
    return limit if remaining is None else max(1.0, min(limit, remaining))


class StartTarget(Step):
    name = "start_target"
    title = "Start the target's database and services (fenced: no writes before the DNS flip)"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = ctx.rt.plan
        lines = []
        fence = plan.services.target_fence.enable
        if fence:
            lines.append(f"on the target ({plan.target.address}): fence it (refuse writes until the DNS flip): {fence}")
        lines.append(f"on the target ({plan.target.address}): start the database: {plan.database.target.start},"
                     " then wait until it answers")  # fmt: skip
        lines += [f"on the target: start service {s.name}: {s.start}" for s in plan.services.target]
        if not fence:
            lines.append("the plan declares no target fence: the target takes writes as soon as its services start")
        return lines

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = ctx.rt
        plan = rt.plan
        since = blocked_since(ctx)
        fence = plan.services.target_fence.enable
        if fence:
            rt.budget.check("fencing the target", since)
            ctx.save(TARGET_FENCED, True)
            try:
                rt.target.run(fence, timeout=window_timeout(ctx, since))
            except TransportError as exc:
                raise StepError(f"fencing the target: {exc}") from None
            ctx.log.info("target_fenced")
        rt.budget.check("starting the target database", since)
        try:
            rt.target.run(plan.database.target.start, timeout=window_timeout(ctx, since))
        except TransportError as exc:
            raise StepError(f"starting the target database: {exc}") from None
        ready_seconds = wait_db_answers(ctx, window_timeout(ctx, since, DB_READY_TIMEOUT))
        ctx.log.info("target_database_ready", seconds=round(ready_seconds, 3))
        rt.budget.check("waiting for the target database", since)
        started = []
        for service in plan.services.target:
            try:
                rt.target.run(service.start, timeout=window_timeout(ctx, since))
            except TransportError as exc:
                raise StepError(f"starting target service {service.name}: {exc}") from None
            ctx.log.info("target_service_started", service=service.name)
            started.append(service.name)
            rt.budget.check(f"starting target service {service.name}", since)
        return {"db_ready_seconds": round(ready_seconds, 3), "services": started, "target_fenced": bool(fence)}

    def undo(self, ctx: StepContext) -> None:
        """Stop the services (reverse order), then the database; every stop is tried even if one fails.

        The target's fence, when this run put it up, stays up: the target must not take writes a rolled-back
        migration would not carry anywhere (`migrate apply` puts it up again anyway).
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
