"""A run's lifecycle: apply, rollback, status and describe (the dry-run), each returning a result object.

This is the composition root: it joins the plan, the steps, the runtime, the hooks and the engine, and holds the
policies around a run — the plan's lock, the plan-hash check, archiving finished runs, the reverse-run rules, the
postpone gate, rollback refusals and what the next action is. It prints nothing: the command line renders results
(progress lines go through the `say` callback) and maps them to exit codes.
"""

from __future__ import annotations

import difflib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import structlog

from orchestrator import exit_codes, secrets
from orchestrator import logging as mlog
from orchestrator.engine.hooks import HookRunner
from orchestrator.engine.interrupt import Interruptions
from orchestrator.engine.journal import Journal, RunState, RunStatus, StepState
from orchestrator.engine.lock import Holder, LockHeld, PlanLock, is_locked
from orchestrator.engine.machine import Engine, EngineConfig, Outcome, StepPlan
from orchestrator.engine.step import Step
from orchestrator.plan.loader import LoadedPlan
from orchestrator.plan.model import Plan

Say = Callable[[str], None]


# The composition: which steps and which runtime a plan gets. Tests of the engine replace these.
def default_steps(plan: Plan) -> list[Step]:
    from orchestrator.steps import build_steps

    return build_steps(plan)


def default_runtime(plan: Plan, plan_path: Path, dry_run: bool) -> Any:
    from orchestrator.runtime import Runtime

    return Runtime(plan, plan_path, dry_run=dry_run)


steps_factory: Callable[[Plan], Sequence[Step]] = default_steps
runtime_factory: Callable[[Plan, Path, bool], Any] = default_runtime


class RunError(Exception):
    """A command stops before (or instead of) acting: one line for the operator and the documented exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ------------------------------------------------------------------------------------------------ results
class ApplyEnd(StrEnum):
    COMPLETED = "completed"
    NOTHING_TO_DO = "nothing_to_do"  # the run had completed before
    ROLLED_BACK = "rolled_back"
    DECLINED = "declined"
    NEEDS_ATTENTION = "needs_attention"


@dataclass(frozen=True)
class StepRow:
    index: int
    name: str
    mark: str  # " (commit point)", " (downtime begins)" or ""
    state: str
    duration: float | None
    note: str
    error: str | None = None


@dataclass
class ApplyResult:
    end: ApplyEnd
    run_id: str | None
    rows: list[StepRow] = field(default_factory=list)
    next_action: str = ""
    report_text: str | None = None
    report_path: Path | None = None
    message: str | None = None


@dataclass
class RollbackResult:
    rolled_back: bool  # False: a compensation failed (needs attention)
    run_id: str | None
    message: str
    rows: list[StepRow] = field(default_factory=list)
    next_action: str = ""


@dataclass
class Description:
    plan_name: str
    plan_path: Path
    notes: list[str]
    steps: list[StepPlan]
    flags: dict[str, list[str]]  # step name -> what the operator should know (downtime, postpone, commit point)
    hooks: dict[str, list[str]]


@dataclass
class Interruption:
    """A run that stopped without finishing, with nobody holding its lock (killed, or its machine died)."""

    blocked_since: float | None  # when writes were blocked (journaled), None if they are not blocked now
    blocked_by: str | None  # the step in whose window writes are blocked
    budget: float
    budget_left: float | None
    resume_would: str
    headline: str = "interrupted: the run stopped without finishing and no process holds its lock"

    def lines(self, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        lines = [self.headline]
        if self.blocked_by is not None and self.blocked_since is None:
            lines.append(f"writes may be blocked now: step {self.blocked_by} had begun the downtime")
        elif self.blocked_since is not None:
            when = time.strftime("%H:%M:%S", time.localtime(self.blocked_since))
            lines.append(
                f"writes blocked now: since {when} ({now - self.blocked_since:.0f} s), by step {self.blocked_by}; "
                "neither rolled back nor committed"
            )
        if self.budget_left is not None:
            left = (
                f"{self.budget_left:.1f} s left" if self.budget_left > 0 else f"spent ({-self.budget_left:.1f} s over)"
            )
            lines.append(f"write budget (cutover.max_write_block {self.budget:g} s): {left}")
        lines.append(f"a resume now would {self.resume_would}")
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "writes_blocked_since": self.blocked_since,
            "blocked_by": self.blocked_by,
            "max_write_block": self.budget,
            "budget_left": self.budget_left,
            "resume_would": self.resume_would,
        }


@dataclass
class StatusReport:
    plan_name: str
    state: RunState | None
    rows: list[StepRow]
    plan_changed: bool
    holder: Holder | None
    postponed_by: Path | None
    next_action: str
    interruption: Interruption | None

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "run": None,
            "next": self.next_action,
            "locked_by": self.holder.__dict__ if self.holder else None,
            "interrupted": self.interruption.as_dict() if self.interruption else None,
        }
        if self.state is not None:
            doc["run"] = {
                "run_id": self.state.run_id,
                "status": self.state.status.value,
                "committed": self.state.committed,
                "started_at": self.state.started_at,
                "ended_at": self.state.ended_at,
                "error": self.state.error,
                "steps": [
                    {"name": r.name, "state": r.state, "duration": r.duration, "error": r.note} for r in self.rows
                ],
            }
        return doc


# ----------------------------------------------------------------------------------------------- the plan
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
        return Journal(self.journal_path).state() if self.journal_path.exists() else None


def load(plan_path: Path) -> LoadedPlan:
    from orchestrator.plan.loader import PlanError, load_plan

    try:
        return load_plan(plan_path)
    except PlanError as exc:
        raise RunError(exit_codes.BAD_INPUT, "\n".join(getattr(exc, "lines", None) or [str(exc)])) from None


def subject(plan_path: Path, *, reverse: bool = False, state_dir: Path | None = None) -> Subject:
    loaded = load(plan_path)
    plan = _run_plan(loaded, reverse)
    return Subject(loaded, plan, plan_path, reverse, _state_dir(plan_path, plan, state_dir))


def _run_plan(loaded: LoadedPlan, reverse: bool) -> Plan:
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


def _state_dir(plan_path: Path, plan: Plan, state_dir: Path | None) -> Path:
    return state_dir if state_dir is not None else plan_path.resolve().parent / ".migrate" / plan.name


def _reverse_state(plan_path: Path, forward: Plan) -> RunState | None:
    try:
        path = _state_dir(plan_path, forward.reversed(), None) / "journal.jsonl"
    except ValueError:  # a plan that cannot be reversed has no reverse run
        return None
    return Journal(path).state() if path.exists() else None


def _moved_back(forward: RunState, back: RunState) -> bool:
    """The forward run completed, then a reverse run completed after it: the service is on the source again."""
    return (
        forward.status == RunStatus.COMPLETED
        and back.status == RunStatus.COMPLETED
        and (back.ended_at or 0) > (forward.ended_at or 0)
    )


def _require_forward_committed(plan_path: Path, forward: Plan) -> None:
    """A reverse run carries the target's writes back: there must be a forward run past its DNS flip."""
    sdir = _state_dir(plan_path, forward, None)
    journal_path = sdir / "journal.jsonl"
    state = Journal(journal_path).state() if journal_path.exists() else None
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


