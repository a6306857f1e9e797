"""What the load's clients report about the front door's effect: failed requests by cause, latency for the run and
inside the migration's window (taken from the migrate journal). Pure figures; the lab runs are in
test_haproxy_lab.py and test_lab_app.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from migrate_lab.load import (
    HTTP_TIMEOUT,
    LoadStats,
    cause_of,
    default_http_timeout,
    journal_window,
    latency_figures,
    request_figures,
    request_lines,
    summary,
)


def write_journal(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps({"seq": n, **e}) + "\n" for n, e in enumerate(events, 1)))
    return path


def test_window_runs_from_writes_blocked_to_the_completed_flip(tmp_path: Path) -> None:
    journal = write_journal(
        tmp_path / "journal.jsonl",
        [
            {"ts": 100.0, "event": "run_started"},
            {"ts": 110.0, "event": "step_saved", "step": "cutover", "key": "writes_blocked_at", "value": 110.5},
            {"ts": 113.0, "event": "step_completed", "step": "cutover", "result": {"writes_blocked_at": 110.5}},
            {"ts": 114.0, "event": "step_started", "step": "dns_flip"},
            {"ts": 114.8, "event": "step_completed", "step": "dns_flip", "result": {}},
            {"ts": 120.0, "event": "run_completed"},
        ],
    )
    assert journal_window(journal) == {"from": 110.5, "to": 114.8, "until": "dns_flip"}


def test_window_of_a_rolled_back_run_ends_with_the_rollback(tmp_path: Path) -> None:
    journal = write_journal(
        tmp_path / "journal.jsonl",
        [
            {"ts": 110.0, "event": "step_saved", "step": "cutover", "key": "writes_blocked_at", "value": 110.0},
            {"ts": 170.0, "event": "rollback_started", "reason": "budget"},
            {"ts": 171.5, "event": "rollback_completed"},
        ],
    )
    assert journal_window(journal) == {"from": 110.0, "to": 171.5, "until": "rollback"}


def test_no_window_without_writes_blocked_or_journal(tmp_path: Path) -> None:
    journal = write_journal(tmp_path / "journal.jsonl", [{"ts": 1.0, "event": "run_started"}])
    assert journal_window(journal) is None
    assert journal_window(tmp_path / "absent.jsonl") is None


def test_causes() -> None:
    assert [cause_of(r) for r in ("refused", "fenced", "timeout", "http_503", "error", "http_500")] == [
        "refused", "fenced", "timeout", "other", "other", "other",
    ]  # fmt: skip


def test_latency_percentiles_are_nearest_rank() -> None:
    figures = latency_figures([float(ms) for ms in range(1, 101)])
    assert figures == {"requests": 100, "p50_ms": 50.0, "p99_ms": 99.0, "max_ms": 100.0}
    assert latency_figures([])["requests"] == 0


def test_request_figures_split_failures_and_the_window() -> None:
    records = [
        {"t": 10.0, "ms": 20.0, "kind": "reads", "ok": True},
        {"t": 11.0, "ms": 5.0, "kind": "writes", "ok": False, "cause": "fenced"},
        {"t": 11.5, "ms": 3000.0, "kind": "writes", "ok": True},  # sent before the window, answered inside it
        {"t": 15.0, "ms": 1.0, "kind": "reads", "ok": False, "cause": "refused"},
        {"t": 30.0, "ms": 40.0, "kind": "writes", "ok": False, "cause": "timeout"},
    ]
    failed, latency = request_figures(records, {"from": 12.0, "to": 16.0, "until": "dns_flip"})
    assert failed["writes"] == {"refused": 0, "fenced": 1, "timeout": 1, "other": 0}
    assert failed["reads"] == {"refused": 1, "fenced": 0, "timeout": 0, "other": 0}
    assert latency["run"]["requests"] == 5 and latency["run"]["max_ms"] == 3000.0
    assert latency["window"] == {"requests": 2, "p50_ms": 1.0, "p99_ms": 3000.0, "max_ms": 3000.0}
    assert "window" not in request_figures(records, None)[1]


def test_summary_keeps_its_figures_and_adds_failures_and_latency() -> None:
    stats = LoadStats(writes_acked=3, duration_s=2.0)
    stats.requests_failed["writes"]["fenced"] = 2
    stats.latency = {"run": latency_figures([10.0, 20.0])}
    text = summary(stats)
    assert "3 writes and 0 uploads acknowledged" in text
    assert "writes failed: 2 (0 refused, 2 fenced, 0 timeout, 0 other)" in text
    assert "latency during the run: p50 10 ms" in text
    lines = request_lines(stats.requests_failed, stats.latency, {"from": 1.0, "to": 2.5, "until": "dns_flip"})
    assert len(lines) == 3  # no window figures without window latency
    # stats.json read back (verify reads it) keeps the new fields.
    again = LoadStats.from_json(json.loads(json.dumps(stats.to_json())))
    assert again.requests_failed == stats.requests_failed and again.latency == stats.latency


def test_clients_wait_longer_than_the_lab_plans_budget_by_default(tmp_path: Path) -> None:
    """The front door holds requests up to the budget (+ a margin): the lab's clients must not give up before."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: lab\ncutover:\n  max_write_block: 60\n")
    assert default_http_timeout(SimpleNamespace(plan_file=plan)) > 60 + 5  # type: ignore[arg-type]
    plan.write_text("name: lab\n")  # the model's default budget, 120 s
    assert default_http_timeout(SimpleNamespace(plan_file=plan)) > 120 + 5  # type: ignore[arg-type]
    # No readable plan: the plain default.
    assert default_http_timeout(SimpleNamespace(plan_file=tmp_path / "absent.yaml")) == HTTP_TIMEOUT  # type: ignore[arg-type]
