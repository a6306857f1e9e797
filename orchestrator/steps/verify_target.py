"""Verify the target before any traffic moves: health checks, then the data itself.

Data: every table's row count (and CHECKSUM TABLE when the plan asks) equals the source's figures taken under
the cut-over's lock, and every file tree is equal (an rsync --dry-run --checksum would change nothing).

All of it runs while writes are blocked: every try, query and comparison is bounded by what is left of the
write-block budget, so a verification that cannot finish in time fails (and the run rolls back) instead of
keeping writes blocked past cutover.max_write_block.
"""

from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pymysql

from orchestrator import health
from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.model import FileTree, Plan
from orchestrator.results import Compared, CutoverResult, FilesResult, TreeFigures, VerifyResult
from orchestrator.steps.repl_common import SWITCH_STEP, replicate_run
from orchestrator.tracking import verify_listed_command
from orchestrator.transports import mysql, rsync
from orchestrator.transports import replication as repl
from orchestrator.transports.ssh import TransportError

MAX_LISTED = 5


def _listed(items: list[str]) -> str:
    more = f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return ", ".join(items[:MAX_LISTED]) + more


def compare_figures(kind: str, expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Human lines for every table whose figure differs ('schema.table: source 10, target 9')."""
    diffs = []
    for table, want in sorted(expected.items()):
        got = actual.get(table)
        if table not in actual:
            diffs.append(f"{table}: missing on the target")
        elif got != want:
            diffs.append(f"{table}: source {want}, target {got}")
    return [f"{kind} differ: {_listed(diffs)}"] if diffs else []


def tree_verification(plan: Plan, tree: FileTree, final: TreeFigures | None) -> tuple[str | None, str]:
    """The in-window comparison of one tree (None: nothing to compare) and what it covers, in words."""
    if final is not None and final.mode == "tracked" and final.change_list:
        if not final.listed:
            return None, "no path changed since the pre-sync"
        command = verify_listed_command(
            tree.source, rsync.target_spec(plan, tree.target), final.change_list,
            ssh=rsync.target_ssh_command(plan), exclude=tree.exclude, chown=tree.owner,
        )  # fmt: skip
        return command, f"the {final.listed} path(s) the final pass copied"
    command = rsync.compare_command(plan, tree.source, tree.target, exclude=tree.exclude, chown=tree.owner)
    return command, "the whole tree (the final pass scanned it whole)"


class VerifyTarget(Step):
    name = "verify_target"
    title = "Verify the target: health checks, row counts, file trees"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        replicate = replicate_run(ctx)
        inside = health.checks_for(plan.health, health.INSIDE, replicate=replicate)
        lines = [f"health check {health.check_label(c)} (up to {plan.health.attempts} tries)" for c in inside]
        if replicate:
            return [
                *lines,
                "GTID positions: the source still at its final position, the target executed exactly it "
                "(the data was compared before the window; nothing inside it reads whole tables or trees)",
            ]
        verify = plan.database.verify
        if verify.row_counts:
            lines.append("compare every table's row count with the source's, taken under the cut-over's lock")
        if verify.checksum:
            lines.append("compare CHECKSUM TABLE of every table with the source's")
        if verify.files:
            lines += [
                f"rsync --dry-run --checksum of the paths the final pass of tree {t.name} copied (the whole tree if it"
                " was scanned whole) must list no change"
                for t in plan.files
            ]
        return lines

    def health(self, ctx: StepContext) -> tuple[dict[str, int], list[str]]:
        """The checks that run inside the window (all of them in the shutdown mode; in the replicate mode those
        whose `when` is 'window' or 'both': the others passed before the window)."""
        plan = runtime(ctx).plan
        checks = health.checks_for(plan.health, health.INSIDE, replicate=replicate_run(ctx))
        return health.run_checks(ctx, checks, plan.health)

    def database(self, ctx: StepContext) -> tuple[dict[str, Any], list[str]]:
        """Row counts (and checksums) of the target against the source's, taken under the cut-over's lock.

        One query per table, each bounded by what is left of the budget, which is checked between tables.
        """
        rt = runtime(ctx)
        plan = rt.plan
        window = ctx.window
        verify = plan.database.verify
        source = CutoverResult.of(ctx.output("cutover"))
        figures: dict[str, Compared] = {}
        problems: list[str] = []
        if not (verify.row_counts or verify.checksum):
            return figures, problems
        wanted = [
            ("row counts", "row_counts", verify.row_counts, source.row_counts),
            ("checksums", "checksums", verify.checksum, source.checksums),
        ]
        doing = "reading the target's tables"
        read_timeout = plan.database.read_timeout

        def _limit(table: str) -> float | None:
            window.check(f"{doing}: {table}")
            return window.timeout(read_timeout)

        try:
            conn = rt.db("target", read_timeout=window.timeout(read_timeout))
            tables = mysql.list_tables(conn, plan.database.schemas)
            for label, key, enabled, expected in wanted:
                if not enabled:
                    continue
                if expected is None:
                    problems.append(f"no source {label} were recorded by the cut-over step")
                    continue
                doing = f"reading the target's {label}"
                read = mysql.row_counts if key == "row_counts" else mysql.checksums
                actual = read(conn, tables, limit=_limit)
                figures[key] = Compared(tables=len(actual), compared=len(expected))
                problems += compare_figures(label, expected, actual)
        except (mysql.DbError, pymysql.MySQLError, TransportError) as exc:
            window.check(doing)  # a query cut short by the budget: say so
            problems.append(f"reading the target database: {exc}")
        return figures, problems

    def trees(self, ctx: StepContext) -> tuple[dict[str, Any], list[str]]:
        """Every path the final pass handled is equal on both hosts (rsync --dry-run --checksum lists no change).

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
        for tree in plan.files:
            command, scopes[tree.name] = tree_verification(plan, tree, final.trees.get(tree.name))
            doing = f"comparing tree {tree.name} ({scopes[tree.name]})"
            window.check(doing)
            if command is None:
                trees[tree.name] = 0
                continue
            try:
                items = rsync.changed_items(rt.source, command, what=f"compare of tree {tree.name}",
                                            timeout=window.timeout())  # fmt: skip
            except TransportError as exc:
                window.check(doing)  # a comparison cut short by the budget: say so
                problems.append(f"{doing}: {exc}")
                continue
            trees[tree.name] = len(items)
            if items:
                problems.append(f"tree {tree.name} differs: {_listed(items)}")
        return {"trees_differing_items": trees, "trees_verified": scopes}, problems

    def positions(self, ctx: StepContext) -> tuple[dict[str, Any], list[str]]:
        """Replicate mode: O(changes) proof of the data. The source is still at the final position the switch
        journaled (nothing committed there since), and the target executed exactly that position."""
        rt = runtime(ctx)
        final_text = ctx.output(SWITCH_STEP).get("final_gtid")
        if not final_text:
            return {}, ["no final GTID position recorded by the switch"]
        final = repl.GtidPosition.parse(str(final_text))
        timeout = ctx.window.timeout(rt.plan.database.read_timeout)

        def _read(which: str) -> str | None:
            """The problem with that side's position, or None (each side in its own thread: two connections)."""
            try:
                conn = rt.db(which, read_timeout=timeout)  # type: ignore[arg-type]
                try:
                    now = repl.gtid_binlog_pos(conn) if which == "source" else repl.gtid_current_pos(conn)
                finally:
                    rt.release(conn)
            except (mysql.DbError, pymysql.MySQLError, TransportError) as exc:
                ctx.window.check("comparing GTID positions")
                return f"reading the {which}'s GTID position: {exc}"
            if not repl.same_position(final, now):
                return f"the {which} stands at GTID {now or 'nothing'}, not the final position {final}"
            return None

        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="gtid") as pool:
            futures = [pool.submit(contextvars.copy_context().run, _read, which) for which in ("source", "target")]
            problems = [problem for future in futures if (problem := future.result()) is not None]
        return {}, problems

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        ctx.window.check("starting the verification")
        if replicate_run(ctx):
            # Side by side, as below: the positions in a thread (carrying the log context), the checks here.
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify") as pool:
                positions_future = pool.submit(contextvars.copy_context().run, self.positions, ctx)
                tries, problems = self.health(ctx)
                problems += positions_future.result()[1]
            if problems:
                raise StepError(f"verify_target: {len(problems)} problem(s): " + "; ".join(problems))
            ctx.window.check("the verification")
            ctx.log.info("target_verified", gtid=ctx.output(SWITCH_STEP).get("final_gtid"))
            return VerifyResult(health_tries=tries).journal()
        # The three checks are independent and each takes time inside the downtime window: run them side by side
        # (the database and the trees in threads, carrying the log context; the health checks here). Each is
        # bounded by the budget, so leaving the pool (which waits for both threads) is bounded too.
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="verify") as pool:
            db_future = pool.submit(contextvars.copy_context().run, self.database, ctx)
            trees_future = pool.submit(contextvars.copy_context().run, self.trees, ctx)
            tries, problems = self.health(ctx)
            db_figures, db_problems = db_future.result()
            tree_figures, tree_problems = trees_future.result()
        problems += db_problems + tree_problems
        if problems:
            raise StepError(f"verify_target: {len(problems)} problem(s): " + "; ".join(problems))
        ctx.window.check("the data verification")
        result = VerifyResult(health_tries=tries, **db_figures, **tree_figures)
        ctx.log.info("target_verified", tables=result.row_counts.tables if result.row_counts else None)
        return result.journal()
