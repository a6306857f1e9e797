"""Seed (replicate mode): a consistent copy of the live source, streamed into the target, prepared, installed.

`mariadb-backup --backup --stream` runs on the source (nice/ionice, `replication.seed_throttle`) and pipes through
the source→target SSH hop into `mbstream -x` in a staging directory beside the target's datadir; `--prepare` makes
it consistent there; the prepared copy then takes the datadir's place (the previous datadir is kept beside it for
undo). The source serves throughout: mariadb-backup blocks its commits only for its BLOCK_COMMIT stage (tens of ms
with --log-copy-interval=10). The copy's GTID position is journaled: the replica starts from it.

The target's database is stopped the whole time (prepare_target stopped it; the step refuses a running one).
Journaled before each action it protects: `seed_streaming` (undo removes the staging dir), `seed_installing` (undo
puts the previous datadir back; a resume finishes a swap a crash cut short instead of repeating it), then the
position.
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.results import SeedResult
from orchestrator.steps.repl_common import DB_PASSWORD_ENV, SEED_POSITION, seed_spec
from orchestrator.transports import replication as repl
from orchestrator.transports.ssh import TransportError

STREAMING = "seed_streaming"
INSTALLING = "seed_installing"
SEED_TIMEOUT = 86400.0
STOP_TIMEOUT = 300.0


class ReplSeed(Step):
    name = "repl_seed"
    title = "Seed the target: a hot backup of the live source streamed over SSH, prepared and installed"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        settings = plan.replication
        throttle = f", --throttle={settings.seed_throttle}" if settings and settings.seed_throttle else ""
        nice = "nice/ionice, " if settings is None or settings.seed_nice else ""
        return [
            f"on the source: mariadb-backup --backup --stream ({nice}--log-copy-interval=10{throttle}) of "
            f"{plan.database.source.datadir} | ssh {plan.target.address} mbstream -x into "
            f"{plan.database.target.datadir}.seed (the source keeps serving)",
            f"on the target (database stopped): mariadb-backup --prepare, then the copy replaces "
            f"{plan.database.target.datadir} (the old one kept as {plan.database.target.datadir}.before-seed)",
            "journal the copy's GTID position (the replica starts there)",
        ]

    def check(self, ctx: StepContext) -> bool:
        return bool(ctx.saved(SEED_POSITION))

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        spec = seed_spec(rt.plan)
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
                rt.target.run(repl.prepare_command(spec), timeout=SEED_TIMEOUT)
                result.prepare_seconds = round(time.monotonic() - started, 3)
                ctx.save(INSTALLING, True)
                rt.target.run(repl.install_command(spec), timeout=STOP_TIMEOUT)
            else:
                ctx.log.info("repl.seed.finishing_install")
                rt.target.run(repl.finish_install_command(spec), timeout=STOP_TIMEOUT)
            info = rt.target.run(repl.backup_position_command(spec.target_datadir), timeout=60).stdout
            position = repl.parse_backup_position(info)
        except TransportError as exc:
            raise StepError(f"seeding the target: {exc}") from None
        except repl.ReplicationError as exc:
            raise StepError(f"seeding the target: {exc}") from None
        ctx.save(SEED_POSITION, str(position.gtid))
        result.gtid = str(position.gtid)
        result.binlog_file, result.binlog_position = position.file, position.position
        ctx.log.info("repl.seeded", gtid=result.gtid, bytes=result.bytes, seconds=result.stream_seconds)
        return result.journal()

    def _stream(self, ctx: StepContext, spec: repl.SeedSpec, result: SeedResult) -> None:
        rt = runtime(ctx)
        try:
            result.estimate_bytes = repl.parse_size(rt.source.run(repl.seed_size_command(spec), timeout=600).stdout)
        except (TransportError, ValueError, IndexError):
            result.estimate_bytes = None
        last_log = 0.0

        def _line(line: str) -> None:
            nonlocal last_log
            streamed = repl.parse_seed_progress(line)
            if streamed is None:
                return
            result.bytes = streamed
            now = time.monotonic()
            if now - last_log >= 1.0:
                last_log = now
                pct = round(100 * streamed / result.estimate_bytes, 1) if result.estimate_bytes else None
                ctx.log.info("seed_progress", bytes=streamed, pct=pct)

        password = runtime(ctx).db_password()  # type: ignore[attr-defined]
        env = {DB_PASSWORD_ENV: password} if password and spec.password_env else None
        ctx.save(STREAMING, True)
        started = time.monotonic()
        streamed = rt.source.stream(repl.seed_stream_command(spec), _line, timeout=SEED_TIMEOUT, env=env)
        result.stream_seconds = round(time.monotonic() - started, 3)
        stages = repl.parse_backup_stages(streamed.stdout)
        result.backup_stages = {s.stage: f"{s.started[-8:]}-{s.finished[-8:]}" for s in stages}

    def undo(self, ctx: StepContext) -> None:
        """The target's database stopped, its previous datadir back in place, the staging dir removed."""
        rt = runtime(ctx)
        if not (ctx.saved(STREAMING) or ctx.saved(INSTALLING)):
            return
        spec = seed_spec(rt.plan)
        if ctx.saved(INSTALLING):
            rt.target.run(rt.plan.database.target.stop, timeout=STOP_TIMEOUT)
            if rt.db_answers("target"):
                raise StepError("the target database still answers after its stop command: its datadir stays seeded")
            rt.target.run(repl.restore_previous_command(spec), timeout=STOP_TIMEOUT)
            ctx.log.info("repl.seed.previous_datadir_restored")
        rt.target.run(repl.discard_staging_command(spec), timeout=STOP_TIMEOUT)
        ctx.save(INSTALLING, False)
        ctx.save(STREAMING, False)
