"""Pre-sync the live datadir in rounds, so the final pass (source stopped) only copies a small delta.

A copy of a running InnoDB datadir is not consistent; these rounds only warm the target. The first round copies
whole files (as `transfer.whole_file` says); later rounds use delta transfer, so a hot table that changed in a few
pages sends those pages, not the whole file again. Once a round sends at most `presync.converged_bytes`, the final
pass will be short too, and the round's duration predicts it.

Then the files the rounds found changed (modified since the pre-sync began: the hot tables, InnoDB's logs) are read
into the page cache of both hosts, niced, when they fit in a quarter of the host's available memory. The final pass
inside the window must read them whole on both hosts (rsync's delta compares every block); the source's copy is cold
(InnoDB writes with O_DIRECT, the rounds read under `nocache`), so without this its disk reads would grow with the
files' size. After it, the pages InnoDB writes before the shutdown are dropped from the cache by those very writes:
only they are read from disk inside the window, O(changes). It costs a read of those files before the window and
that much of the live source's cache; a failure costs nothing but the speed-up.
"""

from __future__ import annotations

import contextvars
import math
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.results import DbPresyncResult, PresyncRound
from orchestrator.steps.common import DATADIR_EXCLUDES, resolved_datadir, throttle_text
from orchestrator.transports import rsync
from orchestrator.transports.ssh import TransportError

# Warm only files whose total size is at most this share of the host's MemAvailable.
WARM_SHARE = 4
WARM_TIMEOUT = 600.0


def warm_command(directory: str, *, share: int = WARM_SHARE) -> str:
    """Shell: read the NUL-separated names on stdin (relative to `directory`) into the page cache, niced, when their
    total size is at most 1/share of MemAvailable. Prints 'warmed=BYTES' or 'skipped=BYTES available=BYTES'."""
    nice = shlex.join(rsync.NICE)
    return (
        f'cd {shlex.quote(directory)} || exit 3; list=$(mktemp) || exit 3; cat > "$list"; '
        'total=$(xargs -0 -r stat -c %s -- < "$list" 2>/dev/null | awk \'{s += $1} END {printf "%d", s}\'); '
        "avail=$(awk '/^MemAvailable:/ {printf \"%d\", $2 * 1024}' /proc/meminfo 2>/dev/null); "
        f'if [ -n "$avail" ] && [ "$total" -le $((avail / {share})) ]; then '
        f'xargs -0 -r {nice} cat -- < "$list" > /dev/null 2>&1; echo "warmed=$total"; '
        'else echo "skipped=$total available=${avail:-unknown}"; fi; rm -f "$list"'
    )


def warm_outcome(output: str, seconds: float) -> str:
    """warm_command's answer, in words."""
    fields = dict(part.split("=", 1) for part in output.split() if "=" in part)
    if "warmed" in fields:
        return f"warmed {fields['warmed']} bytes in {seconds:.1f} s"
    if "skipped" in fields:
        return f"skipped: {fields['skipped']} bytes, more than 1/{WARM_SHARE} of {fields.get('available')} available"
    return f"not warmed: {output.strip()[:80] or 'no answer'}"


class DbPresync(Step):
    name = "db_presync"
    title = "Pre-sync the live database datadir in rounds"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        db = plan.database
        return [
            f"on the source: rsync --inplace {db.source.datadir}/ → {plan.target.address}:{db.target.datadir}/,"
            f" up to {db.presync.max_rounds} rounds, until a round moves ≤ {db.presync.converged_bytes} bytes"
            + (f"; {throttle_text(plan)}" if throttle_text(plan) else ""),
            "read the files changed since the pre-sync began into both hosts' page cache (niced, when they fit in"
            f" 1/{WARM_SHARE} of the available memory): the final pass inside the window then reads only the pages"
            " written since from disk",
        ]

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        plan = rt.plan
        db = plan.database
        if rt.db_answers("target"):
            raise StepError("the target database is running: stop it before copying its datadir (prepare_target)")
        # The real directories (a datadir may be a symbolic link to another disk): the copy lands in the directory
        # the target's server opens, whichever of the two names its configuration gives.
        source_dir, target_dir = resolved_datadir(ctx, "source"), resolved_datadir(ctx, "target")
        first_round = rsync.push_command(
            plan, source_dir, target_dir, exclude=DATADIR_EXCLUDES, live=True, inplace=True
        )
        # Nanosecond mtimes: a file rewritten within the second a round read it must not look unchanged.
        later_rounds = rsync.push_command(
            plan, source_dir, target_dir, exclude=DATADIR_EXCLUDES, live=True, inplace=True,
            extra=["--modify-window=-1", "--no-whole-file"],
        )  # fmt: skip
        rounds: list[PresyncRound] = []
        throttled = 0.0
        began = time.monotonic()
        try:
            rt.target.run(f"mkdir -p {shlex.quote(target_dir)}", timeout=60)
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
            throttled_seconds=round(throttled, 3), cache_warm=self._warm(ctx, time.monotonic() - began),
        ).journal()  # fmt: skip

    def _warm(self, ctx: StepContext, elapsed: float) -> dict[str, str]:
        """The files modified on the source since the pre-sync began (by the source's own clock: whole minutes,
        rounded up), read into both hosts' page cache side by side. Never fails the step."""
        rt = runtime(ctx)
        source_dir, target_dir = resolved_datadir(ctx, "source"), resolved_datadir(ctx, "target")
        minutes = math.ceil(elapsed / 60) + 1
        try:
            found = rt.source.run(
                f"cd {shlex.quote(source_dir)} && find . -type f -mmin -{minutes} -print0", timeout=60
            ).stdout
        except TransportError as exc:
            ctx.log.warning("db_presync.cache_warm_failed", reason=str(exc))
            return {"source": f"not warmed: {exc}", "target": f"not warmed: {exc}"}
        names = [n for n in found.split("\0") if n]
        if not names:
            return {"source": "nothing changed", "target": "nothing changed"}
        listing = "\0".join(names) + "\0"

        def _one(host: Any, datadir: str) -> str:
            started = time.monotonic()
            try:
                out = host.run(warm_command(datadir), input=listing, timeout=WARM_TIMEOUT, check=False).stdout
            except TransportError as exc:
                return f"not warmed: {exc}"
            return warm_outcome(out, time.monotonic() - started)

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="warm") as pool:
            target = pool.submit(contextvars.copy_context().run, _one, rt.target, target_dir)
            outcome = {"source": _one(rt.source, source_dir), "target": target.result()}
        ctx.log.info("db_presync.cache_warmed", files=len(names), **outcome)
        return outcome
