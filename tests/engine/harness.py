"""Runs the real `migrate` command line with file-based steps, so the engine can be killed and resumed for real.

The steps act on a "world" directory (HARNESS_WORLD): each step's effect is a file, its undo removes it, and every
run/undo is appended to world/actions. Environment switches make a step fail, or pause inside its run or undo (the
test then kills the process with SIGKILL).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator import cli, run
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.model import Plan
from orchestrator.secrets import resolve

WORLD = Path(os.environ.get("HARNESS_WORLD", "."))


def _act(line: str) -> None:
    fd = os.open(WORLD / "actions", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _pause(where: str) -> None:
    (WORLD / "paused").write_text(f"{where} {os.getpid()}")
    time.sleep(120)


class FileStep(Step):
    def __init__(self, name: str, *, downtime: bool = False, commit: bool = False) -> None:
        self.name = name  # type: ignore[misc]
        self.title = f"the {name} step"  # type: ignore[misc]
        self.begins_downtime = downtime  # type: ignore[misc]
        self.commit_point = commit  # type: ignore[misc]

    @property
    def effect(self) -> Path:
        return WORLD / f"{self.name}.done"

    def describe(self, ctx: StepContext) -> list[str]:
        return [f"would create {self.effect}"]

    def check(self, ctx: StepContext) -> bool:
        return self.effect.exists()

    def run(self, ctx: StepContext) -> dict[str, Any]:
        _act(f"run {self.name}")
        ctx.save("started", True)
        if os.environ.get("HARNESS_LEAK") == self.name:
            secret = resolve(ctx.rt.plan.dns.api_token)
            ctx.log.info("leaking on purpose", token=secret)
            ctx.save("leak", secret)
            raise StepError(f"failed with token {secret}")
        if os.environ.get("HARNESS_PAUSE_INSIDE") == self.name:
            _pause(f"inside {self.name}")
        if os.environ.get("HARNESS_COMMIT_FAIL") == self.name and not (WORLD / "commit-failed-once").exists():
            (WORLD / "commit-failed-once").write_text("")
            ctx.commit("part of the effect is visible")
            raise StepError(f"{self.name} failed after committing")
        if os.environ.get("HARNESS_FAIL") == self.name:
            raise StepError(f"{self.name} failed on purpose")
        self.effect.write_text("done")
        return {"effect": str(self.effect)}

    def undo(self, ctx: StepContext) -> None:
        _act(f"undo {self.name}")
        if os.environ.get("HARNESS_PAUSE_UNDO") == self.name and not (WORLD / "undo-paused-once").exists():
            (WORLD / "undo-paused-once").write_text("")
            _pause(f"undo {self.name}")
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


class FakeRuntime:
    def __init__(self, plan: Plan, plan_path: Path, dry_run: bool) -> None:
        self.plan = plan
        self.closed = False

    def close(self) -> None:
        self.closed = True


if __name__ == "__main__":
    run.steps_factory = file_steps
    run.runtime_factory = FakeRuntime
    cli.main(sys.argv[1:])
