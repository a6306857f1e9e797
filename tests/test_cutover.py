"""The cut-over step and the run report: pure logic, and the step itself driven on the lab.

The lab tests run the real step against the lab's source (real sshd, mariadbd, rsync): a crash after the source
database was stopped must resume from the journaled figures (a stopped database has none to give), and undo must
leave the source serving as before.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from migrate_lab.state import LabState
from orchestrator import secrets
from orchestrator.database.mysql.session import Blocker, mask_query, summarize_blockers
from orchestrator.engine.step import StepContext, StepError
from orchestrator.plan.loader import load_plan
from orchestrator.report.build import build_report, render_report
from orchestrator.runtime import Runtime
from orchestrator.services.estimates import (
    ASSUMED_SHUTDOWN_SECONDS,
    ASSUMED_START_SECONDS,
    overrun_advice,
    shutdown_forecast,
)
from orchestrator.steps import STEP_ORDER, build_steps
from orchestrator.steps.common import COMMAND_TIMEOUT, backoff_delays
from orchestrator.steps.cutover import Cutover
from orchestrator.steps.dns_flip import DnsFlip
from orchestrator.steps.start_target import StartTarget, held_while_running, start_lock_path
from orchestrator.transports.cloudflare import DnsError
from orchestrator.window import DowntimeWindow
from tests.fakes import OfflineRuntime, example_plan
from tests.test_e2e import (  # noqa: F401 - a fixture
    cf_control,
    dns_client,
    dns_contents,
    fail_edits_of_second_record,
    http,
    live_lab,
    plan_copy,
)

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
    steps = ["files_presync", "db_presync", "cutover", "db_final", "dns_flip", "finish"]
    events: list[dict[str, Any]] = [
        {"event": "run_started", "ts": t, "run_id": "r1", "plan_sha256": "x", "plan_path": "p.yaml", "steps": steps}
    ]
    results = {
        "files_presync": {"bytes": 1000},
        "db_presync": {
            "rounds": [{"round": 1, "bytes": 5000}, {"round": 2, "bytes": 100}],
            "cache_warm": {"source": "warmed 2048 bytes in 0.1 s", "target": "warmed 2048 bytes in 0.1 s"},
        },
        "cutover": {
            "mode": "shutdown",
            "writes_blocked_at": t + 10.0,
            "row_counts": {"a.b": 3},
        },
        "db_final": {"final_pass_bytes": 50},
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
    assert report["bytes_by_step"]["db_final"] == 50
    assert report["write_block_seconds"] == 3.5
    text = render_report(report)
    assert "writes blocked" in text and "3.50 s" in text and "shutdown" in text
    assert report["datadir_cache_warm"]["source"] == "warmed 2048 bytes in 0.1 s"
    assert "datadir read into the page cache before the window: source warmed 2048 bytes" in text


def test_report_of_an_older_run_is_not_mixed_with_the_newer() -> None:
    newer = {"event": "run_started", "ts": 5_000.0, "run_id": "r2", "plan_sha256": "x", "plan_path": "p", "steps": []}
    events = [*_events(), newer]
    assert build_report(events)["run_id"] == "r2"
    assert build_report(events)["bytes_moved"] == 0


def offline_runtime(max_write_block: float) -> OfflineRuntime:
    """The shared offline runtime over the example plan, its downtime budget `max_write_block` seconds."""
    rt = OfflineRuntime(example_plan())
    rt.window = DowntimeWindow(max_write_block)
    return rt


def test_start_target_fences_first_keeps_the_fence_and_bounds_each_command_by_the_budget() -> None:
    rt = offline_runtime(max_write_block=60.0)
    rt.window.begin(time.time() - 53.0)  # about 7 s of the budget left
    result = StartTarget().run(Recorder().context(rt, "start_target"))  # type: ignore[arg-type]
    assert result is not None and result["target_fenced"] is True
    commands = rt.target.commands
    fence = rt.plan.services.target_fence
    # Fenced before anything starts; the fence is left for the DNS flip to lift.
    assert commands[0] == fence.enable
    # The database's start command runs as it is, under the lock an undo waits for (start_target.DB_START_LOCK).
    assert commands[1] == held_while_running(
        start_lock_path(rt.plan.target.private_dir, "test"), rt.plan.database.target.start
    )
    assert commands[2:] == [service.start for service in rt.plan.services.target]
    assert fence.disable not in commands
    assert all(timeout is not None and 1.0 <= timeout <= 7.5 for timeout in rt.target.timeouts), rt.target.calls
    # Outside a window (no cut-over journaled) the fixed timeout applies.
    free = offline_runtime(max_write_block=60.0)
    StartTarget().run(Recorder().context(free, "start_target"))  # type: ignore[arg-type]
    assert set(free.target.timeouts) == {COMMAND_TIMEOUT}


def test_the_shutdown_forecast_adds_the_last_round_to_the_shutdown_and_start_and_keeps_the_reserve_back() -> None:
    forecast = shutdown_forecast(12.5, last_round_bytes=4096, rounds=3, max_write_block=20.0, reserve=5.0)
    assert [part.name for part in forecast.parts] == ["final datadir pass", "source database shutdown", "target start"]
    assert forecast.seconds == 12.5 + ASSUMED_SHUTDOWN_SECONDS + ASSUMED_START_SECONDS
    assert forecast.budget == 15.0 and not forecast.fits  # 15.5 s predicted, 15 s usable
    assert shutdown_forecast(1.0, last_round_bytes=0, rounds=2, max_write_block=120.0, reserve=30.0).fits
    assert not shutdown_forecast(43.0, last_round_bytes=0, rounds=2, max_write_block=60.0, reserve=15.0).fits
    assert shutdown_forecast(42.0, last_round_bytes=0, rounds=2, max_write_block=60.0, reserve=15.0).fits


def test_the_advice_names_what_would_help() -> None:
    forecast = shutdown_forecast(40.0, last_round_bytes=9 << 20, rounds=5, max_write_block=30.0, reserve=7.5)
    text = overrun_advice(forecast, rounds=5, max_rounds=5, converged=False, replicate_possible="log_bin is off")
    assert text.startswith("the shutdown mode's window is predicted at 43.0 s (final datadir pass 40.00 s (measured")
    assert "writes were not blocked, nothing changed" in text
    assert "more pre-sync rounds (database.presync.max_rounds, 5 now)" in text
    assert "the replicate mode" in text and "not possible here: log_bin is off" in text
    assert "cutover.max_write_block ≥ 50 s" in text  # the prediction plus the reserve
    converged = overrun_advice(forecast, rounds=2, max_rounds=5, converged=True, replicate_possible=None)
    assert "more pre-sync rounds" in converged  # rounds left: a later round may come out shorter
    assert "more pre-sync rounds" not in overrun_advice(
        forecast, rounds=5, max_rounds=5, converged=True, replicate_possible=None
    )


def _presynced(rt: OfflineRuntime, budget: float, last_seconds: float, *, refuse: bool = True) -> StepContext:
    cutover = rt.plan.cutover.model_copy(update={"max_write_block": budget, "refuse_predicted_overrun": refuse})
    rt.plan = rt.plan.model_copy(update={"cutover": cutover})
    rounds = [{"round": 1, "bytes": 9 << 30, "seconds": 300.0}, {"round": 2, "bytes": 5 << 20, "seconds": last_seconds}]
    outputs = {
        "db_presync": {"rounds": rounds, "converged": True},
        "preflight": {"mode_reason": "shutdown (as the plan says)"},
    }
    return Recorder().context(rt, "cutover", outputs)  # type: ignore[arg-type]


def test_the_cutover_does_not_begin_a_window_predicted_past_the_budget() -> None:
    rt = offline_runtime(max_write_block=60.0)
    ctx = _presynced(rt, budget=60.0, last_seconds=50.0)  # 50 + 3 assumed > 60 - 15 reserve
    with pytest.raises(StepError, match=r"predicted at 53\.0 s .* writes were not blocked"):
        Cutover()._forecast(ctx)
    assert rt.target.calls == [] and rt.window.blocked_at is None  # nothing ran, writes never blocked
    Cutover()._forecast(_presynced(offline_runtime(60.0), budget=60.0, last_seconds=10.0))  # fits: goes on
    # The operator's choice: enter anyway (the budget still rolls it back).
    Cutover()._forecast(_presynced(offline_runtime(60.0), budget=60.0, last_seconds=50.0, refuse=False))


# --- the step on the lab ----------------------------------------------------------------------------------------


class Recorder:
    """What the engine would journal: values saved by the step, kept across 'crashes'."""

    def __init__(self) -> None:
        self.saved: dict[str, Any] = {}
        self.commits: list[str] = []

    def context(
        self, rt: Runtime, step: str = "cutover", outputs: dict[str, dict[str, Any]] | None = None
    ) -> StepContext:
        def _save(_step: str, key: str, value: Any) -> None:
            self.saved[key] = value

        def _commit(_step: str, reason: str) -> None:
            self.commits.append(reason)

        return StepContext(
            run_id="test",
            step=step,
            dry_run=False,
            rt=rt,
            log=structlog.get_logger("test"),
            _saved=dict(self.saved),
            _outputs=outputs or {},
            _save=_save,
            _commit=_commit,
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
    assert "coursereview.reviews" in first["tables"] and "row_counts" not in first
    assert journal.saved["fenced"] and journal.saved["source_db_stopped"]
    assert not runtime.db_answers("source"), "the source database must be stopped after the cut-over"
    assert state.source.fence_file.exists()

    # A crash after the shutdown: a new process re-enters the step with what was journaled.
    second = Cutover().run(journal.context(runtime))
    assert second is not None
    assert second["tables"] == first["tables"]
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
    # The records are edited side by side: the API fails every edit of the second one (5xx), the first one moves.
    fail_edits_of_second_record(state)
    journal = Recorder()
    try:
        with pytest.raises(DnsError) as failure:
            DnsFlip().run(journal.context(rt, "dns_flip"))
        assert failure.value.transient
        moved = sorted(dns_contents(state).values())
        assert moved == [state.source.address, state.target.address], "exactly one record moved"
        # Each record's old content was journaled before its edit was tried, the failed one's too.
        journaled = {r["name"]: r["content"] for r in journal.saved["old_records"].values()}
        assert journaled == {name: state.source.address for name in state.records}
        cf_control(state, "faults", {"mode": "none"})
        step = DnsFlip()
        step.undo(journal.context(rt, "dns_flip"))
        # Undo fences the target at once and leaves the records to the end of the rollback: the source takes
        # writes again before any DNS call (a slow API must not keep writes blocked).
        assert state.target.fence_file.exists()
        assert sorted(dns_contents(state).values()) == [state.source.address, state.target.address]
        step.settle_after_rollback(journal.context(rt, "dns_flip"))
        assert dns_contents(state) == {name: state.source.address for name in state.records}
    finally:
        cf_control(state, "faults", {"mode": "none"})
        rt.close()


@pytest.mark.lab
def test_dns_flip_resumed_past_the_budget_finishes_a_partial_flip_then_lets_the_target_write(
    live_lab: LabState,  # noqa: F811
    runtime: Runtime,
) -> None:
    """What a kill -9 mid-flip leaves: the target fenced, the first record flipped (its old content journaled), the
    write-block budget long spent. Rolling back now would help nobody: the resumed flip finishes, commits, and only
    then lifts the target's fence. Undo (`rollback --discard-target-writes`) fences it again and restores DNS."""
    state = live_lab
    subprocess.run([str(state.target.bin_dir / "fence-on")], check=True, timeout=60)
    blocked_at = runtime.window.begin(time.time() - runtime.plan.cutover.max_write_block - 30)
    outputs = {"cutover": {"writes_blocked_at": blocked_at}}
    journal = Recorder()
    first = state.records[0]
    with dns_client(state) as client:
        zone_id = client.zone_id(state.zone)
        record = client.find_records(zone_id, first, "A")[0]
        journal.saved["old_records"] = {
            record.id: {"id": record.id, "name": record.name, "type": "A", "content": record.content,
                        "ttl": record.ttl, "proxied": record.proxied}
        }  # fmt: skip
        client.set_content(zone_id, record, state.target.address)

    step = DnsFlip()
    assert step.check(journal.context(runtime, "dns_flip", outputs)) is False
    result = step.run(journal.context(runtime, "dns_flip", outputs))
    assert result is not None and result["target_fence_lifted"] is True
    assert dns_contents(state) == {name: state.target.address for name in state.records}
    assert not state.target.fence_file.exists(), "the flip lifts the target's fence once every record points at it"
    assert journal.commits, "the commit is journaled before the target may take writes"
    assert step.check(journal.context(runtime, "dns_flip", outputs)) is True

    step.undo(journal.context(runtime, "dns_flip", outputs))
    assert state.target.fence_file.exists(), "undo fences the target again"
    assert dns_contents(state) == {name: state.target.address for name in state.records}, "DNS comes last"
    step.settle_after_rollback(journal.context(runtime, "dns_flip", outputs))
    assert dns_contents(state) == {name: state.source.address for name in state.records}

    # A flip that has moved nothing still respects the budget: it fails before touching DNS.
    with pytest.raises(StepError, match=r"more than cutover\.max_write_block"):
        DnsFlip().run(Recorder().context(runtime, "dns_flip", outputs))
    assert dns_contents(state) == {name: state.source.address for name in state.records}
