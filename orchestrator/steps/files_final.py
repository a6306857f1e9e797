"""The file trees' delta after writes stopped: no bandwidth limit, no nice, we are in the downtime window."""

from __future__ import annotations

from typing import Any

from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext
from orchestrator.results import FilesResult
from orchestrator.steps.common import sync_tree


class FilesFinal(Step):
    name = "files_final"
    title = "Copy the file trees' delta (writes blocked)"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        if not plan.files:
            return ["no file trees in the plan"]
        return [
            f"on the source: rsync {t.source}/ → {plan.target.address}:{t.target}/ at full speed (delta only,"
            " nanosecond mtimes)"
            for t in plan.files
        ]

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        result = FilesResult()
        for tree in runtime(ctx).plan.files:
            ctx.window.check(f"starting the final copy of tree {tree.name}")
            result.trees[tree.name] = sync_tree(ctx, tree, live=False)
            ctx.window.check(f"the final copy of tree {tree.name}")
        result.bytes = sum(t.bytes for t in result.trees.values())
        return result.journal()
