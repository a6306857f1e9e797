"""Audit (after the commit, shutdown mode): row counts and CHECKSUM TABLE of every table, target against source.

These read every row, so they stay out of the downtime window. The target's side is read in the consistent snapshot
verify_target opened while the target was still fenced (the data exactly as migrated, whatever it took since); the
source's on the stopped source, which the engine starts read-only and isolated for the audit and stops again
(`Database.isolated_figures`; MariaDB's: orchestrator/database/mysql/audit.py). Both sides are read at the same time.

The run is committed: nothing here rolls back. A difference is reported loudly instead, naming each table (the run's
report, `migrate status`, and the exit code NEEDS_ATTENTION); so is an audit that could not read a side
("incomplete": nothing was proven). An operator then knows which tables to look at while the source's datadir is
still exactly as the clean shutdown left it. A run resumed by another process has no snapshot to read: the audit says
it did not run, and why.

Replicate mode (`Replication.audit_chunks`; MariaDB's: orchestrator/database/mysql/audit.py): the target's snapshot
was opened by verify_target on the promoted, still fenced target; the source is read-only at the final position the
switch journaled (proven again here). Both are compared over the primary-key chunks repl_catchup compares with; a
difference names the table and the chunk. It catches what the switch's GTID proof cannot: a change made on the
replica after repl_catchup's comparison without reaching the binary log. The source then replicates from the target
in finish (reverse replication), after this step.
"""

from __future__ import annotations

import contextvars
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.database.protocol import AuditCutShort, ChunkedAudit
from orchestrator.engine.step import Step, StepContext
from orchestrator.results import AuditResult, CutoverResult, SwitchResult
from orchestrator.services import audit
from orchestrator.steps.common import resolved_datadir
from orchestrator.steps.modes import SHUTDOWN, CutoverMode
from orchestrator.steps.repl_common import SWITCH_STEP, replication

Figures = tuple[dict[str, int], dict[str, int | None]]
# Journaled before the source is started for the audit (its private directory), cleared once it stopped.
ISOLATED_SOURCE = "isolated_source"
LOG_EVERY = 2.0


