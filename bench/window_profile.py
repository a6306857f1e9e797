"""Benchmark helper: where a real run's window goes, operation by operation.

    .venv/bin/python bench/window_profile.py PLAN --env-file F

Runs `migrate apply PLAN --yes` in this process with every SSH command, DNS API call, SQL statement and HAProxy
runtime-API command timed, then prints, for each step inside the window (writes blocked → DNS flipped), how many of
each it made, their seconds, and what is left (local work: journal writes, sleeps, waits). This is how the
estimate's window model (orchestrator/services/estimates.py) was checked against the real steps. Run by hand; not part
of CI.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymysql.cursors

from orchestrator.cli import commands as cli
from orchestrator.transports import cloudflare, haproxy, ssh

CALLS: list[tuple[float, float, str, str]] = []  # started (epoch), seconds, kind, what
_LOCK = threading.Lock()


def timed(kind: str, describe: Callable[..., str], function: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started, clock = time.time(), time.monotonic()
        try:
            return function(*args, **kwargs)
        finally:
            with _LOCK:
                CALLS.append((started, time.monotonic() - clock, kind, describe(*args, **kwargs)[:70]))

    return wrapper


def install() -> None:
    def ssh_what(host: Any, command: str, *_a: Any, **_k: Any) -> str:
        return f"{host.name}: {command}"

    ssh.SshHost.run = timed("ssh", ssh_what, ssh.SshHost.run)  # type: ignore[method-assign]
    ssh.SshHost.stream = timed("ssh-stream", ssh_what, ssh.SshHost.stream)  # type: ignore[method-assign]
    for name in ("zone_id", "find_records", "get_record", "set_content"):
        original = getattr(cloudflare.DnsClient, name)
        setattr(cloudflare.DnsClient, name, timed("dns", lambda *_a, _n=name, **_k: _n, original))
    haproxy.AdminSession.exchange = timed(  # type: ignore[method-assign]
        "haproxy", lambda _s, line, *_a, **_k: line, haproxy.AdminSession.exchange
    )
    pymysql.cursors.Cursor.execute = timed(  # type: ignore[method-assign]
        "sql", lambda _c, query, *_a, **_k: " ".join(str(query).split()), pymysql.cursors.Cursor.execute
    )


def counts(report: dict[str, Any]) -> list[str]:
    """Every step's operations, counted (before the window too: what the dry-run's step estimates count)."""
    lines = []
    for step in report["steps"]:
        start, end = step.get("started_at"), step.get("ended_at")
        if start is None or end is None:
            continue
        inside = [c for c in CALLS if start <= c[0] < end]
        by_kind: dict[str, list[float]] = {}
        for _started, seconds, kind, _what in inside:
            by_kind.setdefault(kind, []).append(seconds)
        kinds = ", ".join(f"{k} {len(v)} x {sum(v):.2f} s" for k, v in by_kind.items())
        lines.append(f"{step['name']}: {end - start:.2f} s = {kinds}")
    return lines


def profile(report: dict[str, Any]) -> list[str]:
    blocked = report["cutover"]["writes_blocked_at"]
    flipped = report["dns_flipped_at"]
    lines = [f"window {flipped - blocked:.2f} s"]
    for step in report["steps"]:
        start, end = step.get("started_at"), step.get("ended_at")
        if start is None or end is None or end < blocked or start > flipped:
            continue
        lo, hi = max(start, blocked), min(end, flipped)
        inside = [c for c in CALLS if lo <= c[0] < hi]
        by_kind: dict[str, list[float]] = {}
        for _started, seconds, kind, _what in inside:
            by_kind.setdefault(kind, []).append(seconds)
        counted = sum(sum(v) for v in by_kind.values())
        kinds = ", ".join(f"{k} {len(v)} x {sum(v):.2f} s" for k, v in by_kind.items())
        lines.append(f"{step['name']}: {hi - lo:.2f} s = {kinds}; rest {hi - lo - counted:.2f} s")
        lines += [f"    {seconds:6.3f} {kind:10} {what}" for _s, seconds, kind, what in sorted(inside)]
    return lines


def main() -> int:
    install()
    plan = Path(sys.argv[1])
    with contextlib.suppress(SystemExit):
        cli.main(["apply", str(plan), "--yes", *sys.argv[2:]])
    reports = sorted((plan.parent / ".migrate").glob("*/report-*.json"), key=lambda p: p.stat().st_mtime)
    report = json.loads(reports[-1].read_text())
    print("\n".join(counts(report)))
    print("\n".join(profile(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
