"""Cut-over (shutdown mode): writes stop on the source and its database is shut down cleanly.

A file copy of a running InnoDB is not consistent even under FLUSH TABLES WITH READ LOCK (purge, page
flushing and change-buffer merges keep writing), so the lock only freezes SQL writes long enough to record
the final figures; the source database is then shut down cleanly, and the next step (`db_final`) copies a
datadir nothing is writing any more.

Order, each fact journaled BEFORE the action it protects, so a crash at any point leaves a state undo can
repair and a re-run can continue from: the rollback's reserve (`rollback_reserve`) → fence the service
(`writes_blocked_at`) → FTWRL (bounded wait) → `read_only` on the source database (`source_read_only`: the
database itself refuses writes for the rest of the window, whatever becomes of our session or the app's fence) →
binlog position and the list of tables under the lock (`final_state`, O(1) and O(tables): no row is read while
writes are blocked) → clean shutdown of the source database (`source_db_stopped`). Row counts and checksums are the
after-commit audit's (steps/audit.py, orchestrator/services/audit.py); the server's command line, read before the
window, is what lets the audit start the stopped source again read-only and isolated.

Between lock attempts the fence is lifted and the service takes writes again (`writes_lifted_at`, then
`writes_blocked_again_at`): only the time writes are actually blocked counts against the budget, and nobody waits
through a backoff. `_block_writes` and `_let_writes_in` are the one place each that blocks and admits writes.

A re-run reuses the figures read under the lock only once it proves the source did not change since: after the
(idempotent) stop, the binary log must end where it ended under the lock (nothing but the shutdown's own stop
event after it). Otherwise the run fails, saying exactly what moved, and rolls back.

"Stopped" is proven, not assumed: a stop command may return while the server is still shutting down (MariaDB
closes client connections early, before InnoDB has flushed), so after it the step waits until no process on
the source holds the datadir's InnoDB files open. Everything after the fence is bounded by the downtime window.
The SQL lives behind `runtime(ctx).database` (the plan's engine), the host probes in `orchestrator.services.probes`.
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.database.protocol import Database, DatabaseError, Session
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.results import CutoverResult, DbPresyncResult, FinalState, LockFigures
from orchestrator.services import audit, estimates, frontdoor, guard, probes
from orchestrator.steps import source_guard
from orchestrator.steps.common import backoff_delays, resolved_datadir, wait_db_answers
from orchestrator.transports.ssh import TransportError
from orchestrator.window import BLOCKED_AGAIN_AT_KEY, LIFTED_AT_KEY, RESERVE_KEY, estimate_reserve, reserve_from

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
SOURCE_READ_ONLY = "source_read_only"
FENCE_COMMAND_TIMEOUT = 60.0
# A clean shutdown appends one stop event (19-byte header, 4-byte checksum) to the binary log: anything longer
# after the position journaled under the lock is a write that happened since.
STOP_EVENT_MAX_BYTES = 64


class Cutover(Step):
    name = "cutover"
    title = "Cut-over: fence, lock, final figures, clean shutdown of the source database"
    begins_downtime = True

    def __init__(self) -> None:
        self._lock_conn: Session | None = None
        self._lock_db: Database | None = None  # the engine that opened it
        self._datadir = ""
        # The database server's processes, seen holding its InnoDB files before the stop: they must be gone after.
        self._server_pids: set[int] = set()
        self._clock_offset = 0.0

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        c = plan.cutover
        fence = plan.services.fence.enable
        return [
            f"on {plan.source.address}: fence the service: {fence}"
            if fence
            else "no fence command: writes are blocked by the database lock only",
            f"{runtime(ctx).database.fence_name} on the source database, waiting at most {c.lock_wait_timeout:g} s, "
            f"{c.lock_attempts} tries with backoff from {c.lock_retry_backoff:g} s",
            "under the lock: the binary log position and the list of tables (no row is read while writes are"
            " blocked: row counts and checksums are the audit's, after the commit)",
            f"on {plan.source.address}: stop the source database cleanly: {plan.database.source.stop}",
            f"writes may stay blocked at most {c.max_write_block:g} s (cutover.max_write_block)",
            *frontdoor.describe(ctx, "source"),
        ]

    def check(self, ctx: StepContext) -> bool:
        return False  # never skipped: a re-run continues from the journaled facts and the stop is idempotent

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        self._datadir = resolved_datadir(ctx, "source")  # preflight resolved it: /proc/<pid>/fd names real paths
        # Figures read under the lock stand only once the shutdown began: before that the lock may have been
        # lost with a crashed process, and writes may have followed.
        journaled = FinalState.of(ctx.saved(FINAL_STATE)) if ctx.saved(SOURCE_DB_STOPPED) else None
        # Measured before writes stop: one round trip less inside the window.
        self._clock_offset = round(probes.clock_offset(rt.source), 6)
        result = CutoverResult(
            mode=rt.plan.cutover.mode, mode_reason=MODE_REASON, source_clock_offset=self._clock_offset,
            fence=rt.database.fence_name,
        )  # fmt: skip
        source_guard.refuse_if_restored(ctx)
        if journaled is None and not ctx.saved(WRITES_BLOCKED_AT):
            self._forecast(ctx)
        try:
            if journaled is not None:
                ctx.log.info("cutover.resume_after_shutdown")
                self._resume_blocked(ctx)
            final = journaled if journaled is not None else self._freeze(ctx)
            # Counted from the first fence, on a re-run too.
            result.writes_blocked_at = ctx.window.blocked_at
            ctx.save(SOURCE_DB_STOPPED, True)
            result.shutdown_seconds = self._stop_source_db(ctx)
            if journaled is not None:
                self._prove_unchanged(ctx, journaled)
        finally:
            self._release_lock()
        ctx.window.check("finishing the cut-over's shutdown")
        merged = CutoverResult.model_validate({**result.model_dump(exclude_none=True), **final.journal()})
        merged.write_block_seconds_so_far = round(time.time() - float(result.writes_blocked_at or 0), 3)
        return merged.journal()

    def _forecast(self, ctx: StepContext) -> None:
        """Before writes stop: the window predicted from what the run measured; past the budget it is not begun
        (writes never blocked, nothing to undo), saying what would help, rather than blocking writes for the
        whole budget and rolling back."""
        plan = runtime(ctx).plan
        presync = DbPresyncResult.of(ctx.output("db_presync"))
        if not presync.rounds:
            return
        last = presync.rounds[-1]
        forecast = estimates.shutdown_forecast(
            last.seconds, last_round_bytes=last.bytes, rounds=len(presync.rounds),
            max_write_block=plan.cutover.max_write_block, reserve=estimate_reserve(plan.cutover.max_write_block),
        )  # fmt: skip
        ctx.log.info("cutover.forecast", predicted_s=forecast.seconds, budget_s=forecast.budget,
                     parts=forecast.summary())  # fmt: skip
        if forecast.fits:
            return
        reason = str(ctx.output("preflight").get("mode_reason") or "")
        advice = estimates.overrun_advice(
            forecast, rounds=len(presync.rounds), max_rounds=plan.database.presync.max_rounds,
            converged=presync.converged, replicate_possible=reason.partition("not possible here: ")[2] or None,
        )  # fmt: skip
        if not plan.cutover.refuse_predicted_overrun:
            ctx.log.warning("cutover.forecast_over_budget", message=advice, entering="cutover.refuse_predicted_overrun")
            return
        raise StepError(advice)

    def undo(self, ctx: StepContext) -> None:
        """Make the source serve again: its database started, writable again, the fence lifted. Each part is
        tried even when another failed (a source with its database up but fenced, or unfenced but read-only, is
        no better than one down): the failures are reported together."""
        rt = runtime(ctx)
        plan = rt.plan
        self._release_lock()
        # Held requests wait while the source comes back (the hold is stretched), then go to it.
        frontdoor.keep_holding_for_rollback(ctx)
        failures: list[str] = []
        if ctx.saved(SOURCE_DB_STOPPED):
            try:
                # A stop cut short (by the budget) is ended on the host before this command starts (the transport
                # sees to it), but the shutdown it asked for may still be under way in the server: let it finish
                # first, or the start finds the server still answering, and the shutdown completes after the
                # rollback, leaving the source down.
                ctx.log.info("cutover.undo.finish_stop", command=plan.database.source.stop)
                rt.source.run(plan.database.source.stop, timeout=SOURCE_DB_START_TIMEOUT)
                ctx.log.info("cutover.undo.start_source_db", command=plan.database.source.start)
                rt.source.run(plan.database.source.start, timeout=SOURCE_DB_START_TIMEOUT)
                wait_db_answers(ctx, "source", SOURCE_DB_START_TIMEOUT, refusal_is_up=True)
                ctx.save(SOURCE_DB_STOPPED, False)
            except (TransportError, StepError, DatabaseError) as exc:
                failures.append(f"starting the source database: {exc}")
        read_only = ctx.saved(SOURCE_READ_ONLY)
        if isinstance(read_only, dict) and read_only.get("set") and not failures:
            try:
                self._restore_read_only(ctx, bool(read_only.get("was")))
                ctx.save(SOURCE_READ_ONLY, {**read_only, "set": False})
            except (DatabaseError, StepError, OSError) as exc:
                failures.append(f"turning read_only off on the source database: {exc}")
        try:
            self._let_writes_in(ctx, timeout=FENCE_COMMAND_TIMEOUT)
        except TransportError as exc:
            failures.append(f"lifting the source's fence ({plan.services.fence.disable}): {exc}")
        source_guard.release(ctx, failures)
        if failures:
            raise StepError("; ".join(failures))

    # -- blocking and admitting writes (the one place each: a front door plugs in here)

    def _block_writes(self, ctx: StepContext) -> float:
        """Writes stop reaching the source: journaled first (when, and that a fence is up), then the fence.

        Counted from just before the fence goes up (the conservative end). Returns when writes were blocked.
        """
        window = ctx.window
        if window.blocked_now:
            return float(window.intervals()[-1][0])  # type: ignore[arg-type]  # an interval always has its start; only its end may be open
        rt = runtime(ctx)
        fence = rt.plan.services.fence.enable
        blocked_at = time.time()
        ctx.save(WRITES_BLOCKED_AT if window.blocked_at is None else BLOCKED_AGAIN_AT_KEY, blocked_at)
        window.begin(blocked_at)
        # The front door holds new requests before the fence would refuse them (plan section `proxy`), for what is
        # left of the budget.
        frontdoor.hold_source(ctx, time.time() - (window.elapsed() or 0.0))
        if fence:
            ctx.save(FENCED, True)
            try:
                rt.source.run(fence, timeout=window.timeout(FENCE_COMMAND_TIMEOUT))
            except TransportError:
                window.check("fencing the source")  # cut short by the budget: say so
                raise
        ctx.log.info("cutover.fenced", fence=bool(fence))
        return blocked_at

    def _resume_blocked(self, ctx: StepContext) -> None:
        """Re-entered after the shutdown began: the window goes on from the journal; the fence goes up again only
        if the journal says it came down."""
        saved_at = ctx.saved(WRITES_BLOCKED_AT)
        if ctx.saved(FENCED) or not runtime(ctx).plan.services.fence.enable:
            if not ctx.window.blocked_now and saved_at:
                ctx.window.begin(float(saved_at))
            return
        self._block_writes(ctx)

    def _let_writes_in(self, ctx: StepContext, *, timeout: float) -> None:
        """Writes reach the source again: the fence lifted, then journaled (the conservative end)."""
        rt = runtime(ctx)
        disable = rt.plan.services.fence.disable
        if ctx.saved(FENCED) and disable:
            ctx.log.info("cutover.lift_fence", command=disable)
            rt.source.run(disable, timeout=timeout)
            ctx.save(FENCED, False)
        # Held requests go to the source, which takes writes again.
        frontdoor.release_source(ctx)
        if ctx.window.blocked_now:
            lifted_at = time.time()
            ctx.save(LIFTED_AT_KEY, lifted_at)
            ctx.window.lift(lifted_at)

    def _restore_read_only(self, ctx: StepContext, was: bool) -> None:
        rt = runtime(ctx)
        conn = rt.db("source", read_timeout=30.0)
        try:
            if rt.database.is_read_only(conn) != was:
                rt.database.set_read_only(conn, was, lock_wait_timeout=rt.plan.cutover.lock_wait_timeout)
            ctx.log.info("cutover.undo.read_only_restored", read_only=was)
        finally:
            rt.release(conn)

    # -- the sequence

    def _freeze(self, ctx: StepContext) -> FinalState:
        """Fence, lock, and read the source's final figures under the lock (journaled before the shutdown)."""
        rt = runtime(ctx)
        # The lock's session is opened while writes still flow: connecting is not part of the window.
        conn = self._open_lock_session(ctx)
        # Before the window too: proving the shutdown later needs the server's open files to be visible.
        self._server_pids, blind = probes.innodb_files_visible(rt.source, self._datadir, rt.database.server_files)
        if blind:
            raise StepError(blind)
        self._remember_server(ctx)
        self._reserve_for_rollback(ctx)
        source_guard.start(ctx, clock_offset=self._clock_offset)
        if rt.database.fence_in_data:
            # The database's fence outlives every session (PostgreSQL's NOLOGIN roles): what to put back at a
            # rollback is journaled before it goes up, not after.
            ctx.save(SOURCE_READ_ONLY, {"set": True, "was": rt.database.is_read_only(conn)})
        lock = self._take_lock(ctx, conn)
        self._refuse_writes_in_the_database(ctx, conn)
        final = self._final_state(ctx, lock)
        ctx.save(FINAL_STATE, final.journal())
        ctx.window.check("about to stop the source database")
        return final

    def _remember_server(self, ctx: StepContext) -> None:
        """Before the window: how the source's server was started, for the after-commit audit (held in this process
        only: a command line may carry what a journal must not). A failure costs the audit, never the run."""
        rt = runtime(ctx)
        verify = rt.plan.database.verify
        if not (verify.row_counts or verify.checksum):
            return
        try:
            launch = audit.read_launch(rt.source, self._server_pids, rt.database.server_programs)
        except (TransportError, OSError) as exc:
            ctx.log.warning("cutover.server_command_line_unread", error=str(exc))
            return
        audit.held(rt).source = launch
        ctx.log.info("cutover.server_command_line", binary=launch.binary if launch else None)

    def reattach(self, ctx: StepContext) -> None:
        """A resumed run (or `migrate rollback`) in a new process: the guard on the source hears this run's
        heartbeat again, so it does not race a live run (it still acts if this process dies too)."""
        source_guard.reattach(ctx)

    def _reserve_for_rollback(self, ctx: StepContext) -> None:
        """Keep back, from the budget, the time the rollback itself needs (journaled: a resume keeps it)."""
        window = ctx.window
        saved = ctx.saved(RESERVE_KEY)
        if isinstance(saved, dict) and "seconds" in saved:
            window.reserve = float(saved["seconds"])
            return
        plan = runtime(ctx).plan
        budget = plan.cutover.max_write_block
        estimate = estimate_reserve(budget)
        measured = self._measure_rollback(ctx)
        derived = reserve_from(measured, len(plan.dns.records), budget)
        if derived is None:
            window.reserve = estimate
            basis = (
                "estimated (the round trips could not be measured): a share of cutover.max_write_block for "
                "starting the source database, lifting the fence and restoring DNS"
            )
        else:
            window.reserve, basis = derived
        ctx.save(RESERVE_KEY, {"seconds": window.reserve, "basis": basis, "measured": measured, "estimate": estimate})
        ctx.log.info("cutover.rollback_reserve", seconds=window.reserve, budget=budget, basis=basis)

    def _measure_rollback(self, ctx: StepContext) -> dict[str, float | None]:
        """What the rollback's own work costs on this run, timed while the service is live (before the window):
        the SSH round trip of a command on each host (the slower of two), a database round trip, a read of every
        DNS record, and the source database's last start (from its error log). A part that cannot be measured is
        None (and said so in the reserve's basis)."""
        rt = runtime(ctx)

        def slowest(action: Any, times: int = 2) -> float | None:
            try:
                spent = []
                for _ in range(times):
                    began = time.monotonic()
                    action()
                    spent.append(time.monotonic() - began)
                return round(max(spent), 4)
            except Exception as exc:  # a part that cannot be measured: the basis says so
                ctx.log.warning("cutover.reserve_not_measured", error=str(exc))
                return None

        conn = self._lock_conn
        measured: dict[str, float | None] = {
            "ssh_source_s": slowest(lambda: rt.source.run("true", timeout=10)),
            "ssh_target_s": slowest(lambda: rt.target.run("true", timeout=10)),
            "db_round_trip_s": slowest(lambda: rt.database.round_trip(conn)) if conn is not None else None,
            "dns_read_s": slowest(lambda: self._read_every_record(ctx), times=1),
            "db_start_s": self._last_db_start(ctx),
        }
        return measured

    def _read_every_record(self, ctx: StepContext) -> None:
        rt = runtime(ctx)
        dns = rt.plan.dns
        timeout = min(dns.timeout, 10.0)
        zone_id = rt.dns.zone_id(dns.zone, timeout=timeout)
        for name in dns.records:
            rt.dns.find_records(zone_id, name, dns.type, timeout=timeout)

    def _last_db_start(self, ctx: StepContext) -> float | None:
        """How long the source database took to start the last time, from its error log (None: no log to read)."""
        conn = self._lock_conn
        if conn is None:
            return None
        try:
            log_path = runtime(ctx).database.error_log_path(conn)
            if not log_path:
                return None
            if not log_path.startswith("/"):
                log_path = f"{self._datadir.rstrip('/')}/{log_path}"
            return probes.ask(runtime(ctx).source, probes.last_start_seconds(log_path), timeout=10)
        except Exception as exc:
            ctx.log.warning("cutover.db_start_not_measured", error=str(exc))
            return None

    def _refuse_writes_in_the_database(self, ctx: StepContext, conn: Session) -> None:
        """SET GLOBAL read_only under our lock: it outlives our session, so writes queued behind the lock (or sent
        by anyone bypassing the app's fence) fail instead of committing when the lock goes with the shutdown."""
        database = runtime(ctx).database
        noted = ctx.saved(SOURCE_READ_ONLY)
        if database.fence_in_data and isinstance(noted, dict):
            was = bool(noted.get("was"))  # journaled before the fence, which is this engine's read_only
        else:
            was = database.is_read_only(conn)
            ctx.save(SOURCE_READ_ONLY, {"set": True, "was": was})
        directory = source_guard.directory(ctx)
        if directory is not None:  # the guard restarts a read-only database it finds running
            guard.mark(runtime(ctx).source, directory, guard.READ_ONLY, timeout=ctx.window.timeout(30.0))
        if not was and not database.fence_in_data:
            database.set_read_only(conn, True, lock_wait_timeout=1)
        ctx.log.info("cutover.read_only", was=was)

    def _open_lock_session(self, ctx: StepContext) -> Session:
        rt = runtime(ctx)
        c = rt.plan.cutover
        # The session must outlive the longest lock wait: a client read timeout would drop it (and the lock).
        conn = rt.db("source", read_timeout=max(rt.plan.database.read_timeout, c.lock_wait_timeout + 30))
        self._lock_conn, self._lock_db = conn, rt.database
        rt.database.set_lock_wait_timeout(conn, c.lock_wait_timeout)
        return conn

    def _take_lock(self, ctx: StepContext, conn: Session) -> LockFigures:
        """FTWRL with a bounded wait per attempt; between attempts the fence is lifted (writes flow) during the
        backoff, so a lock that cannot be had costs the service one attempt's wait at a time, never the backoff."""
        c = runtime(ctx).plan.cutover
        database = runtime(ctx).database
        window = ctx.window
        delays = backoff_delays(c.lock_attempts, c.lock_retry_backoff)
        waited = 0.0
        last = "no attempt"
        for attempt in range(1, c.lock_attempts + 1):
            self._block_writes(ctx)
            window.check(f"waiting for {database.fence_name} (try {attempt})")
            left = window.remaining() or 0.0
            if left < 1.0:  # MariaDB waits in whole seconds: a wait of at least 1 s would overrun the budget
                raise StepError(
                    f"another {database.fence_name} (try {attempt}) would keep writes blocked more than "
                    f"cutover.max_write_block {c.max_write_block:g} s: {max(left, 0):.1f} s remain after the "
                    f"rollback's reserve ({window.reserve:g} s); last try blocked by {last}"
                )
            database.set_lock_wait_timeout(conn, min(c.lock_wait_timeout, int(left)))
            asked = time.monotonic()
            try:
                locked = database.lock_writes(conn)
            except DatabaseError as exc:
                raise StepError(str(exc)) from None
            waited += time.monotonic() - asked
            if locked:
                ctx.log.info("cutover.locked", attempt=attempt, lock_wait_s=round(waited, 3))
                return LockFigures(
                    lock_attempts=attempt, lock_wait_seconds=round(waited, 3), lock_acquired_at=time.time()
                )
            holders = database.find_lock_holders(conn, waited=time.monotonic() - asked)
            blockers = database.find_blockers(conn)
            in_use = database.tables_in_use(conn)
            last = database.summarize_blockers(blockers, in_use, holders=holders)
            ctx.log.warning(
                "cutover.lock_wait_timeout",
                attempt=attempt,
                of=c.lock_attempts,
                waited_s=round(waited, 3),
                held_by=[h.summary() for h in holders],
                waiting=[b.summary() for b in blockers],
                tables_in_use=in_use,
            )
            if attempt <= len(delays):
                # Writes flow while we wait to try again.
                self._let_writes_in(ctx, timeout=window.timeout(FENCE_COMMAND_TIMEOUT) or FENCE_COMMAND_TIMEOUT)
                time.sleep(delays[attempt - 1])
        raise StepError(
            f"could not get {database.fence_name} in {c.lock_attempts} tries of "
            f"{c.lock_wait_timeout:g} s: blocked by {last}"
        )

    def _final_state(self, ctx: StepContext, lock: LockFigures) -> FinalState:
        """The binary log position and the list of tables: O(1) and O(tables) under the lock, each query bounded by
        what is left of the budget (a query cut short closes the lock's session, which releases the lock: the step
        fails and undo lifts the fence). No row is read here: the audit after the commit does that."""
        rt = runtime(ctx)
        window = ctx.window
        conn = self._lock_conn
        assert conn is not None
        started = time.monotonic()
        doing = "reading the source's binary log position and tables under the lock"
        window.check(doing)
        try:
            with rt.database.bounded(conn, window.timeout()):
                tables = rt.database.list_tables(conn, rt.plan.database.schemas)
                binlog = rt.database.final_position(conn)
        except DatabaseError:
            window.check(doing)  # a query cut short by the budget: say so
            raise
        state = FinalState.model_validate(
            {
                **lock.model_dump(exclude_none=True),
                "binlog": binlog,
                "tables": [f"{schema}.{table}" for schema, table in tables],
                "final_state_seconds": round(time.monotonic() - started, 3),
            }
        )
        ctx.log.info("cutover.final_state", tables=len(tables), binlog=binlog)
        return state

    def _stop_source_db(self, ctx: StepContext) -> float:
        rt = runtime(ctx)
        endpoint = rt.plan.database.source
        started = time.monotonic()
        directory = source_guard.directory(ctx)
        # The guard learns the database is stopped before the stop begins (it starts it again if need be).
        stop = f"{guard.marker_command(directory, guard.DB_STOPPED)} && {endpoint.stop}" if directory else endpoint.stop
        try:
            rt.source.run(stop, timeout=ctx.window.timeout(rt.plan.database.read_timeout + 300))
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
                    rt.source, self._datadir, timeout=window.timeout(), pids=self._server_pids,
                    files=rt.database.server_files,
                )  # fmt: skip
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

    def _prove_unchanged(self, ctx: StepContext, journaled: FinalState) -> None:
        """The figures journaled under the lock stand only if the source wrote nothing since: its binary log
        (read on the stopped source) ends where it ended under the lock, but for the shutdown's stop event."""
        rt = runtime(ctx)
        binlog = journaled.binlog
        if binlog is None:
            raise StepError(
                "resuming after the source's shutdown began, but the figures journaled under the lock carry no "
                "binary log position: nothing proves the source wrote nothing since; rolling back"
            )
        name = binlog.file
        index = name.rsplit(".", 1)[0] + ".index"
        datadir = shlex.quote(self._datadir)
        out = rt.source.run(
            f"cd {datadir} && stat -c %s {shlex.quote(name)} && grep -c . {shlex.quote(index)}"
            f" && tail -n 1 {shlex.quote(index)}",
            timeout=ctx.window.timeout(30.0),
        ).stdout.split("\n")
        try:
            size, last = int(out[0]), out[2].strip().rsplit("/", 1)[-1]
        except (IndexError, ValueError):
            raise StepError(
                f"resuming after the source's shutdown began: cannot read the binary log {name} in "
                f"{self._datadir} to prove the source wrote nothing since the lock; rolling back"
            ) from None
        if last != name:
            raise StepError(
                f"the source's binary log moved on since the figures were read under the lock ({name} then, "
                f"{last} now): the source changed after the lock was lost; rolling back"
            )
        if not binlog.position <= size <= binlog.position + STOP_EVENT_MAX_BYTES:
            raise StepError(
                f"the source's binary log {name} ends at {size}, it ended at {binlog.position} under the lock: "
                "the source wrote after the lock was lost, the journaled figures no longer hold; rolling back"
            )
        ctx.log.info("cutover.figures_reproven", binlog=name, position=binlog.position, size=size)

    def _source_db_answers(self, ctx: StepContext) -> bool:
        conn = self._lock_conn
        if conn is not None:
            # The session holding the lock dies with the server: a live session means it is still up.
            return runtime(ctx).database.alive(conn)
        return runtime(ctx).db_answers("source")

    def _release_lock(self) -> None:
        conn, self._lock_conn = self._lock_conn, None
        if conn is not None and self._lock_db is not None:
            self._lock_db.close_quietly(conn)  # closing the session releases FTWRL
