"""The PostgreSQL replicate window's fault paths on the lab, under `lab load` through the front doors: SIGTERM and
kill -9 at each fact the switch journals (the source's writes stopping, its final position, promoting, promoted).
Each ends with the service on one side, writable, and no acknowledged write lost:

- SIGTERM rolls the run back: the source's server (stopped by the switch) is started again and takes writes, DNS
  stays on it, a promoted target is fenced again;
- kill -9 at each fact: tests/test_postgres_kills.py.

A run killed inside the window that nobody resumes: tests/test_postgres_guard.py. One lab for the module, under
/var/tmp (the clusters run as `postgres`).
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from migrate_lab.state import LabState
from migrate_lab.verify import main_verify
from orchestrator import exit_codes
from orchestrator.database.pg import primitives as pg
from tests.pglab import postgres_lab
from tests.test_e2e import a_review, dns_contents, http, outcome, wait_for_load_acks_on
from tests.test_frontdoor_e2e import journal_of, no_failed_requests, start_load, stop_load, wait_for
from tests.test_postgres_replicate import in_recovery, migrate, plan_copy

pytestmark = pytest.mark.lab

TIMEOUT = 600.0
# What each journaled fact means for the switch, in its order (the keys of repl_switch.py).
FACTS = ("source_read_only", "final_gtid", "promoting", "promoted")


@pytest.fixture(scope="module")
def pg_lab() -> Iterator[LabState]:
    with postgres_lab("migrate-pg-faults-", db_size_mb=2) as lab:
        yield lab


def signal_at_fact_hook(control: Path, journal: Path) -> str:
    """The switch's before-step hook: a watcher left behind that sends the signal named in `control` ("TERM
    promoting": the signal, the fact; "- none": no watcher) to the run once its journal records that fact after the
    hook began (it ends with the run otherwise). One `tail -f` (woken by inotify as each record lands) and one
    `grep`, not three processes per look: on a loaded machine such a loop can lag by as long as the switch takes,
    and a signal meant for a fact inside the window then lands after the commit."""
    j = shlex.quote(str(journal))
    return (
        f'[ "$MIGRATE_STEP" = repl_switch ] || exit 0\nrun=$PPID\nread -r sig fact < {shlex.quote(str(control))}\n'
        f'[ "$fact" != none ] || exit 0\nskip=$(wc -l < {j})\n'
        f'( tail -n +"$((skip + 1))" -f --pid=$run {j} | {{ grep -q -m1 "\\"key\\":\\"$fact\\"" && '
        'kill -"$sig" $run; } ) >/dev/null 2>&1 &\n'
    )


def arm(control: Path, sig: str, fact: str) -> None:
    control.write_text(f"{sig} {fact}\n")


def in_recovery_or_down(state: LabState, host: Any) -> bool:
    """The server does not answer, or answers as a standby: it takes no write."""
    try:
        return in_recovery(state, host)
    except pg.PostgresError:
        return True


def source_takes_writes(state: LabState) -> None:
    assert not in_recovery(state, state.source), "the source is not a primary"
    wait_for(lambda: http(state, state.source, "GET", "/healthz")[0] == 200, "the source's app to answer")
    status, body = http(state, state.source, "POST", "/reviews", a_review("after-the-fault"))
    assert status == 201, (status, body[:200])
    assert dns_contents(state) == {n: state.source.address for n in state.records}


@dataclass
class SignalledRun:
    """A plan whose switch signals its own run at a fact (`arm`), its journal, and the load writing meanwhile."""

    plan: Path
    journal: Path
    control: Path
    load_dir: Path
    load: subprocess.Popen[str]


def signalled_run(state: LabState, tmp_path: Path, suffix: str) -> SignalledRun:
    """The plan (a budget the kills' resumes stay within: the guard acts only past it and its margin; the reverse
    path kept for `migrate rollback`) and the load, started, writing on the source."""
    control = tmp_path / "signal-at"
    journal = state.path / ".migrate" / f"course-review-lab-{suffix}" / "journal.jsonl"
    plan = plan_copy(state, suffix, hook=signal_at_fact_hook(control, journal), cutover={"max_write_block": 300},
                     compare=False, keep_reverse=3600)  # fmt: skip
    assert journal_of(state, plan) == journal
    load_dir = tmp_path / "load"
    load = start_load(state, load_dir, journal)
    acks = load_dir / "acks.jsonl"
    try:
        wait_for(lambda: acks.exists() and acks.read_text().count("\n") >= 10, "writes on the source", 60)
    except BaseException:
        stop_load(load)
        raise
    return SignalledRun(plan, journal, control, load_dir, load)


def test_sigterm_at_each_fact_of_the_switch_rolls_back(pg_lab: LabState, tmp_path: Path) -> None:
    state = pg_lab
    run = signalled_run(state, tmp_path, "pgfaults")
    plan, control, load_dir, load = run.plan, run.control, run.load_dir, run.load
    outcomes: list[str] = []
    try:
        for fact in FACTS:
            arm(control, "TERM", fact)
            result = migrate(state, "apply", str(plan), "--yes")
            said = result.stdout + result.stderr
            assert "SIGTERM" in said, outcome(result)
            if fact == "promoted" and result.returncode == exit_codes.OK:
                # The switch's last fact: the signal may land after the commit point, and the run then finishes
                # forward (what an interruption means once the target serves); the service is brought back.
                assert dns_contents(state) == {n: state.target.address for n in state.records}
                back = migrate(state, "rollback", str(plan), "--yes")
                assert back.returncode == exit_codes.OK, f"rollback after SIGTERM at {fact}: {outcome(back)}"
                outcomes.append(f"SIGTERM at {fact}: after the commit, finished forward, rolled back")
            else:
                assert result.returncode == exit_codes.FAILED, f"SIGTERM at {fact}: {outcome(result)}"
                assert "rolled back: the source serves as before" in said, outcome(result)
                outcomes.append(f"SIGTERM at {fact}: rolled back")
            source_takes_writes(state)
        wait_for_load_acks_on(load_dir, state.source.address, since=time.time())
    finally:
        stop_load(load)
    nothing_lost_on_the_source(state, run, outcomes)


def nothing_lost_on_the_source(state: LabState, run: SignalledRun, outcomes: list[str]) -> None:
    """What the faults' run ends with: every acknowledged write on the source, no failed request."""
    print("\n" + "\n".join(outcomes))
    verify = main_verify(state, host="source", load_dir=run.load_dir, journal=run.journal)
    print(
        f"PostgreSQL switch faults: longest write stall {verify.longest_write_stall_s} s, failed "
        f"{verify.requests_failed}, acknowledged {verify.reviews_acknowledged}, lost {verify.acknowledged_lost}"
    )
    assert verify.error is None, verify.error
    assert verify.reviews_acknowledged > 0
    assert verify.acknowledged_lost == 0, verify.lost
    no_failed_requests(verify)
