"""The final datadir pass: the source database is stopped (cut-over), its quiet datadir's delta goes to the target.

Full speed (no bandwidth limit, no nice: writes are blocked), delta transfer, nanosecond mtimes, and every file
the source changed since the pre-sync began is recopied whatever its size and mtime say. Bounded by the downtime
window, retries included: a pass that cannot finish in time fails and the run rolls back. Re-running it is safe and
cheap (a resume re-enters it from its start).

Then, still inside the window and before the target starts (it would write to its datadir), the files the pass copied
(every file changed since the pre-sync began, and whatever else rsync received) are checksummed on both hosts side by
side and must be equal: O(changes). Row counts and CHECKSUM TABLE of every table are the after-commit audit's.
"""

from __future__ import annotations

import contextvars
import fnmatch
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.results import CutoverResult, DbFinalResult
from orchestrator.retry import call_with_retry
from orchestrator.services import probes
from orchestrator.steps.common import DATADIR_EXCLUDES, presync_began, resolved_datadir
from orchestrator.transports import rsync
from orchestrator.transports.ssh import TransportError

# Files changed on the source since the pre-sync began (less this margin, for the clock offset's error)
# are recopied whatever their size and mtime say.
FORCE_MARGIN = 2.0
LISTING_TIMEOUT = 600.0


def _excluded(name: str) -> bool:
    """A path the pass never copies (DATADIR_EXCLUDES: patterns without a slash match the file's name)."""
    base = name.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(base, pattern) for pattern in DATADIR_EXCLUDES)


class DbFinal(Step):
    name = "db_final"
    title = "Final datadir pass (source database stopped, writes blocked)"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        return [
            f"final pass of {plan.database.source.datadir} → {plan.target.address}:{plan.database.target.datadir}"
            " (full speed, delta transfer; every file changed since the pre-sync began is recopied)",
            "checksums of the files that pass copied, on both hosts, must be equal (before the target starts)",
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
            resolved_datadir(ctx, "source"),  # the real directories, as preflight resolved them (no link)
            resolved_datadir(ctx, "target"),
            exclude=DATADIR_EXCLUDES,
            live=False,  # the downtime window: no bandwidth limit, no nice
            inplace=True,
            # rsync's quick check compares whole seconds by default: a file rewritten in the second it was
            # last copied, at the same size, would be skipped. Nanoseconds close that gap.
            # Delta transfer whatever transfer.whole_file says: the target holds a pre-synced copy of every
            # file, so only the blocks written since travel (a hot table is mostly unchanged).
            # The items it received are the files checked below.
            extra=["--modify-window=-1", "--no-whole-file", "--itemize-changes"],
        )
        # Each try gets what is left of the budget as its deadline (the remote rsync is wrapped in `timeout`, so it
        # dies at that deadline even if this process died first); the tries end with the budget.
        one_try = plan.retry.model_copy(update={"attempts": 1})
        stats = call_with_retry(
            lambda: rsync.push(
                rt.source,
                command,
                what="final datadir pass",
                retry=one_try,
                timeout=window.timeout(),
            ),
            window.bounded(plan.retry),
            what="final datadir pass",
        )
        passed = round(time.monotonic() - started, 3)
        window.check("the final datadir pass")
        # Forced files were copied by whichever try ran first; the last try lists what it received itself.
        copied = sorted({name.removeprefix("./") for name in forced if not _excluded(name)} | set(stats.received))
        verify_seconds = self._verify_copied(ctx, copied)
        # With delta transfer, the literal data is what travelled; the files' size is what was brought up to date.
        result = DbFinalResult(
            final_pass_bytes=stats.literal_bytes,
            final_pass_files_size=stats.transferred_bytes,
            final_pass_forced_files=len(forced),
            final_pass_seconds=passed,
            verified_files=len(copied),
            verify_seconds=verify_seconds,
        )
        ctx.log.info("db_final.pass", **result.journal())
        return result.journal()

    def _verify_copied(self, ctx: StepContext, names: list[str]) -> float:
        """The copied files' checksums (CRC-32 and size), read on both hosts side by side, must be equal; bounded by
        the budget. rsync also checks each file it rebuilt against the sender's whole-file checksum: this is the
        independent proof, read on both hosts after the pass."""
        rt = runtime(ctx)
        window = ctx.window
        started = time.monotonic()
        window.check("checksumming the files the final pass copied")
        if not names:
            return 0.0
        listing = "\0".join(names) + "\0"

        def _sums(host: Any, datadir: str) -> dict[str, str]:
            # cksum (CRC-32 and size, hardware-accelerated in current coreutils: several times md5sum's speed) is
            # made to catch a copy that differs. "crc size name" per file; a datadir's file names are the server's
            # own encoding (no newline); a file missing on one side is left out.
            out = host.run(f"cd {shlex.quote(datadir)} && xargs -0 -r cksum --", input=listing,
                           timeout=window.timeout(LISTING_TIMEOUT), check=False).stdout  # fmt: skip
            sums = {}
            for line in out.splitlines():
                crc, size, name = [*line.split(" ", 2), "", ""][:3]
                if name:
                    sums[name] = f"{crc} {size}"
            return sums

        try:
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix="db-final-sums") as pool:
                run = contextvars.copy_context().run
                source_future = pool.submit(run, _sums, rt.source, resolved_datadir(ctx, "source"))
                target = _sums(rt.target, resolved_datadir(ctx, "target"))
                source = source_future.result()
        except TransportError:
            window.check("checksumming the files the final pass copied")  # cut short by the budget: say so
            raise
        differing = [name for name in names if source.get(name) != target.get(name)]
        seconds = round(time.monotonic() - started, 3)
        ctx.log.info("db_final.copied_files_verified", files=len(names), differing=len(differing), seconds=seconds)
        if differing:
            more = f" and {len(differing) - 5} more" if len(differing) > 5 else ""
            raise StepError(
                f"{len(differing)} file(s) the final datadir pass copied differ between the hosts (checksums): "
                + ", ".join(differing[:5])
                + more
            )
        window.check("checksumming the files the final pass copied")
        return seconds

    def _mark_recent_files_stale(self, ctx: StepContext) -> list[str]:
        """Make the final pass copy every file the source changed since the pre-sync began.

        Size and mtime are not proof of equal content: a file rewritten within the timestamp tick in which a
        pre-sync round read it keeps the mtime the target copy got. Files last written before the pre-sync
        began were copied whole by its first round. Setting the target copies' mtime to the epoch forces rsync
        to transfer them; unknown start (no journal): every file.
        """
        rt = runtime(ctx)
        began = presync_began(ctx)
        since = None
        if began is not None:
            offset = CutoverResult.of(ctx.output("cutover")).source_clock_offset
            if offset is None:  # a cut-over journaled without it: one round trip more
                offset = probes.clock_offset(rt.source)
            since = began + offset - FORCE_MARGIN
        window = ctx.window
        names = probes.ask(
            rt.source,
            probes.files_changed_since(resolved_datadir(ctx, "source"), since),
            timeout=window.timeout(LISTING_TIMEOUT),
        )
        if names:
            rt.target.run(
                f"cd {shlex.quote(resolved_datadir(ctx, 'target'))} && xargs -0 -r touch -c -m -d @0 --",
                input="\0".join(names) + "\0",
                timeout=window.timeout(LISTING_TIMEOUT),
            )
        ctx.log.info("db_final.forced_files", files=len(names), presync_began=began)
        return names
