"""The file trees' delta after writes stopped: no bandwidth limit, no nice, we are in the downtime window.

Each tree's change tracker (started by files_presync before its first pass) lists on the source the paths created,
changed, renamed or deleted since; when its tracking can be trusted only those are copied (rsync --files-from,
deletions included): the work is O(changes). When it cannot (watch limit, queue overflow, tracker dead, network
filesystem, ...), the tree is scanned whole, and the log and the result say why and what that costs.
"""

from __future__ import annotations

import contextvars
import secrets
import shlex
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.model import FileTree, Retry
from orchestrator.results import CatchupResult, FilesResult, TreeFigures
from orchestrator.services.detached import Detached, parse_collected
from orchestrator.services.tracking import (
    ChangeList,
    ChangeTracker,
    TrackingError,
    final_pass_command,
    verify_listed_command,
)
from orchestrator.steps.common import sync_tree, window_route
from orchestrator.transports import rsync
from orchestrator.transports.rsync import Stats
from orchestrator.transports.ssh import TransportError

TRACKED = "tracked"
ONE_TRY = Retry(attempts=1)
FULL_SCAN = "full_scan"
# The comparison that rides the pass's command: its output follows this line, its exit status the other marker.
COMPARE_MARK = "--compared--"
COMPARE_EXIT = "compare_exit="
KEPT_ITEMS = 20  # differing paths kept in the result (their count is kept whole)
# Set on the run's runtime by start_early: each tree's list and pass started by the window's first command, by name.
STARTED_EARLY = "files_final_started_early"
EARLY_OUT = "final-early-{}.out"  # in the tracker's state directory, a name of its own for each start


