"""Fault paths on the lab that kill or bypass: each under load and checked with `lab verify` (0 acknowledged writes
lost). The helpers are test_faults.py's.

- The database refuses writes for the whole window: a writer straight to the source database, bypassing the app's
  fence, cannot make a run fail; every row it was told was written is on the target.
- kill -9 while the source database shuts down: the resume completes (the cut-over's second attempt), the copy is
  clean, the audit equal (or says why it could not run), the uploads' tracker carried over.
- kill -9 inside the window and nobody resumes (the shutdown mode, the replicate mode): the guard on the source
  restores it once the budget and its margin have passed, never before; a later `migrate apply` rolls back.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import pymysql
import pytest

from migrate_lab.state import LabState
from migrate_lab.verify import main_verify
from orchestrator import exit_codes
from orchestrator.plan.model import ROOT_RUN_DIR
from orchestrator.services import guard, owned
from tests.test_e2e import (
    MIGRATE,
    a_review,
    assert_source_serves_and_dns_unchanged,
    dns_contents,
    http,
    last_server_start,
    live_lab,
    migrate_apply,
    outcome,
    plan_copy,
    plan_name,
    restore_source_live,
    run_report,
    start_load,
)
from tests.test_faults import (
    Load,
    assert_nothing_lost,
    journal_events,
    journal_path,
    load,
    migrate_status,
    popen_apply,
    saved_keys,
    wait_for,
)
from tests.test_replicate_e2e import journal_events as replicate_journal
from tests.test_replicate_e2e import (
    live,
    on_step,
    replicate_plan,
    source_is_plain_and_writable,
    tunnel,
    tunnel_running,
)

pytestmark = pytest.mark.lab
__all__ = ["live", "live_lab", "load"]


# --- 4. the database refuses writes for the whole window -------------------------------------------------------------

BYPASS_USER, BYPASS_PASSWORD = "bypass", "bypass-writer-pw"


def root_sql(state: LabState, *statements: str) -> None:
    conn = pymysql.connect(unix_socket=str(state.source.db_socket), user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    finally:
        conn.close()


class BypassWriter(threading.Thread):
    """Inserts a row straight into a database every 50 ms (no app, no fence), noting each acknowledged one."""

    def __init__(self, address: str, port: int) -> None:
        super().__init__(daemon=True)
        self.address, self.port = address, port
        self.acknowledged: list[str] = []
        self.refused = 0
        self.done = threading.Event()

    def run(self) -> None:
        conn: Any = None
        while not self.done.wait(0.05):
            row = uuid.uuid4().hex
            try:
                if conn is None:
                    conn = pymysql.connect(
                        host=self.address, port=self.port, user=BYPASS_USER, password=BYPASS_PASSWORD,
                        database="coursereview", autocommit=True, connect_timeout=2, read_timeout=30,
                        ssl_disabled=True,  # loopback; and a TLS context per reconnect costs tens of ms of CPU
                    )  # fmt: skip
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO bypass (id) VALUES (%s)", (row,))
                self.acknowledged.append(row)
            except (pymysql.MySQLError, OSError):
                self.refused += 1
                if conn is not None:
                    conn.close()
                conn = None


def rows_on(address: str, port: int, ids: list[str]) -> set[str]:
    conn = pymysql.connect(host=address, port=port, user=BYPASS_USER, password=BYPASS_PASSWORD, database="coursereview")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id FROM bypass")
            return {row[0] for row in cur.fetchall()} & set(ids)
    finally:
        conn.close()


# Each run lands the writer's attempts at other moments of the window; MIGRATE_BYPASS_RUNS=10 makes a soak of it.
RUNS = int(os.environ.get("MIGRATE_BYPASS_RUNS", "2"))


def test_writers_bypassing_the_fence_cannot_fail_a_run_nor_lose_a_row(live_lab: LabState) -> None:

    state = live_lab
    root_sql(
        state,
        "CREATE TABLE IF NOT EXISTS coursereview.bypass (id VARCHAR(64) PRIMARY KEY)",
        f"CREATE USER IF NOT EXISTS '{BYPASS_USER}'@'%' IDENTIFIED BY '{BYPASS_PASSWORD}'",
        f"GRANT SELECT, INSERT ON coursereview.* TO '{BYPASS_USER}'@'%'",
    )
    plan = plan_copy(state, "bypass", {})
    for run in range(RUNS):
        writer = BypassWriter(state.source.address, state.source.db_port)
        writer.start()
        try:
            wait_for(lambda w=writer: len(w.acknowledged) >= 5, "the bypassing writer's first rows")
            result = migrate_apply(state, plan)
        finally:
            writer.done.set()
            writer.join(timeout=60)
        assert result.returncode == exit_codes.OK, f"run {run + 1}: " + outcome(result)
        found = rows_on(state.target.address, state.target.db_port, writer.acknowledged)
        missing = set(writer.acknowledged) - found
        print(f"run {run + 1}: {len(writer.acknowledged)} rows acknowledged, {writer.refused} refused, 0 missing")
        assert not missing, f"run {run + 1}: {len(missing)} acknowledged rows missing on the target"
        restore_source_live(state)


# --- 5. a resume re-proves what it relies on -------------------------------------------------------------------------


def killed_once_the_source_stops(state: LabState, plan: Path) -> None:
    """`migrate apply`, killed with SIGKILL once it journaled the source database's shutdown (inside the window)."""
    journal = journal_path(state, plan)
    run = popen_apply(state, plan)
    try:
        wait_for(lambda: "source_db_stopped" in saved_keys(journal), "the source's shutdown", proc=run)
        run.kill()
    finally:
        if run.poll() is None:
            run.kill()
        run.communicate(timeout=30)
    assert run.returncode == -signal.SIGKILL


