"""Verify the target before any traffic moves: health checks, then the data itself, O(changes) only.

Data, shutdown mode: every path the final pass of each file tree handled is equal on both hosts (the whole trees
were compared before the window), the datadir files the final pass copied were checksummed on both hosts by
db_final. Row counts and CHECKSUM TABLE read every row, so they are not read here: this step opens a read-only
consistent snapshot on the still-fenced target (one round trip) and keeps the session open; the `audit` step reads
it after the commit and compares it with the stopped source (orchestrator/audit.py).

All of it runs while writes are blocked: every try, query and comparison is bounded by what is left of the
write-block budget, so a verification that cannot finish in time fails (and the run rolls back) instead of
keeping writes blocked past cutover.max_write_block.
"""

from __future__ import annotations

import contextvars
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pymysql

from orchestrator import audit
from orchestrator.contracts import runtime
from orchestrator.engine.step import Step, StepContext, StepError, WriteWindow
from orchestrator.plan.model import CommandCheck, FileTree, HealthCheck, HttpCheck, Plan, SqlCheck, TcpCheck
from orchestrator.results import FilesResult, TreeFigures, VerifyResult
from orchestrator.steps.repl_common import SWITCH_STEP, replicate_run
from orchestrator.tracking import verify_listed_command
from orchestrator.transports import mysql, rsync
from orchestrator.transports import replication as repl
from orchestrator.transports.ssh import TransportError

MAX_LISTED = 5


class CheckFailed(Exception):
    pass


def check_label(check: HealthCheck) -> str:
    if check.name:
        return check.name
    if isinstance(check, HttpCheck):
        return f"http {check.url}"
    if isinstance(check, TcpCheck):
        return f"tcp {check.host}:{check.port}"
    if isinstance(check, SqlCheck):
        return f"sql {check.query[:40]}"
    return f"command on {check.on}: {check.run[:40]}"


