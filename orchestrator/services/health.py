"""The plan's health checks (HTTP, TCP, SQL, command) against the target, each try bounded by the downtime window.

Shared by the steps that run them: `verify_target` (inside the window, right before DNS moves) and, in the replicate
mode, `repl_catchup` (before the window, against the fenced services on the replica's data). Each check's `when`
says where it runs (`checks_for`): a costly check (one that reads a whole table) belongs before the window, where
it costs the live site nothing; inside the window only cheap probes (O(1), not O(data)).
"""

from __future__ import annotations

import contextvars
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from orchestrator.contracts import runtime
from orchestrator.database.protocol import DatabaseError
from orchestrator.engine.step import StepContext, WriteWindow
from orchestrator.plan.model import CommandCheck, HealthCheck, HealthChecks, HttpCheck, SqlCheck, TcpCheck
from orchestrator.transports.ssh import TransportError

BEFORE = "before"
INSIDE = "inside"


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
    except DatabaseError as exc:
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
    if isinstance(check, HttpCheck | TcpCheck):
        runtime(ctx).round_trips.add("http")
    if isinstance(check, HttpCheck):
        _http(check, window.timeout(check.timeout) or check.timeout)
    elif isinstance(check, TcpCheck):
        _tcp(check, window.timeout(check.timeout) or check.timeout)
    elif isinstance(check, SqlCheck):
        _sql(ctx, check, window)
    else:
        _command(ctx, check, window.timeout(check.timeout) or check.timeout)


def checks_for(health: HealthChecks, where: str, *, replicate: bool) -> list[HealthCheck]:
    """The checks that run `where` (BEFORE or INSIDE the window).

    In the replicate mode the target's services run fenced before the window: 'before' checks run there only,
    'window' checks inside only, 'both' in both places. In the shutdown mode the target starts inside the window:
    every check runs there (none can run before), so a check is never skipped whatever its `when`.
    """
    if not replicate:
        return list(health.checks) if where == INSIDE else []
    wanted = ("before", "both") if where == BEFORE else ("window", "both")
    return [check for check in health.checks if check.when in wanted]


def run_checks(ctx: StepContext, checks: list[HealthCheck], health: HealthChecks) -> tuple[dict[str, int], list[str]]:
    """Tries each check until it passes, the checks side by side (each in a thread carrying the log context: they
    are independent, and inside the window their round trips would add up); the tries each needed, and the
    failures, in the plan's order.

    Inside the window tries stop when the budget is spent (StepError), whatever attempts times timeouts would allow.
    """
    if len(checks) <= 1:
        outcomes = [_until_passed(ctx, check, health) for check in checks]
    else:
        with ThreadPoolExecutor(max_workers=len(checks), thread_name_prefix="health") as pool:
            futures = [pool.submit(contextvars.copy_context().run, _until_passed, ctx, c, health) for c in checks]
            outcomes = [future.result() for future in futures]
    tries = {label: attempt for label, attempt, _ in outcomes if attempt is not None}
    failures = [failure for _, _, failure in outcomes if failure is not None]
    return tries, failures


def _until_passed(ctx: StepContext, check: HealthCheck, health: HealthChecks) -> tuple[str, int | None, str | None]:
    """One check tried until it passes: (its label, the try it passed on or None, the failure or None)."""
    window = ctx.window
    label = check_label(check)
    passed: int | None = None
    failure: str | None = None
    for attempt in range(1, health.attempts + 1):
        window.check(f"health check {label}, try {attempt} of {health.attempts}")
        try:
            run_check(ctx, check)
            passed = attempt
            break
        except CheckFailed as exc:
            # A try cut short by the budget is not the check's failure: say the budget ran out.
            window.check(f"health check {label}, try {attempt} of {health.attempts}")
            if attempt == health.attempts:
                failure = f"health check {label} failed {attempt} times: {exc}"
            else:
                time.sleep(window.timeout(health.interval) or health.interval)
    ctx.log.info("health_check", check=label, passed=passed is not None, tries=passed)
    return label, passed, failure
