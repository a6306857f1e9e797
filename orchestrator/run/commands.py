"""apply, rollback, status and describe (the dry-run): the lock, the engine, and the result of each."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from orchestrator import exit_codes, secrets
from orchestrator.engine.interrupt import Interruptions
from orchestrator.engine.journal import Journal, RunState, RunStatus, StepState
from orchestrator.engine.lock import LockHeld, PlanLock, is_locked
from orchestrator.engine.machine import Engine, EngineConfig, Outcome
from orchestrator.engine.step import Step
from orchestrator.engine.view import JournalView
from orchestrator.output import logging as mlog
from orchestrator.output.progress import Phase, phase_of, ttl_wait_until
from orchestrator.plan.model import Plan
from orchestrator.results import AuditResult
from orchestrator.run import compose
from orchestrator.run.compose import Say
from orchestrator.run.crash import interruption_of
from orchestrator.run.policy import (
    Subject,
    archive,
    load_env,
    moved_back,
    next_action,
    plan_diff,
    postpone_flag,
    prepare_secrets,
    require_forward_committed,
    resolve_secrets,
    reverse_state,
    rows,
    state_dir_of,
    subject,
    wait_while_postponed,
)
from orchestrator.run.results import (
    ApplyEnd,
    ApplyResult,
    Description,
    RollbackResult,
    RunError,
    StatusReport,
)
from orchestrator.run.reverse import kept_until, reverse_status, start_finisher
from orchestrator.services import dns_where
from orchestrator.services.dns_ttl import wait_out_old_ttl

if TYPE_CHECKING:
    from orchestrator.run.rehearse import DryRunEstimate  # imports the steps: only when the dry-run measures


def describe(
    plan_path: Path,
    *,
    env_file: Path | None = None,
    state_dir: Path | None = None,
    reverse: bool = False,
    estimate: bool = True,
) -> Description:
    """The dry-run: what every step would do, through the engine with an in-memory journal. Changes nothing.

    With `estimate` (and the secrets at hand) it also measures, read-only, what each transfer would move and how
    long each step and the window would take (the estimate `migrate rehearse` makes, saved nowhere); a host out of
    reach only costs the estimate, said in one line."""
    subj = subject(plan_path, reverse=reverse, state_dir=state_dir)
    plan, notes = subj.plan, []
    if reverse:
        try:
            require_forward_committed(plan_path, subj.loaded.plan)
        except RunError as refused:  # a rehearsal of the way back before the forward run: say what would refuse
            notes.append(f"note: {refused.message}; a real `apply --reverse` would refuse now")
    load_env(env_file)
    secrets_missing: str | None = None
    try:
        resolve_secrets(plan, plan_path)
    except RunError as missing:
        # A rehearsal contacts nothing, so it goes on; the real run would stop here.
        notes.append(f"note: {missing.message}: a real run would stop here (exit {missing.code})")
        secrets_missing = missing.message
    plan = subj.plan = compose.resolve_mode(plan, plan_path, subj.journal_path, probe=False)
    measured: DryRunEstimate | None = None
    estimate_note: str | None = None
    if estimate and compose.estimator is not None:
        if secrets_missing is not None:
            estimate_note = f"estimate: not measured: {secrets_missing} (the hosts are not asked without it)"
        else:
            measured, estimate_note = _measure(plan, plan_path)
        if measured is not None and plan.cutover.mode == "auto":
            plan = subj.plan = plan.model_copy(
                update={"cutover": plan.cutover.model_copy(update={"mode": measured.mode})}
            )
            notes.append(f"note: cutover.mode auto, as the servers are now: {measured.mode_reason}")
    if plan.cutover.mode == "auto":
        notes.append("note: cutover.mode auto is resolved when the run starts (replicate where the servers allow it, "
                     "else shutdown; preflight says which and why): the replicate steps are shown")  # fmt: skip
    existing = subj.saved_state()
    if existing is not None and existing.status not in (RunStatus.COMPLETED, RunStatus.ROLLED_BACK):
        notes.append(f"note: run {existing.run_id} is unfinished ({existing.status.value}); `apply` would resume it")
    steps = compose.steps_factory(plan)
    engine = Engine(
        steps,
        Journal(None),
        config=EngineConfig(str(plan_path), plan.name, subj.loaded.sha256, subj.loaded.text, dry_run=True),
        rt=compose.runtime_factory(plan, plan_path, True),
        hooks=compose.hooks_for(plan, plan_path),
        confirm=lambda _step: False,
        log=mlog.get_logger(),
    )
    try:
        described = engine.describe()
    finally:
        compose.close_runtime(engine.rt)
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
    description = Description(plan.name, plan_path, notes, described, flags, engine.hooks_by_event())
    if measured is not None:
        from orchestrator.services import estimates

        description.estimates = estimates.step_lines(measured.estimate)
        description.estimate_summary = estimates.summary_lines(measured.estimate)
        description.estimate_data = measured.estimate.as_dict()
    elif estimate_note is not None:
        description.estimate_summary = [estimate_note]
    return description


def _measure(plan: Plan, plan_path: Path) -> tuple[DryRunEstimate | None, str | None]:
    """The dry-run's estimate, or why there is none (one line: a host out of reach, a refused login, ...)."""
    from orchestrator.redaction import redact

    assert compose.estimator is not None
    try:
        return compose.estimator(plan, plan_path), None
    except Exception as exc:  # whatever the hosts answered, the dry-run still lists its steps
        mlog.get_logger().debug("dry-run estimate unavailable", error=str(exc), exc_info=True)
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        return None, f"estimate: not measured: {redact(reason)} (`--no-estimate` skips it)"


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
        rt=compose.runtime_factory(plan, subj.plan_path, False),
        hooks=compose.hooks_for(plan, subj.plan_path),
        confirm=confirm,
        log=mlog.get_logger(),
        interruptions=_interruptions(),
    )


