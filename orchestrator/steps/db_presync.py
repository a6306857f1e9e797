"""Pre-sync the live datadir in rounds, so the final pass (source stopped) only copies a small delta.

A copy of a running InnoDB datadir is not consistent; these rounds only warm the target. The first round copies
whole files (as `transfer.whole_file` says); later rounds use delta transfer, so a hot table that changed in a few
pages sends those pages, not the whole file again. Once a round sends at most `presync.converged_bytes`, the final
pass will be short too, and the round's duration predicts it.
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.results import DbPresyncResult, PresyncRound
from orchestrator.steps.common import DATADIR_EXCLUDES, throttle_text
from orchestrator.transports import rsync
from orchestrator.transports.ssh import TransportError


class DbPresync(Step):
    name = "db_presync"
    title = "Pre-sync the live database datadir in rounds"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        db = plan.database
        return [
            f"on the source: rsync --inplace {db.source.datadir}/ → {plan.target.address}:{db.target.datadir}/,"
            f" up to {db.presync.max_rounds} rounds, until a round moves ≤ {db.presync.converged_bytes} bytes"
            + (f"; {throttle_text(plan)}" if throttle_text(plan) else "")
        ]

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        plan = rt.plan
        db = plan.database
        if rt.db_answers("target"):
            raise StepError("the target database is running: stop it before copying its datadir (prepare_target)")
        first_round = rsync.push_command(
            plan, db.source.datadir, db.target.datadir, exclude=DATADIR_EXCLUDES, live=True, inplace=True
        )
        # Nanosecond mtimes: a file rewritten within the second a round read it must not look unchanged.
        later_rounds = rsync.push_command(
            plan, db.source.datadir, db.target.datadir, exclude=DATADIR_EXCLUDES, live=True, inplace=True,
            extra=["--modify-window=-1", "--no-whole-file"],
        )  # fmt: skip
        rounds: list[PresyncRound] = []
        throttled = 0.0
        try:
            rt.target.run(f"mkdir -p {shlex.quote(db.target.datadir)}", timeout=60)
            for number in range(1, db.presync.max_rounds + 1):
                started = time.monotonic()

                def _progress(p: rsync.Progress, number: int = number) -> None:
                    ctx.log.info("rsync_progress", round=number, bytes=p.bytes, pct=p.pct, rate=p.rate, eta=p.eta)

                command = first_round if number == 1 else later_rounds
                stats, paused = rsync.push_live(
                    rt.source, plan, command, what=f"datadir round {number}", retry=plan.retry, on_progress=_progress
                )
                throttled += paused
                seconds = round(time.monotonic() - started, 3)
                # What travelled: rsync's literal data (with whole files, their size; with delta transfer, the
                # changed blocks only).
                sent = stats.literal_bytes
                rounds.append(
                    PresyncRound(round=number, bytes=sent, files_size=stats.transferred_bytes, seconds=seconds)
                )
                ctx.log.info("db_presync_round", round=number, bytes=sent, files_size=stats.transferred_bytes,
                             seconds=seconds, total_size=stats.total_size)  # fmt: skip
                if number > 1 and sent <= db.presync.converged_bytes:
                    break
        except TransportError as exc:
            raise StepError(f"datadir pre-sync: {exc}") from None
        converged = rounds[-1].bytes <= db.presync.converged_bytes
        if not converged:
            ctx.log.warning("db_presync_not_converged", rounds=len(rounds), last_bytes=rounds[-1].bytes)
        if rounds[-1].seconds > plan.cutover.max_write_block:
            ctx.log.warning(
                "db_presync_slower_than_budget",
                last_round_seconds=rounds[-1].seconds,
                max_write_block=plan.cutover.max_write_block,
                hint="the final pass may not fit cutover.max_write_block; the run would roll back if it does not",
            )
        return DbPresyncResult(
            rounds=rounds, converged=converged, predicted_final_seconds=rounds[-1].seconds,
            throttled_seconds=round(throttled, 3),
        ).journal()  # fmt: skip