def guard_restored(trace_file: Path, budget: float) -> tuple[list[str], float]:
    """Once the guard wrote that it restored the source: its trace, and when it acted (epoch seconds)."""
    wait_for(
        lambda: trace_file.exists() and trace_file.read_text().rstrip().endswith(" restored"),
        "the guard to restore the source",
        timeout=budget + guard.MARGIN + 120,
    )
    trace = trace_file.read_text().splitlines()
    print("\n".join(trace))
    return trace, next(float(line.split()[0]) for line in trace if "deadline passed" in line)


def test_kill9_during_the_shutdown_under_load_resumes_to_completion(live_lab: LabState, load: Load) -> None:
    state = live_lab
    # What is proven is the resume, not the budget: writes stay blocked while nobody runs and while the new process
    # starts, which on a loaded machine can take most of the lab plan's 60 s.
    plan = plan_copy(state, "kill-shutdown", {"cutover": {"max_write_block": 180}})
    killed_once_the_source_stops(state, plan)
    result = migrate_apply(state, plan)
    verify = load.stop("target")
    assert result.returncode == exit_codes.OK, outcome(result)
    assert dns_contents(state) == {name: state.target.address for name in state.records}
    assert_nothing_lost(verify)
    # The resume finished the run from the journal (the final figures taken under the lock, not from a stopped
    # database) and the copy is clean.
    report = run_report(state, plan_name(plan))
    assert report["status"] == "completed"
    cutover = next(s for s in report["steps"] if s["name"] == "cutover")
    assert cutover["attempts"] == 2
    # The new process held the target's snapshot. Whether it could also start the stopped source for the audit
    # depends on where the kill landed: a source server still running when the resumed cut-over re-read it is
    # audited equal; one the first run's stop command had already ended left no command line to start it with,
    # and the audit says so instead of comparing anything.
    audited = report["audit"]
    if audited["status"] == "not_run":
        assert "command line was not read" in audited["reason"], audited
    else:
        assert audited["status"] == "equal" and audited["tables"] == len(report["row_counts"]) > 0, audited
    assert "crash recovery" not in last_server_start(state.target)
    # The uploads' change tracker outlived the killed run: the resumed one found it and copied only the changes.
    assert report["final_pass_trees"]["uploads"]["mode"] == "tracked", report["final_pass_trees"]


# --- 6. the guard on the source ---------------------------------------------------------------------------------------


