"""The policies around a run: which plan a command drives and where its run lives, the reverse-run rules, secrets
before anything changes, the next action, the plan-hash diff, the postpone gate and archiving finished runs."""

from __future__ import annotations

import difflib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator import exit_codes, secrets
from orchestrator.engine.journal import RunState, RunStatus, StepState
from orchestrator.engine.lock import is_locked
from orchestrator.engine.step import Step
from orchestrator.engine.view import JournalView
from orchestrator.output import logging as mlog
from orchestrator.plan.loader import LoadedPlan
from orchestrator.plan.model import Plan
from orchestrator.run.results import RunError, StepRow


@dataclass
class Subject:
    """The plan a command drives (the file's, or its reversal) and where its run lives."""

    loaded: LoadedPlan
    plan: Plan
    plan_path: Path
    reverse: bool
    state_dir: Path

    @property
    def journal_path(self) -> Path:
        return self.state_dir / "journal.jsonl"

    def saved_state(self) -> RunState | None:
        return JournalView.read(self.journal_path).state()


def load(plan_path: Path) -> LoadedPlan:
    from orchestrator.plan.loader import PlanError, load_plan

    try:
        return load_plan(plan_path)
    except PlanError as exc:
        raise RunError(exit_codes.BAD_INPUT, "\n".join(getattr(exc, "lines", None) or [str(exc)])) from None


def subject(plan_path: Path, *, reverse: bool = False, state_dir: Path | None = None) -> Subject:
    loaded = load(plan_path)
    plan = run_plan(loaded, reverse)
    return Subject(loaded, plan, plan_path, reverse, state_dir_of(plan_path, plan, state_dir))


def run_plan(loaded: LoadedPlan, reverse: bool) -> Plan:
    if not reverse:
        return loaded.plan
    problem = loaded.plan.reverse_problem()
    if problem is not None:
        raise RunError(exit_codes.BAD_INPUT, f"{loaded.path}: cannot reverse: {problem}")
    from pydantic import ValidationError

    try:
        return loaded.plan.reversed()
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        problem = str(first["msg"]).removeprefix("Value error, ")
        raise RunError(
            exit_codes.BAD_INPUT, f"{loaded.path}: the reversed plan is not valid: {where}: {problem}".rstrip(": ")
        ) from None


def state_dir_of(plan_path: Path, plan: Plan, state_dir: Path | None) -> Path:
    return state_dir if state_dir is not None else plan_path.resolve().parent / ".migrate" / plan.name


def reverse_state(plan_path: Path, forward: Plan) -> RunState | None:
    try:
        path = state_dir_of(plan_path, forward.reversed(), None) / "journal.jsonl"
    except ValueError:  # a plan that cannot be reversed has no reverse run
        return None
    return JournalView.read(path).state()


def moved_back(forward: RunState, back: RunState) -> bool:
    """The forward run completed, then a reverse run completed after it: the service is on the source again."""
    return (
        forward.status == RunStatus.COMPLETED
        and back.status == RunStatus.COMPLETED
        and (back.ended_at or 0) > (forward.ended_at or 0)
    )


def require_forward_committed(plan_path: Path, forward: Plan) -> None:
    """A reverse run carries the target's writes back: there must be a forward run past its DNS flip."""
    sdir = state_dir_of(plan_path, forward, None)
    journal_path = sdir / "journal.jsonl"
    state = JournalView.read(journal_path).state()
    if state is not None and state.status == RunStatus.FAILED_AFTER_COMMIT:
        raise RunError(
            exit_codes.REFUSED,
            f"plan '{forward.name}': run {state.run_id} failed after its DNS flip; finish it first with "
            f"`migrate apply {plan_path}`, then reverse",
        )
    if state is None or state.status != RunStatus.COMPLETED:
        where = "has no run" if state is None else f"run {state.run_id} is {state.status.value}"
        raise RunError(
            exit_codes.REFUSED,
            f"plan '{forward.name}' {where}: nothing to reverse, the service never moved to the target "
            f"(a run that has not flipped DNS is undone with `migrate rollback {plan_path}`)",
        )
    holder = is_locked(sdir / "lock")
    if holder is not None:
        raise RunError(exit_codes.REFUSED, f"the forward run of plan '{forward.name}' is running: {holder.describe()}")


def prepare_secrets(plan: Plan, plan_path: Path, env_file: Path | None) -> None:
    load_env(env_file)
    resolve_secrets(plan, plan_path)


