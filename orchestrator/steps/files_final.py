"""The file trees' delta after writes stopped: no bandwidth limit, no nice, we are in the downtime window."""

from __future__ import annotations

from typing import Any

from orchestrator.engine.step import Step, StepContext
from orchestrator.steps.files_presync import sync_tree
from orchestrator.steps.window import Window, blocked_since


class FilesFinal(Step):
    name = "files_final"
    title = "Copy the file trees' delta (writes blocked)"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = ctx.rt.plan
        if not plan.files:
            return ["no file trees in the plan"]
        return [
            f"on the source: rsync {t.source}/ → {plan.target.address}:{t.target}/ at full speed (delta only,"
            " nanosecond mtimes)"
            for t in plan.files
        ]

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        window = Window(ctx.rt.budget, blocked_since(ctx))
        trees: dict[str, Any] = {}
        for tree in ctx.rt.plan.files:
            window.check(f"starting the final copy of tree {tree.name}")
            trees[tree.name] = sync_tree(ctx, tree, live=False, time_left=window.left())
            window.check(f"the final copy of tree {tree.name}")
        return {"trees": trees, "bytes": sum(t["bytes"] for t in trees.values())}