def _interruptions() -> Interruptions:
    interruptions = Interruptions()
    interruptions.install()
    return interruptions


def apply(
    plan_path: Path,
    *,
    ask: Callable[[Plan, Step], bool],
    say: Say,
    force: bool = False,
    env_file: Path | None = None,
    state_dir: Path | None = None,
    reverse: bool = False,
    over_replica: bool = False,
) -> ApplyResult:
    """Run the migration, or resume the unfinished one. `ask` confirms the downtime (after the postpone gate).

    `over_replica` (a reverse run asked for by `migrate rollback`): only over the reverse replica; should it have
    broken since the rollback looked, refuse rather than go back in the shutdown mode unasked."""
    subj = subject(plan_path, reverse=reverse, state_dir=state_dir)
    plan, loaded = subj.plan, subj.loaded
    if reverse:
        require_forward_committed(plan_path, loaded.plan)
    prepare_secrets(plan, plan_path, env_file)
    plan = subj.plan = compose.resolve_mode(plan, plan_path, subj.journal_path, probe=True)
    if over_replica and plan.cutover.mode != "replicate":
        raise RunError(
            exit_codes.REFUSED,
            f"reverse replication broke before the way back began: nothing was changed; `migrate apply {plan_path} "
            "--reverse` carries the target's writes back in the shutdown mode, or pass --discard-target-writes",
        )
    steps = compose.steps_factory(plan)
    lock = PlanLock(subj.state_dir / "lock", "migrate apply")
    _acquire(lock)
    log = mlog.get_logger()
    try:
        if lock.stale_holder is not None:
            log.warning("took over a stale lock", left_by=lock.stale_holder.describe())
        journal = Journal(subj.journal_path)
        state = journal.state()
        back = None if reverse or state is None else reverse_state(plan_path, loaded.plan)
        if state is not None and back is not None and moved_back(state, back):
            # The service went to the target and came back: a new forward run starts from here.
            archive(state_dir_of(plan_path, loaded.plan.reversed(), None) / "journal.jsonl", back)
            archive(subj.journal_path, state)
            journal, state = Journal(subj.journal_path), None
            log.info("the service was moved back since the last run; starting a new run")
        if state is not None and state.status == RunStatus.COMPLETED:
            again = " --reverse" if reverse else ""
            message = f"run {state.run_id} completed; nothing to do (status: `migrate status {plan_path}{again}`)"
            return ApplyResult(ApplyEnd.NOTHING_TO_DO, state.run_id, message=message)
        if state is not None and state.status == RunStatus.ROLLED_BACK:
            archive(subj.journal_path, state)
            journal, state = Journal(subj.journal_path), None
        if state is not None and state.plan_sha256 != loaded.sha256 and not force:
            raise RunError(
                exit_codes.REFUSED,
                f"{plan_path}: the plan changed since run {state.run_id} began "
                f"({plan_diff(state.plan_text, loaded.text)}); restore it, or resume with --force",
            )

        def confirm(step: Step) -> bool:
            wait_out_old_ttl(JournalView.of(journal), log)  # the pre-syncs ran meanwhile: only what is left of it
            wait_while_postponed(plan, plan_path, step)
            with mlog.live_paused():  # a prompt must not be drawn over
                return ask(plan, step)

        engine = _engine(subj, steps, journal, confirm)
        order = [s.name for s in steps]

        def phase(lag: float | None) -> Phase:
            return phase_of(journal.state(), JournalView.of(journal), order, plan.cutover.max_write_block, lag)

        try:
            with mlog.live_phase(phase):
                outcome = _drive(engine, state, journal, subj.state_dir, say)
        finally:
            engine.interruptions.uninstall()
            compose.close_runtime(engine.rt)
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
        until = kept_until(final) if outcome == Outcome.COMPLETED and not reverse else None
        if until is not None:
            # The reverse path outlives the run: a detached `migrate finish --when-due` ends it when it falls due.
            pid = start_finisher(plan_path, env_file=env_file, state_dir=subj.state_dir)
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(until))
            result.message = (
                f"reverse replication kept until {when} (replication.keep_reverse): `migrate rollback {plan_path}` "
                f"moves back through it losing nothing; `migrate status {plan_path}` shows its lag; `migrate finish "
                f"{plan_path}` ends it now (`migrate finish --when-due`, pid {pid}, ends it then)"
            )
        audit = final.steps.get("audit") if outcome == Outcome.COMPLETED and final is not None else None
        if audit is not None and audit.result:
            audited = AuditResult.of(audit.result)
            summary = audited.summary()
            if summary:
                result.message = f"{result.message}; {summary}" if result.message else summary
            if audited.needs_attention:  # completed and committed, but the data was not proven equal
                result.end = ApplyEnd.NEEDS_ATTENTION
        if final is not None and final.status == RunStatus.FAILED_AFTER_COMMIT and final.error:
            # Committed (the target serves): one line saying what is left, e.g. "committed, DNS pending: …".
            result.message = final.error if final.error.startswith("committed") else f"committed; {final.error}"
        split = dns_where.end_problem(JournalView.of(journal), final, reverse=reverse)
        if split is not None and outcome in (Outcome.COMPLETED, Outcome.ROLLED_BACK):
            # The run did its part, but clients following DNS do not all reach the host that serves.
            log.error("the run ended with DNS not all at the host that serves", problem=split)
            result.end = ApplyEnd.NEEDS_ATTENTION
            said = f"needs attention: {split}; point every record at the host that serves"
            result.message = f"{said}; {result.message}" if result.message else said
        elif split is not None:
            result.message = f"{result.message}; also: {split}" if result.message else f"also: {split}"
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
    from orchestrator.report.build import build_report, render_report
    from orchestrator.report.html import write_report_and_page
    from orchestrator.run.rehearse import estimate_beside

    report = build_report(JournalView.of(journal))
    beside = estimate_beside(state_dir, report)  # the rehearsal's estimate, when there was one
    if beside:
        report["estimate"] = beside
    text = render_report(report) + "".join(f"\n{line}" for line in beside.get("lines", []))
    return secrets.redact(text), write_report_and_page(report, state_dir)


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
    prepare_secrets(plan, plan_path, env_file)
    plan = subj.plan = compose.resolve_mode(plan, plan_path, subj.journal_path, probe=False)
    steps = compose.steps_factory(plan)
    lock = PlanLock(subj.state_dir / "lock", "migrate rollback")
    _acquire(lock)
    try:
        journal = Journal(subj.journal_path)
        state = journal.state()
        if state is None:
            return RollbackResult(True, None, "no run to roll back")
        if state.status == RunStatus.ROLLED_BACK:
            return RollbackResult(True, state.run_id, f"run {state.run_id} is already rolled back")
        back = None if reverse else reverse_state(plan_path, loaded.plan)
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
            compose.close_runtime(engine.rt)
        final = journal.state() or state
        split = dns_where.end_problem(JournalView.of(journal), final, reverse=reverse)
        if outcome == Outcome.ROLLED_BACK and split is None:
            return RollbackResult(True, state.run_id, f"run {state.run_id} rolled back: the source serves as before")
        return RollbackResult(
            False,
            state.run_id,
            f"needs attention: {split}" if split else "",
            rows(final, steps),
            next_action(final, steps, reverse),
        )
    finally:
        lock.release()


