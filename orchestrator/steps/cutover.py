"""Cut-over (shutdown mode): writes stop on the source and its database is shut down cleanly.

A file copy of a running InnoDB is not consistent even under FLUSH TABLES WITH READ LOCK (purge, page
flushing and change-buffer merges keep writing), so the lock only freezes SQL writes long enough to record
the final figures; the source database is then shut down cleanly, and the next step (`db_final`) copies a
datadir nothing is writing any more.

Order, each fact journaled BEFORE the action it protects, so a crash at any point leaves a state undo can
repair and a re-run can continue from: fence the service (`writes_blocked_at`) → FTWRL (bounded wait, retried
with backoff) → binlog position and row counts under the lock (`final_state`) → clean shutdown of the source
database (`source_db_stopped`). A re-run reuses each journaled fact: the figures read under the lock stand once
the shutdown began (a stopped database has none to give), and the stop is idempotent.

"Stopped" is proven, not assumed: a stop command may return while the server is still shutting down (MariaDB
closes client connections early, before InnoDB has flushed), so after it the step waits until no process on
the source holds the datadir's InnoDB files open. Everything after the fence is bounded by the downtime window.
The SQL lives in `transports.mysql`, the host probes in `orchestrator.probes`.
"""

from __future__ import annotations

import time
from typing import Any

import pymysql

from orchestrator import frontdoor, probes
from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.results import CutoverResult, FinalState, LockFigures
from orchestrator.steps.common import wait_db_answers
from orchestrator.transports import mysql
from orchestrator.transports.ssh import TransportError

SOURCE_DB_START_TIMEOUT = 120.0
# How often the source is asked whether anything still holds the datadir's InnoDB files open.
RELEASE_POLL_INTERVAL = 0.05
MODE_REASON = (
    "a file copy of a running InnoDB is not consistent under FLUSH TABLES WITH READ LOCK; the source "
    "database is stopped cleanly while writes are blocked and the final pass copies its quiet datadir"
)
# Journaled facts (step_saved keys).
FENCED = "fenced"
WRITES_BLOCKED_AT = "writes_blocked_at"
FINAL_STATE = "final_state"
SOURCE_DB_STOPPED = "source_db_stopped"


def backoff_delays(attempts: int, first: float) -> list[float]:
    """Seconds to wait after each failed attempt but the last: first, 2*first, 4*first, ..."""
    return [first * (2**i) for i in range(max(attempts - 1, 0))]


