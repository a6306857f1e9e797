"""Verify the target before any traffic moves: health checks, then the data itself, O(changes) only.

Data, both modes: every path the final pass of each file tree copied or deleted is equal on both hosts, a deleted
one absent on both (the whole trees were compared before the window). Replicate mode: the GTID positions. Shutdown
mode: the datadir files the final pass copied were checksummed on both hosts by db_final. Row counts and CHECKSUM
TABLE read every row, so they are not read here: this step opens a read-only consistent snapshot on the still-fenced
target (one round trip) and keeps the session open; the `audit` step reads it after the commit and compares it with
the stopped source (orchestrator/services/audit.py). Replicate mode: the same snapshot of the promoted, still fenced
target, opened by the statement that reads the target's GTID position (one compound statement, one round trip, beside
the source's position and the trees' comparison), compared after the commit in chunks with the frozen
source (`Replication.audit_chunks`).

All of it runs while writes are blocked: every try, query and comparison is bounded by what is left of the
write-block budget, so a verification that cannot finish in time fails (and the run rolls back) instead of
keeping writes blocked past cutover.max_write_block.
"""

from __future__ import annotations

import contextvars
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.contracts import Which, runtime
from orchestrator.database.protocol import DatabaseError, PositionNotReached
from orchestrator.engine.interrupt import Interrupted
from orchestrator.engine.step import Step, StepContext
from orchestrator.plan.model import FileTree, Plan
from orchestrator.results import FilesResult, TreeFigures
from orchestrator.services import audit, health
from orchestrator.services.tracking import verify_listed_command
from orchestrator.steps.common import window_route
from orchestrator.steps.modes import REPLICATE, SHUTDOWN, CutoverMode
from orchestrator.steps.repl_common import SWITCH_STEP, replication
from orchestrator.transports import rsync
from orchestrator.transports.rsync_daemon import DaemonRoute
from orchestrator.transports.ssh import TransportError

MAX_LISTED = 5
# On the run's runtime: (the final position, the future of `positions`) the replicate switch started once it promoted
# the target (read_positions_early).
EARLY_POSITIONS = "early_positions"


def _listed(items: list[str]) -> str:
    more = f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return ", ".join(items[:MAX_LISTED]) + more


def tree_verification(
    plan: Plan, tree: FileTree, final: TreeFigures | None, route: DaemonRoute | None = None
) -> tuple[str | None, str]:
    """The in-window comparison of one tree (None: nothing to compare) and what it covers, in words. A tracked pass
    is checked through the window's rsync route when there is one (`route`), over `-e ssh` otherwise."""
    if final is not None and final.mode == "tracked" and final.change_list:
        if not final.listed:
            return None, "no path changed since the pre-sync"
        if route is not None:
            destination, ssh, extra = route.url(tree), None, route.options()
        else:
            destination, ssh = rsync.target_spec(plan, tree.target), rsync.target_ssh_command(plan)
            extra = rsync.remote_rsync(plan)
        command = verify_listed_command(
            tree.source, destination, final.change_list, ssh=ssh, exclude=tree.exclude, chown=tree.owner, extra=extra
        )  # fmt: skip
        deleted = f", {final.deleted} of them deleted on the target" if final.deleted else ""
        return command, f"the {final.listed} path(s) the final pass copied or deleted{deleted}"
    command = rsync.compare_command(plan, tree.source, tree.target, exclude=tree.exclude, chown=tree.owner)
    return command, "the whole tree (the final pass scanned it whole)"


