"""A step that runs beside the steps after it (`runs_beside`, started by `ctx.start_next_beside()`): it really runs
at the same time as the step that let it start, is done before the commit point, fails the run like any step, is
waited for before a rollback, and is re-entered after a crash like any step found in flight; the report counts
the window's time such steps share once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import structlog

from orchestrator.engine.hooks import HookRunner
from orchestrator.engine.journal import Journal, StepState
from orchestrator.engine.machine import Engine, EngineConfig, Outcome
from orchestrator.engine.step import Step, StepContext, StepError

# A deadlock guard only: every wait here ends as soon as the other thread does its part.
WAIT = 30.0


class World:
    """What the steps did, in order, and the events they meet at."""

    def __init__(self) -> None:
        self.actions: list[str] = []
        self.lock = threading.Lock()
        self.beside_started = threading.Event()
        self.release_beside = threading.Event()
        self.middle_ran = threading.Event()
        self.fail: set[str] = set()

    def act(self, line: str) -> None:
        with self.lock:
            self.actions.append(line)


class Plain(Step):
    def __init__(self, world: World, name: str, *, commit: bool = False) -> None:
        self.world = world
        self.name = name  # type: ignore[misc]
        self.title = f"the {name} step"  # type: ignore[misc]
        self.commit_point = commit  # type: ignore[misc]

    def describe(self, ctx: StepContext) -> list[str]:
        return [self.name]

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        self.world.act(f"run {self.name}")
        if self.name in self.world.fail:
            raise StepError(f"{self.name} failed on purpose")
        return {"done": True}

    def undo(self, ctx: StepContext) -> None:
        self.world.act(f"undo {self.name}")


class Opener(Plain):
    """Lets the next step start, then goes on only once that step is running (proof that both run at once)."""

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        self.world.act(f"run {self.name}")
        ctx.start_next_beside()
        assert self.world.beside_started.wait(WAIT), "the next step did not start beside this one"
        self.world.act(f"{self.name} sees the next step running")
        self.world.release_beside.set()
        if self.name in self.world.fail:
            raise StepError(f"{self.name} failed on purpose")
        return {"done": True}


class Beside(Plain):
    runs_beside = True

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        self.world.act(f"run {self.name}")
        self.world.beside_started.set()
        assert self.world.release_beside.wait(WAIT)
        if self.name in self.world.fail:
            raise StepError(f"{self.name} failed on purpose")
        self.world.act(f"{self.name} done")
        return {"copied": 3}


def engine(world: World, journal: Journal, tmp_path: Path, steps: list[Step] | None = None) -> Engine:
    steps = steps or [
        Plain(world, "before"),
        Opener(world, "switch"),
        Beside(world, "files"),
        Plain(world, "verify"),
        Plain(world, "flip", commit=True),
        Plain(world, "finish"),
    ]
    log = structlog.get_logger("test")
    return Engine(
        steps,
        journal,
        config=EngineConfig(plan_path="p.yaml", plan_name="p", plan_sha256="0", plan_text=""),
        rt=None,
        hooks=HookRunner(tmp_path / "no-hooks", timeout=5, base_env={}, log=log),
        confirm=lambda step: True,
        log=log,
    )


def _events(journal: Journal, kind: str) -> list[str]:
    return [ev["step"] for ev in journal.events if ev.get("event") == kind]


def test_the_next_step_runs_beside_and_is_done_before_the_commit_point(tmp_path: Path) -> None:
    world, journal = World(), Journal(tmp_path / "journal.jsonl")
    eng = engine(world, journal, tmp_path)
    eng.start_run()
    assert eng.forward() == Outcome.COMPLETED
    acts = world.actions
    assert acts.index("run files") < acts.index("switch sees the next step running")
    assert acts.index("files done") < acts.index("run flip"), "the commit point waits for the step beside"
    order = [(ev["event"], ev.get("step")) for ev in journal.events]
    assert order.index(("step_started", "files")) < order.index(("step_completed", "switch"))
    state = Journal(tmp_path / "journal.jsonl").state()
    assert state is not None and state.status.value == "completed"
    assert state.steps["files"].state == StepState.DONE and state.steps["files"].result == {"copied": 3}
    assert sorted(a for a in acts if a.startswith("run ")) == sorted(
        f"run {n}" for n in ("before", "switch", "files", "verify", "flip", "finish")
    ), "each step ran once"


def test_a_failure_beside_rolls_the_run_back_before_the_commit(tmp_path: Path) -> None:
    world, journal = World(), Journal(tmp_path / "journal.jsonl")
    world.fail = {"files"}
    eng = engine(world, journal, tmp_path)
    eng.start_run()
    assert eng.forward() == Outcome.ROLLED_BACK
    assert "run flip" not in world.actions
    assert _events(journal, "step_failed") == ["files"]
    undone = [a for a in world.actions if a.startswith("undo ")]
    assert undone[-2:] == ["undo switch", "undo before"], undone
    assert "undo files" in undone


def test_the_step_beside_is_waited_for_before_the_rollback_of_another_failure(tmp_path: Path) -> None:
    world, journal = World(), Journal(tmp_path / "journal.jsonl")
    world.fail = {"switch"}
    eng = engine(world, journal, tmp_path)
    eng.start_run()
    assert eng.forward() == Outcome.ROLLED_BACK
    acts = world.actions
    assert acts.index("files done") < acts.index("undo files") < acts.index("undo switch") < acts.index("undo before")
    state = Journal(tmp_path / "journal.jsonl").state()
    assert state is not None and state.status.value == "rolled_back"


def test_a_crash_with_both_in_flight_resumes_both(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    crashed = Journal(path)
    names = ["before", "switch", "files", "verify", "flip", "finish"]
    crashed.append("run_started", run_id="r1", plan_path="p.yaml", plan_name="p", plan_sha256="0", plan_text="",
                   steps=names, dry_run=False)  # fmt: skip
    crashed.append("step_started", step="before", title="")
    crashed.append("step_completed", step="before", result={}, duration=0.0, commit_point=False)
    crashed.append("step_started", step="switch", title="")
    crashed.append("step_started", step="files", title="", beside="switch")
    world = World()
    eng = engine(world, Journal(path), tmp_path)
    eng.resume_run()
    assert eng.forward() == Outcome.COMPLETED
    assert "run before" not in world.actions
    assert world.actions.index("run files") < world.actions.index("switch sees the next step running")
    state = Journal(path).state()
    assert state is not None and all(state.steps[n].state == StepState.DONE for n in names)


def test_the_windows_parts_count_steps_side_by_side_once_in_the_time_between_steps() -> None:
    from orchestrator.report.build import window_parts

    # Window 10 → 20: the switch 10 → 13, files beside it 12 → 16, verify 13.5 → 14, the flip 16.5 → 20.
    steps = [
        {"name": "switch", "started_at": 9.0, "ended_at": 13.0},
        {"name": "files", "started_at": 12.0, "ended_at": 16.0},
        {"name": "verify", "started_at": 13.5, "ended_at": 14.0},
        {"name": "flip", "started_at": 16.5, "ended_at": 21.0},
    ]
    parts = window_parts(steps, 10.0, 20.0, None)
    assert parts == {"switch": 3.0, "files": 4.0, "verify": 0.5, "flip": 3.5, "between steps": 0.5}


class Middle(Plain):
    """A step after the one beside that does not need it: it runs while that one still works."""

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        result = super().run(ctx)
        self.world.middle_ran.set()
        return result


class SlowBeside(Beside):
    """Ends only once the step after it has run: a step that reads what it did must wait for it."""

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        self.world.act(f"run {self.name}")
        self.world.beside_started.set()
        assert self.world.release_beside.wait(WAIT)
        assert self.world.middle_ran.wait(WAIT), "the step after it did not run while it worked"
        # Still at work a little longer: an engine that did not wait for it would start the reader meanwhile. (A
        # correct engine waits however long this takes: nothing here depends on the machine's speed to pass.)
        time.sleep(0.3)
        self.world.act(f"{self.name} done")
        return {"copied": 3}


class Reader(Plain):
    waits_for = ("files",)


def test_a_step_that_reads_what_the_step_beside_did_waits_for_it(tmp_path: Path) -> None:
    world, journal = World(), Journal(tmp_path / "journal.jsonl")
    steps = [
        Plain(world, "before"),
        Opener(world, "switch"),
        SlowBeside(world, "files"),
        Middle(world, "start"),
        Reader(world, "verify"),
        Plain(world, "flip", commit=True),
    ]
    eng = engine(world, journal, tmp_path, steps)
    eng.start_run()
    assert eng.forward() == Outcome.COMPLETED
    acts = world.actions
    assert acts.index("run start") < acts.index("files done"), "the step not waiting ran beside"
    assert acts.index("files done") < acts.index("run verify"), "the reader ran before the copy it reads ended"
