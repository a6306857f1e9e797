"""Pre-sync the file trees while the source is live: rsync on the source pushes each tree to the target.

Before each tree's first pass a change tracker (inotifywait, orchestrator/services/tracking.py) starts watching it on
the source, so the final pass inside the downtime window copies only what changed since. Each tracker is journaled
before it starts (undo stops it, a resumed run finds it again). After the pass, a full checksum comparison of the tree
runs here, throttled like the pre-sync: the O(data) verification happens while the service is live, and whatever it
finds different is added to the final pass's list (on a live tree: files written since the pass).
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.model import FileTree
from orchestrator.results import FilesResult, TrackerRef, TreeComparison
from orchestrator.services.tracking import ChangeTracker, TrackingError, state_dir_command, tracker_name
from orchestrator.steps.common import sync_tree, throttle_text
from orchestrator.transports import rsync
from orchestrator.transports.ssh import TransportError

# {tree name: TrackerRef}, journaled before each tracker starts.
TRACKERS = "trackers"
PROGRESS_INTERVAL = 5.0
MAX_LOGGED_DIFFERENCES = 5


def tracker_of(ctx: StepContext, tree: FileTree, ref: TrackerRef) -> ChangeTracker:
    return ChangeTracker(runtime(ctx).source, tree.source, ref.state_dir, name=ref.name)


class FilesPresync(Step):
    name = "files_presync"
    title = "Pre-sync the file trees (source live)"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        if not plan.files:
            return ["no file trees in the plan"]
        lines = []
        for t in plan.files:
            lines.append(f"on the source: start tracking changes in {t.source} (inotifywait), before the first pass")
            lines.append(
                f"on the source: rsync {t.source}/ → {plan.target.user}@{plan.target.address}:{t.target}/"
                + (f" (bwlimit {plan.transfer.bwlimit})" if plan.transfer.bwlimit else "")
                + (" with nice/ionice" if plan.transfer.nice else "")
                + (" under nocache (when installed)" if plan.transfer.nocache else "")
                + (f", {throttle_text(plan)}" if throttle_text(plan) else "")
            )
            lines.append(f"compare tree {t.name} in full (rsync --dry-run --checksum), before the window")
        return lines

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        plan = runtime(ctx).plan
        result = FilesResult()
        for tree in plan.files:
            ref = self.start_tracking(ctx, tree)
            figures = sync_tree(ctx, tree, live=True)
            figures.tracker = ref
            figures.compared = self.compare_before_window(ctx, tree, ref)
            result.trees[tree.name] = figures
        result.bytes = sum(t.bytes for t in result.trees.values())
        result.throttled_seconds = round(sum(t.throttled_seconds for t in result.trees.values()), 3)
        return result.journal()

    # --- change tracking ---

    def start_tracking(self, ctx: StepContext, tree: FileTree) -> TrackerRef:
        """Start (or find again, on a resumed run) the tree's tracker; its watches are set up when this returns.

        A tracker that cannot start is not a failure: the final pass then scans the whole tree, and says so."""
        rt = runtime(ctx)
        refs: dict[str, Any] = dict(ctx.saved(TRACKERS) or {})
        if tree.name in refs:
            ref = TrackerRef.of(refs[tree.name])
        else:
            state_dir = rt.source.run(state_dir_command(), timeout=60).stdout.strip()
            ref = TrackerRef(state_dir=state_dir, name=tracker_name(rt.plan.name, tree.name, tree.source))
            refs[tree.name] = ref.journal()
            ctx.save(TRACKERS, refs)  # journaled before it starts: undo stops what may have started
        tracker = tracker_of(ctx, tree, ref)
        try:
            if not tracker.is_running():
                # The pass below reads the whole tree again: a fresh tracker started before it misses nothing.
                tracker.remove()
            started = tracker.start()
        except (TrackingError, TransportError) as exc:
            ctx.log.warning("tracking_unavailable", tree=tree.name, reason=str(exc),
                            consequence="the final pass will scan the whole tree")  # fmt: skip
            return TrackerRef(state_dir=ref.state_dir, name=ref.name, unavailable=str(exc))
        ctx.log.info("tracking_started" if started else "tracking_found_running", tree=tree.name, root=tree.source)
        return ref

    # --- the full comparison, before the window ---

    def compare_before_window(self, ctx: StepContext, tree: FileTree, ref: TrackerRef) -> TreeComparison:
        """Every byte of the tree compared on both hosts (checksums), throttled; what differs joins the final list."""
        rt = runtime(ctx)
        plan = rt.plan
        command = rsync.compare_command(plan, tree.source, tree.target, exclude=tree.exclude, chown=tree.owner,
                                        live=True)  # fmt: skip
        paths: list[str] = []  # the differences only: O(changes since the pass), never the tree's names
        last_logged = 0.0

        def _line(line: str) -> None:
            nonlocal last_logged
            path = rsync.item_path(line)
            if path is not None:
                # The root itself (its permissions, say) is not listed: a listed root would recurse the whole tree.
                if path != ".":
                    paths.append(path)
                return
            progress = rsync.parse_progress(line)
            now = time.monotonic()
            if progress is not None and now - last_logged >= PROGRESS_INTERVAL:
                last_logged = now
                ctx.log.info("tree_compare_progress", tree=tree.name, bytes=progress.bytes, pct=progress.pct,
                             files=progress.files_done, differing=len(paths))  # fmt: skip

        started = time.monotonic()
        try:
            result = rt.source.stream(command, _line, timeout=None, check=False, keep=lambda _line: False)
        except TransportError as exc:
            raise StepError(f"comparing tree {tree.name} before the window: {exc}") from None
        if result.exit_status not in (0, rsync.VANISHED) and not (
            result.exit_status == rsync.PARTIAL and rsync.only_vanished(result.stderr)
        ):
            raise StepError(str(rsync.RsyncError(f"compare of tree {tree.name}", result.exit_status, result.stderr)))
        if paths and not ref.unavailable:
            tracker = tracker_of(ctx, tree, ref)
            tracker.write_extra(paths)
        comparison = TreeComparison(differing=len(paths), seconds=round(time.monotonic() - started, 3))
        ctx.log.info("tree_compared_before_window", tree=tree.name, differing=len(paths),
                     first=paths[:MAX_LOGGED_DIFFERENCES], seconds=comparison.seconds,
                     note="on a live tree: files written since the pass; the final pass copies them")  # fmt: skip
        return comparison

    def undo(self, ctx: StepContext) -> None:
        """Stop and remove every tracker this run started (only its own pid, verified)."""
        plan = runtime(ctx).plan
        refs: dict[str, Any] = dict(ctx.saved(TRACKERS) or {})
        for tree in plan.files:
            if tree.name in refs:
                tracker = tracker_of(ctx, tree, TrackerRef.of(refs[tree.name]))
                tracker.stop()
                tracker.remove()
                ctx.log.info("tracking_stopped", tree=tree.name)