class VerifyTarget(Step):
    name = "verify_target"
    title = "Verify the target: health checks, the changed files, a snapshot for the audit"
    # It checks the paths the uploads' final pass copied or deleted: that pass may still run beside (replicate mode).
    waits_for = ("files_final",)
    _snapshot_open = False  # the last position read on the target opened the audit's snapshot with it

    def __init__(self, *, mode: CutoverMode = SHUTDOWN) -> None:
        self.mode = mode

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        inside = self.mode.inside_checks(plan)
        lines = [f"health check {health.check_label(c)} (up to {plan.health.attempts} tries)" for c in inside]
        verify = plan.database.verify
        trees = [
            f"rsync --dry-run --checksum of the paths the final pass of tree {t.name} copied or deleted (the whole"
            " tree if it was scanned whole) must list no change: a deleted path still on the target is one"
            for t in plan.files
            if verify.files
        ]
        return self.mode.describe_verify(ctx, lines, trees)

    def health(self, ctx: StepContext) -> tuple[dict[str, int], list[str]]:
        """The checks that run inside the window (all of them in the shutdown mode; in the replicate mode those
        whose `when` is 'window' or 'both': the others passed before the window)."""
        plan = runtime(ctx).plan
        return health.run_checks(ctx, self.mode.inside_checks(plan), plan.health)

    @staticmethod
    def audit_wanted(ctx: StepContext) -> bool:
        verify = runtime(ctx).plan.database.verify
        return verify.row_counts or verify.checksum

    def snapshot(self, ctx: StepContext, conn: Any = None) -> tuple[dict[str, Any], list[str]]:
        """A read-only consistent snapshot of the fenced target, held open for the after-commit audit: O(1) (plus
        the list of tables), bounded by the budget. A target that cannot open one is not healthy. Replicate mode:
        one statement on `conn`, the connection that just read the target's GTID position (held from then on)."""
        rt = runtime(ctx)
        plan = rt.plan
        if not self.audit_wanted(ctx):
            return {}, []
        window = ctx.window
        doing = "opening the target's snapshot for the audit"
        window.check(doing)
        try:
            conn = conn or rt.db("target", read_timeout=window.timeout(plan.database.read_timeout))
            with rt.database.bounded(conn, window.timeout(plan.database.read_timeout)):
                engines = self.mode.open_audit_snapshot(conn, plan.database.schemas, rt.database)
        except DatabaseError as exc:
            if conn is not None:
                rt.release(conn)
            window.check(doing)  # cut short by the budget: say so
            return {}, [f"{doing}: {exc}"]
        return self._hold_snapshot(ctx, conn, engines), []

    @staticmethod
    def _hold_snapshot(ctx: StepContext, conn: Any, engines: dict[str, str] | None) -> dict[str, Any]:
        """Keep the connection whose snapshot is open for the audit (on the run's runtime)."""
        rt = runtime(ctx)
        held = audit.held(rt)
        if held.snapshot is not None:  # a re-run of this step in the same process: the newer one stands
            rt.release(held.snapshot)
        held.snapshot, held.snapshot_at, held.engines = conn, time.time(), engines or {}
        ctx.log.info("audit_snapshot_opened", tables=None if engines is None else len(engines))
        return {"audit_snapshot_at": held.snapshot_at}

    def undo(self, ctx: StepContext) -> None:
        """The run will not commit: the audit's snapshot is closed now rather than when the run ends (an open
        transaction on the target holds its purge back while the rollback runs)."""
        rt = runtime(ctx)
        held = audit.forget(rt)
        if held.snapshot is not None:
            rt.release(held.snapshot)
            ctx.log.info("audit_snapshot_closed", why="rolling back")

    def trees(self, ctx: StepContext) -> tuple[dict[str, Any], list[str]]:
        """Every path the final pass handled is equal on both hosts (rsync --dry-run --checksum lists no change):
        a listed path gone from the source must be gone from the target too (rsync itemizes it '*deleting').

        The whole trees were compared before the window (files_presync); here only the final pass's list is read
        (O(changes)), or the whole tree when that pass had to scan it. Bounded by what is left of the budget.
        """
        rt = runtime(ctx)
        plan = rt.plan
        window = ctx.window
        problems: list[str] = []
        trees: dict[str, int] = {}
        scopes: dict[str, str] = {}
        if not plan.database.verify.files:
            return {}, problems
        final = FilesResult.of(ctx.output("files_final"))
        route = window_route(ctx)
        for tree in plan.files:
            figures = final.trees.get(tree.name)
            command, scopes[tree.name] = tree_verification(plan, tree, figures, route)
            doing = f"comparing tree {tree.name} ({scopes[tree.name]})"
            window.check(doing)
            if command is not None and figures is not None and figures.differing is not None:
                # Compared by the pass's own command right after it (files_final): its answer, no round trip.
                trees[tree.name] = figures.differing
                if figures.differing:
                    more = figures.differing - len(figures.differing_items[:MAX_LISTED])
                    tail = f" and {more} more" if more > 0 else ""
                    problems.append(
                        f"tree {tree.name} differs: {', '.join(figures.differing_items[:MAX_LISTED])}{tail}"
                    )
                continue
            if command is None:
                trees[tree.name] = 0
                continue
            try:
                items = rsync.changed_items(rt.source, command, what=f"compare of tree {tree.name}",
                                            timeout=window.timeout())  # fmt: skip
            except TransportError as exc:
                window.check(doing)  # a comparison cut short by the budget: say so
                if route is None:
                    problems.append(f"{doing}: {exc}")
                    continue
                # The route failed, not the comparison: once more over ssh.
                ctx.log.warning("window_route_failed", tree=tree.name, error=str(exc), instead="rsync -e ssh")
                command, _ = tree_verification(plan, tree, figures)
                try:
                    items = rsync.changed_items(rt.source, command or "true", what=f"compare of tree {tree.name}",
                                                timeout=window.timeout())  # fmt: skip
                except TransportError as again:
                    window.check(doing)
                    problems.append(f"{doing}: {again}")
                    continue
            trees[tree.name] = len(items)
            if items:
                problems.append(f"tree {tree.name} differs: {_listed(items)}")
        return {"trees_differing_items": trees, "trees_verified": scopes}, problems

    def positions(
        self, ctx: StepContext, final_text: str | None = None, *, wait_first: float | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        """Replicate mode: O(changes) proof of the data. The source is still at the final position the switch
        journaled (nothing committed there since), and the target executed exactly that position.

        When the switch read them as soon as it promoted the target (`read_positions_early`, in this process, for
        this final position), their answer is taken: no round trip here; one that found a problem, or failed, is
        read again here. `final_text`: the switch's own call; `wait_first`: the target is read once it has applied
        the final position (a server-side wait of at most that many seconds, in the same statement: the switch
        starts this beside its promotion, which waits for the same), raising PositionNotReached when it has not."""
        rt = runtime(ctx)
        if final_text is None:
            final_text = ctx.output(SWITCH_STEP).get("final_gtid")
            early = getattr(rt, EARLY_POSITIONS, None)
            setattr(rt, EARLY_POSITIONS, None)
            if early is not None and early[0] == final_text:
                try:
                    found: tuple[dict[str, Any], list[str]] = early[1].result()
                    if not found[1]:
                        return found
                    ctx.log.warning("early_positions_failed", error="; ".join(found[1]))
                except Interrupted:  # a signal is the run's to act on, not a failed read
                    raise
                except Exception as exc:  # read again below, as without it
                    ctx.log.warning("early_positions_failed", error=str(exc))
        if not final_text:
            return {}, ["no final GTID position recorded by the switch"]
        rep = replication(rt)
        final = rep.parse_position(str(final_text))
        timeout = ctx.window.timeout(rt.plan.database.read_timeout)

        held: dict[str, Any] = {}

        def _read(which: Which) -> list[str]:
            """The problems with that side's position (each side in its own thread: two connections). On the
            target, the audit's snapshot is opened by the statement that reads the position, on the connection it
            then keeps: no round trip and no connection of its own."""
            problems: list[str] = []

            # A stopped source is not compared after the commit (the mode's audit says why): no snapshot for it.
            with_snapshot = which == "target" and self.audit_wanted(ctx) and not rep.source_stops

            def _position(conn: Any) -> Any:
                if which == "source":
                    return rep.write_position(conn)
                if with_snapshot:
                    return self._snapshot_and_position(ctx, conn, final, wait_first)
                if wait_first is None:
                    return rep.current_position(conn)
                found = rep.current_position_after(conn, final, wait_first)
                if found is None:
                    raise PositionNotReached(f"the target did not apply {final} within {wait_first:g} s")
                return found

            try:
                # The spare opened before the window, unpinged: the read itself is the check (one round trip).
                conn = rt.db(which, read_timeout=timeout, ping_spare=False)
                kept = False
                try:
                    try:
                        now = _position(conn)
                    except DatabaseError as lost:
                        if not lost.connection_lost:
                            raise
                        rt.release(conn)  # that connection was gone: another one (a read, safe to repeat)
                        conn = rt.db(which, read_timeout=timeout)
                        now = _position(conn)
                    if with_snapshot:
                        if self._snapshot_open:
                            held.update(self._hold_snapshot(ctx, conn, None))
                        else:  # a server that refused the one statement: the snapshot on its own, as before
                            figures, problems = self.snapshot(ctx, conn)
                            held.update(figures)
                        kept = not problems
                finally:
                    if not kept:
                        rt.release(conn)
            except DatabaseError as exc:
                ctx.window.check("comparing GTID positions")
                return [f"reading the {which}'s GTID position: {exc}"]
            if not rep.same_position(final, now):
                problems.append(f"the {which} stands at GTID {now or 'nothing'}, not the final position {final}")
            return problems

        # A source the switch stopped (its final position is its clean shutdown's, proven by the promotion) is not
        # read: only the target's position is.
        sides: tuple[Which, ...] = ("target",) if rep.source_stops else ("source", "target")
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="gtid") as pool:
            futures = [pool.submit(contextvars.copy_context().run, _read, which) for which in sides]
            problems = [problem for future in futures for problem in future.result()]
        return held, problems

    def _snapshot_and_position(self, ctx: StepContext, conn: Any, final: Any, wait_first: float | None) -> Any:
        """The audit's snapshot and the target's position in one round trip (`_snapshot_open` says it opened); a
        server that refuses the compound statement (an SQL error, the connection fine) gets the position alone,
        and the snapshot is then opened apart (waiting first: the error goes up, verify_target reads again)."""
        self._snapshot_open = False
        window = ctx.window
        window.check("opening the target's snapshot for the audit")
        try:
            rt = runtime(ctx)
            with rt.database.bounded(conn, window.timeout(rt.plan.database.read_timeout)):
                now = replication(rt).audit_snapshot_and_position(
                    conn, None if wait_first is None else (final, wait_first)
                )
        except DatabaseError as exc:
            if exc.connection_lost or wait_first is not None:
                raise
            ctx.log.warning("audit_snapshot_apart", error=str(exc))
            return replication(runtime(ctx)).current_position(conn)
        self._snapshot_open = True
        return now

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        ctx.window.check("starting the verification")
        # The mode runs the parts that prove its data side by side (health, trees, the snapshot or the positions).
        return self.mode.verify(ctx, self)


def read_positions_early(ctx: StepContext, final_text: str, *, wait_first: float) -> None:
    """Called by the replicate switch once the source is read-only, beside the promotion: verify_target's reads of
    both sides' GTID positions (and, with them, the audit's snapshot of the still fenced target) start now, in a
    thread of their own, side by side with the promotion and the uploads' final pass verify_target waits for; it
    takes their answer instead of a round trip of its own. The target's read waits on the server until it has applied
    the final position (`wait_first` seconds at most), as the promotion does, and reads the position and opens the
    snapshot in that statement. Nothing writes either side meanwhile (the source is read-only and fenced, the target
    fenced until the commit and applying nothing past the final position), so reading now proves what reading after
    the promotion would, before the commit as before; a read that did not reach the position, or found a problem,
    is made again by verify_target."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="positions")
    future = pool.submit(
        contextvars.copy_context().run,
        VerifyTarget(mode=REPLICATE).positions, ctx, final_text, wait_first=wait_first,
    )  # fmt: skip
    pool.shutdown(wait=False)
    setattr(runtime(ctx), EARLY_POSITIONS, (final_text, future))