def test_kill9_in_the_window_without_resume_the_guard_restores_the_source(live_lab: LabState, load: Load) -> None:

    state = live_lab
    budget = 15.0
    # Lock tries with backoffs between them (5 tries, 4 + 8 + 16 + 32 s): the guard's bound must not grow with them.
    cutover = {"max_write_block": budget, "lock_attempts": 5, "lock_retry_backoff": 4}
    cutover["refuse_predicted_overrun"] = False
    plan = plan_copy(state, "guard", {"cutover": cutover})
    killed_once_the_source_stops(state, plan)
    events = journal_events(state, plan)
    saved = {ev["key"]: ev["value"] for ev in events if ev.get("event") == "step_saved"}
    # The documented bound, as the guard was given it: writes first blocked + the budget + the margin (the lab's
    # hosts share one clock; the deadline is rounded up to a whole second in the guard).
    bound = float(saved["writes_blocked_at"]) + budget + guard.MARGIN
    assert float(saved["guard"]["deadline"]) <= bound, (saved["guard"], bound)
    trace_file = Path(saved["guard"]["dir"]) / guard.TRACE
    # `status` says the run is interrupted and what the guard will do (read before it is due).
    said = migrate_status(state, plan).stdout
    assert "interrupted" in said and "the guard on the source" in said, said
    # Nobody resumes: the guard alone brings the source back once the budget and its margin have passed.
    trace, acted_at = guard_restored(trace_file, budget)
    restored_at = next(float(line.split()[0]) for line in trace if line.endswith(" restored"))
    blocked_at = float(saved["writes_blocked_at"])
    # The run beat until it was killed (the heartbeat file was touched inside the window), then stopped.
    last_beat = (Path(saved["guard"]["dir"]) / guard.HEARTBEAT).stat().st_mtime
    assert last_beat >= blocked_at - 1, (last_beat, blocked_at)
    assert "no heartbeat since" in " ".join(trace), trace
    print(
        f"guard: acted {acted_at - blocked_at:.1f} s after writes were blocked, source restored after "
        f"{restored_at - blocked_at:.1f} s (budget {budget:g} s + margin {guard.MARGIN:g} s); last heartbeat "
        f"{last_beat - blocked_at:.1f} s into the window"
    )
    # Never before its deadline: until then the run could have been resumed and committed.
    assert acted_at >= float(saved["guard"]["deadline"]) - 1.0, trace  # the deadline is rounded up to whole seconds
    # Acted at the bound: the guard's own trace says which deadline it kept (a whole second, rounded up).
    kept = next(line for line in trace if "acts after" in line).split("acts after ")[1].split()[0]
    assert float(kept) <= math.ceil(bound), (kept, bound, trace)
    assert "start the database: done" in " ".join(trace) and "lift the fence: done" in " ".join(trace), trace
    assert_source_serves_and_dns_unchanged(state)
    # `status` says where every record points (read live): at the source.
    doc = json.loads(migrate_status(state, plan, "--json").stdout)
    assert {name: [r["points_at"] for r in rs] for name, rs in doc["dns"]["records"].items()} == {
        name: ["source"] for name in state.records
    }
    # A later `migrate apply` finds the run past its budget, rolls it back, and says what the guard had done.
    result = migrate_apply(state, plan)
    assert result.returncode == exit_codes.FAILED, outcome(result)
    assert "guard_had_restored_the_source" in result.stdout + result.stderr, outcome(result)
    verify = load.stop("source")
    assert_source_serves_and_dns_unchanged(state)
    assert_nothing_lost(verify)