def status(
    plan_path: Path,
    *,
    state_dir: Path | None = None,
    reverse: bool = False,
    live_dns: bool = True,
    env_file: Path | None = None,
) -> StatusReport:
    """Where the run stands, who runs it now, where every DNS record points (read live when the token is at hand,
    else the run's last reading), and — after a crash — what is blocked and what a resume would do."""
    subj = subject(plan_path, reverse=reverse, state_dir=state_dir)
    load_env(env_file)
    subj.plan = compose.resolve_mode(subj.plan, plan_path, subj.journal_path, probe=False)
    steps = compose.steps_factory(subj.plan)
    events = JournalView.read(subj.journal_path)
    state = events.state()
    holder = is_locked(subj.state_dir / "lock")
    flag = postpone_flag(subj.plan, plan_path)
    interruption = None
    if state is not None and holder is None:
        interruption = interruption_of(state, events, steps, subj.plan.cutover.max_write_block, reverse)
    report = StatusReport(
        plan_name=subj.plan.name,
        state=state,
        rows=rows(state, steps) if state is not None else [],
        plan_changed=state is not None and state.plan_sha256 != subj.loaded.sha256,
        holder=holder,
        postponed_by=flag if flag is not None and flag.exists() else None,
        next_action=next_action(state, steps, reverse),
        interruption=interruption,
        ttl_wait_until=ttl_wait_until(state) if state is not None else None,
    )
    report.replication = _replication_status(subj, state) or reverse_status(plan_path, state, reverse, state_dir)
    if state is not None:
        report.dns = dns_where.now(subj.plan, plan_path, events, live=live_dns)
        back = None if reverse else reverse_state(plan_path, subj.loaded.plan)
        serving = dns_where.serving_host(
            state, reverse=reverse, moved_back=back is not None and moved_back(state, back)
        )
        report.dns_problem = dns_where.problem(report.dns, serving)
        from orchestrator.report.build import reserve_report, run_events

        report.rollback_reserve = reserve_report(run_events(events))
    audit = state.steps.get("audit") if state is not None else None
    report.audit = AuditResult.of(audit.result).summary() if audit is not None and audit.result else None
    if live_dns:
        report.leftovers = _leftovers(subj, state)
    return report


