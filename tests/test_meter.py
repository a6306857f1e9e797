"""The round-trip meter: counts go to the step bound in the log's context, threads that carry it included."""

from __future__ import annotations

import contextvars
import threading

import structlog

from orchestrator.report.build import window_round_trips
from orchestrator.transports.meter import RoundTrips


def test_counts_go_to_the_step_that_made_them_threads_included() -> None:
    meter = RoundTrips()
    meter.add("ssh")  # outside any step: not a step's
    structlog.contextvars.bind_contextvars(step="repl_switch")
    try:
        meter.add("sql", 3)
        thread = threading.Thread(target=contextvars.copy_context().run, args=(meter.add, "haproxy"))
        thread.start()
        thread.join()
        structlog.contextvars.bind_contextvars(step="switch_traffic")
        meter.add("ssh")
    finally:
        structlog.contextvars.unbind_contextvars("step")
    assert meter.by_step() == {"repl_switch": {"sql": 3, "haproxy": 1}, "switch_traffic": {"ssh": 1}}


def test_only_what_is_made_while_writes_are_blocked_is_counted() -> None:
    blocked = [False]
    meter = RoundTrips(inside=lambda: blocked[0])
    structlog.contextvars.bind_contextvars(step="repl_switch")
    try:
        meter.add("sql", 5)  # the switch's preparation, before the window
        blocked[0] = True
        meter.add("sql", 2)
    finally:
        structlog.contextvars.unbind_contextvars("step")
    assert meter.by_step() == {"repl_switch": {"sql": 2}}


def test_the_report_gives_the_window_steps_their_counts() -> None:
    steps = [
        {"name": "repl_catchup", "started_at": 10.0, "ended_at": 20.0},
        {"name": "repl_switch", "started_at": 20.0, "ended_at": 20.2},
        {"name": "switch_traffic", "started_at": 20.3, "ended_at": 20.4},
        {"name": "dns_flip", "started_at": 20.4, "ended_at": 21.0},
    ]
    counted = {"repl_catchup": {"sql": 40}, "repl_switch": {"sql": 9}, "switch_traffic": {"haproxy": 2, "ssh": 2},
               "dns_flip": {"dns": 5}}  # fmt: skip
    outputs = {"finish": {"round_trips": counted}}
    # Writes blocked at 20.0, flowing again at the door's switch (20.4): DNS came after the window.
    assert window_round_trips(steps, 20.0, 20.4, outputs) == {
        "repl_switch": {"sql": 9},
        "switch_traffic": {"haproxy": 2, "ssh": 2},
    }