class Audit(Step):
    name = "audit"
    title = "Audit (after the commit): row counts and checksums of every table, target snapshot against the source"

    def __init__(self, *, mode: CutoverMode = SHUTDOWN) -> None:
        self.mode = mode

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        verify = plan.database.verify
        if not (verify.row_counts or verify.checksum):
            return ["database.verify asks for neither row counts nor checksums: nothing to audit"]
        return self.mode.describe_audit(plan)

    def check(self, ctx: StepContext) -> bool:
        return False

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        verify = rt.plan.database.verify
        if not (verify.row_counts or verify.checksum):
            return AuditResult(status="off", reason="database.verify asks for neither",
                               method=self.mode.audit_method).journal()  # fmt: skip
        held = audit.forget(rt)
        try:
            result = self.mode.audit(ctx, self, held)
        finally:
            if held.snapshot is not None:
                rt.release(held.snapshot)  # ends the snapshot's transaction: the target's purge goes on
        result.checksum_name = rt.database.checksum_name
        log = ctx.log.warning if result.status != "equal" else ctx.log.info
        log("audit", status=result.status, reason=result.reason, tables=result.tables, rows=result.rows,
            chunks=result.chunks, seconds=result.seconds, differences=result.differences[:20],
            live_differences=result.live_differences[:20])  # fmt: skip
        return result.journal()

    def audit_figures(self, ctx: StepContext, held: audit.Held) -> AuditResult:
        """Shutdown mode: the held target snapshot's figures against the stopped source's, side by side."""
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

        database = rt.database
        launch = held.source

        def _target() -> Figures:
            began = time.monotonic()
            try:
                return database.snapshot_figures(snapshot, tables, timeout=audit.READ_TIMEOUT, **wanted)
            finally:
                timing["target"] = round(time.monotonic() - began, 3)

        def _source() -> Figures:
            return self._source(ctx, launch, tables, wanted)

        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit") as pool:
                target_future = pool.submit(contextvars.copy_context().run, _target)
                began = time.monotonic()
                try:
                    source = _source()
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

    def audit_chunks(self, ctx: StepContext, held: audit.Held) -> AuditResult:
        """Replicate mode: the held target snapshot against the read-only source, chunk by chunk."""
        rt = runtime(ctx)
        final_text = SwitchResult.of(ctx.output(SWITCH_STEP)).final_gtid
        if held.snapshot is None:
            return AuditResult(method="chunks", status="not_run", reason="no snapshot of the target: the process "
                               "that opened it at the promotion is gone (the run was resumed); the target has taken "
                               "writes since the commit, so it is not compared now")  # fmt: skip
        if not final_text:
            return AuditResult(method="chunks", status="not_run", reason="the switch journaled no final position")
        rep = replication(rt)
        final = rep.parse_position(final_text)
        settings = rt.plan.replication
        chunk_rows = settings.chunk_rows if settings else 2000
        pause = settings.compare_pause if settings else 0.0
        started = time.monotonic()
        last_log = 0.0

        def _progress(table: str, done: int, total: int) -> None:
            nonlocal last_log
            now = time.monotonic()
            if now - last_log >= LOG_EVERY or done == total:
                last_log = now
                ctx.log.info("audit.progress", table=table, chunk=done, of=total)

        def _compare_started(tables: int) -> None:
            ctx.log.info("audit.compare_started", tables=tables, at=str(final), chunk_rows=chunk_rows)

        source = None
        try:
            source = rt.db("source", read_timeout=audit.READ_TIMEOUT)
            found = rep.audit_chunks(held.snapshot, source, final, rt.plan.database.schemas, chunk_rows=chunk_rows,
                                     pause_ratio=pause, timeout=audit.READ_TIMEOUT, on_start=_compare_started,
                                     on_chunk=_progress)  # fmt: skip
        except AuditCutShort as exc:
            return AuditResult(method="chunks", status="incomplete", reason=str(exc), at_gtid=str(final),
                               seconds=round(time.monotonic() - started, 3))  # fmt: skip
        except Exception as exc:  # committed: any failure is reported, never raised
            return AuditResult(method="chunks", status="incomplete", reason=f"{type(exc).__name__}: {exc}",
                               at_gtid=str(final), seconds=round(time.monotonic() - started, 3))  # fmt: skip
        finally:
            if source is not None:
                rt.release(source)
        return self._compare_chunks(found, final).model_copy(update={"seconds": round(time.monotonic() - started, 3)})

    @staticmethod
    def _compare_chunks(found: ChunkedAudit, final: Any) -> AuditResult:
        """The verdict: a differing chunk of a transactional table is a difference; of another engine (read live,
        outside the snapshot), reported apart as maybe a write since the commit."""
        lines = [(d.table, d.describe()) for d in found.differences]
        lines += [(table, f"{table}: missing on the target") for table in found.missing]
        live = [text for table, text in lines if not audit.transactional(found.engines.get(table, "innodb"))]
        lost = [text for _, text in lines if text not in live]
        unread = sorted(found.unread)
        status = "differs" if lost else "incomplete" if unread else "equal"
        reason = (f"{len(unread)} table(s) could not be compared: "
                  + "; ".join(f"{t} ({found.unread[t]})" for t in unread[:5])) if unread else None  # fmt: skip
        return AuditResult(method="chunks", status=status, reason=reason, tables=found.tables, chunks=found.chunks,
                           rows=found.rows, at_gtid=str(final), differences=lost, live_differences=live)  # fmt: skip

    def _source(
        self, ctx: StepContext, launch: audit.ServerLaunch, tables: list[str], wanted: dict[str, bool]
    ) -> Figures:
        """The stopped source, started read-only and isolated, read, and stopped again (whatever happened). Its
        directory is journaled before it starts: a run that dies meanwhile stops it the next time."""
        rt = runtime(ctx)

        def _started(directory: str | None) -> None:
            ctx.save(ISOLATED_SOURCE, directory)
            if directory is None:
                ctx.log.info("audit.source_stopped")
            else:
                ctx.log.info("audit.source_starting", binary=launch.binary, directory=directory)

        return rt.database.isolated_figures(rt.source, launch, resolved_datadir(ctx, "source"), tables,
                                            timeout=audit.READ_TIMEOUT, started=_started, **wanted)  # fmt: skip

    def stop_left_over(self, ctx: StepContext) -> None:
        """A source server an earlier (dead) run of this step started for the audit is stopped first."""
        directory = ctx.saved(ISOLATED_SOURCE)
        if not directory:
            return
        try:
            rt = runtime(ctx)
            rt.database.stop_isolated(rt.source, str(directory))
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
