"""Start the target: fence it first (when the plan says how), then its database (waiting until it answers), then
its services in the plan's order.

The target's fence stays up: health checks are reads and pass, but no client write is acknowledged on the target
before every DNS record points at it. The DNS flip lifts the fence once the last record is read back — that is
the commit point. Were the target to take writes earlier, a flip failing half-way would roll back and lose them.

Every command runs inside the downtime window, so its timeout is bounded by what is left of the write-block budget.
"""

from __future__ import annotations

import shlex
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.results import StartTargetResult
from orchestrator.steps.common import COMMAND_TIMEOUT, run_services, wait_db_answers
from orchestrator.steps.modes import SHUTDOWN, CutoverMode
from orchestrator.transports.ssh import TransportError

DB_READY_TIMEOUT = 120.0
# Journaled before the target's fence goes up, so a rollback or the DNS flip knows it was put there by this run.
TARGET_FENCED = "target_fenced"
# Journaled before the target's database start command runs: the lock that command holds on the target while it
# runs. An undo (in this process after an interruption, or in a later `migrate rollback` after a kill -9) waits for
# that lock, so it never stops a database that is still starting and then watches it come up behind its back.
DB_START_LOCK = "target_db_start_lock"


def start_lock_path(private_dir: str, run_id: str) -> str:
    """In the target's private directory (plan `run_dir`): no other account can hold or replace this lock."""
    return f"{private_dir.rstrip('/')}/migrate-db-start-{run_id}.lock"


def held_while_running(lock: str, command: str) -> str:
    """`command` run under an exclusive lock on `lock`, held by flock itself (-o: the database the command starts
    in the background does not inherit it) until the command ends, the lock file then removed; without flock on the
    host, the command alone. Its exit status is the command's."""
    quoted = shlex.quote(lock)
    return (
        f"if command -v flock >/dev/null 2>&1; then flock -o {quoted} sh -c {shlex.quote(command)}; rc=$?; "
        f"rm -f {quoted}; exit $rc; else sh -c {shlex.quote(command)}; fi"
    )


def wait_for_start_command(lock: str, seconds: float) -> str:
    """Returns once the start command holding `lock` has ended (or at once when none holds it), bounded in time;
    the lock file goes."""
    quoted = shlex.quote(lock)
    return (
        f"if command -v flock >/dev/null 2>&1 && [ -e {quoted} ]; then flock -w {int(seconds)} {quoted} true; "
        f"fi; rm -f {quoted}"
    )


class StartTarget(Step):
    name = "start_target"
    title = "Start the target's database and services (fenced: no writes before the DNS flip)"

    def __init__(self, *, mode: CutoverMode = SHUTDOWN) -> None:
        self.mode = mode

    def describe(self, ctx: StepContext) -> list[str]:
        return self.mode.describe_start(ctx, lambda: self._describe_start(ctx))

    def _describe_start(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
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
        return self.mode.start_target(ctx, lambda: self._start(ctx))

    def _start(self, ctx: StepContext) -> dict[str, Any]:
        """The target fenced, its database started (waited for), its services started in the plan's order."""
        rt = runtime(ctx)
        plan = rt.plan
        window = ctx.window

        def _timeout() -> float | None:
            return window.timeout(COMMAND_TIMEOUT)

        fence = plan.services.target_fence.enable
        if fence:
            window.check("fencing the target")
            ctx.save(TARGET_FENCED, True)
            try:
                rt.target.run(fence, timeout=_timeout())
            except TransportError as exc:
                raise StepError(f"fencing the target: {exc}") from None
            ctx.log.info("target_fenced")
        window.check("starting the target database")
        lock = start_lock_path(rt.plan.target.private_dir, ctx.run_id)
        ctx.save(DB_START_LOCK, lock)
        try:
            rt.target.run(held_while_running(lock, plan.database.target.start), timeout=_timeout())
        except TransportError as exc:
            raise StepError(f"starting the target database: {exc}") from None
        ready_seconds = wait_db_answers(ctx, "target", window.timeout(DB_READY_TIMEOUT) or DB_READY_TIMEOUT)
        ctx.log.info("target_database_ready", seconds=round(ready_seconds, 3))
        window.check("waiting for the target database")
        if rt.database.fence_in_data:
            self._open_database(ctx)
        started = run_services(
            ctx,
            rt.target,
            plan.services.target,
            "start",
            event="target_service_started",
            keep_going=False,
            kind="target service",
            timeout=_timeout,
            after=lambda service: window.check(f"starting target service {service.name}"),
        )
        return StartTargetResult(
            db_ready_seconds=round(ready_seconds, 3), services=started.done, target_fenced=bool(fence)
        ).journal()

    def _open_database(self, ctx: StepContext) -> None:
        """The source's database fence came with the copy (PostgreSQL's NOLOGIN roles): lifted here, so the app and
        its health checks can log in. Until the commit the app's own fence (services.target_fence) holds writes, as
        it does on a target whose database fence does not travel."""
        rt = runtime(ctx)
        conn = rt.db("target", read_timeout=ctx.window.timeout(COMMAND_TIMEOUT))
        try:
            roles = rt.database.lift_fence(conn)
        finally:
            rt.release(conn)
        ctx.log.info("target_database_fence_lifted", roles=roles)

    def undo(self, ctx: StepContext) -> None:
        """Stop the services (reverse order), then the database; every stop is tried even if one fails.

        The target's fence, when this run put it up, stays up: the target must not take writes a rolled-back
        migration would not carry anywhere (`migrate apply` puts it up again anyway). In replicate mode this step
        started nothing: the replica step's undo stops them.
        """
        self.mode.undo_start(ctx, lambda: self._stop(ctx))

    def _stop(self, ctx: StepContext) -> None:
        rt = runtime(ctx)
        plan = rt.plan
        stopped = run_services(
            ctx, rt.target, reversed(plan.services.target), "stop", event="target_service_stopped", keep_going=True
        )
        failures = stopped.failures
        lock = ctx.saved(DB_START_LOCK)
        try:
            if lock:
                # An interrupted start may still be starting the database: its stop must come after, not before.
                rt.target.run(wait_for_start_command(str(lock), DB_READY_TIMEOUT), timeout=DB_READY_TIMEOUT + 30)
            rt.target.run(plan.database.target.stop, timeout=COMMAND_TIMEOUT)
            # Its effect checked, not assumed: a database that still answers was not stopped.
            if lock and rt.db_answers("target"):
                failures.append("database: it still answers after its stop command")
            else:
                ctx.log.info("target_database_stopped")
        except TransportError as exc:
            failures.append(f"database: {exc}")
        if failures:
            raise StepError("stopping the target failed: " + "; ".join(failures))
