"""Verify the target before any traffic moves: health checks, then the data itself.

Data: every table's row count (and CHECKSUM TABLE when the plan asks) equals the source's figures taken under
the cut-over's lock, and every file tree is equal (an rsync --dry-run --checksum would change nothing).
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

from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.model import CommandCheck, HealthCheck, HttpCheck, SqlCheck, TcpCheck
from orchestrator.steps.files_final import blocked_since
from orchestrator.transports import mysql, rsync
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


def _http(check: HttpCheck) -> None:
    headers = {"Host": check.host_header} if check.host_header else {}
    request = urllib.request.Request(check.url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=check.timeout) as response:
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


def _tcp(check: TcpCheck) -> None:
    try:
        with socket.create_connection((check.host, check.port), timeout=check.timeout):
            pass
    except OSError as exc:
        raise CheckFailed(f"cannot connect ({exc.strerror or exc})") from None


def _sql(ctx: StepContext, check: SqlCheck) -> None:
    try:
        conn = ctx.rt.db("target", retry=False)
        with conn.cursor() as cur:
            cur.execute(check.query)
            row = cur.fetchone()
    except (mysql.DbError, pymysql.MySQLError, TransportError) as exc:
        raise CheckFailed(str(exc)) from None
    if check.expect is not None:
        got = None if row is None or row[0] is None else str(row[0])
        if got != check.expect:
            raise CheckFailed(f"answered {got!r}, expected {check.expect!r}")


def _command(ctx: StepContext, check: CommandCheck) -> None:
    host = ctx.rt.target if check.on == "target" else ctx.rt.source
    try:
        result = host.run(check.run, timeout=check.timeout, check=False)
    except TransportError as exc:
        raise CheckFailed(str(exc)) from None
    if result.exit_status != 0:
        last = next((x.strip() for x in reversed(result.stderr.splitlines()) if x.strip()), "")
        raise CheckFailed(f"exit {result.exit_status}" + (f": {last}" if last else ""))


def run_check(ctx: StepContext, check: HealthCheck) -> None:
    if isinstance(check, HttpCheck):
        _http(check)
    elif isinstance(check, TcpCheck):
        _tcp(check)
    elif isinstance(check, SqlCheck):
        _sql(ctx, check)
    else:
        _command(ctx, check)


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


class VerifyTarget(Step):
    name = "verify_target"
    title = "Verify the target: health checks, row counts, file trees"

    def describe(self, ctx: StepContext) -> list[str]:
        plan = ctx.rt.plan
        lines = [f"health check {check_label(c)} (up to {plan.health.attempts} tries)" for c in plan.health.checks]
        verify = plan.database.verify
        if verify.row_counts:
            lines.append("compare every table's row count with the source's, taken under the cut-over's lock")
        if verify.checksum:
            lines.append("compare CHECKSUM TABLE of every table with the source's")
        if verify.files:
            lines += [f"rsync --dry-run --checksum of tree {t.name} must list no change" for t in plan.files]
        return lines

    def health(self, ctx: StepContext) -> tuple[dict[str, int], list[str]]:
        """Tries each check until it passes; the tries each needed, and the failures."""
        plan = ctx.rt.plan
        tries: dict[str, int] = {}
        failures: list[str] = []
        for check in plan.health.checks:
            label = check_label(check)
            for attempt in range(1, plan.health.attempts + 1):
                try:
                    run_check(ctx, check)
                    tries[label] = attempt
                    break
                except CheckFailed as exc:
                    if attempt == plan.health.attempts:
                        failures.append(f"health check {label} failed {attempt} times: {exc}")
                    else:
                        time.sleep(plan.health.interval)
            ctx.log.info("health_check", check=label, passed=label in tries, tries=tries.get(label))
        return tries, failures

    def database(self, ctx: StepContext) -> tuple[dict[str, Any], list[str]]:
        """Row counts (and checksums) of the target against the source's, taken under the cut-over's lock."""
        rt = ctx.rt
        plan = rt.plan
        verify = plan.database.verify
        source = ctx.output("cutover")
        figures: dict[str, Any] = {}
        problems: list[str] = []
        if not (verify.row_counts or verify.checksum):
            return figures, problems
        wanted = [("row counts", "row_counts", verify.row_counts), ("checksums", "checksums", verify.checksum)]
        try:
            conn = rt.db("target")
            tables = mysql.list_tables(conn, plan.database.schemas)
            for label, key, enabled in wanted:
                if not enabled:
                    continue
                expected = source.get(key)
                if expected is None:
                    problems.append(f"no source {label} were recorded by the cut-over step")
                    continue
                read = mysql.row_counts if key == "row_counts" else mysql.checksums
                actual = read(conn, tables)
                figures[key] = {"tables": len(actual), "compared": len(expected)}
                problems += compare_figures(label, expected, actual)
        except (mysql.DbError, pymysql.MySQLError, TransportError) as exc:
            problems.append(f"reading the target database: {exc}")
        return figures, problems

    def trees(self, ctx: StepContext) -> tuple[dict[str, Any], list[str]]:
        """Every file tree equal: an rsync --dry-run --checksum from the source lists no change."""
        rt = ctx.rt
        plan = rt.plan
        problems: list[str] = []
        trees: dict[str, int] = {}
        if not plan.database.verify.files:
            return {}, problems
        for tree in plan.files:
            command = rsync.compare_command(plan, tree.source, tree.target, exclude=tree.exclude,
                                            chown=tree.owner)  # fmt: skip
            try:
                items = rsync.changed_items(rt.source, command, what=f"compare of tree {tree.name}")
            except TransportError as exc:
                problems.append(f"comparing tree {tree.name}: {exc}")
                continue
            trees[tree.name] = len(items)
            if items:
                problems.append(f"tree {tree.name} differs: {_listed(items)}")
        return {"trees_differing_items": trees}, problems

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        budget = ctx.rt.budget
        since = blocked_since(ctx)
        budget.check("starting the verification", since)
        # The three checks are independent and each takes time inside the downtime window: run them side by side
        # (the database and the trees in threads, carrying the log context; the health checks here).
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="verify") as pool:
            db_future = pool.submit(contextvars.copy_context().run, self.database, ctx)
            trees_future = pool.submit(contextvars.copy_context().run, self.trees, ctx)
            tries, problems = self.health(ctx)
            db_figures, db_problems = db_future.result()
            tree_figures, tree_problems = trees_future.result()
        figures = {**db_figures, **tree_figures}
        problems += db_problems + tree_problems
        if problems:
            raise StepError(f"verify_target: {len(problems)} problem(s): " + "; ".join(problems))
        budget.check("the data verification", since)
        ctx.log.info("target_verified", **{k: v for k, v in figures.items() if not isinstance(v, dict)})
        return {"health_tries": tries, **figures}