def test_kill9_in_the_replicate_window_without_resume_the_guard_restores_the_source(
    live: LabState, tmp_path: Path
) -> None:
    """The replicate mode's source is read-only and fenced inside its window: killed there (the target promoted, DNS
    not flipped) and never resumed, the guard restarts the source's database (which clears read_only) and lifts the
    fence once the budget and its margin have passed; a later `migrate apply` rolls back; 0 lost."""

    state = live
    budget = 10.0
    plan = replicate_plan(
        state, "replguard", {"before-step": on_step("verify_target", "kill -9 $PPID\n")}, max_write_block=budget,
        compare=False,
    )  # fmt: skip
    load_dir = tmp_path / "load"
    load = start_load(state, load_dir, 600)
    try:
        wait_for(lambda: (load_dir / "acks.jsonl").exists(), "the load's first write")
        killed = migrate_apply(state, plan, timeout=400)
        assert killed.returncode == -signal.SIGKILL, outcome(killed)
        (state.path / "hooks-replguard" / "before-step").unlink()
        events = replicate_journal(state, plan)
        saved = {ev["key"]: ev["value"] for ev in events if ev.get("event") == "step_saved"}
        assert "promoted" in saved and "writes_blocked_at" in saved, sorted(saved)
        writable, _ = source_is_plain_and_writable(state)
        assert not writable, "the kill should have left the source read-only"
        trace_file = Path(saved["guard"]["dir"]) / guard.TRACE
        trace, acted_at = guard_restored(trace_file, budget)
        assert acted_at >= float(saved["guard"]["deadline"]) - 1.0, trace
        said = " ".join(trace)
        assert "stop the read-only database" in said and "start the database: done" in said, trace
        assert "lift the fence: done" in said, trace
        # Nobody ran, and the source takes writes again: read_only cleared, the app's fence lifted, DNS unchanged.
        wait_for(lambda: http(state, state.source, "GET", "/healthz")[0] == 200, "the source's app to answer")
        status, body = http(state, state.source, "POST", "/reviews", a_review("after-the-guard"))
        assert status == 201, (status, body[:200])
        assert dns_contents(state) == {name: state.source.address for name in state.records}
        # A later `migrate apply` finds the run past its budget and rolls it back (the target read-only again).
        result = migrate_apply(state, plan, timeout=400)
        assert result.returncode == exit_codes.FAILED, outcome(result)
        assert "guard_had_restored_the_source" in result.stdout + result.stderr, outcome(result)
        # Killed in its window and rolled back: no tunnel, rsync password file or daemon of the run is left on either
        # host, and no process of it (the guard that acted keeps only its directory, with its trace).
        assert owned_on_hosts(owned.plan_key(plan_name(plan), plan)) == []
    finally:
        load.send_signal(signal.SIGTERM)
        load.communicate(timeout=60)
    assert_source_serves_and_dns_unchanged(state)
    verify = main_verify(state, host="source", load_dir=load_dir)
    assert_nothing_lost(verify)


# --- 7. SIGTERM while the target's database starts ------------------------------------------------------------------


def target_db_running(state: LabState) -> bool:
    """The target's mariadbd answers on its socket, or its pid file names a live process."""
    try:
        pymysql.connect(unix_socket=str(state.target.db_socket), user="root", connect_timeout=2).close()
        return True
    except pymysql.MySQLError:
        pass
    try:
        os.kill(int(state.target.db_pid_file.read_text().strip()), 0)
        return True
    except (OSError, ValueError):
        return False


def test_sigterm_while_the_target_database_starts_leaves_it_stopped(live_lab: LabState, tmp_path: Path) -> None:
    """SIGTERM lands while the target's start command runs (it is slow to begin: the server is not up yet when the
    rollback's stop runs). The undo waits for that command to end, stops the database and checks it stopped: no
    database runs on the target once the run has rolled back, even after the start command has finished."""
    state = live_lab
    began, ended = tmp_path / "start-command-began", tmp_path / "start-command-ended"
    endpoint = {
        "socket": str(state.target.db_socket),
        "datadir": str(state.target.datadir),
        # The command says when it runs; it is slow to begin, so the interruption, sent once it runs, always lands
        # before the server is started.
        "start": f"touch {began}; sleep 1; {state.target.bin_dir / 'db-start'}; rc=$?; touch {ended}; exit $rc",
        "stop": str(state.target.bin_dir / "db-stop"),
    }
    plan = plan_copy(state, "sigterm-start", {"database": {"target": endpoint}})
    for attempt in range(START_SIGTERM_RUNS):
        began.unlink(missing_ok=True)
        ended.unlink(missing_ok=True)
        run = popen_apply(state, plan)
        try:
            wait_for(began.exists, "the target's database start command to run", proc=run)
            run.send_signal(signal.SIGTERM)
            stdout, stderr = run.communicate(timeout=240)
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode == exit_codes.FAILED, (attempt, run.returncode, stdout[-2000:], stderr[-3000:])
        assert "interrupted by SIGTERM" in stdout + stderr, stderr[-3000:]
        # The start command has ended (whether the rollback waited for it or not): only then is "not running" a
        # verdict.
        wait_for(ended.exists, "the target's start command to end")
        assert not target_db_running(state), f"try {attempt + 1}: the rollback left the target's database running"
        assert_source_serves_and_dns_unchanged(state)


