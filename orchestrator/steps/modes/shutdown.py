"""The shutdown cut-over mode: the source database stopped cleanly under the lock, its quiet datadir's delta copied,
the target started inside the window; the audit reads the stopped source, started read-only and isolated."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.contracts import StepRuntime, runtime
from orchestrator.engine.step import StepContext, StepError
from orchestrator.plan.model import Plan
from orchestrator.results import AuditResult, VerifyResult
from orchestrator.services import audit, estimates, health
from orchestrator.services.health import HealthCheck
from orchestrator.steps.modes.base import AuditKit, CutoverMode, VerifyKit


class Shutdown(CutoverMode):
    name = "shutdown"
    # Pre-sync the live datadir, stop the source database cleanly under the lock, copy its quiet datadir's delta.
    own_steps: tuple[str, ...] = ("db_presync", "cutover", "db_final")
    audit_method = "figures"

    def probes_replication(self, declared: str) -> bool:
        return declared == "auto"  # to say why auto chose this mode

    def requirement_problems(self, found: list[str], app_users: Callable[[], list[str]]) -> list[str]:
        return []

    def describe_start(self, ctx: StepContext, lines: Callable[[], list[str]]) -> list[str]:
        return lines()

    def start_target(self, ctx: StepContext, start: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        return start()

    def undo_start(self, ctx: StepContext, stop: Callable[[], None]) -> None:
        stop()

    def inside_checks(self, plan: Plan) -> list[HealthCheck]:
        return health.checks_for(plan.health, health.INSIDE, replicate=False)

    def describe_verify(self, ctx: StepContext, checks: list[str], trees: list[str]) -> list[str]:
        verify = runtime(ctx).plan.database.verify
        lines = list(checks)
        if verify.row_counts or verify.checksum:
            lines.append(
                "open a read-only consistent snapshot on the fenced target and keep it: the audit after the commit"
                " compares its " + " and ".join(n for n, on in (("row counts", verify.row_counts),
                                                                  ("CHECKSUM TABLE", verify.checksum)) if on)
                + " of every table with the stopped source's (nothing inside the window reads whole tables)"
            )  # fmt: skip
        return lines + trees

    def open_audit_snapshot(self, conn: Any, schemas: list[str] | None, database: Any) -> dict[str, str] | None:
        return database.open_snapshot(conn, schemas)

    def verify(self, ctx: StepContext, kit: VerifyKit) -> dict[str, Any]:
        # The three checks are independent and each takes time inside the downtime window: run them side by side
        # (the database and the trees in threads, carrying the log context; the health checks here). Each is
        # bounded by the budget, so leaving the pool (which waits for both threads) is bounded too.
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="verify") as pool:
            db_future = pool.submit(contextvars.copy_context().run, kit.snapshot, ctx)
            trees_future = pool.submit(contextvars.copy_context().run, kit.trees, ctx)
            tries, problems = kit.health(ctx)
            db_figures, db_problems = db_future.result()
            tree_figures, tree_problems = trees_future.result()
        problems += db_problems + tree_problems
        if problems:
            raise StepError(f"verify_target: {len(problems)} problem(s): " + "; ".join(problems))
        ctx.window.check("the data verification")
        result = VerifyResult(health_tries=tries, **db_figures, **tree_figures)
        ctx.log.info("target_verified", audit_snapshot=result.audit_snapshot_at is not None)
        return result.journal()

    def describe_audit(self, plan: Plan) -> list[str]:
        verify = plan.database.verify
        what = " and ".join(
            n for n, on in (("row counts", verify.row_counts), ("CHECKSUM TABLE", verify.checksum)) if on
        )
        return [
            f"{what} of every table in the target's snapshot (opened before its fence lifted), side by side with",
            f"the stopped source on {plan.source.address} started read-only and isolated (no network, a private "
            "socket, InnoDB read-only, no binary log), stopped again after",
            "a difference is reported naming the table (report, status, exit code 4): the run is committed",
        ]

    def audit(self, ctx: StepContext, kit: AuditKit, held: audit.Held) -> AuditResult:
        kit.stop_left_over(ctx)  # a source an earlier (dead) try started for the audit
        return kit.audit_figures(ctx, held)

    # -- the estimate
    def database_transfer(self, rt: StepRuntime) -> estimates.TransferEstimate:
        return estimates.datadir_estimate(rt)

    def window_shell(self, host: Any) -> bool:
        return False

    def health_rounds(self, rt: StepRuntime) -> tuple[list[float], str]:
        return estimates.health_rounds(rt)  # the target starts inside the window: aimed at the source

    def datadir_delta(self, rt: StepRuntime) -> tuple[int, float]:
        return estimates.datadir_delta(rt)

    def window_parts(self, basis: estimates.WindowBasis) -> list[estimates.WindowPart]:
        return estimates.shutdown_window(basis)

    def measure_compare(self, rt: StepRuntime) -> tuple[float, int] | None:
        return None

    def before_parts(self, units: estimates.UnitCosts, plan: Plan,
                     compare: tuple[float, int] | None) -> list[estimates.WindowPart]:  # fmt: skip
        return []
