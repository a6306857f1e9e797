"""`migrate status --watch` follows a run from another terminal until it ends, and exits with its outcome.

On the lab: `migrate apply --json` runs in one process, held before the downtime by its postpone flag; `status
--watch` in another sees the steps move, the run held at the gate (with the DNS TTLs already lowered on the
Cloudflare double), then the rest of the steps and the end, and exits 0. The apply's console is JSON lines, with
the transfers' progress as records. Offline: the outcome a watch exits with, and the log tail it reads.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from migrate_lab.state import LabState
from orchestrator import exit_codes
from orchestrator.engine.journal import replay
from orchestrator.output.progress import TRANSFER_EVENT, phase_of, ttl_wait_until
from orchestrator.run.results import StatusReport
from orchestrator.run.watch import LogTail, outcome_code
from orchestrator.services import dns_where
from tests.test_e2e import MIGRATE, PLAN_NAMES, dns_client, plan_copy, plan_name, restore_source_live

LAB_TTL, LOWERED = 60, 30
WAIT_LIMIT = 180.0


def wait_for(condition: Callable[[], bool], what: str, alive: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + WAIT_LIMIT
    while not condition():
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"the run ended (exit {alive.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {WAIT_LIMIT:.0f} s for {what}")
        time.sleep(0.1)


class Lines:
    """A process's stdout, collected line by line as it comes."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def has(self, pattern: str) -> bool:
        return any(re.search(pattern, line) for line in list(self.lines))

    def index(self, pattern: str) -> int:
        return next(i for i, line in enumerate(self.lines) if re.search(pattern, line))

    def join(self) -> None:
        self._thread.join(timeout=30)


def ttls(state: LabState) -> dict[str, list[int]]:
    with dns_client(state) as client:
        zone_id = client.zone_id(state.zone)
        return {name: sorted(r.ttl for r in client.find_records(zone_id, name, "A")) for name in state.records}


def contents(state: LabState) -> dict[str, list[str]]:
    with dns_client(state) as client:
        zone_id = client.zone_id(state.zone)
        return {name: sorted(r.content for r in client.find_records(zone_id, name, "A")) for name in state.records}


@pytest.fixture
def source_live(lab: LabState) -> Iterator[LabState]:
    restore_source_live(lab)
    try:
        yield lab
    finally:
        restore_source_live(lab)


