"""File-based steps for testing the engine through the real command line, in-process or as a real process.

The steps act on a "world" directory (HARNESS_WORLD): each step's effect is a file, its undo removes it, and every
run/undo is appended to world/actions. Environment switches make a step fail, commit midway, crash (an exception the
engine does not catch: what kill -9 leaves behind, in-process), or pause inside its run or undo (a test then signals
or kills the real process).

Run as a module it is `migrate` with these steps: `python -m tests.engine.harness apply plan.yaml`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.cli import commands as cli
from orchestrator.engine.step import Step, StepContext, StepError, UndoRefused
from orchestrator.plan.model import Plan
from orchestrator.run import compose
from orchestrator.secrets import resolve
from tests.fakes import OfflineRuntime


class Crash(BaseException):
    """The process dies here (in-process stand-in for kill -9: nothing after it runs, nothing is journaled)."""


def world() -> Path:
    return Path(os.environ.get("HARNESS_WORLD", "."))


def _act(line: str) -> None:
    fd = os.open(world() / "actions", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _pause(where: str) -> None:
    (world() / "paused").write_text(f"{where} {os.getpid()}")
    time.sleep(120)


# A commit sent to be made elsewhere (a command that goes on on a host without us): the step journals that it sent
# it, the far side may or may not have made it (world/remote-committed), and the answer is lost.
REMOTE_COMMITTED = "remote-committed"
REMOTE_CANCELLED = "remote-cancelled"


class FileStep(Step):
    def __init__(self, name: str, *, downtime: bool = False, commit: bool = False) -> None:
        self.name = name  # type: ignore[misc]
        self.title = f"the {name} step"  # type: ignore[misc]
        self.begins_downtime = downtime  # type: ignore[misc]
        self.commit_point = commit  # type: ignore[misc]

    @property
    def effect(self) -> Path:
        return world() / f"{self.name}.done"

    def describe(self, ctx: StepContext) -> list[str]:
        return [f"would create {self.effect}"]

    def check(self, ctx: StepContext) -> bool:
        return self.effect.exists()

    def run(self, ctx: StepContext) -> dict[str, Any]:
        _act(f"run {self.name}")
        if os.environ.get("HARNESS_SAVE_UNSYNCED") == self.name:
            if ctx.saved("unsynced"):
                _act(f"found unsynced {self.name}")
            ctx.save("unsynced", True, sync=False)
        ctx.save("started", True)
        if os.environ.get("HARNESS_LEAK") == self.name:
            secret = resolve(ctx.rt.plan.dns.api_token)
            ctx.log.info("leaking on purpose", token=secret)
            ctx.save("leak", secret)
            raise StepError(f"failed with token {secret}")
        if os.environ.get("HARNESS_BLOCK_WRITES") == self.name:
            ctx.save("writes_blocked_at", float(os.environ.get("HARNESS_BLOCKED_AT") or time.time()))
        if os.environ.get("HARNESS_PAUSE_INSIDE") == self.name:
            _pause(f"inside {self.name}")
        if os.environ.get("HARNESS_CRASH_INSIDE") == self.name:
            raise Crash(f"crash inside {self.name}")
        if os.environ.get("HARNESS_COMMIT_MIDWAY") == self.name:
            ctx.commit("part of the effect is visible")
        if os.environ.get("HARNESS_COMMIT_FAIL") == self.name and not (world() / "commit-failed-once").exists():
            (world() / "commit-failed-once").write_text("")
            ctx.commit("part of the effect is visible")
            raise StepError(f"{self.name} failed after committing")
        if os.environ.get("HARNESS_FAIL") == self.name:
            raise StepError(f"{self.name} failed on purpose in {world()}")
        if os.environ.get("HARNESS_REMOTE_COMMIT") == self.name and not (world() / REMOTE_COMMITTED).exists():
            ctx.save("commit_sent", True)
            if os.environ.get("HARNESS_REMOTE_MAKES_IT") and not (world() / REMOTE_CANCELLED).exists():
                (world() / REMOTE_COMMITTED).write_text("")
            raise StepError(f"{self.name}: the commit's answer was lost")
        self.effect.write_text("done")
        return {"effect": str(self.effect)}

    def settle_commit(self, ctx: StepContext) -> bool:
        if not ctx.saved("commit_sent"):
            return False
        _act(f"settle {self.name}")
        if os.environ.get("HARNESS_SETTLE_UNKNOWN") == self.name:
            raise StepError("the far side does not answer")
        if (world() / REMOTE_COMMITTED).exists():
            return True
        (world() / REMOTE_CANCELLED).write_text("")
        return False

    def undo(self, ctx: StepContext) -> None:
        _act(f"undo {self.name}")
        if os.environ.get("HARNESS_UNDO_REFUSE") == self.name:
            raise UndoRefused(f"{self.name} must not be undone now")
        if os.environ.get("HARNESS_PAUSE_UNDO") == self.name and not (world() / "undo-paused-once").exists():
            (world() / "undo-paused-once").write_text("")
            _pause(f"undo {self.name}")
        if os.environ.get("HARNESS_CRASH_UNDO") == self.name and not (world() / "undo-crashed-once").exists():
            (world() / "undo-crashed-once").write_text("")
            raise Crash(f"crash inside undo {self.name}")
        self.effect.unlink(missing_ok=True)


STEP_NAMES = ["prepare", "copy", "cutover", "start", "flip", "finish"]


def file_steps(plan: Plan) -> list[Step]:
    return [
        FileStep("prepare"),
        FileStep("copy"),
        FileStep("cutover", downtime=True),
        FileStep("start"),
        FileStep("flip", commit=True),
        FileStep("finish"),
    ]


def offline_runtime(plan: Plan, plan_path: Path, dry_run: bool) -> OfflineRuntime:
    """The shared offline runtime (tests/fakes.py): file steps use none of it, the engine hands it on."""
    return OfflineRuntime(plan)


def use_file_steps() -> None:
    compose.steps_factory = file_steps
    compose.runtime_factory = offline_runtime
    compose.estimator = None  # file steps: no hosts to measure


if __name__ == "__main__":
    use_file_steps()
    cli.main(sys.argv[1:])
