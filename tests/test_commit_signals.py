"""A signal at the commit never loses a write (the commit driven from the source, `proxy.source.commit_from:
source`, the path `auto` takes at any distance beyond loopback), on the lab under `migrate lab load`.

- SIGTERM inside the commit's one command on the source, once it has recorded the commit there and lifted the
  target's fence: that command ends on the source without us (its own session), the target takes writes through the
  source's door. The run settles the commit before it decides anything: found made, it is journaled committed and
  finished forward at once (no compensation runs), with the time the clients were served again taken from the
  record on the source. Exit 0, DNS on the target, 0 acknowledged writes lost.
- kill -9 inside the commit's command, once it recorded the commit and lifted the target's fence, then `migrate
  rollback`: the rollback settles the commit first, finds it made, undoes nothing (the target serves through the
  source's door) and says `migrate apply`, which finishes the run; the journal says the clients were served again
  when the record was written on the source, before anybody resumed. 0 lost.
- SIGTERM inside the window's first command on the source, after its fence and before its database stop: the
  rollback ends that command on the host before it touches the database, then makes the source writable whatever a
  read would have said. Exit 1 (rolled back), the source writable and serving, 0 lost.

The signals are sent by the plan's own commands (a fence that signals the run once), so nothing waits on timing.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from migrate_lab.state import LabState
from migrate_lab.verify import main_verify
from orchestrator import exit_codes
from tests.test_e2e import assert_source_serves_and_dns_unchanged, dns_contents, migrate_apply, outcome, plan_name
from tests.test_e2e import start_load as start_lab_load
from tests.test_replicate_e2e import (
    TIMEOUT,
    journal_events,
    kills_once,
    live,
    migrate,
    on_step,
    replicate_plan,
    run_killed,
    run_report,
    source_is_plain_and_writable,
    wait_for_load_acks_on,
)

pytestmark = pytest.mark.lab
__all__ = ["live"]


def signals_once(pid_file: Path, command: str, sig: signal.Signals, *, sleep_after: float = 0.0) -> str:
    """`command` (a fence's), then, the first time only, `sig` to the run whose pid is in `pid_file`; `sleep_after`
    keeps the command running that long past the signal (what follows it in the same command waits)."""
    used = shlex.quote(f"{pid_file}.used")
    pause = f" sleep {sleep_after:g};" if sleep_after else ""
    send = f"if mv {shlex.quote(str(pid_file))} {used} 2>/dev/null; then kill -{sig.name[3:]} $(cat {used});{pause} fi"
    return f"{command} && {{ {send}; }}; true"


def commit_from_source_plan(state: LabState, suffix: str, hooks: dict[str, str]) -> tuple[Path, dict[str, Any]]:
    plan = replicate_plan(state, suffix, hooks)
    yaml = YAML()
    data = yaml.load(plan.read_text())
    data["proxy"]["source"]["commit_from"] = "source"
    return plan, data


def write(plan: Path, data: dict[str, Any]) -> None:
    with plan.open("w") as out:
        YAML().dump(data, out)


def load_flowing(state: LabState, load_dir: Path) -> subprocess.Popen[str]:
    """`migrate lab load` started, once it has ten writes acknowledged (or a minute passed)."""
    load = start_lab_load(state, load_dir, 300)
    acks = load_dir / "acks.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (acks.exists() and acks.read_text().count("\n") >= 10):
        time.sleep(0.05)
    return load


def under_load(state: LabState, plan: Path, load_dir: Path) -> subprocess.CompletedProcess[str]:
    load = load_flowing(state, load_dir)
    try:
        result = migrate_apply(state, plan, timeout=TIMEOUT)
        serving = state.target if result.returncode == exit_codes.OK else state.source
        wait_for_load_acks_on(load_dir, serving.address, since=time.time())
        return result
    finally:
        load.send_signal(signal.SIGTERM)
        load.communicate(timeout=60)


def test_sigterm_inside_the_commit_command_finishes_forward_and_loses_nothing(live: LabState, tmp_path: Path) -> None:
    state = live
    pid_file = state.path / "commit-term.pid"
    plan, data = commit_from_source_plan(
        state, "committerm", {"after-step": on_step("verify_target", f"echo $PPID > {shlex.quote(str(pid_file))}\n")}
    )
    fence = data["services"]["target_fence"]
    fence["disable"] = signals_once(pid_file, fence["disable"], signal.SIGTERM)
    write(plan, data)
    load_dir = tmp_path / "load"
    result = under_load(state, plan, load_dir)
    assert Path(f"{pid_file}.used").exists(), "the commit's command did not signal the run"
    assert result.returncode == exit_codes.OK, outcome(result)
    events = journal_events(state, plan)
    assert not any(e.get("event") in ("rollback_started", "undo_started") for e in events), "a compensation ran"
    assert any(e.get("event") == "committed" for e in events)
    report = run_report(state, plan_name(plan))
    assert report["status"] == "completed"
    switch = next(e for e in events if e.get("event") == "step_completed" and e.get("step") == "switch_traffic")
    # When the clients were served again: the commit's record on the source, not when the run found it.
    assert switch["result"]["writes_flow_at"] <= switch["ts"]
    assert dns_contents(state) == {name: state.target.address for name in state.records}
    verify = main_verify(state, host="target", load_dir=load_dir)
    assert verify.error is None, verify.error
    assert verify.acknowledged_lost == 0, verify.lost


def test_sigterm_inside_the_first_command_rolls_back_to_a_writable_source(live: LabState, tmp_path: Path) -> None:
    state = live
    pid_file = state.path / "first-term.pid"
    plan, data = commit_from_source_plan(
        state, "firstterm", {"before-step": on_step("repl_switch", f"echo $PPID > {shlex.quote(str(pid_file))}\n")}
    )
    # Signalled once the source's fence is up; the first command then waits a second before it goes on to the
    # database's stop, so the rollback's first look at the source comes while it still runs there.
    fence = data["services"]["fence"]
    fence["enable"] = signals_once(pid_file, fence["enable"], signal.SIGTERM, sleep_after=1.0)
    write(plan, data)
    load_dir = tmp_path / "load"
    result = under_load(state, plan, load_dir)
    assert Path(f"{pid_file}.used").exists(), "the first command did not signal the run"
    assert result.returncode == exit_codes.FAILED, outcome(result)
    time.sleep(2.0)  # past the first command's own pause: a stop it still made would show now
    writable, replica_status = source_is_plain_and_writable(state)
    assert writable and replica_status is None
    assert_source_serves_and_dns_unchanged(state)
    verify = main_verify(state, host="source", load_dir=load_dir)
    assert verify.error is None, verify.error
    assert verify.acknowledged_lost == 0, verify.lost


def test_kill9_inside_the_commit_command_then_rollback_undoes_nothing_and_apply_finishes(
    live: LabState, tmp_path: Path
) -> None:
    state = live
    pid_file = state.path / "commit-kill.pid"
    plan, data = commit_from_source_plan(
        state, "commitkill", {"after-step": on_step("verify_target", f"echo $PPID > {shlex.quote(str(pid_file))}\n")}
    )
    fence = data["services"]["target_fence"]
    fence["disable"] = kills_once(pid_file, fence["disable"], before=False)
    write(plan, data)
    load_dir = tmp_path / "load"
    load = load_flowing(state, load_dir)
    try:
        run_killed(state, plan)
        assert Path(f"{pid_file}.used").exists(), "the commit's command did not kill the run"
        back = migrate(state, "rollback", str(plan), "--yes", "--env-file", str(state.env_file))
        assert back.returncode == exit_codes.NEEDS_ATTENTION, outcome(back)
        assert "`migrate apply`" in back.stdout + back.stderr, outcome(back)
        events = journal_events(state, plan)
        assert not any(e.get("event") in ("rollback_started", "undo_started") for e in events), "a compensation ran"
        resumed_at = time.time()
        result = migrate_apply(state, plan, timeout=TIMEOUT)
        assert result.returncode == exit_codes.OK, outcome(result)
        wait_for_load_acks_on(load_dir, state.target.address, since=time.time())
    finally:
        load.send_signal(signal.SIGTERM)
        load.communicate(timeout=60)
    events = journal_events(state, plan)
    assert not any(e.get("event") in ("rollback_started", "undo_started") for e in events), "a compensation ran"
    switch = next(e for e in events if e.get("event") == "step_completed" and e.get("step") == "switch_traffic")
    # Served again when the commit was recorded on the source, not when a process came back to find it.
    assert switch["result"]["writes_flow_at"] < resumed_at
    assert run_report(state, plan_name(plan))["status"] == "completed"
    assert dns_contents(state) == {name: state.target.address for name in state.records}
    verify = main_verify(state, host="target", load_dir=load_dir)
    assert verify.error is None, verify.error
    assert verify.acknowledged_lost == 0, verify.lost
