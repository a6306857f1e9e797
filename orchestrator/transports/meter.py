"""Round trips, counted as the steps make them: each command on a host, SQL statement, front-door (HAProxy admin)
command, health check over HTTP and DNS API call, under the step that made it (the step bound in the log's context,
which the engine binds for a step and its threads carry).

One meter per runtime, handed to the transports it builds. The finish step journals what it counted
(`round_trips`), and the report gives each part of the window its counts: the window is a chain of round trips to
the hosts, and these counts say which part spends how many (a resumed run counts only what its own process made).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import structlog

# What one unit of each kind costs in network round trips between us and the host (or the API): a command in the
# kept shell is one exchange; a command in a new SSH session opens a channel first (the counts say which); a
# front-door exchange (one command, or a batch of them on one line) rides the door's kept admin connection, whose
# opening (a forwarded channel) counts one more; an SQL statement (a compound statement included) rides an open
# tunnel; an HTTP check and a DNS call each one request (on an open connection).
KINDS = ("ssh", "ssh_session", "sql", "haproxy", "http", "dns")


class RoundTrips:
    """`inside`: whether writes are blocked now; only what is made then is counted (the window's round trips: a
    step that begins the window counts from the block, not its preparation before it). None: everything."""

    def __init__(self, inside: Callable[[], bool] | None = None) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, Counter[str]] = {}
        self._inside = inside

    def add(self, kind: str, count: int = 1) -> None:
        if self._inside is not None and not self._inside():
            return
        step = str(structlog.contextvars.get_contextvars().get("step") or "")
        with self._lock:
            self._counts.setdefault(step, Counter())[kind] += count

    def by_step(self) -> dict[str, dict[str, int]]:
        """{step: {kind: count}} for every step that made one (work outside any step left out)."""
        with self._lock:
            return {step: dict(counts) for step, counts in self._counts.items() if step}