def _secrets(plan: Plan, plan_path: Path, env_file: Path | None) -> None:
    _load_env(env_file)
    _resolve(plan, plan_path)


def _load_env(env_file: Path | None) -> None:
    try:
        secrets.load_env_file(env_file)
    except secrets.EnvFileError as exc:
        raise RunError(exit_codes.BAD_INPUT, str(exc)) from None


def _resolve(plan: Plan, plan_path: Path) -> None:
    try:
        secrets.resolve_all(plan, plan_path)
    except secrets.SecretError as exc:
        raise RunError(exit_codes.BAD_INPUT, str(exc)) from None


def hooks_for(plan: Plan, plan_path: Path) -> HookRunner:
    directory = Path(os.path.expanduser(plan.hooks.dir))
    if not directory.is_absolute():
        directory = plan_path.resolve().parent / directory
    return HookRunner(
        directory,
        timeout=plan.hooks.timeout,
        base_env=secrets.hook_environment(plan.hooks.pass_env),
        passed=plan.hooks.pass_env,
        log=mlog.get_logger(),
    )


def _close(rt: Any) -> None:
    close = getattr(rt, "close", None)
    if close is not None:
        close()


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


def _plan_diff(old: str, new: str) -> str:
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


# ------------------------------------------------------------------------------------------------ commands
def describe(
    plan_path: Path, *, env_file: Path | None = None, state_dir: Path | None = None, reverse: bool = False
) -> Description:
    """The dry-run: what every step would do, through the engine with an in-memory journal. Changes nothing."""
    subj = subject(plan_path, reverse=reverse, state_dir=state_dir)
    plan, notes = subj.plan, []
    if reverse:
        try:
            _require_forward_committed(plan_path, subj.loaded.plan)
        except RunError as refused:  # a rehearsal of the way back before the forward run: say what would refuse
            notes.append(f"note: {refused.message}; a real `apply --reverse` would refuse now")
    _load_env(env_file)
    try:
        _resolve(plan, plan_path)
    except RunError as missing:
        # A rehearsal contacts nothing, so it goes on; the real run would stop here.
        notes.append(f"note: {missing.message}: a real run would stop here (exit {missing.code})")
    existing = subj.saved_state()
    if existing is not None and existing.status not in (RunStatus.COMPLETED, RunStatus.ROLLED_BACK):
        notes.append(f"note: run {existing.run_id} is unfinished ({existing.status.value}); `apply` would resume it")
    steps = steps_factory(plan)
    engine = Engine(
        steps,
        Journal(None),
        config=EngineConfig(str(plan_path), plan.name, subj.loaded.sha256, subj.loaded.text, dry_run=True),
        rt=runtime_factory(plan, plan_path, True),
        hooks=hooks_for(plan, plan_path),
        confirm=lambda _step: False,
        log=mlog.get_logger(),
    )
    try:
        described = engine.describe()
    finally:
        _close(engine.rt)
    flags: dict[str, list[str]] = {}
    for step in steps:
        marks = []
        if step.begins_downtime:
            marks.append("DOWNTIME BEGINS: asks for confirmation first")
            if plan.cutover.postpone_flag:
                marks.append(f"waits while {plan.cutover.postpone_flag} exists")
        if step.commit_point:
            marks.append("COMMIT POINT: no automatic rollback after it")
        flags[step.name] = marks
    return Description(plan.name, plan_path, notes, described, flags, engine.hooks_by_event())


