"""The engine through the real command line, with file-based steps: forward, rollback, resume after kill -9."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import exit_codes
from tests.engine.harness import STEP_NAMES

SECRET = "tok-Zq8x-planted-secret-91"

PLAN = """\
name: harness
source:
  address: 127.0.0.2
  key: /nonexistent/key
target:
  address: 127.0.0.3
  key: /nonexistent/key
database:
  source: {datadir: /srv/db, start: "true", stop: "true"}
  target: {datadir: /srv/db, start: "true", stop: "true"}
dns:
  api_token: {env: HARNESS_TOKEN}
  zone: example.test
  records: [www.example.test]
"""

HOOK_WAIT = """#!/bin/sh
env | grep '^MIGRATE_' | sort > "$HARNESS_WORLD/hook-env-$MIGRATE_STEP"
env | sort > "$HARNESS_WORLD/hook-fullenv-$MIGRATE_STEP"
if [ "$MIGRATE_STEP" = "$HARNESS_PAUSE_BEFORE" ]; then
  echo "before $MIGRATE_STEP $$" > "$HARNESS_WORLD/paused"
  echo $$ > "$HARNESS_WORLD/hook.pid"
  exec sleep 120
fi
if [ "$MIGRATE_STEP" = "$HARNESS_HOOK_FAIL" ]; then echo "hook says no" >&2; exit 7; fi
exit 0
"""


class World:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "world"
        self.dir.mkdir()
        self.plan = root / "plan.yaml"
        self.plan.write_text(PLAN)
        hooks = root / "hooks"
        hooks.mkdir()
        hook = hooks / "before-step"
        hook.write_text(HOOK_WAIT)
        hook.chmod(0o755)
        self.state_dir = root / ".migrate" / "harness"
        self.procs: list[subprocess.Popen[str]] = []

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HARNESS_", "MIGRATE_"))}
        env.update(HARNESS_WORLD=str(self.dir), HARNESS_TOKEN=SECRET, PYTHONUNBUFFERED="1")
        env.update(extra)
        return env

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "tests.engine.harness", *args]

    def run(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cmd(*args),
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=Path(__file__).resolve().parents[2],
            stdin=subprocess.DEVNULL,
        )

    def start(self, *args: str, **extra: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            self.cmd(*args),
            env=self.env(**extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
            stdin=subprocess.DEVNULL,
        )
        self.procs.append(proc)
        return proc

    def wait_paused(self, proc: subprocess.Popen[str], timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            paused = self.dir / "paused"
            if paused.exists() and paused.read_text().strip():
                return paused.read_text()
            if proc.poll() is not None:
                raise AssertionError(
                    f"exited {proc.returncode} before pausing: {proc.stderr.read() if proc.stderr else ''}"
                )
            time.sleep(0.02)
        raise AssertionError("never paused")

    def kill9(self, proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        hook_pid = self.dir / "hook.pid"
        if hook_pid.exists():  # the paused hook runs in its own session; it is ours to stop
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(hook_pid.read_text()), signal.SIGKILL)
            hook_pid.unlink()
        (self.dir / "paused").unlink(missing_ok=True)

    def actions(self) -> list[str]:
        path = self.dir / "actions"
        return path.read_text().splitlines() if path.exists() else []

    def effects(self) -> set[str]:
        return {p.name.removesuffix(".done") for p in self.dir.glob("*.done")}

    def journal(self) -> list[dict]:
        path = self.state_dir / "journal.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def status_json(self) -> dict:
        res = self.run("status", str(self.plan), "--json")
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    # Whatever a failed assertion left running: the paused `migrate` processes and a paused hook.
    for proc in w.procs:
        if proc.poll() is None:
            w.kill9(proc)


def test_forward_runs_every_step_once_and_completes(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.actions() == [f"run {n}" for n in STEP_NAMES]
    assert world.effects() == set(STEP_NAMES)
    assert world.status_json()["run"]["status"] == "completed"
    again = world.run("apply", str(world.plan), "--yes")
    assert again.returncode == exit_codes.OK
    assert "nothing to do" in again.stdout
    assert world.actions() == [f"run {n}" for n in STEP_NAMES]


def test_failure_runs_compensations_in_reverse(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes", HARNESS_FAIL="start")
    assert res.returncode == exit_codes.FAILED
    assert "start failed on purpose" in res.stderr
    assert world.actions() == [
        "run prepare",
        "run copy",
        "run cutover",
        "run start",
        "undo start",
        "undo cutover",
        "undo copy",
        "undo prepare",
    ]
    assert world.effects() == set()
    assert world.status_json()["run"]["status"] == "rolled_back"
    # A new apply after a rollback starts a fresh run and keeps the old journal in history.
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK
    assert len(list((world.state_dir / "history").glob("*.journal.jsonl"))) == 1


@pytest.mark.parametrize("step", STEP_NAMES)
def test_kill9_at_step_boundary_resumes_without_redoing_finished_steps(world: World, step: str) -> None:
    proc = world.start("apply", str(world.plan), "--yes", HARNESS_PAUSE_BEFORE=step)
    assert world.wait_paused(proc).startswith(f"before {step}")
    world.kill9(proc)
    done_before = STEP_NAMES[: STEP_NAMES.index(step)]
    assert world.effects() == set(done_before)
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    assert "resuming" in res.stdout
    assert world.actions() == [f"run {n}" for n in STEP_NAMES], "each step ran exactly once"
    assert world.effects() == set(STEP_NAMES)


@pytest.mark.parametrize("step", STEP_NAMES)
def test_kill9_inside_a_step_reenters_it_from_its_start(world: World, step: str) -> None:
    proc = world.start("apply", str(world.plan), "--yes", HARNESS_PAUSE_INSIDE=step)
    assert world.wait_paused(proc).startswith(f"inside {step}")
    world.kill9(proc)
    assert world.status_json()["run"]["steps"][STEP_NAMES.index(step)]["state"] == "running"
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    expected = [f"run {n}" for n in STEP_NAMES]
    expected.insert(STEP_NAMES.index(step), f"run {step}")  # the interrupted step is re-entered from its start
    assert world.actions() == expected
    assert world.effects() == set(STEP_NAMES)
    # The journal shows the interrupted step started twice: once before the kill, once on resume.
    starts = [e["step"] for e in world.journal() if e["event"] == "step_started"]
    assert starts.count(step) == 2


def test_resumed_step_whose_effect_is_in_place_is_not_run_again(world: World) -> None:
    proc = world.start("apply", str(world.plan), "--yes", HARNESS_PAUSE_INSIDE="copy")
    world.wait_paused(proc)
    world.kill9(proc)
    (world.dir / "copy.done").write_text("done")  # the step's effect landed just before the crash
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.actions().count("run copy") == 1


def test_second_apply_is_refused_while_the_first_is_alive_then_stale_lock_recovered(world: World) -> None:
    proc = world.start("apply", str(world.plan), "--yes", HARNESS_PAUSE_INSIDE="copy")
    world.wait_paused(proc)
    second = world.run("apply", str(world.plan), "--yes")
    assert second.returncode == exit_codes.REFUSED
    assert f"pid {proc.pid}" in second.stderr and "since" in second.stderr
    status = world.status_json()
    assert status["locked_by"]["pid"] == proc.pid
    world.kill9(proc)
    assert world.status_json()["locked_by"] is None
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    assert "stale lock" in res.stderr and f"pid {proc.pid}" in res.stderr


def test_interrupted_rollback_resumes(world: World) -> None:
    proc = world.start("apply", str(world.plan), "--yes", HARNESS_FAIL="start", HARNESS_PAUSE_UNDO="copy")
    assert world.wait_paused(proc).startswith("undo copy")
    world.kill9(proc)
    assert world.status_json()["run"]["status"] == "rolling_back"
    res = world.run("rollback", str(world.plan))
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.actions() == [
        "run prepare",
        "run copy",
        "run cutover",
        "run start",
        "undo start",
        "undo cutover",
        "undo copy",  # killed inside this undo
        "undo copy",
        "undo prepare",  # resumed: the interrupted undo again, then the rest; none repeated
    ]
    assert world.effects() == set()
    assert world.status_json()["run"]["status"] == "rolled_back"


def test_apply_on_an_interrupted_rollback_finishes_the_rollback(world: World) -> None:
    proc = world.start("apply", str(world.plan), "--yes", HARNESS_FAIL="cutover", HARNESS_PAUSE_UNDO="copy")
    world.wait_paused(proc)
    world.kill9(proc)
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.FAILED
    assert "unfinished rollback" in res.stdout
    assert world.effects() == set()


def test_dry_run_changes_nothing_and_never_touches_a_real_journal(world: World) -> None:
    res = world.run("apply", str(world.plan), "--dry-run")
    assert res.returncode == exit_codes.OK, res.stderr
    assert "would create" in res.stdout and "DOWNTIME BEGINS" in res.stdout and "COMMIT POINT" in res.stdout
    assert world.actions() == [] and world.effects() == set()
    assert not (world.state_dir / "journal.jsonl").exists()
    # With a real, unfinished run: the dry-run leaves its journal byte for byte as it was.
    proc = world.start("apply", str(world.plan), "--yes", HARNESS_PAUSE_INSIDE="cutover")
    world.wait_paused(proc)
    world.kill9(proc)
    before = (world.state_dir / "journal.jsonl").read_bytes()
    res = world.run("apply", str(world.plan), "--dry-run")
    assert res.returncode == exit_codes.OK, res.stderr
    assert "unfinished" in res.stdout
    assert (world.state_dir / "journal.jsonl").read_bytes() == before


def test_changed_plan_refuses_resume_unless_forced(world: World) -> None:
    proc = world.start("apply", str(world.plan), "--yes", HARNESS_PAUSE_INSIDE="copy")
    world.wait_paused(proc)
    world.kill9(proc)
    world.plan.write_text(PLAN.replace("records: [www.example.test]", "records: [api.example.test]"))
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.REFUSED
    assert "plan changed" in res.stderr and "api.example.test" in res.stderr and "www.example.test" in res.stderr
    res = world.run("apply", str(world.plan), "--yes", "--force")
    assert res.returncode == exit_codes.OK, res.stderr


def test_confirmation_gate_stops_before_the_downtime(world: World) -> None:
    res = world.run("apply", str(world.plan))  # no --yes and no terminal: not confirmed
    assert res.returncode == exit_codes.REFUSED
    assert world.actions() == ["run prepare", "run copy"]
    assert "--yes" in res.stderr
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK
    assert world.actions() == [f"run {n}" for n in STEP_NAMES]


def test_failing_before_hook_aborts_and_rolls_back_with_documented_environment(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes", HARNESS_HOOK_FAIL="cutover")
    assert res.returncode == exit_codes.FAILED
    assert "hook before-step" in res.stderr and "exited 7" in res.stderr
    assert "run cutover" not in world.actions()
    assert world.effects() == set()
    env = dict(line.split("=", 1) for line in (world.dir / "hook-env-copy").read_text().splitlines())
    assert env["MIGRATE_EVENT"] == "before-step"
    assert env["MIGRATE_STEP"] == "copy" and env["MIGRATE_STEP_INDEX"] == "2" and env["MIGRATE_STEP_COUNT"] == "6"
    assert env["MIGRATE_PLAN_NAME"] == "harness" and env["MIGRATE_DRY_RUN"] == "0"
    assert env["MIGRATE_RUN_ID"] and float(env["MIGRATE_ELAPSED_SECONDS"]) >= 0
    assert env["MIGRATE_JOURNAL"].endswith("journal.jsonl")


def test_failure_after_commit_point_is_not_rolled_back_automatically(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes", HARNESS_FAIL="finish")
    assert res.returncode == exit_codes.NEEDS_ATTENTION
    assert not any(a.startswith("undo") for a in world.actions())
    assert world.status_json()["run"]["status"] == "failed_after_commit"
    res = world.run("rollback", str(world.plan))
    assert res.returncode == exit_codes.REFUSED
    assert "--discard-target-writes" in res.stderr
    res = world.run("apply", str(world.plan), "--yes")  # resume forward: only the failed step again
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.actions().count("run finish") == 2 and world.actions().count("run flip") == 1


def test_rollback_after_commit_with_discard_target_writes(world: World) -> None:
    assert world.run("apply", str(world.plan), "--yes").returncode == exit_codes.OK
    res = world.run("rollback", str(world.plan), "--discard-target-writes", "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.effects() == set()


def test_planted_secret_never_reaches_any_output(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes", "-v", HARNESS_LEAK="cutover")
    assert res.returncode == exit_codes.FAILED
    assert SECRET not in res.stdout and SECRET not in res.stderr
    assert "***" in res.stderr
    files = [p for p in world.root.rglob("*") if p.is_file()]
    assert any(p.name.startswith("run-") for p in files), "the run's JSON log exists"
    assert any(p.name.startswith("hook-fullenv-") for p in files), "hooks dumped their whole environment"
    for path in files:
        assert SECRET not in path.read_text(errors="replace"), path
    status = world.run("status", str(world.plan))
    assert SECRET not in status.stdout + status.stderr


def test_missing_secret_is_bad_input_and_changes_nothing(world: World) -> None:
    env_without = {"HARNESS_TOKEN": ""}
    res = world.run("apply", str(world.plan), "--yes", **env_without)
    assert res.returncode == exit_codes.BAD_INPUT
    assert res.stderr.strip().count("\n") == 0 and "HARNESS_TOKEN" in res.stderr
    assert world.actions() == [] and not world.state_dir.exists()


def test_a_step_that_commits_midway_is_finished_forward_not_rolled_back(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes", HARNESS_COMMIT_FAIL="start")
    assert res.returncode == exit_codes.NEEDS_ATTENTION, res.stderr
    assert not any(a.startswith("undo") for a in world.actions())
    assert world.status_json()["run"]["status"] == "failed_after_commit"
    assert [e["reason"] for e in world.journal() if e["event"] == "committed"] == ["part of the effect is visible"]
    res = world.run("apply", str(world.plan), "--yes", HARNESS_COMMIT_FAIL="start")
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.effects() == set(STEP_NAMES)


def test_resuming_a_started_downtime_step_does_not_ask_again(world: World) -> None:
    proc = world.start("apply", str(world.plan), "--yes", HARNESS_PAUSE_INSIDE="cutover")
    world.wait_paused(proc)
    world.kill9(proc)
    res = world.run("apply", str(world.plan))  # no --yes and no terminal: the gate would decline
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.effects() == set(STEP_NAMES)


def test_postpone_flag_holds_the_run_before_the_downtime_until_deleted(world: World) -> None:
    world.plan.write_text(PLAN + "cutover:\n  postpone_flag: hold-cutover\n")
    flag = world.root / "hold-cutover"
    flag.write_text("")
    proc = world.start("apply", str(world.plan), "--yes")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "run copy" not in world.actions():
        time.sleep(0.05)
    time.sleep(1.0)  # held: the cut-over must not begin while the flag exists
    assert world.actions() == ["run prepare", "run copy"] and proc.poll() is None
    status = world.run("status", str(world.plan))
    assert f"postponed while {flag} exists" in " ".join(status.stdout.split())
    flag.unlink()
    assert proc.wait(timeout=30) == exit_codes.OK
    assert world.effects() == set(STEP_NAMES)
    assert "cut-over postponed" in (proc.stderr.read() if proc.stderr else "")