START_SIGTERM_RUNS = int(os.environ.get("MIGRATE_START_SIGTERM_RUNS", "1"))


# --- 4, 5, 8. what a run leaves on the hosts is its own, and ends with it ------------------------------------------


def owned_on_hosts(key: str) -> list[str]:
    """Every tunnel socket, rsync password directory or daemon directory of the plan `key` (both lab hosts share
    the private directory), and every process whose command line names one of them."""
    found = [
        str(path)
        for pattern in (
            f"{owned.TUNNEL_PREFIX}{key}-*",
            f"{owned.RSYNC_CLIENT_PREFIX}{key}-*",
            f"{owned.RSYNC_DAEMON_PREFIX}{key}-*",
        )
        for path in Path(ROOT_RUN_DIR).glob(pattern)
    ]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if key in cmdline:
                found.append(f"pid {proc.name}: {cmdline[:200]}")
    return found


def test_a_killed_runs_tunnel_neither_breaks_the_next_run_nor_outlives_a_rollback(live: LabState) -> None:
    """A run killed (kill -9) with its replication tunnel up, whose state is then removed: its tunnel is an orphan,
    and `status` lists it. The next run ends it at its preflight and replicates through a tunnel of its own (an old
    tunnel answering on a socket of the plan's name was taken for the new run's: its replica then failed with error
    2003). That run killed too, then `migrate rollback`: no tunnel, rsync password file or daemon of either run is
    left on either host."""
    state = live
    hooks = state.path / "hooks-leftovers"
    plan = replicate_plan(
        state, "leftovers", {"before-step": on_step("repl_catchup", "kill -9 $PPID\n")}, compare=False
    )
    key = owned.plan_key(plan_name(plan), plan)
    killed = migrate_apply(state, plan, timeout=400)
    assert killed.returncode == -signal.SIGKILL, outcome(killed)
    assert tunnel_running(tunnel(plan, "fwd")), "the killed run's tunnel should still run"
    shutil.rmtree(journal_path(state, plan).parent)  # nobody resumes: the run's state goes
    doc = json.loads(migrate_status(state, plan, "--json").stdout)
    orphans = doc["left_by_other_runs"]
    found = "left by another run of this plan: tunnel of run"
    assert any(line.startswith(found) and line.endswith(": running") for line in orphans), orphans

    # The next run: killed once its replica caught up through its own tunnel (the comparison's lag gate passed, the
    # window's rsync route open), then rolled back. (Killed inside its window, then rolled back: the guard's test.)
    (hooks / "before-step").write_text("#!/bin/bash\nset -u\n" + on_step("repl_switch", "kill -9 $PPID\n"))
    killed = migrate_apply(state, plan, timeout=400)
    assert killed.returncode == -signal.SIGKILL, outcome(killed)
    events = replicate_journal(state, plan)
    saved = {ev["key"]: ev["value"] for ev in events if ev.get("event") == "step_saved"}
    done = [ev["step"] for ev in events if ev.get("event") == "step_completed"]
    assert "repl_catchup" in done, done
    sockets = [path.name for path in Path(ROOT_RUN_DIR).glob(f"{owned.TUNNEL_PREFIX}{key}-*.ctl")]
    assert sockets == [f"{owned.TUNNEL_PREFIX}{saved['forward_tunnel']['name']}.ctl"], sockets  # the first one ended
    assert list(Path(ROOT_RUN_DIR).glob(f"{owned.RSYNC_CLIENT_PREFIX}{key}-*")), "the window's route was not open"
    (hooks / "before-step").unlink()
    rolled = subprocess.run(
        [str(MIGRATE), "rollback", str(plan), "--yes", "--env-file", str(state.env_file)],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert rolled.returncode == exit_codes.OK, outcome(rolled)
    assert owned_on_hosts(key) == []
    assert_source_serves_and_dns_unchanged(state)