def _leftovers(subj: Subject, state: RunState | None) -> list[str]:
    """What earlier runs of this plan left on the hosts (tunnels, rsync password files and daemons), read live
    (reads only): everything of this plan but the current run's while it is unfinished or keeps its reverse path.
    One line each; one line saying why when the hosts cannot be asked."""
    from orchestrator.services import owned

    ongoing = state is not None and (
        state.status not in (RunStatus.COMPLETED, RunStatus.ROLLED_BACK) or kept_until(state) is not None
    )
    keep = (owned.run_tag(state.run_id),) if ongoing and state is not None else ()
    key = owned.plan_key(subj.plan.name, subj.plan_path)
    # Both hosts at once, each connection bounded: a host out of reach costs `status` seconds, not a retry loop.
    plan = subj.plan.model_copy(
        update={
            side: getattr(subj.plan, side).model_copy(
                update={"connect_timeout": min(getattr(subj.plan, side).connect_timeout, LEFTOVERS_CONNECT_TIMEOUT)}
            )
            for side in ("source", "target")
        }
    )
    rt = compose.runtime_factory(plan, subj.plan_path, True)

    def ask(which: str) -> list[str]:
        try:
            sweep = owned.sweep_command(key, keep, end=False, base=getattr(plan, which).private_dir)
            result = rt.host(which).run(sweep, timeout=15, check=False)
        except Exception as exc:  # a host out of reach: status still says everything else
            return [f"what other runs left on the {which} was not checked: {' '.join(str(exc).split())[:200]}"]
        return [f"left by another run of this plan: {found.line(which)}" for found in owned.parse_sweep(result.stdout)]

    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            return [line for lines in pool.map(ask, ("source", "target")) for line in lines]
    finally:
        compose.close_runtime(rt)


REPLICA_STEPS = ("repl_replica", "repl_catchup", "repl_switch")
# How long `status` waits for each host's SSH connection when it looks for what other runs left there.
LEFTOVERS_CONNECT_TIMEOUT = 5.0


def _replication_status(subj: Subject, state: RunState | None) -> str | None:
    """The replica's lag, read live while the run is between the replica's start and the switch (reads only;
    needs the database password in the environment, else the last lag the run logged)."""
    if state is None or state.status in (RunStatus.COMPLETED, RunStatus.ROLLED_BACK):
        return None
    records = {name: state.steps[name] for name in REPLICA_STEPS if name in state.steps}
    if not any(rec.started_at is not None for rec in records.values()):
        return None  # no replica yet
    switch = records.get("repl_switch")
    if switch is not None and switch.state == StepState.DONE:
        return None  # promoted: no replica any more
    from orchestrator.steps.repl_common import replica_line

    rt = compose.runtime_factory(subj.plan, subj.plan_path, True)
    try:
        return replica_line(rt)
    except Exception as exc:  # the servers or the secret out of reach: the run's own last word on it
        logged = _last_logged_lag(subj.state_dir / f"run-{state.run_id}.log.jsonl")
        return logged or f"replica: cannot be read now ({exc})"
    finally:
        compose.close_runtime(rt)


def _last_logged_lag(log_path: Path) -> str | None:
    import json

    if not log_path.exists():
        return None
    for line in reversed(log_path.read_text(errors="replace").splitlines()[-2000:]):
        if '"repl.waiting_for_lag"' in line or '"repl.caught_up"' in line:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                fields = {k: v for k, v in record.items() if k not in ("event", "run_id", "step", "level", "logger")}
                return f"replica (the run's log, {record.get('timestamp', '')}): {record.get('event')} {fields}"
    return None
