"""A world for the engine's tests: a plan, a hooks directory and file-based steps (tests/engine/harness.py).

`run` drives the real command line in-process (fast; a `Crash` from a step or from the journal is what kill -9
leaves behind). `start`/`run_process` drive it as a real process, for the few cases that need one (kill -9, a live
lock holder, a real signal).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import commands as cli
from orchestrator.engine.journal import Journal
from orchestrator.run import compose
from tests.engine.harness import Crash, use_file_steps

ROOT = Path(__file__).resolve().parents[2]
SECRET = "tok-Zq8x-planted-secret-91"
CRASHED = -9  # the in-process stand-in for "killed"

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
env | grep '^MIGRATE_' | sort > "$HARNESS_WORLD/hook-env-$MIGRATE_EVENT-$MIGRATE_STEP"
env | sort > "$HARNESS_WORLD/hook-fullenv-$MIGRATE_EVENT-$MIGRATE_STEP"
[ "$MIGRATE_EVENT" = before-step ] || exit 0
if [ "$MIGRATE_STEP" = "$HARNESS_PAUSE_BEFORE" ]; then
  echo "before $MIGRATE_STEP $$" > "$HARNESS_WORLD/paused"
  echo $$ > "$HARNESS_WORLD/hook.pid"
  exec sleep 120
fi
if [ "$MIGRATE_STEP" = "$HARNESS_HOOK_FAIL" ]; then echo "hook says no" >&2; exit 7; fi
exit 0
"""


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


class World:
    def __init__(self, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.root = root
        self.capsys = capsys
        self.dir = root / "world"
        self.dir.mkdir()
        self.plan = root / "plan.yaml"
        self.plan.write_text(PLAN)
        self.hooks = root / "hooks"
        self.hooks.mkdir()
        for event in ("before-step", "on-start", "after-step", "on-failure", "on-rollback", "on-success"):
            hook = self.hooks / event
            hook.write_text(HOOK_WAIT)
            hook.chmod(0o755)
        self.state_dir = root / ".migrate" / "harness"
        self.procs: list[subprocess.Popen[str]] = []

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HARNESS_", "MIGRATE_"))}
        env.update(HARNESS_WORLD=str(self.dir), HARNESS_TOKEN=SECRET, PYTHONUNBUFFERED="1")
        env.update(extra)
        return env

    # ------------------------------------------------------------------------------------------ in-process
    def run(self, *args: str, **extra: str) -> Result:
        """`migrate ARGS` in this process, with the file steps; a Crash ends it as kill -9 would."""
        factories = compose.steps_factory, compose.runtime_factory, compose.estimator
        use_file_steps()
        try:
            return run_in_process(self.capsys, list(args), self.env(**extra))
        finally:
            compose.steps_factory, compose.runtime_factory, compose.estimator = factories

    # ------------------------------------------------------------------------------------------ processes
    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "tests.engine.harness", *args]

    def run_process(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cmd(*args),
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
        )

    def start(self, *args: str, **extra: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            self.cmd(*args),
            env=self.env(**extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
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
        self.stop_paused_hook()

    def stop_paused_hook(self) -> None:
        hook_pid = self.dir / "hook.pid"
        if hook_pid.exists():  # the paused hook runs in its own session; it is ours to stop
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(hook_pid.read_text()), signal.SIGKILL)
            hook_pid.unlink()
        (self.dir / "paused").unlink(missing_ok=True)

    # ------------------------------------------------------------------------------------------ the world
    def actions(self) -> list[str]:
        path = self.dir / "actions"
        return path.read_text().splitlines() if path.exists() else []

    def effects(self) -> set[str]:
        return {p.name.removesuffix(".done") for p in self.dir.glob("*.done")}

    def journal(self) -> list[dict[str, Any]]:
        path = self.state_dir / "journal.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def status_json(self) -> dict[str, Any]:
        res = self.run("status", str(self.plan), "--json")
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)


def run_in_process(capsys: pytest.CaptureFixture[str], argv: list[str], env: dict[str, str]) -> Result:
    """`migrate ARGV` in this process with exactly `env` (restored after, --env-file included)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    capsys.readouterr()
    code: int = 0
    try:
        cli.main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    except Crash:
        code = CRASHED
    finally:
        os.environ.clear()
        os.environ.update(saved)
    captured = capsys.readouterr()
    return Result(code, captured.out, captured.err)


def matches(record: dict[str, Any], event: str, step: str | None) -> bool:
    return record.get("event") == event and (step is None or record.get("step") == step)


@contextlib.contextmanager
def crash_before(monkeypatch: pytest.MonkeyPatch, event: str, step: str | None = None) -> Iterator[None]:
    """The process dies just before the journal records `event` (of `step`): kill -9 at that boundary."""
    original = Journal._persist

    def persist(self: Journal, record: dict[str, Any], **how: Any) -> None:
        if self.path is not None and matches(record, event, step):
            raise Crash(f"before {event} {step}")
        original(self, record, **how)

    with monkeypatch.context() as patch:
        patch.setattr(Journal, "_persist", persist)
        yield


@contextlib.contextmanager
def after_record(
    monkeypatch: pytest.MonkeyPatch, event: str, step: str | None, action: Callable[[], None]
) -> Iterator[None]:
    """Do `action` the moment the journal record is durable, before the engine has taken it in (the narrowest gap
    between the file and the memory)."""
    original = Journal._persist

    def persist(self: Journal, record: dict[str, Any], **how: Any) -> None:
        original(self, record, **how)
        if self.path is not None and matches(record, event, step):
            action()

    with monkeypatch.context() as patch:
        patch.setattr(Journal, "_persist", persist)
        yield