def _acquire(lock: PlanLock) -> None:
    try:
        lock.acquire()
    except LockHeld as exc:
        raise RunError(exit_codes.REFUSED, str(exc)) from None
    except OSError as exc:
        where = exc.filename or lock.path
        raise RunError(exit_codes.BAD_INPUT, f"state directory: cannot use {where}: {exc.strerror}") from None


def _engine(subj: Subject, steps: Sequence[Step], journal: Journal, confirm: Callable[[Step], bool]) -> Engine:
    plan, loaded = subj.plan, subj.loaded
    return Engine(
        steps,
        journal,
        config=EngineConfig(str(subj.plan_path), plan.name, loaded.sha256, loaded.text),
        rt=runtime_factory(plan, subj.plan_path, False),
        hooks=hooks_for(plan, subj.plan_path),
        confirm=confirm,
        log=mlog.get_logger(),
        interruptions=_interruptions(),
    )


def _interruptions() -> Interruptions:
    interruptions = Interruptions()
    interruptions.install()
    return interruptions


def _archive(journal_path: Path, state: RunState) -> None:
    history = journal_path.parent / "history"
    history.mkdir(exist_ok=True)
    journal_path.rename(history / f"{state.run_id}.journal.jsonl")


def apply(
    plan_path: Path,
    *,
    ask: Callable[[Plan, Step], bool],
    say: Say,
    force: bool = False,
    env_file: Path | None = None,
    state_dir: Path | None = None,
    reverse: bool = False,
) -> ApplyResult:
    """Run the migration, or resume the unfinished one. `ask` confirms the downtime (after the postpone gate)."""
    subj = subject(plan_path, reverse=reverse, state_dir=state_dir)
    plan, loaded = subj.plan, subj.loaded
    if reverse:
        _require_forward_committed(plan_path, loaded.plan)
    _secrets(plan, plan_path, env_file)
    steps = steps_factory(plan)
    lock = PlanLock(subj.state_dir / "lock", "migrate apply")
    _acquire(lock)
    log = mlog.get_logger()
    try:
        if lock.stale_holder is not None:
            log.warning("took over a stale lock", left_by=lock.stale_holder.describe())
        journal = Journal(subj.journal_path)
        state = journal.state()
        back = None if reverse or state is None else _reverse_state(plan_path, loaded.plan)
        if state is not None and back is not None and _moved_back(state, back):
            # The service went to the target and came back: a new forward run starts from here.
            _archive(_state_dir(plan_path, loaded.plan.reversed(), None) / "journal.jsonl", back)
            _archive(subj.journal_path, state)
            journal, state = Journal(subj.journal_path), None
            log.info("the service was moved back since the last run; starting a new run")
        if state is not None and state.status == RunStatus.COMPLETED:
            again = " --reverse" if reverse else ""
            message = f"run {state.run_id} completed; nothing to do (status: `migrate status {plan_path}{again}`)"
            return ApplyResult(ApplyEnd.NOTHING_TO_DO, state.run_id, message=message)
        if state is not None and state.status == RunStatus.ROLLED_BACK:
            _archive(subj.journal_path, state)
            journal, state = Journal(subj.journal_path), None
        if state is not None and state.plan_sha256 != loaded.sha256 and not force:
            raise RunError(
                exit_codes.REFUSED,
                f"{plan_path}: the plan changed since run {state.run_id} began "
                f"({_plan_diff(state.plan_text, loaded.text)}); restore it, or resume with --force",
            )

        def confirm(step: Step) -> bool:
            wait_while_postponed(plan, plan_path, step)
            return ask(plan, step)

        engine = _engine(subj, steps, journal, confirm)
        try:
            outcome = _drive(engine, state, journal, subj.state_dir, say)
        finally:
            engine.interruptions.uninstall()
            _close(engine.rt)
        final = journal.state()
        result = ApplyResult(
            {
                Outcome.COMPLETED: ApplyEnd.COMPLETED,
                Outcome.ROLLED_BACK: ApplyEnd.ROLLED_BACK,
                Outcome.DECLINED: ApplyEnd.DECLINED,
                Outcome.NEEDS_ATTENTION: ApplyEnd.NEEDS_ATTENTION,
            }[outcome],
            final.run_id if final else None,
        )
        if outcome == Outcome.COMPLETED or (final and final.status == RunStatus.ROLLED_BACK):
            result.report_text, result.report_path = _write_report(subj.state_dir, journal)
        if outcome != Outcome.COMPLETED and final is not None:
            result.rows = rows(final, steps)
            result.next_action = next_action(final, steps, reverse)
        return result
    finally:
        lock.release()


