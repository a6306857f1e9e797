"""Audit (after the commit, shutdown mode): row counts and CHECKSUM TABLE of every table, target against source.

These read every row, so they stay out of the downtime window. The target's side is read in the consistent
snapshot verify_target opened while the target was still fenced (the data exactly as migrated, whatever it took
since); the source's on the stopped source, started read-only and isolated for the audit and stopped again
(orchestrator/audit.py). Both sides are read at the same time.

The run is committed: nothing here rolls back. A difference is reported loudly instead, naming each table (the run's
report, `migrate status`, and the exit code NEEDS_ATTENTION); so is an audit that could not read a side
("incomplete": nothing was proven). An operator then knows which tables to look at while the source's datadir is
still exactly as the clean shutdown left it. A run resumed by another process has no snapshot to read: the audit
says it did not run, and why.
"""

from __future__ import annotations

import contextvars
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator import audit
from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext
from orchestrator.results import AuditResult, CutoverResult
from orchestrator.steps.repl_common import replicate_run

Figures = tuple[dict[str, int], dict[str, int | None]]
# Journaled before the source is started for the audit (its private directory), cleared once it stopped.
ISOLATED_SOURCE = "isolated_source"


class Audit(Step):
    name = "audit"
    title = "Audit (after the commit): row counts and checksums of every table, target snapshot against the source"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        verify = plan.database.verify
        if replicate_run(ctx):
            return ["replicate mode: the tables were compared before the window (repl_catchup): nothing to audit"]
        if not (verify.row_counts or verify.checksum):
            return ["database.verify asks for neither row counts nor checksums: nothing to audit"]
        what = " and ".join(
            n for n, on in (("row counts", verify.row_counts), ("CHECKSUM TABLE", verify.checksum)) if on
        )
        return [
            f"{what} of every table in the target's snapshot (opened before its fence lifted), side by side with",
            f"the stopped source on {plan.source.address} started read-only and isolated (no network, a private "
            "socket, InnoDB read-only, no binary log), stopped again after",
            "a difference is reported naming the table (report, status, exit code 4): the run is committed",
        ]

    def check(self, ctx: StepContext) -> bool:
        return False

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        verify = rt.plan.database.verify
        if replicate_run(ctx):
            return AuditResult(status="not_needed", reason="replicate mode: compared before the window").journal()
        if not (verify.row_counts or verify.checksum):
            return AuditResult(status="off", reason="database.verify asks for neither").journal()
        self._stop_left_over(ctx)
        held = audit.forget(ctx.run_id) or audit.Held()
        try:
            result = self._audit(ctx, held)
        finally:
            if held.snapshot is not None:
                rt.release(held.snapshot)  # ends the snapshot's transaction: the target's purge goes on
        log = ctx.log.warning if result.status != "equal" else ctx.log.info
        log("audit", status=result.status, reason=result.reason, tables=result.tables,
            differences=result.differences[:20], live_differences=result.live_differences[:20])  # fmt: skip
        return result.journal()

    def _audit(self, ctx: StepContext, held: audit.Held) -> AuditResult:
        rt = runtime(ctx)
        verify = rt.plan.database.verify
        tables = CutoverResult.of(ctx.output("cutover")).tables
        if held.snapshot is None:
            return AuditResult(status="not_run", reason="no snapshot of the target: the process that opened it is "
                               "gone (the run was resumed); the target has taken writes since the commit")  # fmt: skip
        if tables is None:
            return AuditResult(status="not_run", reason="the cut-over journaled no list of tables")
        if held.source is None:
            why = (
                "the source server's command line was not read in this process (resumed after the source's "
                "shutdown began, or unreadable: see the cut-over's log): the source cannot be started for the audit"
            )
            return AuditResult(status="not_run", tables=len(tables), reason=why)
        started = time.monotonic()
        wanted = {"counts": verify.row_counts, "checksums": verify.checksum}
        timing: dict[str, float] = {}

        snapshot = held.snapshot  # not None: checked above (a closure would not see that)

        def _target() -> Figures:
            began = time.monotonic()
            try:
                return audit.snapshot_figures(snapshot, tables, **wanted)
            finally:
                timing["target"] = round(time.monotonic() - began, 3)

        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit") as pool:
                target_future = pool.submit(contextvars.copy_context().run, _target)
                began = time.monotonic()
                try:
                    source = self._source(ctx, held.source, tables, wanted)
                finally:
                    timing["source"] = round(time.monotonic() - began, 3)
                target = target_future.result()
        except Exception as exc:  # committed: any failure is reported, never raised
            return AuditResult(status="incomplete", tables=len(tables), reason=f"{type(exc).__name__}: {exc}",
                               seconds=round(time.monotonic() - started, 3))  # fmt: skip
        return self._compare(tables, held.engines, source, target, wanted).model_copy(
            update={"source_seconds": timing.get("source"), "target_seconds": timing.get("target"),
                    "seconds": round(time.monotonic() - started, 3)}
        )  # fmt: skip

    def _source(
        self, ctx: StepContext, launch: audit.ServerLaunch, tables: list[str], wanted: dict[str, bool]
    ) -> Figures:
        """The stopped source, started read-only and isolated, read, and stopped again (whatever happened). Its
        directory is journaled before it starts: a run that dies meanwhile stops it the next time."""
        rt = runtime(ctx)
        server = audit.private_dir(rt.source, launch)
        ctx.save(ISOLATED_SOURCE, server.directory)
        ctx.log.info("audit.source_starting", binary=launch.binary, directory=server.directory)
        try:
            audit.start_isolated(server, launch)
            return audit.source_figures(server, tables, **wanted)
        finally:
            audit.stop_isolated(server)
            ctx.save(ISOLATED_SOURCE, None)
            ctx.log.info("audit.source_stopped")

    def _stop_left_over(self, ctx: StepContext) -> None:
        """A source server an earlier (dead) run of this step started for the audit is stopped first."""
        directory = ctx.saved(ISOLATED_SOURCE)
        if not directory:
            return
        try:
            audit.stop_isolated(audit.IsolatedServer(runtime(ctx).source, str(directory)))
            ctx.save(ISOLATED_SOURCE, None)
            ctx.log.info("audit.left_over_source_stopped", directory=directory)
        except Exception as exc:  # committed: reported, never raised
            ctx.log.warning("audit.left_over_source_not_stopped", directory=directory, error=str(exc))

    def _compare(self, tables: list[str], engines: dict[str, str], source: Figures, target: Figures,
                 wanted: dict[str, bool]) -> AuditResult:  # fmt: skip
        source_counts, source_sums = source
        target_counts, target_sums = target
        unread = [t for t in tables if (wanted["counts"] and t not in source_counts)
                  or (wanted["checksums"] and t not in source_sums)]  # fmt: skip
        lines = []
        if wanted["counts"]:
            lines += audit.differences("row count", source_counts, target_counts)
        if wanted["checksums"]:
            lines += audit.differences("CHECKSUM TABLE", source_sums, target_sums)
        # A non-transactional table is outside the snapshot: read live, it may hold writes made since the commit.
        live = [line for line in lines if not audit.transactional(engines.get(line.split(": ", 1)[0], "innodb"))]
        lost = [line for line in lines if line not in live]
        status = "differs" if lost else "incomplete" if unread else "equal"
        reason = f"{len(unread)} table(s) could not be read on the source: {', '.join(unread[:5])}" if unread else None
        return AuditResult(status=status, reason=reason, tables=len(tables), row_counts=source_counts or None,
                           checksums_compared=len(source_sums), differences=lost, live_differences=live)  # fmt: skip
