"""The few engine cases that need a real `migrate` process: kill -9 (the kernel drops the lock, nothing else runs),
a live lock holder, a real signal, and a run held by the postpone flag while another command looks at it."""

from __future__ import annotations

import signal
import time

import pytest

from orchestrator import exit_codes
from tests.engine.harness import STEP_NAMES
from tests.engine.world import PLAN, World


@pytest.mark.parametrize("step", ["cutover", "flip"])
def test_kill9_at_step_boundary_resumes_a_real_process(world: World, step: str) -> None:
    proc = world.start("apply", str(world.plan), "--yes", HARNESS_PAUSE_BEFORE=step)
    assert world.wait_paused(proc).startswith(f"before {step}")
    world.kill9(proc)
    assert world.effects() == set(STEP_NAMES[: STEP_NAMES.index(step)])
    res = world.run_process("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    assert "resuming" in res.stdout
    assert world.actions() == [f"run {n}" for n in STEP_NAMES], "each step ran exactly once"
    assert world.effects() == set(STEP_NAMES)


def test_kill9_inside_a_step_reenters_it_in_a_real_process(world: World) -> None:
    proc = world.start("apply", str(world.plan), "--yes", HARNESS_PAUSE_INSIDE="start")
    assert world.wait_paused(proc).startswith("inside start")
    world.kill9(proc)
    status = world.status_json()
    assert status["run"]["steps"][STEP_NAMES.index("start")]["state"] == "running"
    assert status["interrupted"] is not None, "no live holder: the run is reported interrupted"
    res = world.run_process("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    expected = [f"run {n}" for n in STEP_NAMES]
    expected.insert(STEP_NAMES.index("start"), "run start")
    assert world.actions() == expected


def test_second_apply_is_refused_while_the_first_is_alive_then_stale_lock_recovered(world: World) -> None:
    proc = world.start("apply", str(world.plan), "--yes", HARNESS_PAUSE_INSIDE="copy")
    world.wait_paused(proc)
    second = world.run_process("apply", str(world.plan), "--yes")
    assert second.returncode == exit_codes.REFUSED
    assert f"pid {proc.pid}" in second.stderr and "since" in second.stderr
    status = world.status_json()
    assert status["locked_by"]["pid"] == proc.pid
    assert status["interrupted"] is None, "a live holder: running, not interrupted"
    world.kill9(proc)
    assert world.status_json()["locked_by"] is None
    res = world.run_process("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    assert "stale lock" in res.stderr and f"pid {proc.pid}" in res.stderr


def test_kill9_inside_an_undo_then_rollback_resumes(world: World) -> None:
    proc = world.start("apply", str(world.plan), "--yes", HARNESS_FAIL="start", HARNESS_PAUSE_UNDO="copy")
    assert world.wait_paused(proc).startswith("undo copy")
    world.kill9(proc)
    assert world.status_json()["run"]["status"] == "rolling_back"
    res = world.run_process("rollback", str(world.plan))
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.actions()[-3:] == ["undo copy", "undo copy", "undo prepare"]
    assert world.effects() == set()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_real_signal_inside_a_step_before_the_commit_point_rolls_back(world: World, signum: int) -> None:
    proc = world.start("apply", str(world.plan), "--yes", HARNESS_PAUSE_INSIDE="start")
    assert world.wait_paused(proc).startswith("inside start")
    proc.send_signal(signum)
    assert proc.wait(timeout=30) == exit_codes.FAILED
    stderr = proc.stderr.read() if proc.stderr else ""
    assert f"interrupted by {signal.Signals(signum).name}" in stderr
    assert world.actions()[-4:] == ["undo start", "undo cutover", "undo copy", "undo prepare"]
    assert world.effects() == set()
    status = world.status_json()
    assert status["run"]["status"] == "rolled_back" and status["run"]["committed"] is False


def test_postpone_flag_holds_the_run_before_the_downtime_until_deleted(world: World) -> None:
    world.plan.write_text(PLAN + "cutover:\n  postpone_flag: hold-cutover\n")
    flag = world.root / "hold-cutover"
    flag.write_text("")
    proc = world.start("apply", str(world.plan), "--yes")
    # Held at the gate: the run's log says so (its first reminder is written as the wait begins).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
        "cut-over postponed" in log.read_text() for log in world.state_dir.glob("run-*.log.jsonl")
    ):
        assert proc.poll() is None, "the run ended instead of waiting at the gate"
        time.sleep(0.05)
    assert world.actions() == ["run prepare", "run copy"] and proc.poll() is None
    status = world.run("status", str(world.plan))
    assert f"postponed while {flag} exists" in " ".join(status.stdout.split())
    flag.unlink()
    assert proc.wait(timeout=30) == exit_codes.OK
    assert world.effects() == set(STEP_NAMES)
    assert "cut-over postponed" in (proc.stderr.read() if proc.stderr else "")