class Cutover(Step):
    name = "cutover"
    title = "Cut-over: fence, lock, final figures, clean shutdown of the source database"
    begins_downtime = True

    def __init__(self) -> None:
        self._lock_conn: pymysql.connections.Connection | None = None
        self._datadir = ""
        # The database server's processes, seen holding its InnoDB files before the stop: they must be gone after.
        self._server_pids: set[int] = set()

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        c = plan.cutover
        fence = plan.services.fence.enable
        return [
            f"on {plan.source.address}: fence the service: {fence}"
            if fence
            else "no fence command: writes are blocked by the database lock only",
            f"FLUSH TABLES WITH READ LOCK on the source database, waiting at most {c.lock_wait_timeout:g} s, "
            f"{c.lock_attempts} tries with backoff from {c.lock_retry_backoff:g} s",
            "under the lock: binlog position, row counts of every table"
            + (" and CHECKSUM TABLE" if plan.database.verify.checksum else ""),
            f"on {plan.source.address}: stop the source database cleanly: {plan.database.source.stop}",
            f"writes may stay blocked at most {c.max_write_block:g} s (cutover.max_write_block)",
            *frontdoor.describe(ctx, "source"),
        ]

    def check(self, ctx: StepContext) -> bool:
        return False  # never skipped: a re-run continues from the journaled facts and the stop is idempotent

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        self._datadir = probes.real_datadir(rt.source, rt.plan.database.source.datadir)
        # Figures read under the lock stand only once the shutdown began: before that the lock may have been
        # lost with a crashed process, and writes may have followed.
        journaled = FinalState.of(ctx.saved(FINAL_STATE)) if ctx.saved(SOURCE_DB_STOPPED) else None
        result = CutoverResult(
            mode=rt.plan.cutover.mode,
            mode_reason=MODE_REASON,
            # Measured before writes stop: one round trip less inside the window.
            source_clock_offset=round(probes.clock_offset(rt.source), 6),
        )
        try:
            if journaled is not None:
                ctx.log.info("cutover.resume_after_shutdown")
            final = journaled if journaled is not None else self._freeze(ctx)
            # Counted from the first fence, on a re-run too.
            result.writes_blocked_at = ctx.window.begin(float(ctx.saved(WRITES_BLOCKED_AT)))
            ctx.save(SOURCE_DB_STOPPED, True)
            result.shutdown_seconds = self._stop_source_db(ctx)
        finally:
            self._release_lock()
        ctx.window.check("finishing the cut-over's shutdown")
        merged = CutoverResult.model_validate({**result.model_dump(exclude_none=True), **final.journal()})
        merged.write_block_seconds_so_far = round(time.time() - float(result.writes_blocked_at or 0), 3)
        return merged.journal()

    def undo(self, ctx: StepContext) -> None:
        rt = runtime(ctx)
        plan = rt.plan
        self._release_lock()
        frontdoor.keep_holding_for_rollback(ctx)
        if ctx.saved(SOURCE_DB_STOPPED):
            # A stop cut short (by the budget) may still be under way: let it finish first, or the start finds the
            # server still answering, and the shutdown completes after the rollback, leaving the source down.
            ctx.log.info("cutover.undo.finish_stop", command=plan.database.source.stop)
            rt.source.run(plan.database.source.stop, timeout=SOURCE_DB_START_TIMEOUT)
            ctx.log.info("cutover.undo.start_source_db", command=plan.database.source.start)
            rt.source.run(plan.database.source.start, timeout=SOURCE_DB_START_TIMEOUT)
            wait_db_answers(ctx, "source", SOURCE_DB_START_TIMEOUT, refusal_is_up=True)
            ctx.save(SOURCE_DB_STOPPED, False)
        if ctx.saved(FENCED) and plan.services.fence.disable:
            ctx.log.info("cutover.undo.lift_fence", command=plan.services.fence.disable)
            rt.source.run(plan.services.fence.disable, timeout=60)
            ctx.save(FENCED, False)
        # Held requests go to the source, which takes writes again.
        frontdoor.release_source(ctx)

    # -- the sequence

    def _freeze(self, ctx: StepContext) -> FinalState:
        """Fence, lock, and read the source's final figures under the lock (journaled before the shutdown)."""
        rt = runtime(ctx)
        # The lock's session is opened while writes still flow: connecting is not part of the window.
        conn = self._open_lock_session(ctx)
        # Before the window too: proving the shutdown later needs the server's open files to be visible.
        self._server_pids, blind = probes.innodb_files_visible(rt.source, self._datadir)
        if blind:
            raise StepError(blind)
        self._fence(ctx)
        final = self._final_state(ctx, self._take_lock(ctx, conn))
        ctx.save(FINAL_STATE, final.journal())
        ctx.window.check("about to stop the source database")
        return final

    def _fence(self, ctx: StepContext) -> float:
        rt = runtime(ctx)
        fence = rt.plan.services.fence.enable
        saved_at = ctx.saved(WRITES_BLOCKED_AT)
        # Counted from just before the fence goes up (the conservative end); on a re-run, from the first fence.
        blocked_at = float(saved_at) if saved_at else time.time()
        if fence:
            ctx.save(FENCED, True)
        if not saved_at:
            ctx.save(WRITES_BLOCKED_AT, blocked_at)
        # The front door holds new requests before the fence would refuse them (plan section `proxy`).
        frontdoor.hold_source(ctx, blocked_at)
        if fence:
            rt.source.run(fence, timeout=60)
        ctx.window.begin(blocked_at)
        ctx.log.info("cutover.fenced", fence=bool(fence))
        return blocked_at

    def _open_lock_session(self, ctx: StepContext) -> pymysql.connections.Connection:
        rt = runtime(ctx)
        c = rt.plan.cutover
        # The session must outlive the longest lock wait: a client read timeout would drop it (and the lock).
        conn = rt.db("source", read_timeout=max(rt.plan.database.read_timeout, c.lock_wait_timeout + 30))
        self._lock_conn = conn
        mysql.set_lock_wait_timeout(conn, c.lock_wait_timeout)
        return conn

    def _take_lock(self, ctx: StepContext, conn: pymysql.connections.Connection) -> LockFigures:
        c = runtime(ctx).plan.cutover
        delays = backoff_delays(c.lock_attempts, c.lock_retry_backoff)
        waited = 0.0
        last_blockers: list[mysql.Blocker] = []
        last_in_use: list[str] = []
        for attempt in range(1, c.lock_attempts + 1):
            asked = time.monotonic()
            try:
                locked = mysql.flush_tables_with_read_lock(conn)
            except mysql.DbError as exc:
                raise StepError(str(exc)) from None
            waited += time.monotonic() - asked
            if locked:
                ctx.log.info("cutover.locked", attempt=attempt, lock_wait_s=round(waited, 3))
                return LockFigures(
                    lock_attempts=attempt, lock_wait_seconds=round(waited, 3), lock_acquired_at=time.time()
                )
            last_blockers = mysql.find_blockers(conn)
            last_in_use = mysql.tables_in_use(conn)
            ctx.log.warning(
                "cutover.lock_wait_timeout",
                attempt=attempt,
                of=c.lock_attempts,
                waited_s=round(waited, 3),
                blocked_by=[b.summary() for b in last_blockers],
                tables_in_use=last_in_use,
            )
            if attempt <= len(delays):
                ctx.window.check(f"waiting for FLUSH TABLES WITH READ LOCK ({attempt} tries)")
                time.sleep(delays[attempt - 1])
        raise StepError(
            f"could not get FLUSH TABLES WITH READ LOCK in {c.lock_attempts} tries of "
            f"{c.lock_wait_timeout:g} s: blocked by {mysql.summarize_blockers(last_blockers, last_in_use)}"
        )

    def _final_state(self, ctx: StepContext, lock: LockFigures) -> FinalState:
        rt = runtime(ctx)
        window = ctx.window
        conn = self._lock_conn
        assert conn is not None
        started = time.monotonic()
        doing = "reading the source's final figures"

        def _limit(table: str) -> float | None:
            # One query per table, each bounded by what is left of the budget (a query cut short closes the
            # lock's session, which releases the lock: the step fails and undo lifts the fence).
            window.check(f"{doing}: {table}")
            return window.timeout()

        checksums: dict[str, int | None] | None = None
        try:
            tables = mysql.list_tables(conn, rt.plan.database.schemas)
            binlog = mysql.binlog_position(conn)
            doing = "counting the source's rows under the lock"
            counts = dict(mysql.row_counts(conn, tables, limit=_limit))
            if rt.plan.database.verify.checksum:
                doing = "checksumming the source's tables under the lock"
                checksums = dict(mysql.checksums(conn, tables, limit=_limit))
        except pymysql.err.MySQLError:
            window.check(doing)  # a query cut short by the budget: say so
            raise
        state = FinalState.model_validate(
            {
                **lock.model_dump(exclude_none=True),
                "binlog": binlog,
                "row_counts": counts,
                "checksums": checksums,
                "final_state_seconds": round(time.monotonic() - started, 3),
            }
        )
        ctx.log.info("cutover.final_state", tables=len(tables), binlog=binlog)
        return state

    def _stop_source_db(self, ctx: StepContext) -> float:
        rt = runtime(ctx)
        endpoint = rt.plan.database.source
        started = time.monotonic()
        try:
            rt.source.run(endpoint.stop, timeout=ctx.window.timeout(rt.plan.database.read_timeout + 300))
        except TransportError:
            ctx.window.check("stopping the source database")  # cut short by the budget: say so
            raise
        # First the files (a stop command may return while the server is still shutting down, and a server
        # about to close its connections may still answer), then the server itself must be gone.
        self._wait_innodb_released(ctx)
        if self._source_db_answers(ctx):
            raise StepError(
                f"the source database is still running after its stop command ({endpoint.stop}): it still"
                " answers; writes stay blocked"
            )
        seconds = round(time.monotonic() - started, 3)
        ctx.log.info("cutover.source_db_stopped", seconds=seconds)
        return seconds

    def _wait_innodb_released(self, ctx: StepContext) -> None:
        """Wait until no process on the source holds the datadir's InnoDB files open, within the budget.

        A stop command may return before the server is gone (it only signalled it, or gave up waiting): until
        then InnoDB may still be flushing, and a copy of the datadir would not be consistent. The server's
        processes seen before the stop must have exited too (after closing InnoDB, a server still closes its
        binary and Aria logs in the datadir). When the budget runs out, the error names who still holds them.
        """
        rt = runtime(ctx)
        window = ctx.window
        stop = rt.plan.database.source.stop
        started = time.monotonic()
        polls = 0
        holders: dict[int, set[str]] = {}

        def _still_running() -> StepError:
            seen = probes.describe_holders(holders) if holders else "its files could not be checked"
            return StepError(
                f"the source database is still running after its stop command ({stop}): {seen} after"
                f" {time.monotonic() - started:.1f} s, and the write-block budget (cutover.max_write_block"
                f" {rt.plan.cutover.max_write_block:g} s) is spent"
            )

        while True:
            try:
                holders = probes.innodb_holders(
                    rt.source, self._datadir, timeout=window.timeout(), pids=self._server_pids
                )
            except TransportError:
                remaining = window.remaining()
                if polls and remaining is not None and remaining <= 0:
                    raise _still_running() from None
                window.check("waiting for the source database to stop")
                raise
            polls += 1
            if not holders:
                ctx.log.info("cutover.innodb_released", waited_s=round(time.monotonic() - started, 3), polls=polls)
                return
            remaining = window.remaining()
            if remaining is None or remaining <= 0:
                raise _still_running()
            time.sleep(min(RELEASE_POLL_INTERVAL, remaining))

    def _source_db_answers(self, ctx: StepContext) -> bool:
        conn = self._lock_conn
        if conn is not None:
            # The session holding the lock dies with the server: a live session means it is still up.
            return mysql.session_alive(conn)
        return runtime(ctx).db_answers("source")

    def _release_lock(self) -> None:
        conn, self._lock_conn = self._lock_conn, None
        if conn is not None:
            mysql.close_quietly(conn)  # closing the session releases FTWRL
