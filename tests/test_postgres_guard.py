"""A PostgreSQL replicate run killed inside its window that nobody resumes, on the lab under `lab load`: the guard on
the source starts its server once the budget and its margin have passed, never before; the app's roles log in there
(the switch left none NOLOGIN); a later `migrate apply` rolls the run back; nothing acknowledged is lost.

Apart from tests/test_postgres_faults.py so that the two, each waiting on its own lab, run side by side.
"""

from __future__ import annotations

import shlex
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from migrate_lab.state import LabState
from migrate_lab.verify import main_verify
from orchestrator import exit_codes
from orchestrator.services import guard
from tests.pglab import postgres_lab
from tests.test_e2e import migrate_apply, outcome, wait_for_load_acks_on
from tests.test_faults_kill import guard_restored
from tests.test_frontdoor_e2e import start_load, stop_load, wait_for
from tests.test_postgres_faults import TIMEOUT, in_recovery_or_down, source_takes_writes
from tests.test_postgres_replicate import events_of, migrate, plan_copy

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def pg_lab() -> Iterator[LabState]:
    with postgres_lab("migrate-pg-guard-", db_size_mb=2) as lab:
        yield lab


def test_killed_in_the_window_and_never_resumed_the_guard_starts_the_source(pg_lab: LabState, tmp_path: Path) -> None:
    """kill -9 once the source's server is stopped (its final position journaled) and nobody resumes: the guard
    starts it again once the budget and its margin have passed, the app's roles log in there, and a later
    `migrate apply` rolls the run back; nothing acknowledged is lost."""
    state = pg_lab
    budget = 5.0
    name = "course-review-lab-pgguard"
    journal = state.path / ".migrate" / name / "journal.jsonl"
    killer = (
        f'[ "$MIGRATE_STEP" = repl_switch ] || exit 0\nrun=$PPID\n'
        f"( while ! grep -q '\"final_gtid\"' {shlex.quote(str(journal))}; do sleep 0.002; done; kill -9 $run ) "
        ">/dev/null 2>&1 &\n"
    )
    plan = plan_copy(state, "pgguard", hook=killer, compare=False, cutover={"max_write_block": budget})
    load_dir = tmp_path / "load"
    load = start_load(state, load_dir, journal)
    try:
        acks = load_dir / "acks.jsonl"
        wait_for(lambda: acks.exists() and acks.read_text().count("\n") >= 10, "writes on the source", 60)
        killed = migrate(state, "apply", str(plan), "--yes")
        assert killed.returncode == -signal.SIGKILL, outcome(killed)
        (state.path / "hooks-pgguard" / "before-step").unlink()
        saved = {ev["key"]: ev["value"] for ev in events_of(state, name) if ev.get("event") == "step_saved"}
        assert "final_gtid" in saved and "writes_blocked_at" in saved, sorted(saved)
        assert in_recovery_or_down(state, state.source), "the kill should have left the source stopped"
        trace, acted_at = guard_restored(Path(saved["guard"]["dir"]) / guard.TRACE, budget)
        assert acted_at >= float(saved["guard"]["deadline"]) - 1.0, trace
        assert "start the database: done" in " ".join(trace), trace
        source_takes_writes(state)  # the app's role logs in: nothing left it NOLOGIN
        result = migrate_apply(state, plan, timeout=TIMEOUT)
        assert result.returncode == exit_codes.FAILED, outcome(result)
        assert "guard_had_restored_the_source" in result.stdout + result.stderr, outcome(result)
        source_takes_writes(state)
        wait_for_load_acks_on(load_dir, state.source.address, since=time.time())
    finally:
        stop_load(load)
    verify = main_verify(state, host="source", load_dir=load_dir, journal=journal)
    assert verify.error is None, verify.error
    assert verify.reviews_acknowledged > 0
    assert verify.acknowledged_lost == 0, verify.lost
