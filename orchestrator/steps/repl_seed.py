"""Seed (replicate mode): a consistent copy of the live source, streamed into the target, prepared, installed.

`mariadb-backup --backup --stream` runs on the source (nice/ionice, `replication.seed_throttle`) and pipes through
the source→target SSH hop into `mbstream -x` in a staging directory beside the target's datadir; `--prepare` makes
it consistent there; the prepared copy then takes the datadir's place (the previous datadir is kept beside it for
undo). Both datadirs are the real directories preflight resolved on their hosts: when /var/lib/mysql is a link
to another disk, the staging dir, the swap and `<datadir>.before-seed` are beside the directory it points at (one
filesystem: the renames copy nothing), and the link stays. The source serves throughout: mariadb-backup blocks its
commits only for its BLOCK_COMMIT stage (tens of ms with --log-copy-interval=10), and gets back the ordinary CPU
and I/O priority from its locking stages on (a niced process holding BLOCK_COMMIT on a busy host would hold every
commit for seconds). The copy's GTID position is
journaled: the replica starts from it.

Like the pre-syncs, the stream runs under `nocache` where the source has it (`transfer.nocache`): its LD_PRELOAD
follows mariadb-backup, which then drops from the page cache each data file's pages it brought in (pages the live
server had cached stay).

With `transfer.max_load` or `transfer.max_latency_ms` the backup pauses like the pre-syncs (SIGSTOP/SIGCONT of its
process group: mariadb-backup, dd and the ssh to the target), within two bounds of its own: never once it began the
stages that lock the live server (from BACKUP STAGE FLUSH on: a paused BLOCK_COMMIT would hold every commit), and
never past the point where its redo log copier, paused with it, could lose redo the source writes over: a pause ends
once the source wrote REDO_SHARE of its redo log (innodb_log_file_size) since it began, checked every
PAUSED_CHECK_SECONDS (and `transfer.max_pause` bounds it as always).

The target's database is stopped the whole time (prepare_target stopped it; the step refuses a running one).
Journaled before each action it protects: `seed_streaming` (undo removes the staging dir), `seed_installing` (undo
puts the previous datadir back; a resume finishes a swap a crash cut short instead of repeating it), then the
position.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.database.protocol import DatabaseError, ReplicationError, SeedKit
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.results import SeedResult
from orchestrator.steps.common import resolved_datadir, throttle_text
from orchestrator.steps.repl_common import SEED_POSITION, replication, seed_spec
from orchestrator.transports.ssh import TransportError
from orchestrator.transports.throttle import Thresholds, Throttle, group_marker, live_command

STREAMING = "seed_streaming"
INSTALLING = "seed_installing"
SEED_TIMEOUT = 86400.0
STOP_TIMEOUT = 300.0
# The pause bound for the backup's redo log copier: at most this share of the source's redo log written during one
# pause (the copier, stopped with the backup, was at most --log-copy-interval behind when it stopped; the rest of
# the log is the margin for the last check interval and for its catching up after the resume).
REDO_SHARE = 0.5
PAUSED_CHECK_SECONDS = 0.5


class RedoGuard:
    """Ends a pause of the backup before the source writes over redo its copier has not read: the source's LSN when
    the pause began against its LSN now, at most REDO_SHARE of its redo log's size. Called from the throttle's
    thread only (its own connection)."""

    def __init__(self, read_lsn: Callable[[], int], capacity: int) -> None:
        self.read_lsn, self.capacity = read_lsn, capacity
        self.paused_at_lsn: int | None = None
        self.most_written = 0  # the most redo written during one pause, bytes

    def pause_began(self) -> None:
        try:
            self.paused_at_lsn = self.read_lsn()
        except Exception:  # unreadable: must_resume ends the pause at once
            self.paused_at_lsn = None

    def must_resume(self) -> str | None:
        if self.paused_at_lsn is None:
            return "the source's redo log position cannot be read"
        try:
            written = self.read_lsn() - self.paused_at_lsn
        except Exception:
            return "the source's redo log position cannot be read"
        self.most_written = max(self.most_written, written)
        if written >= REDO_SHARE * self.capacity:
            return f"the redo log: {written} bytes written since the pause, of {self.capacity}"
        return None


def _spec(ctx: StepContext) -> Any:
    """The seed acts on each datadir as its host resolves it: with /var/lib/mysql a link to another disk, the copy
    is staged, swapped in and the old one kept beside the directory the link points at; the link stays."""
    rt = runtime(ctx)
    return seed_spec(rt.plan, replication(rt), source_datadir=resolved_datadir(ctx, "source"),
                     target_datadir=resolved_datadir(ctx, "target"))  # fmt: skip


def _kit(ctx: StepContext) -> SeedKit:
    """The engine's seed commands and their parsers."""
    return replication(runtime(ctx)).seed