def _drive(engine: Engine, state: RunState | None, journal: Journal, sdir: Path, say: Say) -> Outcome:
    if state is None:
        state = engine.start_run()
        mlog.log_to_file(sdir / f"run-{state.run_id}.log.jsonl")
        say(f"run {state.run_id}: {len(engine.steps)} steps; journal {journal.path}")
        return engine.forward()
    mlog.log_to_file(sdir / f"run-{state.run_id}.log.jsonl")
    if state.status in (RunStatus.ROLLING_BACK, RunStatus.ROLLBACK_FAILED):
        say(f"run {state.run_id} has an unfinished rollback: resuming it")
        engine.resume_run()
        return engine.rollback(reason=state.rollback_reason or "resumed")
    say(f"run {state.run_id} is unfinished ({state.status.value}): resuming it")
    engine.resume_run()
    return engine.forward()


def _write_report(state_dir: Path, journal: Journal) -> tuple[str, Path]:
    from orchestrator.report import build_report, render_report, write_report

    report = build_report(journal.events)
    return secrets.redact(render_report(report)), write_report(report, state_dir)


def rollback(
    plan_path: Path,
    *,
    discard_target_writes: bool,
    confirmed: Callable[[Plan], bool],
    env_file: Path | None = None,
    state_dir: Path | None = None,
    reverse: bool = False,
) -> RollbackResult:
    """Undo the run: compensations in reverse order, so the source serves as before.

    `confirmed` asks the operator (typing the plan's name) before discarding the target's writes.
    """
    subj = subject(plan_path, reverse=reverse, state_dir=state_dir)
    plan, loaded = subj.plan, subj.loaded
    if not subj.journal_path.exists():
        return RollbackResult(True, None, f"plan '{plan.name}' has no run: nothing to roll back")
    _secrets(plan, plan_path, env_file)
    steps = steps_factory(plan)
    lock = PlanLock(subj.state_dir / "lock", "migrate rollback")
    _acquire(lock)
    try:
        journal = Journal(subj.journal_path)
        state = journal.state()
        if state is None:
            return RollbackResult(True, None, "no run to roll back")
        if state.status == RunStatus.ROLLED_BACK:
            return RollbackResult(True, state.run_id, f"run {state.run_id} is already rolled back")
        back = None if reverse else _reverse_state(plan_path, loaded.plan)
        if back is not None:
            # Even a rolled-back reverse run has pre-synced the target's live data over the source's datadir and
            # trees: undoing the forward run would start the source on that copy.
            raise RunError(
                exit_codes.REFUSED,
                f"run {back.run_id} (--reverse) is {back.status.value}: the source's data was overwritten by the way "
                f"back; see `migrate status {plan_path} --reverse`",
            )
        if state.committed and not discard_target_writes:
            discard = "--discard-target-writes to point DNS back anyway"
            # A reverse run has no reverse of its own: moving forward again is a new run of the plan.
            advice = (
                f"Pass {discard}."
                if reverse
                else f"Run `migrate apply {plan_path} --reverse` to carry them back, or pass {discard}."
            )
            raise RunError(
                exit_codes.REFUSED,
                f"run {state.run_id} is past the DNS flip: the target has taken writes since, and rolling back would "
                f"lose them. {advice}",
            )
        if state.committed and not confirmed(plan):
            raise RunError(exit_codes.REFUSED, "not confirmed (type the plan's name at a terminal, or pass --yes)")
        mlog.log_to_file(subj.state_dir / f"run-{state.run_id}.log.jsonl")
        engine = _engine(subj, steps, journal, lambda _step: True)
        structlog.contextvars.bind_contextvars(run_id=state.run_id)
        try:
            outcome = engine.rollback(reason=state.rollback_reason or "requested by the operator")
        finally:
            engine.interruptions.uninstall()
            _close(engine.rt)
        if outcome == Outcome.ROLLED_BACK:
            return RollbackResult(True, state.run_id, f"run {state.run_id} rolled back: the source serves as before")
        final = journal.state() or state
        return RollbackResult(False, state.run_id, "", rows(final, steps), next_action(final, steps, reverse))
    finally:
        lock.release()


