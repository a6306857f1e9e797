"""kill -9 at each fact the PostgreSQL replicate switch journals (the source's writes stopping, its final position,
promoting, promoted), in turn within one run, on the lab under `lab load` through the front doors: each `migrate
apply` resumes the switch where the last one was killed, until one completes; `migrate rollback` then brings the
service back. No acknowledged write is lost, no request fails.

Apart from tests/test_postgres_faults.py (SIGTERM at the same facts) so that the two, each on its own lab, run side
by side.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from migrate_lab.state import LabState
from orchestrator import exit_codes
from tests.pglab import postgres_lab
from tests.test_e2e import dns_contents, migrate_apply, outcome, wait_for_load_acks_on
from tests.test_frontdoor_e2e import stop_load
from tests.test_postgres_faults import (
    FACTS,
    TIMEOUT,
    arm,
    in_recovery_or_down,
    nothing_lost_on_the_source,
    signalled_run,
    source_takes_writes,
)
from tests.test_postgres_replicate import in_recovery, migrate

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def pg_lab() -> Iterator[LabState]:
    with postgres_lab("migrate-pg-kills-", db_size_mb=2) as lab:
        yield lab


def test_kill9_at_each_fact_of_the_switch_in_turn_resumes_to_the_end(pg_lab: LabState, tmp_path: Path) -> None:
    state = pg_lab
    run = signalled_run(state, tmp_path, "pgkills")
    plan, control, load_dir, load = run.plan, run.control, run.load_dir, run.load
    outcomes: list[str] = []
    try:
        # kill -9 at each fact of one run in turn: each `migrate apply` resumes the switch from what the last one
        # journaled, and is killed at the next fact, until one completes.
        for fact in FACTS:
            arm(control, "KILL", fact)
            killed = migrate(state, "apply", str(plan), "--yes")
            if fact != FACTS[0] and killed.returncode == exit_codes.OK:
                # The kill at the fact before landed after this one was journaled (facts follow each other within
                # milliseconds): the resume found this part done, journaled nothing of it again, and completed.
                outcomes.append(f"kill -9 at {fact}: not reached (the last kill landed past it), completed")
                break
            assert killed.returncode == -signal.SIGKILL, f"kill -9 at {fact}: {outcome(killed)}"
            if fact != "source_read_only":  # journaled before the stop: the source may still run (its app fenced)
                assert in_recovery_or_down(state, state.source), "the source answered as a primary after the kill"
            outcomes.append(f"kill -9 at {fact}: killed, resumed by the next run")
        else:
            arm(control, "-", "none")  # the last resume goes on
            resumed = migrate_apply(state, plan, timeout=TIMEOUT)
            assert resumed.returncode == exit_codes.OK, f"resumed after kill -9 at promoted: {outcome(resumed)}"
            assert "resuming" in resumed.stdout + resumed.stderr, outcome(resumed)
        assert dns_contents(state) == {n: state.target.address for n in state.records}
        assert not in_recovery(state, state.target)
        back = migrate(state, "rollback", str(plan), "--yes")
        assert back.returncode == exit_codes.OK, f"rollback after the kills: {outcome(back)}"
        source_takes_writes(state)
        wait_for_load_acks_on(load_dir, state.source.address, since=time.time())
    finally:
        stop_load(load)
    nothing_lost_on_the_source(state, run, outcomes)