class ReplSeed(Step):
    name = "repl_seed"
    title = "Seed the target: a hot backup of the live source streamed over SSH, prepared and installed"

    def describe(self, ctx: StepContext) -> list[str]:
        rt = runtime(ctx)
        plan = rt.plan
        return replication(rt).describe("seed", plan) + (
            [
                f"the backup {throttle_text(plan)} (never once it began locking the source, from BACKUP STAGE FLUSH "
                f"on; a pause ends once the source wrote {REDO_SHARE:.0%} of its redo log)"
            ]
            if throttle_text(plan)
            else []
        )

    def check(self, ctx: StepContext) -> bool:
        return bool(ctx.saved(SEED_POSITION))

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        spec, seed = _spec(ctx), _kit(ctx)
        result = SeedResult()
        try:
            if not ctx.saved(INSTALLING):
                if rt.db_answers("target"):
                    raise StepError(
                        "the target database is running: the seed replaces its datadir (prepare_target stops it; "
                        "check services.stop_target_first)"
                    )
                self._stream(ctx, spec, result)
                started = time.monotonic()
                rt.target.run(seed.prepare_command(spec), timeout=SEED_TIMEOUT)
                result.prepare_seconds = round(time.monotonic() - started, 3)
                ctx.save(INSTALLING, True)
                rt.target.run(seed.install_command(spec), timeout=STOP_TIMEOUT)
            else:
                ctx.log.info("repl.seed.finishing_install")
                rt.target.run(seed.finish_install_command(spec), timeout=STOP_TIMEOUT)
            info = rt.target.run(seed.backup_position_command(spec.target_datadir), timeout=60).stdout
            position = seed.parse_backup_position(info)
        except TransportError as exc:
            raise StepError(f"seeding the target: {exc}") from None
        except ReplicationError as exc:
            raise StepError(f"seeding the target: {exc}") from None
        ctx.save(SEED_POSITION, str(position.gtid))
        result.gtid = str(position.gtid)
        result.binlog_file, result.binlog_position = position.file, position.position
        ctx.log.info("repl.seeded", gtid=result.gtid, bytes=result.bytes, seconds=result.stream_seconds)
        return result.journal()

    def _stream(self, ctx: StepContext, spec: Any, result: SeedResult) -> None:
        rt = runtime(ctx)
        seed = _kit(ctx)
        try:
            result.estimate_bytes = seed.parse_size(rt.source.run(seed.seed_size_command(spec), timeout=600).stdout)
        except (TransportError, ValueError, IndexError):
            result.estimate_bytes = None
        last_log = 0.0

        def _line(line: str) -> None:
            nonlocal last_log
            streamed = seed.parse_seed_progress(line)
            if streamed is None:
                return
            result.bytes = streamed
            now = time.monotonic()
            if now - last_log >= 1.0:
                last_log = now
                pct = round(100 * streamed / result.estimate_bytes, 1) if result.estimate_bytes else None
                ctx.log.info("seed_progress", bytes=streamed, pct=pct)

        settings = rt.plan.replication
        if seed.secret == "replication" and settings is not None:
            password: str | None = rt.secret(settings.password)
        else:
            password = rt.db_password()
        # The password goes to the script's stdin, which gives it to the backup program alone (the engine's seed).
        stdin = (password or "") + "\n" if spec.password_env else None
        ctx.save(STREAMING, True)
        started = time.monotonic()
        thresholds = Thresholds.of(rt.plan)
        if thresholds is None:
            # Under `nocache` like the pre-syncs (transfer.nocache, where the source has it): the backup's reads of
            # every data file leave the live server's page cache as they found it.
            command = live_command(seed.seed_stream_command(spec), nocache=rt.plan.transfer.nocache, group_marker=None)
            streamed = rt.source.stream(command, _line, timeout=SEED_TIMEOUT, input=stdin)
        else:
            streamed = self._throttled(ctx, spec, thresholds, _line, stdin, result)
        result.stream_seconds = round(time.monotonic() - started, 3)
        stages = seed.parse_backup_stages(streamed.stdout)
        result.backup_stages = {s.stage: f"{s.started[-8:]}-{s.finished[-8:]}" for s in stages}
        locks = seed.parse_backup_locks(streamed.stdout)
        result.commits_blocked_seconds, result.ddl_blocked_seconds = locks.commits_blocked, locks.ddl_blocked
        result.commits_blocked_at = locks.commits_blocked_from
        ctx.log.info("repl.seed.source_locks", commits_blocked_s=locks.commits_blocked, ddl_blocked_s=locks.ddl_blocked)

    def _throttled(
        self,
        ctx: StepContext,
        spec: Any,
        thresholds: Thresholds,
        line: Callable[[str], None],
        stdin: str | None,
        result: SeedResult,
    ) -> Any:
        """The stream in a process group of its own, paused while the source is loaded or the app slow, within the
        backup's own bounds (its locking stages, its redo log)."""
        rt = runtime(ctx)
        seed = _kit(ctx)
        marker = group_marker(rt.plan.source.private_dir, "seed")
        log_path = marker + ".log"
        command = live_command(seed.seed_stream_command(spec, log_path=log_path), nocache=rt.plan.transfer.nocache,
                               group_marker=marker, max_load=thresholds.max_load)  # fmt: skip
        try:
            conn = rt.db("source", read_timeout=30.0)
        except DatabaseError as exc:
            raise StepError(f"seeding the target: the throttle cannot read the source's redo log: {exc}") from None
        try:
            try:
                guard = RedoGuard(lambda: seed.redo_lsn(conn), seed.redo_capacity(conn))
            except DatabaseError as exc:
                raise StepError(f"seeding the target: {exc.about('the source redo log size')}") from None
            throttle = Throttle(rt.source, marker, thresholds, what="seed",
                                may_not_stop=seed.seed_locking_command(log_path), on_pause=guard.pause_began,
                                must_resume=guard.must_resume, paused_check_interval=PAUSED_CHECK_SECONDS)  # fmt: skip
            with throttle:
                streamed = rt.source.stream(command, line, timeout=SEED_TIMEOUT, input=stdin)
        finally:
            rt.release(conn)
        result.throttled_seconds = round(throttle.throttled_seconds, 3)
        result.throttle = {**throttle.figures(), "most_redo_in_a_pause": guard.most_written,
                           "redo_log_bytes": guard.capacity}  # fmt: skip
        ctx.log.info("seed_throttle", **result.throttle)
        return streamed

    def undo(self, ctx: StepContext) -> None:
        """The target's database stopped, its previous datadir back in place, the staging dir removed."""
        rt = runtime(ctx)
        if not (ctx.saved(STREAMING) or ctx.saved(INSTALLING)):
            return
        spec, seed = _spec(ctx), _kit(ctx)
        if ctx.saved(INSTALLING):
            rt.target.run(rt.plan.database.target.stop, timeout=STOP_TIMEOUT)
            if rt.db_answers("target"):
                raise StepError("the target database still answers after its stop command: its datadir stays seeded")
            rt.target.run(seed.restore_previous_command(spec), timeout=STOP_TIMEOUT)
            ctx.log.info("repl.seed.previous_datadir_restored")
        rt.target.run(seed.discard_staging_command(spec), timeout=STOP_TIMEOUT)
        ctx.save(INSTALLING, False)
        ctx.save(STREAMING, False)