def _http(check: HttpCheck, timeout: float) -> None:
    headers = {"Host": check.host_header} if check.host_header else {}
    request = urllib.request.Request(check.url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, body = response.status, response.read(1 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(1 << 20).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CheckFailed(f"no answer ({reason})") from None
    if status != check.expect_status:
        raise CheckFailed(f"status {status}, expected {check.expect_status}")
    if check.expect_body is not None and check.expect_body not in body:
        raise CheckFailed(f"body lacks {check.expect_body!r}")


def _tcp(check: TcpCheck, timeout: float) -> None:
    try:
        with socket.create_connection((check.host, check.port), timeout=timeout):
            pass
    except OSError as exc:
        raise CheckFailed(f"cannot connect ({exc.strerror or exc})") from None


def _sql(ctx: StepContext, check: SqlCheck, window: WriteWindow) -> None:
    rt = runtime(ctx)
    conn = None
    try:
        conn = rt.db("target", retry=False, read_timeout=window.timeout(rt.plan.database.read_timeout))
        with conn.cursor() as cur:
            cur.execute(check.query)
            row = cur.fetchone()
    except (mysql.DbError, pymysql.MySQLError, TransportError) as exc:
        raise CheckFailed(str(exc)) from None
    finally:
        if conn is not None:
            rt.release(conn)  # one connection per try: do not pile them up until the run ends
    if check.expect is not None:
        got = None if row is None or row[0] is None else str(row[0])
        if got != check.expect:
            raise CheckFailed(f"answered {got!r}, expected {check.expect!r}")


def _command(ctx: StepContext, check: CommandCheck, timeout: float) -> None:
    host = runtime(ctx).host(check.on)
    try:
        result = host.run(check.run, timeout=timeout, check=False)
    except TransportError as exc:
        raise CheckFailed(str(exc)) from None
    if result.exit_status != 0:
        last = next((x.strip() for x in reversed(result.stderr.splitlines()) if x.strip()), "")
        raise CheckFailed(f"exit {result.exit_status}" + (f": {last}" if last else ""))


def run_check(ctx: StepContext, check: HealthCheck) -> None:
    """One try of a check, its own timeout bounded by what is left of the downtime window."""
    window = ctx.window
    if isinstance(check, HttpCheck):
        _http(check, window.timeout(check.timeout) or check.timeout)
    elif isinstance(check, TcpCheck):
        _tcp(check, window.timeout(check.timeout) or check.timeout)
    elif isinstance(check, SqlCheck):
        _sql(ctx, check, window)
    else:
        _command(ctx, check, window.timeout(check.timeout) or check.timeout)


def _listed(items: list[str]) -> str:
    more = f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return ", ".join(items[:MAX_LISTED]) + more


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
    title = "Verify the target: health checks, the changed files, a snapshot for the audit"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        lines = [f"health check {check_label(c)} (up to {plan.health.attempts} tries)" for c in plan.health.checks]
        if replicate_run(ctx):
            return [
                *lines,
                "GTID positions: the source still at its final position, the target executed exactly it "
                "(the data was compared before the window; nothing inside it reads whole tables or trees)",
            ]
        verify = plan.database.verify
        if verify.row_counts or verify.checksum:
            lines.append(
                "open a read-only consistent snapshot on the fenced target and keep it: the audit after the commit"
                " compares its " + " and ".join(n for n, on in (("row counts", verify.row_counts),
                                                                  ("CHECKSUM TABLE", verify.checksum)) if on)
                + " of every table with the stopped source's (nothing inside the window reads whole tables)"
            )  # fmt: skip
        if verify.files:
            lines += [
                f"rsync --dry-run --checksum of the paths the final pass of tree {t.name} copied (the whole tree if it"
                " was scanned whole) must list no change"
                for t in plan.files
            ]
        return lines

    def health(self, ctx: StepContext) -> tuple[dict[str, int], list[str]]:
        """Tries each check until it passes; the tries each needed, and the failures.

        Tries stop when the budget is spent (StepError), whatever attempts times timeouts would allow.
        """
        plan = runtime(ctx).plan
        window = ctx.window
        tries: dict[str, int] = {}
        failures: list[str] = []
        for check in plan.health.checks:
            label = check_label(check)
            for attempt in range(1, plan.health.attempts + 1):
                window.check(f"health check {label}, try {attempt} of {plan.health.attempts}")
                try:
                    run_check(ctx, check)
                    tries[label] = attempt
                    break
                except CheckFailed as exc:
                    # A try cut short by the budget is not the check's failure: say the budget ran out.
                    window.check(f"health check {label}, try {attempt} of {plan.health.attempts}")
                    if attempt == plan.health.attempts:
                        failures.append(f"health check {label} failed {attempt} times: {exc}")
                    else:
                        time.sleep(window.timeout(plan.health.interval) or 0.0)
            ctx.log.info("health_check", check=label, passed=label in tries, tries=tries.get(label))
        return tries, failures

    def snapshot(self, ctx: StepContext) -> tuple[dict[str, Any], list[str]]:
        """A read-only consistent snapshot of the fenced target, held open for the after-commit audit: O(1) (plus
        the list of tables), bounded by the budget. A target that cannot open one is not healthy."""
        rt = runtime(ctx)
        plan = rt.plan
        verify = plan.database.verify
        if not (verify.row_counts or verify.checksum):
            return {}, []
        window = ctx.window
        doing = "opening the target's snapshot for the audit"
        window.check(doing)
        conn = None
        try:
            conn = rt.db("target", read_timeout=window.timeout(plan.database.read_timeout))
            with mysql.read_timeout(conn, window.timeout(plan.database.read_timeout)):
                engines = audit.open_snapshot(conn, plan.database.schemas)
        except (mysql.DbError, pymysql.MySQLError, TransportError) as exc:
            if conn is not None:
                rt.release(conn)
            window.check(doing)  # cut short by the budget: say so
            return {}, [f"{doing}: {exc}"]
        held = audit.held(ctx.run_id)
        if held.snapshot is not None:  # a re-run of this step in the same process: the newer one stands
            rt.release(held.snapshot)
        held.snapshot, held.snapshot_at, held.engines = conn, time.time(), engines
        ctx.log.info("audit_snapshot_opened", tables=len(engines))
        return {"audit_snapshot_at": held.snapshot_at}, []

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
        problems: list[str] = []
        try:
            for which in ("source", "target"):
                conn = rt.db(which, read_timeout=timeout)
                try:
                    now = repl.gtid_binlog_pos(conn) if which == "source" else repl.gtid_current_pos(conn)
                finally:
                    rt.release(conn)
                if not repl.same_position(final, now):
                    problems.append(f"the {which} stands at GTID {now or 'nothing'}, not the final position {final}")
        except (mysql.DbError, pymysql.MySQLError, TransportError) as exc:
            ctx.window.check("comparing GTID positions")
            problems.append(f"reading GTID positions: {exc}")
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
            db_future = pool.submit(contextvars.copy_context().run, self.snapshot, ctx)
            trees_future = pool.submit(contextvars.copy_context().run, self.trees, ctx)
            tries, problems = self.health(ctx)
            db_figures, db_problems = db_future.result()
            tree_figures, tree_problems = trees_future.result()
        problems += db_problems + tree_problems
        if problems:
            raise StepError(f"verify_target: {len(problems)} problem(s): " + "; ".join(problems))
        ctx.window.check("the data verification")
        result = VerifyResult(health_tries=tries, **db_figures, **tree_figures)
        ctx.log.info("target_verified", audit_snapshot=result.audit_snapshot_at is not None)
        return result.journal()