class FilesFinal(Step):
    name = "files_final"
    title = "Copy the file trees' delta (writes blocked)"
    # In the replicate mode the switch lets it start once the source's fence is up: the delta then travels while
    # the replica applies its last transactions and is promoted, and while the target is verified; the engine
    # waits for it before the DNS flip (a commit point). No later step reads its output in that mode.
    runs_beside = True

    def __init__(self) -> None:
        self._targets_made: Future[None] | None = None

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        if not plan.files:
            return ["no file trees in the plan"]
        return [
            f"on the source: rsync of the paths tracked as changed in {t.source}/ → {plan.target.address}:"
            f"{t.target}/ at full speed (a full delta scan, nanosecond mtimes, if the tracking cannot be trusted)"
            for t in plan.files
        ]

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        result = FilesResult()
        presync = FilesResult.of(ctx.output("files_presync"))
        trees = runtime(ctx).plan.files
        if not trees:
            return result.journal()
        # The target directories are made on the target while the source builds its change lists: one SSH round
        # trip fewer on the window's path.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mkdir") as pool:
            self._targets_made = pool.submit(contextvars.copy_context().run, self._make_targets, ctx)
            for tree in trees:
                ctx.window.check(f"starting the final copy of tree {tree.name}")
                result.trees[tree.name] = self.final_copy(ctx, tree, presync.trees.get(tree.name))
                ctx.window.check(f"the final copy of tree {tree.name}")
        result.bytes = sum(t.bytes for t in result.trees.values())
        return result.journal()

    def _make_targets(self, ctx: StepContext) -> None:
        rt = runtime(ctx)
        paths = " ".join(shlex.quote(tree.target) for tree in rt.plan.files)
        rt.target.run(f"mkdir -p {paths}", timeout=ctx.window.timeout(60.0))

    def final_copy(self, ctx: StepContext, tree: FileTree, presync: TreeFigures | None) -> TreeFigures:
        ref = presync.tracker if presync else None
        if ref is None:
            return self.full_scan(ctx, tree, presync, "no change tracker was started for this tree")
        if ref.unavailable:
            return self.full_scan(ctx, tree, presync, f"the tracker could not start: {ref.unavailable}")
        tracker = ChangeTracker(runtime(ctx).source, tree.source, ref.state_dir, name=ref.name)
        # Through the window's rsync route, the pass over the list rides the list's own command (one round trip
        # for both): harmless if the list turns out untrusted (the full scan below copies everything anyway).
        started = time.monotonic()
        then = self._pass_command(ctx, tree, tracker.list_file)
        try:
            changes = self._collected(ctx, tree, tracker) if then is not None else None
            if changes is None:
                since = self._since_prepass(ctx, tree)
                changes = tracker.changes(timeout=ctx.window.timeout(300.0) or 300.0, then=then, since=since)
        except (TrackingError, TransportError) as exc:
            return self.full_scan(ctx, tree, presync, f"the change list could not be read: {exc}")
        if not changes.trust.trusted:
            return self.full_scan(ctx, tree, presync, "; ".join(changes.trust.reasons))
        figures = self._passed_with_list(ctx, tree, changes, started)
        if figures is None:
            figures = self.tracked_copy(ctx, tree, changes.path, changes.count)
        figures.entries = presync.entries if presync else None  # what a full scan would have had to compare
        return figures

    def start_early(self, ctx: StepContext) -> str | None:
        """For the switch's first command on the source, once its fence is up: each tracked tree's list and final
        pass (what final_copy would send, through the window's rsync route) started there in the background
        (services/detached.py). final_copy then collects the answer with one command, sent as soon as this step
        starts beside the switch, instead of starting the work one round trip later. Shell to put in that command;
        None: nothing to start (no tracker, no route: final_copy goes as before)."""
        rt = runtime(ctx)
        presync = FilesResult.of(ctx.output("files_presync"))
        started: dict[str, Detached] = {}
        for tree in rt.plan.files:
            figures = presync.trees.get(tree.name)
            ref = figures.tracker if figures else None
            if ref is None or ref.unavailable:
                continue
            tracker = ChangeTracker(rt.source, tree.source, ref.state_dir, name=ref.name)
            then = self._pass_command(ctx, tree, tracker.list_file)
            if then is None:
                continue
            timeout = ctx.window.timeout(300.0) or 300.0
            script = tracker.changes_script(tracker.list_file, wait=min(timeout, 60.0), then=then,
                                            since=self._since_prepass(ctx, tree))  # fmt: skip
            out = f"{ref.state_dir.rstrip('/')}/{EARLY_OUT.format(secrets.token_hex(4))}"
            started[tree.name] = Detached(script, out, timeout)
        setattr(rt, STARTED_EARLY, started)
        return "; ".join(detached.start() for detached in started.values()) or None

    def _collected(self, ctx: StepContext, tree: FileTree, tracker: ChangeTracker) -> ChangeList | None:
        """The list and pass the switch's first command started for this tree, once ended; None when it started
        none (or it never ran: then final_copy sends its own)."""
        detached = getattr(runtime(ctx), STARTED_EARLY, {}).pop(tree.name, None)
        if detached is None:
            return None
        # It ends by its own deadline (set from the window's when it started); the wait for it, by the window's.
        bound = ctx.window.timeout(detached.timeout + 10) or detached.timeout + 10
        answer = runtime(ctx).source.run(detached.collect(), timeout=bound, check=False)
        collected = parse_collected(answer.stdout)
        if collected is None:
            ctx.log.warning("final_pass_not_started_early", tree=tree.name, instead="its own command")
            return None
        _, output = collected
        ctx.log.info("final_pass_started_early", tree=tree.name)
        return tracker.read_changes(tracker.list_file, output, answer.stderr, then=True)

    @staticmethod
    def _since_prepass(ctx: StepContext, tree: FileTree) -> int:
        """Where the replicate mode's checked pre-window pass left the tracker's events (steps/common.py
        tracked_prepass): only what changed after it is listed now. 0: everything since the pre-sync."""
        catchup = ctx.output("repl_catchup")
        prepass = CatchupResult.of(catchup).prewindow_trees.get(tree.name) if catchup else None
        return prepass.since if prepass is not None and prepass.since else 0

    def _pass_command(self, ctx: StepContext, tree: FileTree, list_file: str) -> str | None:
        """The final pass over the list through the window's rsync route (None: no route, the pass goes apart),
        then, when it succeeded and the plan verifies files, the comparison verify_target makes of the listed paths
        (rsync --dry-run --checksum through the same route): writes are stopped, so nothing changes between the two,
        and verify_target reads its answer instead of a round trip of its own. The pass's status is the command's."""
        rt = runtime(ctx)
        route = window_route(ctx)
        if route is None:
            return None
        transfer = rt.plan.transfer
        passing = final_pass_command(
            tree.source, route.url(tree), list_file, exclude=tree.exclude, chown=tree.owner,
            timeout=transfer.rsync_timeout, whole_file=transfer.whole_file, extra=route.options(),
        )  # fmt: skip
        if not rt.plan.database.verify.files:
            return passing
        compare = verify_listed_command(
            tree.source, route.url(tree), list_file, exclude=tree.exclude, chown=tree.owner, extra=route.options()
        )
        return pass_then_compare(passing, compare)

    def _passed_with_list(
        self, ctx: StepContext, tree: FileTree, changes: ChangeList, started: float
    ) -> TreeFigures | None:
        """The figures of the pass that rode the list's command, or None when it must run apart: it did not run
        (an empty list needs none: then the figures of nothing), or failed (the pass apart retries it, over ssh
        if the route fails again)."""
        if changes.count == 0 or changes.then is None:
            return None
        code, output = changes.then
        if rsync.exit_kind(code) != "ok":
            ctx.log.warning("final_pass_with_list_failed", tree=tree.name, exit=code, instead="a pass apart")
            return None
        output, differing = compared_after_pass(output)
        stats = rsync.parse_stats(output)
        figures = TreeFigures(
            bytes=stats.transferred_bytes, files=stats.files_transferred, total_size=stats.total_size,
            seconds=round(time.monotonic() - started, 3), mode=TRACKED, listed=changes.count,
            change_list=changes.path, deleted=stats.deleted, route="daemon",
        )  # fmt: skip
        if differing is not None:
            figures.differing, figures.differing_items = len(differing), differing[:KEPT_ITEMS]
        ctx.log.info("final_pass_tracked", tree=tree.name, paths=changes.count, with_list=True,
                     compared=differing is not None)  # fmt: skip
        ctx.log.info("tree_synced", tree=tree.name, **figures.journal())
        return figures

    def tracked_copy(self, ctx: StepContext, tree: FileTree, list_file: str, count: int) -> TreeFigures:
        """rsync of the listed paths only: each copied, or deleted on the target when gone from the source."""
        rt = runtime(ctx)
        window = ctx.window
        ctx.log.info("final_pass_tracked", tree=tree.name, paths=count)
        started = time.monotonic()
        stats, route = rsync.Stats(), None
        if count:
            try:
                if self._targets_made is not None:
                    self._targets_made.result()  # made side by side with the change list (run)
                else:
                    rt.target.run(f"mkdir -p {shlex.quote(tree.target)}", timeout=window.timeout(60.0))
                stats, route = self._push_listed(ctx, tree, list_file)
            except TransportError as exc:
                raise StepError(f"copying the changes of tree {tree.name}: {exc}") from None
        figures = TreeFigures(
            bytes=stats.transferred_bytes, files=stats.files_transferred, total_size=stats.total_size,
            seconds=round(time.monotonic() - started, 3), mode=TRACKED, listed=count, change_list=list_file,
            deleted=stats.deleted, route=route,
        )  # fmt: skip
        ctx.log.info("tree_synced", tree=tree.name, **figures.journal())
        return figures

    def _push_listed(self, ctx: StepContext, tree: FileTree, list_file: str) -> tuple[Stats, str]:
        """The listed paths pushed through the window's rsync route (the daemon opened before the window) when there
        is one, over `-e ssh` otherwise or when the route fails (said in the log). Returns the figures and the way
        taken ("daemon" or "ssh")."""
        rt = runtime(ctx)
        plan = rt.plan
        window = ctx.window
        what = f"tracked final pass of tree {tree.name}"

        def push(destination: str, *, ssh: str | None = None, extra: Iterable[str] = (), once: bool = False) -> Stats:
            command = final_pass_command(
                tree.source, destination, list_file, ssh=ssh, exclude=tree.exclude, chown=tree.owner,
                timeout=plan.transfer.rsync_timeout, whole_file=plan.transfer.whole_file, extra=extra,
            )  # fmt: skip
            retry = ONE_TRY if once else window.bounded(plan.retry)
            return rsync.push(rt.source, command, what=what, retry=retry, timeout=window.timeout(), short=True)

        route = window_route(ctx)
        if route is not None:
            try:
                # One try: a route that fails is not retried inside the window, the ssh way below is.
                return push(route.url(tree), extra=route.options(), once=True), "daemon"
            except TransportError as exc:
                window.check(f"the final copy of tree {tree.name}")
                ctx.log.warning("window_route_failed", tree=tree.name, error=str(exc), instead="rsync -e ssh")
        hop = rsync.target_ssh_command(plan)
        return push(rsync.target_spec(plan, tree.target), ssh=hop, extra=rsync.remote_rsync(plan)), "ssh"

    def full_scan(self, ctx: StepContext, tree: FileTree, presync: TreeFigures | None, reason: str) -> TreeFigures:
        """The whole tree's delta: every file stat'ed on both hosts. Said loudly, with why and what it costs."""
        entries = presync.entries if presync else None
        size = presync.total_size if presync else None
        ctx.log.warning(
            "final_pass_full_scan", tree=tree.name, reason=reason, tree_entries=entries, tree_bytes=size,
            cost="every file of the tree is compared on both hosts while writes are blocked",
        )  # fmt: skip
        figures = sync_tree(ctx, tree, live=False)
        figures.mode = FULL_SCAN
        figures.fallback_reason = reason
        figures.entries = figures.entries or entries
        return figures


def pass_then_compare(passing: str, compare: str) -> str:
    """Shell: the pass, then, only when it succeeded, the comparison; the pass's status is the command's. The
    comparison's messages are not items: one that fails says so by its status (and verify_target compares)."""
    return (
        f"{passing}; rc=$?; echo {COMPARE_MARK}; if [ $rc -eq 0 ]; then {compare} 2>/dev/null; "
        f"echo {COMPARE_EXIT}$?; fi; exit $rc"
    )


def compared_after_pass(output: str) -> tuple[str, list[str] | None]:
    """The pass's own output, and the items its comparison found differing (None: no comparison ran, or it failed:
    verify_target compares then)."""
    passed, marked, rest = output.partition(f"{COMPARE_MARK}\n")
    if not marked:
        return output, None
    listed, found, status = rest.rpartition(COMPARE_EXIT)
    if not found or status.strip() != "0":
        return passed, None
    return passed, rsync.itemized(listed)
