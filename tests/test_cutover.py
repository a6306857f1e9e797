"""The cut-over step and the run report: pure logic, and the step itself driven on the lab.

The lab tests run the real step against the lab's source (real sshd, mariadbd, rsync): a crash after the source
database was stopped must resume from the journaled figures (a stopped database has none to give), and undo must
leave the source serving as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from orchestrator import secrets
from orchestrator.engine.step import StepContext
from orchestrator.lab.state import LabState
from orchestrator.plan.loader import load_plan
from orchestrator.report import build_report, render_report
from orchestrator.runtime import Runtime
from orchestrator.steps import STEP_ORDER, build_steps
from orchestrator.steps.cutover import Blocker, Cutover, backoff_delays, mask_query, summarize_blockers
from orchestrator.steps.dns_flip import DnsFlip
from orchestrator.transports.cloudflare import DnsError
from tests.test_e2e import cf_control, dns_contents, http, live_lab, plan_copy  # noqa: F401 - a fixture

# --- pure logic -------------------------------------------------------------------------------------------------


def test_steps_come_in_migration_order() -> None:
    plan = load_plan(Path(__file__).parents[1] / "plans" / "course-review.yaml").plan
    steps = build_steps(plan)
    assert [s.name for s in steps] == list(STEP_ORDER)
    assert [s.name for s in steps if s.begins_downtime] == ["cutover"]
    assert [s.name for s in steps if s.commit_point] == ["dns_flip"]


def test_lock_retries_back_off_doubling() -> None:
    assert backoff_delays(4, 2.0) == [2.0, 4.0, 8.0]
    assert backoff_delays(1, 2.0) == []


def test_blocker_queries_are_masked_and_truncated() -> None:
    secrets.register("hunter2-very-secret")
    assert "s3cr3t" not in mask_query("CREATE USER x IDENTIFIED BY 's3cr3t'")
    assert "s3cr3t" not in mask_query("SET PASSWORD FOR x = PASSWORD('s3cr3t')")
    assert "hunter2-very-secret" not in mask_query("SELECT 'hunter2-very-secret' FROM t")
    long = mask_query("SELECT " + "x, " * 100 + "y FROM reviews", limit=40)
    assert len(long) == 40 and long.endswith("…")
    assert mask_query("SELECT\n  SLEEP(30)\n FROM reviews") == "SELECT SLEEP(30) FROM reviews"


def test_blocker_summary_names_queries_and_locked_tables() -> None:
    blocker = Blocker(id=7, user="app", command="Query", seconds=12, state="User sleep", query="SELECT SLEEP(30)")
    text = summarize_blockers([blocker], ["coursereview.reviews"])
    assert text == "#7 app Query for 12s: SELECT SLEEP(30); tables in use: coursereview.reviews"
    assert "no running query" in summarize_blockers([], [])


def _events() -> list[dict[str, Any]]:
    t = 1_000.0
    steps = ["files_presync", "db_presync", "cutover", "dns_flip", "finish"]
    events: list[dict[str, Any]] = [
        {"event": "run_started", "ts": t, "run_id": "r1", "plan_sha256": "x", "plan_path": "p.yaml", "steps": steps}
    ]
    results = {
        "files_presync": {"bytes": 1000},
        "db_presync": {"rounds": [{"round": 1, "bytes": 5000}, {"round": 2, "bytes": 100}]},
        "cutover": {
            "mode": "shutdown",
            "writes_blocked_at": t + 10.0,
            "final_pass_bytes": 50,
            "row_counts": {"a.b": 3},
        },
        "dns_flip": {"flipped_at": t + 13.5},
    }
    for i, name in enumerate(steps[:-1]):
        events.append({"event": "step_started", "ts": t + 2 * i, "step": name})
        events.append({"event": "step_completed", "ts": t + 2 * i + 1.5, "step": name, "result": results[name]})
    events.append({"event": "step_started", "ts": t + 20, "step": "finish"})
    return events


def test_report_gives_durations_bytes_and_the_write_block_window() -> None:
    report = build_report(_events(), now=1_021.0)
    steps = {s["name"]: s for s in report["steps"]}
    assert steps["cutover"]["duration"] == 1.5
    assert steps["finish"]["state"] == "running" and steps["finish"]["duration"] == 1.0
    assert report["bytes_moved"] == 1000 + 5100 + 50
    assert report["write_block_seconds"] == 3.5
    text = render_report(report)
    assert "writes blocked" in text and "3.50 s" in text and "shutdown" in text


def test_report_of_an_older_run_is_not_mixed_with_the_newer() -> None:
    newer = {"event": "run_started", "ts": 5_000.0, "run_id": "r2", "plan_sha256": "x", "plan_path": "p", "steps": []}
    events = [*_events(), newer]
    assert build_report(events)["run_id"] == "r2"
    assert build_report(events)["bytes_moved"] == 0


# --- the step on the lab ----------------------------------------------------------------------------------------


class Recorder:
    """What the engine would journal: values saved by the step, kept across 'crashes'."""

    def __init__(self) -> None:
        self.saved: dict[str, Any] = {}

    def context(self, rt: Runtime, step: str = "cutover") -> StepContext:
        def _save(_step: str, key: str, value: Any) -> None:
            self.saved[key] = value

        return StepContext(
            run_id="test",
            step=step,
            dry_run=False,
            rt=rt,
            log=structlog.get_logger("test"),
            _saved=dict(self.saved),
            _save=_save,
        )


@pytest.fixture
def runtime(live_lab: LabState, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:  # noqa: F811
    for key, value in live_lab.secrets().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CLOUDFLARE_EMAIL", raising=False)
    monkeypatch.delenv("CLOUDFLARE_API_KEY", raising=False)
    rt = Runtime(load_plan(live_lab.plan_file).plan, live_lab.plan_file)
    try:
        yield rt
    finally:
        rt.close()


@pytest.mark.lab
def test_cutover_resumes_after_the_shutdown_from_journaled_figures_and_undo_restores(
    live_lab: LabState,  # noqa: F811
    runtime: Runtime,
) -> None:
    state = live_lab
    journal = Recorder()
    first = Cutover().run(journal.context(runtime))
    assert first is not None
    assert first["mode"] == "shutdown"
    assert first["row_counts"]["coursereview.reviews"] > 0
    assert journal.saved["fenced"] and journal.saved["source_db_stopped"]
    assert not runtime.db_answers("source"), "the source database must be stopped after the cut-over"
    assert state.source.fence_file.exists()

    # A crash after the shutdown: a new process re-enters the step with what was journaled.
    second = Cutover().run(journal.context(runtime))
    assert second is not None
    assert second["row_counts"] == first["row_counts"]
    assert second["writes_blocked_at"] == first["writes_blocked_at"]
    assert second["binlog"] == first["binlog"]

    step = Cutover()
    step.undo(journal.context(runtime))
    step.undo(journal.context(runtime))  # idempotent
    assert runtime.db_answers("source")
    assert not state.source.fence_file.exists()
    assert http(state, state.source, "GET", "/healthz")[0] == 200


@pytest.mark.lab
def test_dns_flip_failing_midway_restores_the_records_it_flipped(
    live_lab: LabState,  # noqa: F811
    runtime: Runtime,
) -> None:
    state = live_lab
    plan_path = plan_copy(state, "flip", {"retry": {"attempts": 2, "max_seconds": 3, "max_wait": 0.2}})
    rt = Runtime(load_plan(plan_path).plan, plan_path)
    real = rt.dns

    class BreaksAfterFirstEdit:
        """The real adapter; the API starts failing (5xx on every edit) right after the first record moved."""

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def set_content(self, zone_id: str, record: Any, content: str) -> Any:
            updated = real.set_content(zone_id, record, content)
            cf_control(state, "faults", {"mode": "5xx", "count": -1, "methods": ["PATCH", "PUT"]})
            return updated

    rt._dns = BreaksAfterFirstEdit()  # type: ignore[assignment]
    journal = Recorder()
    try:
        with pytest.raises(DnsError) as failure:
            DnsFlip().run(journal.context(rt, "dns_flip"))
        assert failure.value.transient
        moved = sorted(dns_contents(state).values())
        assert moved == [state.source.address, state.target.address], "exactly one record moved before the failure"
        # Each record's old content was journaled before its edit was tried, the failed one's too.
        journaled = {r["name"]: r["content"] for r in journal.saved["old_records"].values()}
        assert journaled == {name: state.source.address for name in state.records}
        cf_control(state, "faults", {"mode": "none"})
        DnsFlip().undo(journal.context(rt, "dns_flip"))
        assert dns_contents(state) == {name: state.source.address for name in state.records}
    finally:
        cf_control(state, "faults", {"mode": "none"})
        rt.close()