@pytest.mark.lab
def test_status_watch_follows_a_run_through_the_gate_to_its_end(source_live: LabState, tmp_path: Path) -> None:
    state = source_live
    flag = state.path / "hold-watch"
    plan = plan_copy(
        state,
        "watch",
        {"dns": {"lower_ttl_to": LOWERED, "lower_ttl_wait": 0}, "cutover": {"postpone_flag": str(flag)}},
    )
    PLAN_NAMES.add(plan_name(plan))
    state_dir = state.path / ".migrate" / plan_name(plan)
    flag.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY")}
    apply_out, apply_err = (tmp_path / "apply.out").open("w+"), (tmp_path / "apply.err").open("w+")
    # The watch starts first: with no run yet it waits for one.
    watch = subprocess.Popen(
        [str(MIGRATE), "status", str(plan), "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    seen = Lines(watch)
    apply = subprocess.Popen(
        [str(MIGRATE), "apply", str(plan), "--yes", "--json", "--env-file", str(state.env_file)],
        stdout=apply_out,
        stderr=apply_err,
        text=True,
        env=env,
    )
    try:
        wait_for(lambda: seen.has("no run yet") or seen.has(r"step 1 preflight"), "the watch's first look", watch)

        def held() -> bool:
            return any("cut-over postponed" in log.read_text() for log in state_dir.glob("run-*.log.jsonl"))

        wait_for(held, "the run to be held at the gate", apply)
        wait_for(lambda: seen.has(r"step \d+ db_presync: done"), "the watch to see the pre-sync done", watch)
        # Held before the downtime: the TTLs are already lowered, and the watch has not seen the cut-over run.
        assert ttls(state) == {name: [LOWERED] for name in state.records}
        assert not seen.has(r"step \d+ cutover: (running|done)")
        assert watch.poll() is None and apply.poll() is None
        flag.unlink()
        assert apply.wait(timeout=WAIT_LIMIT) == exit_codes.OK
        assert watch.wait(timeout=WAIT_LIMIT) == exit_codes.OK
    finally:
        for proc in (apply, watch):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        flag.unlink(missing_ok=True)
    seen.join()
    text = "\n".join(seen.lines)
    assert seen.index(r"step \d+ db_presync: done") < seen.index(r"step \d+ cutover: done"), text
    assert seen.index(r"step \d+ cutover: done") < seen.index(r"step \d+ finish: done"), text
    assert re.search(r"run \S+ ended: completed", seen.lines[-1]), text
    # After the commit: DNS on the target, the original TTL back.
    assert contents(state) == {name: [state.target.address] for name in state.records}
    assert ttls(state) == {name: [LAB_TTL] for name in state.records}
    # The apply's console was JSON lines, the transfers' progress among them, and no escape code anywhere.
    apply_err.seek(0)
    records = [json.loads(line) for line in apply_err.read().splitlines() if line.strip()]
    transfers = [r["progress"] for r in records if r.get("event") == TRANSFER_EVENT]
    assert {t["id"] for t in transfers} >= {"tree uploads", "datadir round 1"}
    assert any(t["state"] == "done" and t["pct"] == 100 for t in transfers)
    apply_out.seek(0)
    assert "\x1b[" not in apply_out.read() + text


# --- offline ---------------------------------------------------------------------------------------------------


def _events(*kinds: tuple[str, dict[str, object]]) -> list[dict[str, object]]:
    started = {"event": "run_started", "run_id": "r1", "plan_sha256": "x", "plan_path": "p", "plan_text": "",
               "steps": ["a", "b"], "ts": 1.0}  # fmt: skip
    return [started, *({"event": kind, "ts": 2.0, **fields} for kind, fields in kinds)]


def test_a_watch_exits_with_the_code_the_run_gave() -> None:
    completed = _events(("run_completed", {}))
    declined = _events(("gate_declined", {"step": "b"}))
    rolled_back = _events(("rollback_started", {"reason": "x"}), ("rollback_completed", {}))
    for events, code in (
        (completed, exit_codes.OK),
        (declined, exit_codes.REFUSED),
        (rolled_back, exit_codes.FAILED),
    ):
        state = replay(events)
        assert state is not None
        assert outcome_code(state, events) == code, events


def test_a_watch_exits_needs_attention_when_the_runs_end_reading_found_dns_not_at_the_serving_host() -> None:
    def reading(records: dict[str, list[str]]) -> tuple[str, dict[str, object]]:
        value = {"at": 3.0, "records": records, "source": ["10.0.0.1"], "target": "10.0.0.2", "end": True}
        return ("step_saved", {"step": "dns_flip", "key": dns_where.RECORDS_NOW, "value": value})

    split = {"www": ["10.0.0.2"], "api": ["10.0.0.1"]}
    at_source = {"www": ["10.0.0.1"], "api": ["10.0.0.1"]}
    completed_split = _events(reading(split), ("run_completed", {}))
    rolled_back_split = _events(reading(split), ("rollback_started", {"reason": "x"}), ("rollback_completed", {}))
    completed_at_source = _events(reading(at_source), ("run_completed", {}))
    rolled_back_at_source = _events(
        reading(at_source), ("rollback_started", {"reason": "x"}), ("rollback_completed", {})
    )
    for events, code in (
        (completed_split, exit_codes.NEEDS_ATTENTION),
        (rolled_back_split, exit_codes.NEEDS_ATTENTION),
        (completed_at_source, exit_codes.NEEDS_ATTENTION),  # completed, but clients still reach the old host
        (rolled_back_at_source, exit_codes.FAILED),  # the plain rollback: what apply returned
    ):
        state = replay(events)
        assert state is not None
        assert outcome_code(state, events) == code, events


def test_the_log_tail_keeps_the_latest_transfer_and_waits_for_a_torn_line(tmp_path: Path) -> None:
    log = tmp_path / "run.log.jsonl"
    first = {"event": TRANSFER_EVENT, "step": "files_presync", "progress": {"id": "tree a", "bytes": 10, "pct": 5}}
    later = {"event": TRANSFER_EVENT, "step": "files_presync", "progress": {"id": "tree a", "bytes": 90, "pct": 45}}
    log.write_text(json.dumps(first) + "\n" + json.dumps(later)[:20])
    tail = LogTail()
    tail.follow(log)
    assert tail.transfers["tree a"].bytes == 10
    log.write_text(
        json.dumps(first) + "\n" + json.dumps(later) + "\n" + json.dumps({"event": "x", "replication_lag": 1.5}) + "\n"
    )
    tail.follow(log)
    assert tail.transfers["tree a"].bytes == 90 and tail.lag == 1.5
    done = {"event": TRANSFER_EVENT, "progress": {"id": "tree a", "bytes": 100, "pct": 100, "state": "done"}}
    with log.open("a") as out:
        out.write(json.dumps(done) + "\n")
    tail.follow(log)
    assert "tree a" not in tail.transfers


def test_the_phase_line_and_status_say_how_long_the_old_ttl_still_holds_the_cutover() -> None:
    now = 1_800_000_000.0
    events = _events(
        ("step_started", {"step": "lower_ttl"}),
        ("step_saved", {"step": "lower_ttl", "key": "wait_until", "value": now + 125}),
        ("step_completed", {"step": "lower_ttl", "result": {}, "duration": 0.1}),
    )
    state = replay(events)
    assert state is not None
    phase = phase_of(state, events, ["lower_ttl", "files_presync", "cutover"], 120.0, None)
    assert "waiting out the old DNS TTL: 2:05 left" in phase.line(now)
    assert "writes flow" in phase.line(now)
    assert "old DNS TTL" not in phase.line(now + 126)
    report = StatusReport("p", state, [], False, None, None, "", None, ttl_wait_until=ttl_wait_until(state))
    assert report.ttl_wait_left(now) == 125 and report.ttl_wait_left(now + 200) is None