def status(plan_path: Path, *, state_dir: Path | None = None, reverse: bool = False) -> StatusReport:
    """Where the run stands, who runs it now, and — after a crash — what is blocked and what a resume would do."""
    subj = subject(plan_path, reverse=reverse, state_dir=state_dir)
    steps = steps_factory(subj.plan)
    journal = Journal(subj.journal_path) if subj.journal_path.exists() else None
    state = journal.state() if journal is not None else None
    holder = is_locked(subj.state_dir / "lock")
    flag = postpone_flag(subj.plan, plan_path)
    interruption = None
    if journal is not None and state is not None and holder is None:
        interruption = interruption_of(state, journal.events, steps, subj.plan.cutover.max_write_block, reverse)
    return StatusReport(
        plan_name=subj.plan.name,
        state=state,
        rows=rows(state, steps) if state is not None else [],
        plan_changed=state is not None and state.plan_sha256 != subj.loaded.sha256,
        holder=holder,
        postponed_by=flag if flag is not None and flag.exists() else None,
        next_action=next_action(state, steps, reverse),
        interruption=interruption,
    )


UNFINISHED = (RunStatus.RUNNING, RunStatus.ROLLING_BACK, RunStatus.ROLLBACK_FAILED)


def interruption_of(
    state: RunState,
    events: list[dict[str, Any]],
    steps: Sequence[Step],
    budget: float,
    reverse: bool = False,
    now: float | None = None,
) -> Interruption | None:
    """What an unfinished run with no live process left behind: is the downtime still on, how much budget is left,
    and what a resume would do now. None when the run finished (or failed after its commit point: the target serves).
    """
    if state.status not in UNFINISHED:
        return None
    if state.status == RunStatus.RUNNING and events and events[-1].get("event") == "gate_declined":
        return None  # stopped on purpose before the downtime: nothing is blocked, `apply` asks again
    now = time.time() if now is None else now
    downtime = next((s for s in steps if s.begins_downtime), None)
    blocked_by: str | None = None
    blocked_since: float | None = None
    if downtime is not None and not state.committed:
        rec = state.step(downtime.name)
        if rec.state not in (StepState.PENDING, StepState.UNDONE):
            blocked_by = downtime.name
            blocked_since = _writes_blocked_at(events)
    left = None if blocked_since is None else budget - (now - blocked_since)
    if state.status != RunStatus.RUNNING:
        would = "resume the rollback (`migrate rollback` or `apply`)"
    elif left is not None and left <= 0:
        would = "roll back: the write budget is spent, so the step in the window fails its budget check"
    else:
        would = "continue: " + next_action(state, steps, reverse).removeprefix("`migrate apply` resumes: ")
        if left is not None:
            would += f", with {left:.1f} s of the write budget left"
    found = Interruption(blocked_since, blocked_by, budget, left, would)
    if state.status == RunStatus.ROLLBACK_FAILED:
        found.headline = "stopped: a compensation failed and no process holds the lock"
    return found


def _writes_blocked_at(events: list[dict[str, Any]]) -> float | None:
    """The journaled moment writes were blocked (saved by the step that blocks them, or in its result)."""
    found: float | None = None
    for event in events:
        if event.get("event") == "step_saved" and event.get("key") == "writes_blocked_at":
            found = _number(event.get("value"))
        elif event.get("event") == "step_completed":
            value = _number((event.get("result") or {}).get("writes_blocked_at"))
            found = value if value is not None else found
    return found


def _number(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
