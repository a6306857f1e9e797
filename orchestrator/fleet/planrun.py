"""One plan of a fleet, run exactly as `migrate apply --yes PLAN` runs it: in its own process.

Why a process and not `run.commands.apply` in this one: a run configures process-wide things — the logging
handlers and its JSON log file, the signal handlers of its safe points (main thread only), the secrets loaded from
its env file into the environment and the redaction registry. Two plans in one process would share all of them
(two lab plans even use the same variable names for different passwords). A `migrate apply` process has its own
journal, lock, report and resume, and its exit code is the documented one.

The process dies with the one that started it (PR_SET_PDEATHSIG): a fleet runner or a Temporal worker killed
mid-plan leaves no plan running unsupervised; the plan's journal says where it stands and the next runner resumes
it. Should a plan's lock still be held by a live process (an `apply` started by hand, or one that outlived its
runner), the runner waits for it to end, then runs `apply` again, which resumes or says there is nothing to do.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import exit_codes
from orchestrator.engine.journal import RunState, StepState
from orchestrator.engine.lock import is_locked
from orchestrator.engine.view import JournalView
from orchestrator.fleet.schedule import PlanEnd, PlanSpec
from orchestrator.plan.loader import PlanError, load_plan
from orchestrator.run.policy import state_dir_of

POLL_SECONDS = 1.0
# An apply that died of a signal (not its own exit) is run again this many times: a resume, not a loop.
MAX_RESTARTS = 3
PR_SET_PDEATHSIG = 1
OUTPUT_FILE = "fleet-apply.out"

Progress = Callable[[dict[str, Any]], None]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def state_dir(plan_path: Path) -> Path | None:
    try:
        return state_dir_of(plan_path, load_plan(plan_path).plan, None)
    except PlanError:
        return None


def journal_state(journal_path: Path) -> RunState | None:
    return JournalView.read(journal_path).state()


def progress_of(state: RunState | None) -> dict[str, Any]:
    """Where a run stands, as plain data (a heartbeat's details, a status line)."""
    if state is None:
        return {"status": "not started"}
    steps = list(state.steps.values())
    current = next((s.name for s in steps if s.state in (StepState.RUNNING, StepState.UNDOING)), None)
    return {
        "run_id": state.run_id,
        "status": state.status.value,
        "step": current,
        "done": sum(1 for s in steps if s.state == StepState.DONE),
        "steps": len(steps),
        "committed": state.committed,
    }


def apply_command(spec: PlanSpec) -> list[str]:
    command = [sys.executable, "-m", "orchestrator.cli.commands", "apply", "--yes", spec.plan_path]
    return [*command, "--env-file", spec.env_file] if spec.env_file else command


async def run_plan(spec: PlanSpec, progress: Progress | None = None) -> PlanEnd:
    """Run (or resume) the plan to its end; `progress` is called with `progress_of` every second meanwhile."""
    plan_path = Path(spec.plan_path)
    sdir = state_dir(plan_path)
    if sdir is None:
        return PlanEnd(spec.name, exit_codes.BAD_INPUT, message=f"{plan_path}: the plan does not load")
    sdir.mkdir(parents=True, exist_ok=True)
    journal_path, lock_path = sdir / "journal.jsonl", sdir / "lock"
    restarts = 0
    while True:
        while is_locked(lock_path) is not None:  # a live apply of this plan: let it end
            if progress is not None:
                progress({**progress_of(journal_state(journal_path)), "waiting_for": "the plan's lock"})
            await asyncio.sleep(POLL_SECONDS)
        code = await _apply_once(spec, sdir / OUTPUT_FILE, journal_path, progress)
        if code == exit_codes.REFUSED and is_locked(lock_path) is not None:
            continue  # another process took the lock between our look and our start
        if (code < 0 or code == exit_codes.INTERRUPTED) and restarts < MAX_RESTARTS:
            restarts += 1
            continue
        break
    state = journal_state(journal_path)
    return PlanEnd(
        spec.name,
        code if code >= 0 else exit_codes.INTERRUPTED,
        run_id=state.run_id if state else None,
        status=state.status.value if state else None,
        message=_last_line(sdir / OUTPUT_FILE),
    )


async def _apply_once(spec: PlanSpec, output: Path, journal_path: Path, progress: Progress | None) -> int:
    with output.open("ab") as sink:
        proc = await asyncio.create_subprocess_exec(
            *apply_command(spec),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            env={**os.environ, "NO_COLOR": "1"},
        )
        try:
            while True:
                try:
                    return await asyncio.wait_for(proc.wait(), POLL_SECONDS)
                except TimeoutError:
                    if progress is not None:
                        progress(progress_of(journal_state(journal_path)))
        except asyncio.CancelledError:
            # Cancelled (a Temporal cancellation of the plan's activity): what SIGTERM means to `migrate apply` —
            # roll back at its next safe point before the commit, finish forward after it. Its end is waited for.
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                await asyncio.shield(proc.wait())
            raise


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""
