"""Switch (replicate mode) — the downtime window begins here: the source stops taking writes, the replica executes
its last transactions and becomes the primary.

Fence the source's service and, side by side, SET GLOBAL read_only on the source with the bounded wait
(`writes_blocked_at`, `fenced` and `source_read_only` journaled first: read_only is global and outlives this
process, so undo and a resume clear it) → the source's final GTID position (journaled) → MASTER_GTID_WAIT on the
target for it, bounded by what is left of `cutover.max_write_block` → the promotion with its proof (`promoting`
journaled first): replication stopped, the target executed exactly the source's final position, replication
forgotten, read_only off. No file copy, no server start, no full row count: the work is what the replica had not
applied yet. Each side costs one round trip: read_only with the final position (one compound statement, beside the
fence), then the wait with the promotion and its proof (another; a replica slower than a first slice of the wait is
waited for in slices and promoted on its own, as before).

The target's services stay fenced: the DNS flip lifts the fence (the commit point). Once the source's fence and
read_only are up, the uploads' final delta (files_final) starts beside the rest of this step (`start_next_beside`):
it needs writes stopped, not the database promoted. The in-window health checks (`when: both|window`) run side by
side with the switch once writes are held (after the front door's drain), against the fenced target (its services
run on the replica's data, which the promotion leaves as it is): their round trips overlap the fence, the
replica's wait and the promotion instead of following them. A check that fails stops the switch (before the
promotion when it failed by then); verify_target reports them, and runs them itself when the switch did not (a
resumed switch that found the promotion done).

With a front door (plan section `proxy`), the source's HAProxy holds new requests just before the fence goes up
and its undo releases them once the source takes writes again (orchestrator/services/frontdoor.py, as in the cut-over).
When the source host drives its own door (found before the window: frontdoor.holds_from_source), the hold, the drain
of the writes in flight and the fence are one command there (one round trip instead of two or more); read_only
follows it, beside the uploads' pass, and the in-window checks begin with the window.
"""

from __future__ import annotations

import contextvars
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.database.protocol import (
    DatabaseError,
    HostStop,
    Position,
    PositionMismatch,
    Replication,
    ReplicationError,
    Session,
)
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.results import SwitchResult
from orchestrator.services import frontdoor, guard, health, probes, source_commit
from orchestrator.steps import files_final, source_guard, verify_target
from orchestrator.steps.common import keep_shells
from orchestrator.steps.repl_common import (
    FINAL_GTID,
    REPLICA_PORT,
    declared_mode,
    local_login,
    mode_reason,
    replica_source,
    replication,
    reverse_over_replica,
    server_access,
)
from orchestrator.transports.ssh import TransportError

WRITES_BLOCKED_AT = "writes_blocked_at"
FENCED = "fenced"
SOURCE_READ_ONLY = "source_read_only"
PROMOTING = "promoting"
PROMOTED = "promoted"
FENCE_TIMEOUT = 60.0
# How many times undo tries to get the source's database back (a second apart) after a switch that stops it.
SOURCE_AGAIN_TRIES = 10


