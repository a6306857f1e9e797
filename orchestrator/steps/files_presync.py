"""Pre-sync the file trees while the source is live: rsync on the source pushes each tree to the target."""

from __future__ import annotations

import shlex
import time
from typing import Any

from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.model import FileTree, Plan
from orchestrator.steps.window import bounded_retry
from orchestrator.transports import rsync
from orchestrator.transports.ssh import TransportError


def tree_push_command(plan: Plan, tree: FileTree, *, live: bool) -> str:
    """The rsync that pushes one tree, run on the source.

    Inside the downtime window (live=False) mtimes are compared to the nanosecond: rsync's default quick check
    compares whole seconds, so a file rewritten at the same size within the second the pre-sync copied it would
    look unchanged and its last write would be lost.
    """
    extra = [] if live else ["--modify-window=-1"]
    return rsync.push_command(
        plan, tree.source, tree.target, exclude=tree.exclude, live=live, chown=tree.owner, extra=extra
    )


def sync_tree(ctx: StepContext, tree: FileTree, *, live: bool, time_left: float | None = None) -> dict[str, Any]:
    """Push one tree source → target, logging progress; the figures of the transfer.

    `time_left` bounds the push, retries included (inside the downtime window: what is left of the budget).
    """
    rt = ctx.rt
    plan = rt.plan
    command = tree_push_command(plan, tree, live=live)

    def _progress(p: rsync.Progress) -> None:
        ctx.log.info("rsync_progress", tree=tree.name, bytes=p.bytes, pct=p.pct, files=p.files_done,
                     rate=p.rate, eta=p.eta)  # fmt: skip

    started = time.monotonic()
    try:
        rt.target.run(f"mkdir -p {shlex.quote(tree.target)}", timeout=60)
        stats = rsync.push(
            rt.source,
            command,
            what=f"tree {tree.name}",
            retry=bounded_retry(plan.retry, time_left),
            on_progress=_progress,
            timeout=time_left,
        )
    except TransportError as exc:
        raise StepError(f"copying tree {tree.name}: {exc}") from None
    seconds = round(time.monotonic() - started, 3)
    figures = {
        "bytes": stats.transferred_bytes,
        "files": stats.files_transferred,
        "total_size": stats.total_size,
        "seconds": seconds,
    }
    ctx.log.info("tree_synced", tree=tree.name, **figures)
    return figures


class FilesPresync(Step):
    name = "files_presync"
    title = "Pre-sync the file trees (source live)"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = ctx.rt.plan
        if not plan.files:
            return ["no file trees in the plan"]
        return [
            f"on the source: rsync {t.source}/ → {plan.target.user}@{plan.target.address}:{t.target}/"
            + (f" (bwlimit {plan.transfer.bwlimit})" if plan.transfer.bwlimit else "")
            + (" with nice/ionice" if plan.transfer.nice else "")
            for t in plan.files
        ]

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        trees = {tree.name: sync_tree(ctx, tree, live=True) for tree in ctx.rt.plan.files}
        return {"trees": trees, "bytes": sum(t["bytes"] for t in trees.values())}