def load_env(env_file: Path | None) -> None:
    try:
        secrets.load_env_file(env_file)
    except secrets.EnvFileError as exc:
        raise RunError(exit_codes.BAD_INPUT, str(exc)) from None


def resolve_secrets(plan: Plan, plan_path: Path) -> None:
    try:
        secrets.resolve_all(plan, plan_path)
    except secrets.SecretError as exc:
        raise RunError(exit_codes.BAD_INPUT, str(exc)) from None


# ------------------------------------------------------------------------------------------- next action
def rows(state: RunState, steps: Sequence[Step]) -> list[StepRow]:
    out = []
    for i, step in enumerate(steps, 1):
        rec = state.step(step.name)
        note = rec.error or ""
        if rec.result.get("already_in_place"):
            note = "effect already in place"
        mark = " (commit point)" if step.commit_point else (" (downtime begins)" if step.begins_downtime else "")
        out.append(StepRow(i, step.name, mark, rec.state.value, rec.duration, note, rec.error))
    return out


def next_action(state: RunState | None, steps: Sequence[Step], reverse: bool = False) -> str:
    text = _next_action_text(state, steps)
    if not reverse:
        return text
    return text.replace("`migrate apply`", "`migrate apply --reverse`").replace(
        "`migrate rollback`", "`migrate rollback --reverse`"
    )


def _next_action_text(state: RunState | None, steps: Sequence[Step]) -> str:
    if state is None:
        return "`migrate apply` starts a new run"
    if state.status == RunStatus.COMPLETED:
        return "nothing: the migration is complete"
    if state.status == RunStatus.ROLLED_BACK:
        return "`migrate apply` starts a new run (the last one was rolled back)"
    if state.committed and state.status in (RunStatus.ROLLING_BACK, RunStatus.ROLLBACK_FAILED):
        return "`migrate apply` finishes the run (it committed before it stopped: the target serves)"
    if state.status == RunStatus.ROLLING_BACK:
        return "`migrate rollback` (or `apply`) resumes the interrupted rollback"
    if state.status == RunStatus.ROLLBACK_FAILED:
        failed = [r.name for r in state.steps.values() if r.state == StepState.UNDO_FAILED]
        return f"fix the cause, then `migrate rollback` retries the compensation of {', '.join(failed)}"
    for step in steps:
        rec = state.step(step.name)
        if rec.state != StepState.DONE:
            verb = "re-enter" if rec.state in (StepState.RUNNING, StepState.FAILED) else "run"
            return f"`migrate apply` resumes: {verb} step {step.name} ({step.title})"
    return "`migrate apply` finishes the run"


def plan_diff(old: str, new: str) -> str:
    changed = [
        line
        for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    shown = "; ".join(" ".join(c.split()) for c in changed[:6])
    more = f" (+{len(changed) - 6} more)" if len(changed) > 6 else ""
    return shown + more


# --------------------------------------------------------------------------------------- the postpone gate
POSTPONE_REMINDER_SECONDS = 30.0


def postpone_flag(plan: Plan, plan_path: Path) -> Path | None:
    if plan.cutover.postpone_flag is None:
        return None
    flag = Path(os.path.expanduser(plan.cutover.postpone_flag))
    return flag if flag.is_absolute() else plan_path.resolve().parent / flag


def wait_while_postponed(plan: Plan, plan_path: Path, step: Step) -> None:
    """Hold the run before the downtime while the plan's postpone flag file exists (the operator says when)."""
    flag = postpone_flag(plan, plan_path)
    if flag is None:
        return
    log = mlog.get_logger()
    since = time.monotonic()
    reminded = -POSTPONE_REMINDER_SECONDS
    while flag.exists():
        waited = time.monotonic() - since
        if waited - reminded >= POSTPONE_REMINDER_SECONDS:
            log.warning(
                "cut-over postponed: delete the flag file to begin the downtime; Ctrl-C rolls back",
                flag=str(flag),
                next=step.name,
                waited=f"{waited:.0f}s",
            )
            reminded = waited
        time.sleep(0.5)
    if time.monotonic() - since > 0.5:
        log.info("postpone flag removed: going on", flag=str(flag))


def archive(journal_path: Path, state: RunState) -> None:
    history = journal_path.parent / "history"
    history.mkdir(exist_ok=True)
    journal_path.rename(history / f"{state.run_id}.journal.jsonl")
