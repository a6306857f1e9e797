"""Catch-up (replicate mode), before any window: the comparison, then the wait until the replica is close enough.

The comparison (after Vitess VDiff): the replica is stopped first, then a consistent snapshot opens on the source
(it blocks no writer) at a known GTID position, the replica runs up to exactly that position and stops there, and
both sides are checksummed over the same primary-key chunks. A difference stops the run, naming the table and the
chunk; the source never stopped serving. The replica then resumes.

The lag gate: the window may begin only once the replica reaches a position just read on the source within
`replication.max_lag` seconds (the wait the window itself will have). It tries for at most
`replication.lag_wait` seconds, logging what it waits for; a replica that stops with an error ends the wait at
once with the replica's own message. Nothing here changes the source.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.database.protocol import ReplicationError
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.results import CatchupResult, FilesResult
from orchestrator.services import health
from orchestrator.steps.common import keep_shells, open_window_route, tracked_prepass
from orchestrator.steps.repl_common import replication, reverse_over_replica

LOG_EVERY = 2.0


class ReplCatchup(Step):
    name = "repl_catchup"
    title = "Compare source and replica at one consistent point, then wait until the replica's lag is small"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        settings = plan.replication
        lines = []
        if reverse_over_replica(ctx):
            lines.append("the way back: the old source replicates from the target since the forward run's finish; "
                         "no comparison (the forward run compared), only the lag gate")  # fmt: skip
        elif settings is None or settings.compare:
            lines += replication(runtime(ctx)).describe("compare", plan)
        before = health.checks_for(plan.health, health.BEFORE, replicate=True)
        lines += [
            f"health check {health.check_label(c)} against the fenced target, before the window "
            f"(up to {plan.health.attempts} tries)"
            for c in before
        ]
        lines += [
            f"the last tracked pass of tree {t.name} while the source serves: the paths changed since the pre-sync"
            for t in plan.files
        ]
        max_lag = settings.max_lag if settings else 1.0
        lag_wait = settings.lag_wait if settings else 600.0
        lines.append(
            f"wait until the replica reaches the source's current position within {max_lag:g} s "
            f"(replication.max_lag), at most {lag_wait:g} s (replication.lag_wait); a replica error stops the run "
            "with the replica's own message"
        )
        lines.append(
            "open a shell on each host for the window's short commands (the fence, the change list, the target's "
            "fence): no new SSH session inside the window"
        )
        return lines

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        settings = rt.plan.replication
        assert settings is not None
        result = CatchupResult()
        source = rt.db("source")
        target = rt.db("target")
        try:
            failure = self._replica_error(ctx, target)
            if failure:
                raise StepError(f"the replica stopped: {failure}")
            # The way back compares nothing: the forward run did, and the reverse replica applies the target's
            # own binlog from the exact position both stood at.
            if settings.compare and not reverse_over_replica(ctx):
                self._compare(ctx, source, target, result)
            self._health(ctx, result)
            self._files_prepass(ctx, result)
            self._wait_for_lag(ctx, source, target, result)
            keep_shells(ctx)
            open_window_route(ctx)
        except ReplicationError as exc:
            raise StepError(f"catching up: {exc}") from None
        finally:
            rt.release(source)
            rt.release(target)
        return result.journal()

    @staticmethod
    def _replica_error(ctx: StepContext, conn: Any) -> str | None:
        status = replication(runtime(ctx)).replica_status(conn)
        if status is None:
            return "the target is not a replica"
        return status.error

    def _compare(self, ctx: StepContext, source: Any, target: Any, result: CatchupResult) -> None:
        rt = runtime(ctx)
        settings = rt.plan.replication
        assert settings is not None
        tables = rt.database.list_tables(source, rt.plan.database.schemas)
        snapshot_conn = rt.db("source", read_timeout=max(rt.plan.database.read_timeout, 600.0))
        started = time.monotonic()
        chunks = 0
        last_log = 0.0

        def _progress(table: str, done: int, total: int) -> None:
            nonlocal chunks, last_log
            chunks += 1
            now = time.monotonic()
            if now - last_log >= LOG_EVERY or done == total:
                last_log = now
                ctx.log.info("repl.compare_progress", table=table, chunk=done, of=total)

        rep = replication(rt)
        ctx.log.info("repl.compare_started", tables=len(tables))
        try:
            compared = rep.compare(
                snapshot_conn, target, tables, chunk_rows=settings.chunk_rows, pause_ratio=settings.compare_pause,
                timeout=settings.lag_wait, on_chunk=_progress,
            )  # fmt: skip
        finally:
            rt.release(snapshot_conn)
        result.snapshot_gtid = str(compared.position)
        if compared.error is not None:
            why = compared.error or f"it did not reach it within {settings.lag_wait:g} s (replication.lag_wait)"
            raise StepError(f"the replica could not stop at the snapshot's position {compared.position}: {why}")
        diffs = compared.differences
        result.compared_tables = len(tables)
        result.compared_chunks = chunks
        result.compare_seconds = round(time.monotonic() - started, 3)
        if diffs:
            more = f" (and {len(diffs) - 3} more chunks)" if len(diffs) > 3 else ""
            raise StepError(
                "the replica differs from the source at "
                + str(result.snapshot_gtid)
                + ": "
                + "; ".join(d.describe() for d in diffs[:3])
                + more
            )
        for line in compared.not_compared:
            ctx.log.warning("repl.compare_not_compared", table=line)
        result.not_compared = list(compared.not_compared)
        rep.start_replica(target)
        ctx.log.info("repl.compared_equal", tables=len(tables), chunks=chunks, seconds=result.compare_seconds)

    def _health(self, ctx: StepContext, result: CatchupResult) -> None:
        """The target's services run fenced on the replica's data: the health checks pass here, before the window,
        so inside it only the cheap ones run again (`when: both`) and the costly ones (`when: before`) not at all."""
        plan = runtime(ctx).plan
        checks = health.checks_for(plan.health, health.BEFORE, replicate=True)
        started = time.monotonic()
        tries, failures = health.run_checks(ctx, checks, plan.health)
        result.health_tries = tries
        result.health_seconds = round(time.monotonic() - started, 3)
        if failures:
            raise StepError(
                "the target failed its health checks before the window (the source serves as before): "
                + "; ".join(failures)
            )

    def _files_prepass(self, ctx: StepContext, result: CatchupResult) -> None:
        """The uploads changed since the pre-sync (the seed and the comparison took a while), copied while the
        source serves: the final pass inside the window then moves only what changed after this."""
        presync = FilesResult.of(ctx.output("files_presync"))
        for tree in runtime(ctx).plan.files:
            figures = tracked_prepass(ctx, tree, presync.trees.get(tree.name))
            if figures is not None:
                result.prewindow_trees[tree.name] = figures

    def _wait_for_lag(self, ctx: StepContext, source: Any, target: Any, result: CatchupResult) -> None:
        settings = runtime(ctx).plan.replication
        assert settings is not None
        rep = replication(runtime(ctx))
        started = time.monotonic()
        last_log = 0.0
        while True:
            wanted = rep.write_position(source)
            waited = rep.wait_for_position(target, wanted, settings.max_lag)
            if waited.outcome == "reached":
                result.lag_seconds = round(waited.waited, 3)
                result.lag_waited_seconds = round(time.monotonic() - started, 3)
                ctx.log.info("repl.caught_up", lag_s=result.lag_seconds, waited_s=result.lag_waited_seconds)
                return
            if waited.outcome == "replica_failed":
                raise StepError(f"the replica stopped: {waited.error}")
            spent = time.monotonic() - started
            status = rep.replica_status(target)
            behind = status.seconds_behind if status else None
            if spent >= settings.lag_wait:
                raise StepError(
                    f"the replica did not reach the source's position within replication.max_lag "
                    f"{settings.max_lag:g} s in {spent:.0f} s of trying (replication.lag_wait {settings.lag_wait:g} "
                    f"s): it stands at {waited.position or 'nothing'}, the source at {wanted}, "
                    f"Seconds_Behind_Master {behind}; nothing was changed, the source serves as before"
                )
            now = time.monotonic()
            if now - last_log >= LOG_EVERY:
                last_log = now
                ctx.log.info(
                    "repl.waiting_for_lag",
                    waiting_for=f"the replica to reach the source's position within {settings.max_lag:g} s",
                    replica_at=str(waited.position),
                    source_at=str(wanted),
                    seconds_behind=behind,
                    waited_s=round(spent, 1),
                    gives_up_after_s=settings.lag_wait,
                )
