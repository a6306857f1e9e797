"""The reverse path of a replicate run after its DNS flip: the old source, a GTID replica of the target since the
forward run's finish, kept `replication.keep_reverse` seconds.

- `rollback_route`: whether `migrate rollback PLAN` after the flip becomes a reverse cut-over (the reverse run,
  `<name>-reverse`, over the reverse replica: the same window and guarantees as the forward switch), or refuses in
  one line because the reverse path is over or broken (nothing changed), or is the ordinary rollback.
- `end_reverse_path` (`migrate finish PLAN`): ends a kept reverse path now, on both sides.
- `start_finisher` / `finish_when_due` (`migrate finish PLAN --when-due`, started detached by a completed `apply`):
  ends it at the end of `replication.keep_reverse`, unless something ended it before (a way back, `migrate
  finish`, the run's journal gone); it re-reads the journal every few seconds, so it never outlives the path long.
- `reverse_status`: the kept path's lag, read live, for `migrate status`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from orchestrator import exit_codes
from orchestrator.engine.events import StepSaved
from orchestrator.engine.journal import Journal, RunState, RunStatus
from orchestrator.engine.lock import LockHeld, PlanLock
from orchestrator.engine.view import JournalView
from orchestrator.plan.model import Plan
from orchestrator.run import compose
from orchestrator.run.policy import moved_back, prepare_secrets, reverse_state, state_dir_of, subject
from orchestrator.run.results import RunError
from orchestrator.steps.repl_common import (
    FINISH_STEP,
    SWITCH_STEP,
    TORN_DOWN,
    end_tunnels,
    forget_replication_on,
    reverse_kept_until,
    reverse_line,
    reverse_problem,
)

SHUTDOWN_WAY_BACK = "`migrate apply {plan} --reverse` carries the target's writes back in the shutdown mode"


def _replicated(state: RunState) -> bool:
    return SWITCH_STEP in state.steps


def _began_over_replica(journal_path: Path) -> bool:
    """The reverse run journaled there began over the reverse replica (its step list has the switch)."""
    return SWITCH_STEP in JournalView.read(journal_path).run_steps()


def kept_until(state: RunState | None) -> float | None:
    """Until when this completed forward run keeps its reverse path (None: not kept, torn down, not completed)."""
    if state is None or state.status != RunStatus.COMPLETED or FINISH_STEP not in state.steps:
        return None
    return reverse_kept_until(state.steps[FINISH_STEP].saved)


def rollback_route(
    plan_path: Path, *, discard_target_writes: bool, reverse: bool, env_file: Path | None, state_dir: Path | None
) -> str | None:
    """For `migrate rollback PLAN`: the line announcing a reverse cut-over over the reverse replica (the caller then
    runs `apply --reverse`), or None for the ordinary rollback (and its own refusals).

    Refuses (RunError, exit 3, nothing changed) when a replicate run is past its flip and the reverse path is over
    or broken: never a silent loss, the two ways that remain are named.
    """
    if reverse or discard_target_writes:
        return None
    subj = subject(plan_path, state_dir=state_dir)
    state = subj.saved_state()
    if state is None or not state.committed or not _replicated(state):
        return None
    forward = subj.loaded.plan
    if forward.reverse_problem() is not None:
        return None  # no way back at all: the ordinary refusal
    back = reverse_state(plan_path, forward)
    back_journal = state_dir_of(plan_path, forward, None).parent / f"{forward.name}-reverse" / "journal.jsonl"
    if back is not None and back.status != RunStatus.ROLLED_BACK:
        if moved_back(state, back) or not _began_over_replica(back_journal):
            return None  # moved back already, or a shutdown-mode way back under way: the ordinary refusal says so
        return f"run {back.run_id} (--reverse, over the reverse replica) is unfinished: resuming it"
    if back is not None and not _began_over_replica(back_journal):
        return None  # a rolled-back shutdown-mode way back overwrote the source's data: the ordinary refusal
    if state.status != RunStatus.COMPLETED:
        return None  # failed after its flip: the ordinary refusal says to finish it first
    advice = f"nothing was changed; {SHUTDOWN_WAY_BACK.format(plan=plan_path)}, or pass --discard-target-writes"
    if kept_until(state) is None:
        torn = state.steps[FINISH_STEP].saved.get(TORN_DOWN)
        why = "torn down" if torn else "not kept (replication.keep_reverse 0, or it was not healthy at the finish)"
        raise RunError(
            exit_codes.REFUSED,
            f"run {state.run_id} is past the DNS flip and its reverse replication is over ({why}): {advice}",
        )
    plan = subj.plan
    prepare_secrets(plan, plan_path, env_file)
    rt = compose.runtime_factory(plan, plan_path, True)
    try:
        problem = reverse_problem(rt, "source")
    except Exception as exc:
        problem = f"the old source could not be asked: {exc}"
    finally:
        compose.close_runtime(rt)
    if problem is not None:
        raise RunError(
            exit_codes.REFUSED,
            f"run {state.run_id} is past the DNS flip and reverse replication is broken: {problem}; {advice}",
        )
    return (
        f"run {state.run_id} is past the DNS flip; reverse replication is healthy: moving back through it (run "
        f"{forward.name}-reverse: the target fenced and read-only, the old source promoted with proof, DNS back)"
    )


def end_reverse_path(plan_path: Path, *, env_file: Path | None, state_dir: Path | None) -> str:
    """`migrate finish PLAN`: end the reverse path a completed replicate run keeps (STOP SLAVE, RESET SLAVE ALL on
    both sides, both tunnels ended), journaled in that run. Idempotent; refuses while a reverse run is unfinished."""
    subj = subject(plan_path, state_dir=state_dir)
    state = subj.saved_state()
    if state is None:
        return f"plan '{subj.plan.name}' has no run: nothing to finish"
    if state.status != RunStatus.COMPLETED:
        raise RunError(
            exit_codes.REFUSED,
            f"run {state.run_id} is {state.status.value}: `migrate apply {plan_path}` finishes it (or `migrate "
            f"rollback {plan_path}` undoes it)",
        )
    if kept_until(state) is None:
        return f"run {state.run_id} is complete and keeps no reverse path: nothing to finish"
    back = reverse_state(plan_path, subj.loaded.plan)
    if back is not None and moved_back(state, back):
        return f"run {back.run_id} (--reverse) moved the service back and ended the reverse path: nothing to finish"
    if back is not None and back.status not in (RunStatus.COMPLETED, RunStatus.ROLLED_BACK):
        raise RunError(
            exit_codes.REFUSED,
            f"run {back.run_id} (--reverse) is {back.status.value}: it goes back over this reverse path; finish or "
            f"roll it back first (`migrate status {plan_path} --reverse`)",
        )
    prepare_secrets(subj.plan, plan_path, env_file)
    lock = PlanLock(subj.state_dir / "lock", "migrate finish")
    try:
        lock.acquire()
    except LockHeld as exc:
        raise RunError(exit_codes.REFUSED, str(exc)) from None
    try:
        _tear_down(subj.plan, plan_path)
        Journal(subj.journal_path).append(StepSaved(step=FINISH_STEP, key=TORN_DOWN, value=True))
    finally:
        lock.release()
    return (
        f"run {state.run_id}: reverse replication ended on both sides (STOP SLAVE, RESET SLAVE ALL) and its tunnels "
        f"closed; from now on the way back is {SHUTDOWN_WAY_BACK.format(plan=plan_path)}"
    )


def _tear_down(plan: Plan, plan_path: Path) -> None:

    rt = compose.runtime_factory(plan, plan_path, False)
    try:
        failures = forget_replication_on(rt, ("source", "target"))
        if failures:
            raise RunError(exit_codes.NEEDS_ATTENTION, "ending reverse replication: " + "; ".join(failures))
        end_tunnels(rt.source, rt.plan.name, rt.plan_path, rt.plan.source.private_dir)
    finally:
        compose.close_runtime(rt)


def reverse_status(plan_path: Path, state: RunState | None, reverse: bool, state_dir: Path | None) -> str | None:
    """The kept reverse path of a completed forward run, read live (needs the database password in the
    environment; otherwise says until when it is kept)."""
    if reverse:
        return None
    until = kept_until(state)
    if until is None or state is None:
        return None
    subj = subject(plan_path, state_dir=state_dir)
    back = reverse_state(plan_path, subj.loaded.plan)
    if back is not None and moved_back(state, back):
        return None
    rt = compose.runtime_factory(subj.plan, plan_path, True)
    try:
        return reverse_line(rt, until, str(plan_path))
    except Exception as exc:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(until))
        return (
            f"reverse replication: kept until {when} (cannot be read now: {exc}); `migrate finish {plan_path}` ends it"
        )
    finally:
        compose.close_runtime(rt)


POLL_SECONDS = 2.0


def finish_when_due(
    plan_path: Path, *, env_file: Path | None, state_dir: Path | None, poll: float = POLL_SECONDS
) -> str:
    """Wait until the kept reverse path is due, then end it; return early, changing nothing, once it is no longer
    kept. A way back under way when it falls due is waited for (it ends the path, or rolls back and leaves it)."""
    while True:
        subj = subject(plan_path, state_dir=state_dir)
        state = subj.saved_state()
        until = kept_until(state)
        if until is None or state is None:
            return "the reverse path is no longer kept: nothing to finish"
        back = reverse_state(plan_path, subj.loaded.plan)
        if back is not None and moved_back(state, back):
            return f"run {back.run_id} (--reverse) moved the service back: nothing to finish"
        if time.time() >= until:
            try:
                return end_reverse_path(plan_path, env_file=env_file, state_dir=state_dir)
            except RunError as exc:
                if exc.code != exit_codes.REFUSED:
                    raise
        time.sleep(max(0.1, min(poll, until - time.time())))


def start_finisher(plan_path: Path, *, env_file: Path | None, state_dir: Path) -> int:
    """Start `migrate finish PLAN --when-due` detached (its own session, its output in the state directory); its
    pid. It needs the secrets the run had: the same --env-file, or this process's environment, inherited."""
    command = [sys.executable, "-m", "orchestrator.cli.commands", "finish", str(plan_path), "--when-due", "--state-dir",
               str(state_dir)]  # fmt: skip
    if env_file is not None:
        command += ["--env-file", str(env_file)]
    with open(state_dir / "reverse-finish.log", "ab") as log:
        child = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=os.getcwd(),
        )  # fmt: skip
    return child.pid
