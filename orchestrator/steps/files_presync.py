"""Pre-sync the file trees while the source is live: rsync on the source pushes each tree to the target."""

from __future__ import annotations

from typing import Any

from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext
from orchestrator.results import FilesResult
from orchestrator.steps.common import sync_tree


class FilesPresync(Step):
    name = "files_presync"
    title = "Pre-sync the file trees (source live)"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        if not plan.files:
            return ["no file trees in the plan"]
        return [
            f"on the source: rsync {t.source}/ → {plan.target.user}@{plan.target.address}:{t.target}/"
            + (f" (bwlimit {plan.transfer.bwlimit})" if plan.transfer.bwlimit else "")
            + (" with nice/ionice" if plan.transfer.nice else "")
            + (" under nocache (when installed)" if plan.transfer.nocache else "")
            + (
                f", paused while the source's load is above {plan.transfer.max_load:g}"
                if plan.transfer.max_load is not None
                else ""
            )
            for t in plan.files
        ]

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        trees = {tree.name: sync_tree(ctx, tree, live=True) for tree in runtime(ctx).plan.files}
        throttled = round(sum(t.throttled_seconds for t in trees.values()), 3)
        return FilesResult(
            trees=trees, bytes=sum(t.bytes for t in trees.values()), throttled_seconds=throttled
        ).journal()
