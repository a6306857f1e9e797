"""The final datadir pass: the source database is stopped (cut-over), its quiet datadir's delta goes to the target.

Full speed (no bandwidth limit, no nice: writes are blocked), delta transfer, nanosecond mtimes, and every file
the source changed since the pre-sync began is recopied whatever its size and mtime say. Bounded by the downtime
window, retries included: a pass that cannot finish in time fails and the run rolls back. Re-running it is safe and
cheap (a resume re-enters it from its start).
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from orchestrator import probes
from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext
from orchestrator.results import CutoverResult, DbFinalResult
from orchestrator.retry import call_with_retry
from orchestrator.steps.common import DATADIR_EXCLUDES, presync_began
from orchestrator.transports import rsync

# Files changed on the source since the pre-sync began (less this margin, for the clock offset's error)
# are recopied whatever their size and mtime say.
FORCE_MARGIN = 2.0
LISTING_TIMEOUT = 600.0


class DbFinal(Step):
    name = "db_final"
    title = "Final datadir pass (source database stopped, writes blocked)"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        return [
            f"final pass of {plan.database.source.datadir} → {plan.target.address}:{plan.database.target.datadir}"
            " (full speed, delta transfer; every file changed since the pre-sync began is recopied)"
        ]

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        plan = rt.plan
        window = ctx.window
        window.check("starting the final datadir pass")
        started = time.monotonic()
        forced = self._mark_recent_files_stale(ctx)
        command = rsync.push_command(
            plan,
            plan.database.source.datadir,
            plan.database.target.datadir,
            exclude=DATADIR_EXCLUDES,
            live=False,  # the downtime window: no bandwidth limit, no nice
            inplace=True,
            # rsync's quick check compares whole seconds by default: a file rewritten in the second it was
            # last copied, at the same size, would be skipped. Nanoseconds close that gap.
            # Delta transfer whatever transfer.whole_file says: the target holds a pre-synced copy of every
            # file, so only the blocks written since travel (a hot table is mostly unchanged).
            extra=["--modify-window=-1", "--no-whole-file"],
        )
        # Each try gets what is left of the budget as its deadline (the remote rsync is wrapped in `timeout`, so it
        # dies at that deadline even if this process died first); the tries end with the budget.
        one_try = plan.retry.model_copy(update={"attempts": 1})
        stats = call_with_retry(
            lambda: rsync.push(
                rt.source,  # type: ignore[arg-type]
                command,
                what="final datadir pass",
                retry=one_try,
                timeout=window.timeout(),
            ),
            window.bounded(plan.retry),
            what="final datadir pass",
        )
        # With delta transfer, the literal data is what travelled; the files' size is what was brought up to date.
        result = DbFinalResult(
            final_pass_bytes=stats.literal_bytes,
            final_pass_files_size=stats.transferred_bytes,
            final_pass_forced_files=forced,
            final_pass_seconds=round(time.monotonic() - started, 3),
        )
        ctx.log.info("db_final.pass", **result.journal())
        window.check("the final datadir pass")
        return result.journal()

    def _mark_recent_files_stale(self, ctx: StepContext) -> int:
        """Make the final pass copy every file the source changed since the pre-sync began.

        Size and mtime are not proof of equal content: a file rewritten within the timestamp tick in which a
        pre-sync round read it keeps the mtime the target copy got. Files last written before the pre-sync
        began were copied whole by its first round. Setting the target copies' mtime to the epoch forces rsync
        to transfer them; unknown start (no journal): every file.
        """
        rt = runtime(ctx)
        db = rt.plan.database
        began = presync_began(ctx)
        since = None
        if began is not None:
            offset = CutoverResult.of(ctx.output("cutover")).source_clock_offset
            if offset is None:  # a cut-over journaled without it: one round trip more
                offset = probes.clock_offset(rt.source)
            since = began + offset - FORCE_MARGIN
        window = ctx.window
        names = probes.ask(
            rt.source, probes.files_changed_since(db.source.datadir, since), timeout=window.timeout(LISTING_TIMEOUT)
        )
        if names:
            rt.target.run(
                f"cd {shlex.quote(db.target.datadir)} && xargs -0 -r touch -c -m -d @0 --",
                input="\0".join(names) + "\0",
                timeout=window.timeout(LISTING_TIMEOUT),
            )
        ctx.log.info("db_final.forced_files", files=len(names), presync_began=began)
        return len(names)