class ReplSwitch(Step):
    name = "repl_switch"
    title = "Switch: fence and read_only on the source, the replica catches its final position, promoted with proof"
    begins_downtime = True

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        c = plan.cutover
        fence = plan.services.fence.enable
        return [
            f"on {plan.source.address}: fence the service: {fence}" if fence else "no fence command: read_only only",
            *replication(runtime(ctx)).describe("switch", plan),
            *[
                f"side by side once writes are held: health check {health.check_label(c)} against the fenced "
                f"target (up to {plan.health.attempts} tries)"
                for c in health.checks_for(plan.health, health.INSIDE, replicate=True)
            ],
            f"writes may stay blocked at most {c.max_write_block:g} s (cutover.max_write_block); before the window, "
            f"a guard starts on {plan.source.address}: should this run die inside it and nobody resume, the guard "
            "restarts the source database (clearing read_only) and lifts the fence once the budget and a margin "
            "have passed",
            *frontdoor.describe(ctx, "source"),
        ]

    def check(self, ctx: StepContext) -> bool:
        return False  # re-entered after a crash: continues from the journaled facts

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        plan = rt.plan
        window = ctx.window
        rep = replication(rt)
        result = SwitchResult(mode_reason=mode_reason("replicate", [], declared_mode(ctx), rep.requirements))
        # Connections are opened while writes still flow: connecting is not part of the window. The hosts' kept
        # shells were opened by repl_catchup; a switch resumed in a new process opens its own (the window's short
        # commands, and the database's stop on the source's host, run in them).
        keep_shells(ctx)
        source = self._source(ctx, rep)
        target = rt.db("target", read_timeout=max(plan.database.read_timeout, plan.cutover.max_write_block + 30))
        # And those the window's reads take after the promotion: the SQL health checks, verify_target's positions.
        sql_checks = [c for c in health.checks_for(plan.health, health.INSIDE, replicate=True) if c.kind == "sql"]
        rt.keep_spare("target", 1 + len(sql_checks))
        rt.keep_spare("source", 1)
        # The in-window health checks' thread: never left running past this step (each try is bounded by the
        # budget, so waiting for it is bounded too).
        checking = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checks")
        try:
            if ctx.saved(PROMOTED) or self._already_promoted(ctx, target):
                ctx.log.info("repl.switch.already_promoted")
            else:
                failure = rep.replica_status(target)
                if ctx.saved(PROMOTING) and failure is not None and not failure.sql_running and not failure.error:
                    rep.start_replica(target)  # a crash inside the promotion, after its STOP SLAVE
                if failure is None or failure.error:
                    why = failure.error if failure is not None else "the target is not a replica"
                    raise StepError(f"the replica is not healthy before the window: {why}")
                if reverse_over_replica(ctx) and not ctx.saved(REPLICA_PORT):
                    ctx.save(REPLICA_PORT, failure.master_port)  # undo makes the old source a replica again
                if source is not None:
                    rep.before_window(source)  # before the guard: its deadline counts from its start
                self._start_guard(ctx)
                # What the front door's hold needs is read while writes still flow (reads only).
                ready = frontdoor.prepare_hold(ctx, source_serves_reads=not rep.source_stops)
                from_source = frontdoor.holds_from_source(ctx, ready)
                host_stop = self._host_stop(ctx, source) if from_source else None
                began = time.monotonic()
                if from_source:
                    assert ready is not None
                    # The hold, the drain and the fence in one command on the source; then, in it, the uploads'
                    # final pass started and the database's stop (when it rides there), else read_only after it.
                    # The checks (reads of the fenced target) begin with the window, beside that command.
                    blocked_at = self._begin(ctx, ready, hold=False)
                    checks = checking.submit(contextvars.copy_context().run, self._window_checks, ctx)
                    then, lock_wait = self._after_fence(ctx, host_stop)
                    done = frontdoor.hold_and_fence_from_source(
                        ctx, blocked_at, ready, timeout=ctx.window.timeout(FENCE_TIMEOUT), then=then
                    )
                    result.hold_and_fence_seconds = round(time.monotonic() - began, 3)
                    ctx.start_next_beside()
                    stopped = self._stopped_there(ctx, host_stop, done)
                    if stopped is not None:
                        final = stopped
                        result.stopped_in_first_command = True
                        ctx.log.info("repl.switch.source_read_only", on_host=True, lock_wait_s=lock_wait)
                    else:
                        result.read_only_seconds, final = self._read_only(ctx, source)
                else:
                    blocked_at, checks, final = self._hold_then_fence(ctx, ready, source, checking, result, began)
                result.writes_blocked_at = blocked_at
                # Nothing can write the uploads now (the app's fence is up): their final delta (files_final) runs
                # beside the replica's last transactions and the promotion instead of after them.
                ctx.start_next_beside()
                self._final_position(ctx, final)
                result.final_gtid = str(final)
                window.check("waiting for the replica")
                if checks.done():
                    self._checked(checks, result)  # a failure by now stops the switch before the promotion
                # verify_target's position reads (and the audit's snapshot) begin now, beside the promotion (the
                # target's waits on the server for the final position, as the promotion does) and the uploads' pass.
                verify_target.read_positions_early(ctx, str(final), wait_first=rep.wait_slice)
                executed = self._wait_and_promote(ctx, target, final, result)
                result.executed_gtid = str(executed)
                # Lost with the machine (not with a kill -9), a resume finds the promotion on the server
                # (_already_promoted); the next step's start is fsync'd before anything depends on it.
                ctx.save(PROMOTED, str(executed), sync=False)
                self._checked(checks, result)
                result.switch_seconds = round(time.monotonic() - began, 3)
            result.writes_blocked_at = window.begin(float(ctx.saved(WRITES_BLOCKED_AT)))
            result.final_gtid = result.final_gtid or ctx.saved(FINAL_GTID)
            result.executed_gtid = result.executed_gtid or ctx.saved(PROMOTED)
        except ReplicationError as exc:
            window.check("the switch")
            raise StepError(f"the switch: {exc}") from None
        except DatabaseError as exc:
            window.check("the switch")
            raise StepError(f"the switch: {exc}") from None
        finally:
            checking.shutdown(wait=True)
            if source is not None:
                rt.release(source)
            rt.release(target)
        ctx.log.info(
            "repl.switched", final=result.final_gtid, wait_s=result.wait_seconds, total_s=result.switch_seconds
        )
        window.check("finishing the switch")
        return result.journal()

    # -- the sequence

    def _hold_then_fence(
        self,
        ctx: StepContext,
        ready: frontdoor.HoldReady | None,
        source: Any,
        checking: ThreadPoolExecutor,
        result: SwitchResult,
        began: float,
    ) -> tuple[float, Future[tuple[dict[str, int], list[str], float]], Position]:
        """The hold from here (its own round trips), then the app's fence and the database's read_only side by
        side: either blocks writes, and the fence's SSH round trip need not come before the database's."""
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fence") as pool:
            blocked_at = self._begin(ctx, ready)
            checks = checking.submit(contextvars.copy_context().run, self._window_checks, ctx)
            result.hold_seconds = round(time.monotonic() - began, 3)
            fenced = pool.submit(contextvars.copy_context().run, self._fence, ctx)
            try:
                result.read_only_seconds, final = self._read_only(ctx, source)
            finally:
                fence_failure = fenced.exception()  # waited for: undo finds the fence up, not going up
            if fence_failure is not None:
                raise fence_failure
            result.fence_seconds = fenced.result()
        return blocked_at, checks, final

    def _host_stop(self, ctx: StepContext, source: Session | None) -> HostStop | None:
        """Before the window: whether the source's stop of writes (read_only and its final position) rides the
        window's first command on the source, right after its fence, instead of a round trip of its own after that
        command's answer: the engine made it ready there (Replication.host_stop), and the round trip it saves (one
        query over the session, timed now) costs more than the host's own work for it (a client's start), or the
        plan drives the source's side from there (proxy.source.commit_from: source)."""
        if source is None:
            return None
        rt = runtime(ctx)
        rep = replication(rt)
        try:
            stop = rep.host_stop(server_access(rt, "source"), local_login(rt, "source"))
        except TransportError as exc:
            ctx.log.warning("repl.switch.stop_on_host_unready", error=str(exc))
            return None
        if stop is None:
            ctx.log.info("repl.switch.stop_on_host", used=False, why="the engine or the host cannot")
            return None
        door = frontdoor.section(ctx, "source")
        if door is not None and door.commit_from == "source":
            ctx.log.info("repl.switch.stop_on_host", used=True, why="proxy.source.commit_from: source")
            return stop
        if stop.local_cost <= 0:  # nothing of its own to weigh (PostgreSQL's stop is a host command anyway)
            ctx.log.info("repl.switch.stop_on_host", used=True, why="no cost beside the round trip it saves")
            return stop
        began = time.monotonic()
        rep.is_read_only(source)
        round_trip = time.monotonic() - began
        worth = round_trip > stop.local_cost
        ctx.log.info("repl.switch.stop_on_host", used=worth, round_trip_s=round(round_trip, 4),
                     host_work_s=round(stop.local_cost, 4))  # fmt: skip
        return stop if worth else None

    def _after_fence(self, ctx: StepContext, host_stop: HostStop | None) -> tuple[str | None, float]:
        """What the first command on the source runs once its fence is up: the uploads' final pass started in the
        background (files_final.start_early), then the database's stop when it rides there; and the lock wait
        given to that stop (what is left of the budget, at most cutover.lock_wait_timeout)."""
        c = runtime(ctx).plan.cutover
        lock_wait = min(c.lock_wait_timeout, ctx.window.timeout() or c.lock_wait_timeout)
        parts = [files_final.FilesFinal().start_early(ctx)]
        if host_stop is not None:
            parts.append(host_stop.command(lock_wait_timeout=lock_wait))
        then = "; ".join(p for p in parts if p)
        return then or None, lock_wait

    def _stopped_there(
        self, ctx: StepContext, host_stop: HostStop | None, done: source_commit.HoldAndFence
    ) -> Position | None:
        """The final position the first command's stop read; None when it did not ride there or did not stop
        writes (said in the log: the switch stops them over its session, as without it)."""
        if host_stop is None:
            return None
        try:
            return host_stop.parse(done.then_status, done.then_said)
        except ReplicationError as exc:
            ctx.log.warning("repl.switch.stop_on_host_failed", error=str(exc), instead="over the session")
            return None

    def _source(self, ctx: StepContext, rep: Replication) -> Session | None:
        """The source's session; None for a source this switch already stopped (a re-entered switch of an engine
        whose switch stops it: its final position is read from its files then)."""
        rt = runtime(ctx)
        plan = rt.plan
        if rep.source_stops and ctx.saved(WRITES_BLOCKED_AT) and not rt.db_answers("source"):
            return None
        return rt.db("source", read_timeout=max(plan.database.read_timeout, plan.cutover.lock_wait_timeout + 30))

    def _start_guard(self, ctx: StepContext) -> None:
        """Before the window, the guard on the source (steps/source_guard.py), as in the shutdown mode: should this
        run die inside the window and nobody resume it, the guard restores the source once the budget and its margin
        have passed (it restarts the database, which clears read_only, and lifts the fence). A re-entered switch
        whose guard already did so rolls back: the source has taken writes since.

        READ_ONLY is left for it in its start's round trip, not inside the window: had this run died between the
        guard's start and read_only (a few milliseconds), the guard would restart a database that was writable."""
        source_guard.refuse_if_restored(ctx)
        # The source's clock offset, measured only for a guard not started yet (one round trip, before the window).
        offset = None if source_guard.started(ctx) else round(probes.clock_offset(runtime(ctx).source), 6)
        source_guard.start(ctx, clock_offset=offset, marks=(guard.READ_ONLY,))

    def reattach(self, ctx: StepContext) -> None:
        """A resumed run (or `migrate rollback`) in a new process: the guard hears this run's heartbeat again."""
        source_guard.reattach(ctx)

    def _begin(self, ctx: StepContext, ready: frontdoor.HoldReady | None, *, hold: bool = True) -> float:
        """The window begins: journaled (`fenced`, `source_read_only`, with the front door driven from the source
        its hold's facts, then `writes_blocked_at`) before anything moves; then the front door's hold (unless `hold`
        is False: the caller holds with its fence).

        What undo reads as "may be up" (the fence, read_only, the hold) is journaled before the window's clock
        starts: each record is an fsync (2-5 ms), and undo's lifting of what was never set is harmless, so only
        `writes_blocked_at` is written inside the window."""
        if runtime(ctx).plan.services.fence.enable:
            ctx.save(FENCED, True)
        ctx.save(SOURCE_READ_ONLY, True)
        if ready is not None and not hold:
            frontdoor.journal_hold_ahead(ctx, ready)
        saved_at = ctx.saved(WRITES_BLOCKED_AT)
        blocked_at = float(saved_at) if saved_at else time.time()
        if not saved_at:
            ctx.save(WRITES_BLOCKED_AT, blocked_at)
        ctx.window.begin(blocked_at)
        # The front door holds new requests before the fence and read_only would refuse them (plan section `proxy`);
        # the source database goes on serving reads, unless the engine's switch stops it (it holds reads too then).
        if hold:
            stops = replication(runtime(ctx)).source_stops
            frontdoor.hold_source(ctx, blocked_at, source_serves_reads=not stops, ready=ready)
        return blocked_at

    def _window_checks(self, ctx: StepContext) -> tuple[dict[str, int], list[str], float]:
        """The health checks that run inside the window (`when: both|window`), side by side: tries, failures,
        seconds."""
        plan = runtime(ctx).plan
        started = time.monotonic()
        tries, failures = health.run_checks(ctx, health.checks_for(plan.health, health.INSIDE, replicate=True),
                                            plan.health)  # fmt: skip
        return tries, failures, round(time.monotonic() - started, 3)

    def _checked(self, checks: Future[tuple[dict[str, int], list[str], float]], result: SwitchResult) -> None:
        """The in-window checks' outcome into the result; a failure stops the switch (StepError)."""
        if result.health_tries is not None:
            return
        tries, failures, seconds = checks.result()
        if failures:
            raise StepError(f"inside the window, {len(failures)} health check(s) failed: " + "; ".join(failures))
        result.health_tries, result.health_seconds = tries, seconds

    def _fence(self, ctx: StepContext) -> float:
        """The source's fence command; its seconds (it runs side by side with read_only)."""
        rt = runtime(ctx)
        fence = rt.plan.services.fence.enable
        started = time.monotonic()
        if fence:
            try:
                rt.source.run(fence, timeout=ctx.window.timeout(FENCE_TIMEOUT))
            except TransportError as exc:
                ctx.window.check("fencing the source")
                raise StepError(f"fencing the source: {exc}") from None
        ctx.window.check("fencing the source")
        seconds = round(time.monotonic() - started, 3)
        ctx.log.info("repl.switch.fenced", fence=bool(fence), seconds=seconds)
        return seconds

    def _wait_and_promote(self, ctx: StepContext, target: Any, final: Position, result: SwitchResult) -> Position:
        """The replica's wait and its promotion with proof. Usually one round trip: the replica reaches the final
        position within a first slice of the wait and is promoted in the same compound statement
        (switch.wait_and_promote). Else the wait goes on in slices that notice a broken replica, then the promotion
        as its own statements. `promoting` is journaled before each action that may promote."""
        window = ctx.window
        budget = runtime(ctx).plan.cutover.max_write_block
        rep = replication(runtime(ctx))
        window.check("promoting the replica")
        ctx.save(PROMOTING, True)
        started = time.monotonic()
        try:
            first = rep.wait_and_promote(target, final, min(rep.wait_slice, window.timeout() or budget),
                                         within=window.timeout() or budget)  # fmt: skip
            if first.promoted:
                result.wait_seconds = round(first.waited, 3)
                result.promote_seconds = round(time.monotonic() - started - first.waited, 3)
                return first.executed
            # Not reached within the slice: nothing changed on the target, which the journal says again (its undo
            # need not touch a target that was never promoted), until the promotion below.
            ctx.save(PROMOTING, False)
            waited = rep.wait_for_position(target, final, window.timeout() or budget)
            result.wait_seconds = round(time.monotonic() - started, 3)
            if waited.outcome == "replica_failed":
                raise StepError(f"the replica stopped inside the window: {waited.error}")
            if waited.outcome != "reached":
                window.check(f"waiting for the replica to reach {final}")
                raise StepError(f"the replica did not reach the source's final position {final} in time")
            window.check("promoting the replica")
            ctx.save(PROMOTING, True)
            promoted = time.monotonic()
            executed = rep.promote(target, final, within=window.timeout() or budget)
            result.promote_seconds = round(time.monotonic() - promoted, 3)
            return executed
        except PositionMismatch as exc:
            raise StepError(f"not promoted: {exc}") from None

    def _read_only(self, ctx: StepContext, source: Any) -> tuple[float, Position]:
        """read_only on the source, each try bounded by the budget, retried with backoff like the lock; with it, in
        the same round trip, the source's final position (read once read_only is set)."""
        c = runtime(ctx).plan.cutover
        rep = replication(runtime(ctx))
        window = ctx.window
        started = time.monotonic()
        delay = c.lock_retry_backoff
        for attempt in range(1, c.lock_attempts + 1):
            window.check(f"setting read_only on the source (try {attempt})")
            try:
                final = rep.stop_writes(
                    source,
                    lock_wait_timeout=min(c.lock_wait_timeout, window.timeout() or 1.0),
                    server=server_access(runtime(ctx), "source"),
                )
                seconds = round(time.monotonic() - started, 3)
                ctx.log.info("repl.switch.source_read_only", attempt=attempt, seconds=seconds)
                return seconds, final
            except ReplicationError as exc:
                ctx.log.warning("repl.switch.read_only_wait_timeout", attempt=attempt, error=str(exc))
                if attempt == c.lock_attempts:
                    raise StepError(
                        f"could not set read_only on the source in {c.lock_attempts} tries of "
                        f"{c.lock_wait_timeout:g} s: {exc}"
                    ) from None
                window.check(f"waiting to set read_only on the source ({attempt} tries)")
                time.sleep(min(delay, window.timeout() or delay))
                delay *= 2
        raise AssertionError("unreachable")

    def _final_position(self, ctx: StepContext, final: Position) -> None:
        """The source's last position, read once it is read-only: journaled before the target waits for it (made
        durable by `promoting`'s fsync, which comes before the statement that waits)."""
        ctx.save(FINAL_GTID, str(final), sync=False)
        ctx.log.info("repl.switch.final_position", gtid=str(final))

    def _already_promoted(self, ctx: StepContext, target: Any) -> bool:
        """A crash between the promotion and its journal record: the target is no replica, writable, and at the
        source's journaled final position."""
        final = ctx.saved(FINAL_GTID)
        if not (ctx.saved(PROMOTING) and final):
            return False
        rep = replication(runtime(ctx))
        if rep.replica_status(target) is not None or rep.is_read_only(target):
            return False
        return rep.same_position(rep.parse_position(str(final)), rep.executed_position(target))

    def undo(self, ctx: StepContext) -> None:
        """The target read-only again (it must not take writes), the source writable again, its fence lifted.

        The target's replication is put back by the replica step's undo (or the database stopped). read_only is
        checked on the server, not assumed from the journal: a kill -9 may have left it set.
        """
        rt = runtime(ctx)
        plan = rt.plan
        # Held requests wait while the source takes writes again (the hold is stretched), then go to it.
        frontdoor.keep_holding_for_rollback(ctx)
        failures: list[str] = []
        rep = replication(rt)
        if ctx.saved(PROMOTING):
            try:
                conn = rt.db("target", retry=False)
                try:
                    rep.set_read_only(conn, True, lock_wait_timeout=plan.cutover.lock_wait_timeout)
                finally:
                    rt.release(conn)
            except Exception as exc:
                failures.append(f"making the target read-only again: {exc}")
        if reverse_over_replica(ctx) and not failures:
            try:
                self._replicate_again(ctx)
            except Exception as exc:
                failures.append(f"making the old source a replica of the target again: {exc}")
        if ctx.saved(SOURCE_READ_ONLY) or ctx.saved(WRITES_BLOCKED_AT):
            # The window's first command on the source may set read_only itself, and a stop (a signal) may have cut
            # it short while it still runs there: a command on the host ends it first (the transport ends what was
            # cut short before its next command), then read_only is lifted whatever a read would say.
            rt.source.run("true", timeout=FENCE_TIMEOUT)
            conn = self._source_again(ctx)
            try:
                rep.set_read_only(conn, False, lock_wait_timeout=plan.cutover.lock_wait_timeout)
                ctx.log.info("repl.switch.undo.source_writable")
            finally:
                rt.release(conn)
            ctx.save(SOURCE_READ_ONLY, False)
        if ctx.saved(FENCED) and plan.services.fence.disable:
            rt.source.run(plan.services.fence.disable, timeout=FENCE_TIMEOUT)
            ctx.log.info("repl.switch.undo.fence_lifted")
            ctx.save(FENCED, False)
        frontdoor.release_source(ctx)  # not reached while the source refuses writes: a retried rollback releases
        source_guard.release(ctx, failures)
        if failures:
            raise StepError("; ".join(failures))

    def _source_again(self, ctx: StepContext) -> Session:
        """The source's database for undo. An engine whose switch stops the source's server gets it started again,
        also when this run was interrupted while that stop was going on: the server still refused us itself a
        moment ago (shutting down), then it was gone. Tried a few times, a second apart."""
        rt = runtime(ctx)
        rep = replication(rt)
        if not rep.source_stops:
            return rt.db("source")
        for attempt in range(1, SOURCE_AGAIN_TRIES + 1):
            try:
                if not rt.db_answers("source"):
                    # The switch stopped it. A start while the stop still ends fails ("another server may be
                    # running"): tried again a second later, as a connection refused is.
                    rt.source.run(rt.plan.database.source.start, timeout=FENCE_TIMEOUT)
                    ctx.log.info("repl.switch.undo.source_started")
                return rt.db("source", retry=False)
            except (DatabaseError, TransportError) as exc:
                if attempt == SOURCE_AGAIN_TRIES:
                    raise
                ctx.log.warning("repl.switch.undo.source_not_yet", attempt=attempt, error=str(exc))
                time.sleep(1.0)
        raise AssertionError("unreachable")

    def _replicate_again(self, ctx: StepContext) -> None:
        """A rolled-back reverse switch: the old source (read-only) follows the target again, from the final
        position when the promotion had forgotten its replication, so the reverse path stays as the forward run
        keeps it (a later `migrate rollback` can go back over it)."""
        rt = runtime(ctx)
        rep = replication(rt)
        conn = rt.db("target", retry=False)
        try:
            status = rep.replica_status(conn)
            port, final = ctx.saved(REPLICA_PORT), ctx.saved(FINAL_GTID)
            if status is None and port and final:
                rep.follow(conn, replica_source(rt, int(port)), rep.parse_position(str(final)), seeded=False)
                status = rep.replica_status(conn)
            if status is not None and not status.replicating and not status.error:
                rep.start_replica(conn)
                ctx.log.info("repl.switch.undo.replicating_again")
        finally:
            rt.release(conn)
