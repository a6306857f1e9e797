"""The `migrate` command line: the composition root that joins the plan, the engine, the steps and the runtime."""

from __future__ import annotations

import difflib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import structlog
import typer
from rich.console import Console
from rich.table import Table

from orchestrator import exit_codes
from orchestrator import logging as mlog
from orchestrator.engine.hooks import EVENTS, HookFailed, HookRunner
from orchestrator.engine.journal import Journal, RunState, RunStatus, StepState
from orchestrator.engine.lock import LockHeld, PlanLock, is_locked
from orchestrator.engine.machine import Engine, EngineConfig, Outcome
from orchestrator.engine.step import Step, StepContext
from orchestrator.plan.model import Plan, SecretRef
from orchestrator.secrets import SecretError, redact, resolve

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Move a web service (files + MySQL/MariaDB + Cloudflare DNS) to a new server with seconds of downtime.",
    pretty_exceptions_enable=False,
)


def _console(*, stderr: bool) -> Console:
    # Piped into a log or CI, rich would wrap everything at 80 columns: give tables room instead.
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=None if stream.isatty() else 200)


out = _console(stderr=False)
err = _console(stderr=True)


# The composition: which steps and which runtime a plan gets. Tests of the engine replace these.
def default_steps(plan: Plan) -> list[Step]:
    from orchestrator.steps import build_steps

    return build_steps(plan)


def default_runtime(plan: Plan, plan_path: Path, dry_run: bool) -> Any:
    from orchestrator.runtime import Runtime

    return Runtime(plan, plan_path, dry_run=dry_run)


steps_factory: Callable[[Plan], Sequence[Step]] = default_steps
runtime_factory: Callable[[Plan, Path, bool], Any] = default_runtime


class Exit(Exception):
    def __init__(self, code: int, message: str | None = None) -> None:
        super().__init__(message or "")
        self.code = code
        self.message = message


PlanArg = Annotated[Path, typer.Argument(help="the plan file (YAML)", show_default=False, metavar="PLAN")]
EnvFileOpt = Annotated[
    Path | None, typer.Option("--env-file", help="KEY=VALUE file loaded into the environment (secrets)")
]
StateDirOpt = Annotated[
    Path | None,
    typer.Option("--state-dir", help="where the journal, lock and logs live \\[default: <plan dir>/.migrate/<name>]"),
]
ReverseOpt = Annotated[
    bool,
    typer.Option(
        "--reverse",
        help="the reverse run (<name>-reverse): move the service back from the target to the source after the "
        "DNS flip, carrying the target's writes",
    ),
]


# --------------------------------------------------------------------------------------------------- helpers
def _load(plan_path: Path):  # -> LoadedPlan
    from orchestrator.plan.loader import PlanError, load_plan

    try:
        return load_plan(plan_path)
    except PlanError as exc:
        raise Exit(exit_codes.BAD_INPUT, "\n".join(getattr(exc, "lines", None) or [str(exc)])) from None


def _run_plan(loaded: Any, reverse: bool) -> Plan:
    """The plan a command drives: the file's, or its reversal (target back to source) with --reverse."""
    if not reverse:
        return loaded.plan
    problem = loaded.plan.reverse_problem()
    if problem is not None:
        raise Exit(exit_codes.BAD_INPUT, f"{loaded.path}: cannot reverse: {problem}")
    from pydantic import ValidationError

    try:
        return loaded.plan.reversed()
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        problem = str(first["msg"]).removeprefix("Value error, ")
        raise Exit(
            exit_codes.BAD_INPUT, f"{loaded.path}: the reversed plan is not valid: {where}: {problem}".rstrip(": ")
        ) from None


def _reverse_state(plan_path: Path, forward: Plan) -> RunState | None:
    """The state of the plan's reverse run, if it has one."""
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
        raise Exit(
            exit_codes.REFUSED,
            f"plan '{forward.name}': run {state.run_id} failed after its DNS flip; finish it first with "
            f"`migrate apply {plan_path}`, then reverse",
        )
    if state is None or state.status != RunStatus.COMPLETED:
        where = "has no run" if state is None else f"run {state.run_id} is {state.status.value}"
        raise Exit(
            exit_codes.REFUSED,
            f"plan '{forward.name}' {where}: nothing to reverse, the service never moved to the target "
            f"(a run that has not flipped DNS is undone with `migrate rollback {plan_path}`)",
        )
    holder = is_locked(sdir / "lock")
    if holder is not None:
        raise Exit(exit_codes.REFUSED, f"the forward run of plan '{forward.name}' is running: {holder.describe()}")


def _load_env_file(env_file: Path | None) -> None:
    if env_file is None:
        return
    try:
        lines = env_file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise Exit(exit_codes.BAD_INPUT, f"{env_file}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise Exit(exit_codes.BAD_INPUT, f"{env_file}: cannot read: not UTF-8 text") from None
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not key.strip().isidentifier():
            raise Exit(exit_codes.BAD_INPUT, f"{env_file}:{number}: expected KEY=VALUE")
        os.environ[key.strip()] = value.strip().strip("'\"")


def _secret_refs(obj: Any, path: str = "") -> Iterator[tuple[str, SecretRef]]:
    if isinstance(obj, SecretRef):
        yield path, obj
    elif hasattr(obj, "model_fields"):
        for name in type(obj).model_fields:
            yield from _secret_refs(getattr(obj, name), f"{path}.{name}" if path else name)
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from _secret_refs(item, f"{path}[{i}]")


def _resolve_secrets(plan: Plan, plan_path: Path) -> None:
    """Every referenced secret must be there before anything changes anywhere (and is registered for redaction)."""
    for field_path, ref in _secret_refs(plan):
        try:
            resolve(ref, plan_path.parent)
        except SecretError as exc:
            raise Exit(exit_codes.BAD_INPUT, f"{plan_path}: {field_path}: {exc}") from None


def _state_dir(plan_path: Path, plan: Plan, state_dir: Path | None) -> Path:
    return state_dir if state_dir is not None else plan_path.resolve().parent / ".migrate" / plan.name


def _hooks(plan: Plan, plan_path: Path) -> HookRunner:
    directory = Path(os.path.expanduser(plan.hooks.dir))
    if not directory.is_absolute():
        directory = plan_path.resolve().parent / directory
    return HookRunner(directory, timeout=plan.hooks.timeout, base_env={}, log=mlog.get_logger())


def _plan_diff(old: str, new: str) -> str:
    changed = [
        line
        for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    shown = "; ".join(" ".join(c.split()) for c in changed[:6])
    more = f" (+{len(changed) - 6} more)" if len(changed) > 6 else ""
    return shown + more


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}m"


def _next_action(state: RunState | None, steps: Sequence[Step], reverse: bool = False) -> str:
    text = _next_action_text(state, steps)
    return (
        text.replace("`migrate apply`", "`migrate apply --reverse`").replace(
            "`migrate rollback`", "`migrate rollback --reverse`"
        )
        if reverse
        else text
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


def _print_state(state: RunState, steps: Sequence[Step]) -> None:
    table = Table(title=f"run {state.run_id}: {state.status.value}", title_justify="left")
    for col in ("#", "step", "state", "duration", "note"):
        table.add_column(col)
    for i, step in enumerate(steps, 1):
        rec = state.step(step.name)
        note = rec.error or ""
        if rec.result.get("already_in_place"):
            note = "effect already in place"
        mark = " (commit point)" if step.commit_point else (" (downtime begins)" if step.begins_downtime else "")
        table.add_row(str(i), step.name + mark, rec.state.value, _fmt_duration(rec.duration), note[:120])
    out.print(table)


def _archive(journal_path: Path, state: RunState) -> None:
    history = journal_path.parent / "history"
    history.mkdir(exist_ok=True)
    journal_path.rename(history / f"{state.run_id}.journal.jsonl")


POSTPONE_REMINDER_SECONDS = 30.0


def _postpone_flag(plan: Plan, plan_path: Path) -> Path | None:
    if plan.cutover.postpone_flag is None:
        return None
    flag = Path(os.path.expanduser(plan.cutover.postpone_flag))
    return flag if flag.is_absolute() else plan_path.resolve().parent / flag


def _wait_while_postponed(plan: Plan, plan_path: Path, step: Step) -> None:
    """Hold the run before the downtime while the plan's postpone flag file exists (the operator says when)."""
    flag = _postpone_flag(plan, plan_path)
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


def _confirmer(plan: Plan, plan_path: Path, yes: bool) -> Callable[[Step], bool]:
    def confirm(step: Step) -> bool:
        _wait_while_postponed(plan, plan_path, step)
        if yes:
            return True
        if not sys.stdin.isatty():
            err.print("[yellow]the next step begins the downtime; confirm with --yes when not at a terminal[/]")
            return False
        err.print(
            f"[bold]Next: {step.title}.[/] This begins the downtime: writes to the service stop until the target "
            "serves."
        )
        return _typed_plan_name(plan, "to go on")

    return confirm


def _typed_plan_name(plan: Plan, purpose: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(f"Type the plan's name ({plan.name}) {purpose}: ").strip() == plan.name


def _install_signal_handlers() -> None:
    def to_interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, to_interrupt)
    # The operator's SSH session dropping must not leave writes blocked: treated as an interruption (roll back).
    signal.signal(signal.SIGHUP, to_interrupt)


def _engine(
    plan: Plan,
    plan_path: Path,
    loaded: Any,
    steps: Sequence[Step],
    journal: Journal,
    *,
    confirm: Callable[[Step], bool],
) -> Engine:
    return Engine(
        steps,
        journal,
        config=EngineConfig(str(plan_path), plan.name, loaded.sha256, loaded.text),
        rt=runtime_factory(plan, plan_path, False),
        hooks=_hooks(plan, plan_path),
        confirm=confirm,
        log=mlog.get_logger(),
    )


def _acquire(lock: PlanLock) -> None:
    try:
        lock.acquire()
    except LockHeld as exc:
        raise Exit(exit_codes.REFUSED, str(exc)) from None
    except OSError as exc:
        where = exc.filename or lock.path
        raise Exit(exit_codes.BAD_INPUT, f"state directory: cannot use {where}: {exc.strerror}") from None


def _close(rt: Any) -> None:
    close = getattr(rt, "close", None)
    if close is not None:
        close()


def _write_report(state_dir: Path, journal: Journal) -> Path:
    from orchestrator.report import build_report, render_report, write_report

    report = build_report(journal.events)
    path = write_report(report, state_dir)
    out.print(redact(render_report(report)), markup=False)
    out.print(f"report: {path}")
    return path


# -------------------------------------------------------------------------------------------------- commands
@app.command()
def validate(plan_path: PlanArg) -> None:
    """Check a plan: one line per problem with file:line:col, exit 2 when it is invalid."""
    loaded = _load(plan_path)
    steps = steps_factory(loaded.plan)
    out.print(f"{plan_path}: valid: plan '{loaded.plan.name}', {len(steps)} steps")


@app.command()
def schema() -> None:
    """Print the JSON Schema of the plan (for editors)."""
    from orchestrator.plan.loader import plan_json_schema

    out.print_json(json.dumps(plan_json_schema()))


@app.command()
def apply(
    plan_path: PlanArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask before the downtime begins")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="say what every step would do; change nothing")] = False,
    force: Annotated[bool, typer.Option("--force", help="resume even though the plan changed")] = False,
    env_file: EnvFileOpt = None,
    state_dir: StateDirOpt = None,
    reverse: ReverseOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug detail on the console")] = False,
) -> None:
    """Run the migration (or resume an unfinished one)."""
    mlog.configure(verbose=verbose)
    loaded = _load(plan_path)
    plan = _run_plan(loaded, reverse)
    if reverse:
        try:
            _require_forward_committed(plan_path, loaded.plan)
        except Exit as refused:
            if not dry_run:
                raise
            # A dry-run of the way back is a fine rehearsal before the forward run; it says what would refuse.
            out.print(f"note: {refused.message}; a real `apply --reverse` would refuse now", markup=False)
    _load_env_file(env_file)
    try:
        _resolve_secrets(plan, plan_path)
    except Exit as missing:
        if not dry_run:
            raise
        # A rehearsal contacts nothing, so it goes on; the real run would stop here.
        out.print(f"note: {missing.message}: a real run would stop here (exit {missing.code})", markup=False)
    steps = steps_factory(plan)
    sdir = _state_dir(plan_path, plan, state_dir)
    journal_path = sdir / "journal.jsonl"
    if dry_run:
        _dry_run(plan, plan_path, steps, journal_path)
        return
    _install_signal_handlers()
    lock = PlanLock(sdir / "lock", "migrate apply")
    _acquire(lock)
    log = mlog.get_logger()
    try:
        if lock.stale_holder is not None:
            log.warning("took over a stale lock", left_by=lock.stale_holder.describe())
        journal = Journal(journal_path)
        state = journal.state()
        back = None if reverse or state is None else _reverse_state(plan_path, loaded.plan)
        if state is not None and back is not None and _moved_back(state, back):
            # The service went to the target and came back: a new forward run starts from here.
            _archive(_state_dir(plan_path, loaded.plan.reversed(), None) / "journal.jsonl", back)
            _archive(journal_path, state)
            journal, state = Journal(journal_path), None
            log.info("the service was moved back since the last run; starting a new run")
        if state is not None and state.status == RunStatus.COMPLETED:
            again = " --reverse" if reverse else ""
            out.print(f"run {state.run_id} completed; nothing to do (status: `migrate status {plan_path}{again}`)")
            return
        if state is not None and state.status == RunStatus.ROLLED_BACK:
            _archive(journal_path, state)
            journal, state = Journal(journal_path), None
        if state is not None and state.plan_sha256 != loaded.sha256 and not force:
            raise Exit(
                exit_codes.REFUSED,
                f"{plan_path}: the plan changed since run {state.run_id} began "
                f"({_plan_diff(state.plan_text, loaded.text)}); restore it, or resume with --force",
            )
        engine = _engine(plan, plan_path, loaded, steps, journal, confirm=_confirmer(plan, plan_path, yes))
        try:
            outcome = _drive(engine, state, journal, sdir)
        finally:
            _close(engine.rt)
        final = journal.state()
        if outcome == Outcome.COMPLETED or (final and final.status == RunStatus.ROLLED_BACK):
            _write_report(sdir, journal)
        code = {
            Outcome.COMPLETED: exit_codes.OK,
            Outcome.ROLLED_BACK: exit_codes.FAILED,
            Outcome.DECLINED: exit_codes.REFUSED,
            Outcome.NEEDS_ATTENTION: exit_codes.NEEDS_ATTENTION,
        }[outcome]
        if code != exit_codes.OK and final is not None:
            _print_state(final, steps)
            err.print(f"next: {_next_action(final, steps, reverse)}")
        raise Exit(code)
    finally:
        lock.release()


def _drive(engine: Engine, state: RunState | None, journal: Journal, sdir: Path) -> Outcome:
    if state is None:
        state = engine.start_run()
        mlog.log_to_file(sdir / f"run-{state.run_id}.log.jsonl")
        out.print(f"run {state.run_id}: {len(engine.steps)} steps; journal {journal.path}")
        return engine.forward()
    mlog.log_to_file(sdir / f"run-{state.run_id}.log.jsonl")
    if state.status in (RunStatus.ROLLING_BACK, RunStatus.ROLLBACK_FAILED):
        out.print(f"run {state.run_id} has an unfinished rollback: resuming it")
        engine.resume_run()
        return engine.rollback(reason=state.rollback_reason or "resumed")
    out.print(f"run {state.run_id} is unfinished ({state.status.value}): resuming it")
    engine.resume_run()
    return engine.forward()


def _dry_run(plan: Plan, plan_path: Path, steps: Sequence[Step], journal_path: Path) -> None:
    """Describe every step. Reads nothing it would change; never opens the real run's journal for writing."""
    existing = Journal(journal_path).state() if journal_path.exists() else None
    out.print(f"[bold]dry-run of plan '{plan.name}'[/] ({plan_path}): nothing will be changed")
    if existing is not None and existing.status not in (RunStatus.COMPLETED, RunStatus.ROLLED_BACK):
        out.print(f"note: run {existing.run_id} is unfinished ({existing.status.value}); `apply` would resume it")
    rt = runtime_factory(plan, plan_path, True)
    hooks = _hooks(plan, plan_path)
    try:
        for i, step in enumerate(steps, 1):
            ctx = StepContext(
                run_id="dry-run", step=step.name, dry_run=True, rt=rt, log=mlog.get_logger(step=step.name)
            )
            flags = []
            if step.begins_downtime:
                flags.append("DOWNTIME BEGINS: asks for confirmation first")
                if plan.cutover.postpone_flag:
                    flags.append(f"waits while {plan.cutover.postpone_flag} exists")
            if step.commit_point:
                flags.append("COMMIT POINT: no automatic rollback after it")
            out.print(
                f"\n[bold]{i}. {step.title}[/] ({step.name})" + (f"  [yellow]{'; '.join(flags)}[/]" if flags else "")
            )
            for line in step.describe(ctx):
                out.print(f"   - {redact(line)}")
        fired = {event: [p.name for p in hooks.hooks_for(event)] for event in EVENTS}
        fired = {k: v for k, v in fired.items() if v}
        out.print("\nhooks: " + ("; ".join(f"{k}: {', '.join(v)}" for k, v in fired.items()) or "none"))
    finally:
        _close(rt)


@app.command()
def status(
    plan_path: PlanArg,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
    state_dir: StateDirOpt = None,
    reverse: ReverseOpt = False,
) -> None:
    """Where the run stands: each step's state and duration, and what the next action would be."""
    loaded = _load(plan_path)
    plan = _run_plan(loaded, reverse)
    steps = steps_factory(plan)
    sdir = _state_dir(plan_path, plan, state_dir)
    state = Journal(sdir / "journal.jsonl").state() if (sdir / "journal.jsonl").exists() else None
    holder = is_locked(sdir / "lock")
    if as_json:
        doc: dict[str, Any] = {
            "run": None,
            "next": _next_action(state, steps, reverse),
            "locked_by": holder.__dict__ if holder else None,
        }
        if state is not None:
            doc["run"] = {
                "run_id": state.run_id,
                "status": state.status.value,
                "committed": state.committed,
                "started_at": state.started_at,
                "ended_at": state.ended_at,
                "error": state.error,
                "steps": [
                    {
                        "name": s.name,
                        "state": state.step(s.name).state.value,
                        "duration": state.step(s.name).duration,
                        "error": state.step(s.name).error,
                    }
                    for s in steps
                ],
            }
        out.print_json(json.dumps(doc, default=str))
        return
    if state is None:
        out.print(f"plan '{plan.name}': no run yet")
    else:
        _print_state(state, steps)
        if state.plan_sha256 != loaded.sha256:
            out.print("[yellow]the plan file changed since this run began[/]")
    if holder is not None:
        out.print(f"running now: {holder.describe()}")
    flag = _postpone_flag(plan, plan_path)
    if flag is not None and flag.exists():
        out.print(f"the cut-over is postponed while {flag} exists: delete it to begin the downtime")
    out.print(f"next: {_next_action(state, steps, reverse)}")


@app.command()
def rollback(
    plan_path: PlanArg,
    discard_target_writes: Annotated[
        bool,
        typer.Option(
            "--discard-target-writes", help="after the DNS flip: point DNS back and lose what the target took"
        ),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for the plan's name")] = False,
    env_file: EnvFileOpt = None,
    state_dir: StateDirOpt = None,
    reverse: ReverseOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="debug detail on the console")] = False,
) -> None:
    """Undo the run: compensations in reverse order, so the source serves as before."""
    mlog.configure(verbose=verbose)
    loaded = _load(plan_path)
    plan = _run_plan(loaded, reverse)
    sdir = _state_dir(plan_path, plan, state_dir)
    if not (sdir / "journal.jsonl").exists():
        out.print(f"plan '{plan.name}' has no run: nothing to roll back")
        return
    _load_env_file(env_file)
    _resolve_secrets(plan, plan_path)
    steps = steps_factory(plan)
    _install_signal_handlers()
    lock = PlanLock(sdir / "lock", "migrate rollback")
    _acquire(lock)
    try:
        journal = Journal(sdir / "journal.jsonl")
        state = journal.state()
        if state is None:
            out.print("no run to roll back")
            return
        if state.status == RunStatus.ROLLED_BACK:
            out.print(f"run {state.run_id} is already rolled back")
            return
        back = None if reverse else _reverse_state(plan_path, loaded.plan)
        if back is not None:
            # Even a rolled-back reverse run has pre-synced the target's live data over the source's datadir and
            # trees: undoing the forward run would start the source on that copy.
            raise Exit(
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
            raise Exit(
                exit_codes.REFUSED,
                f"run {state.run_id} is past the DNS flip: the target has taken writes since, and rolling back would "
                f"lose them. {advice}",
            )
        if state.committed and not yes and not _typed_plan_name(plan, "to discard the target's writes"):
            raise Exit(exit_codes.REFUSED, "not confirmed (type the plan's name at a terminal, or pass --yes)")
        mlog.log_to_file(sdir / f"run-{state.run_id}.log.jsonl")
        engine = _engine(plan, plan_path, loaded, steps, journal, confirm=lambda _step: True)
        structlog.contextvars.bind_contextvars(run_id=state.run_id)
        try:
            outcome = engine.rollback(reason=state.rollback_reason or "requested by the operator")
        finally:
            _close(engine.rt)
        if outcome == Outcome.ROLLED_BACK:
            out.print(f"run {state.run_id} rolled back: the source serves as before")
            raise Exit(exit_codes.OK)
        final = journal.state()
        if final is not None:
            _print_state(final, steps)
            err.print(f"next: {_next_action(final, steps, reverse)}")
        raise Exit(exit_codes.NEEDS_ATTENTION)
    finally:
        lock.release()


def _mount_lab() -> None:
    try:
        from orchestrator.lab.cli import lab_app
    except ImportError:
        return
    app.add_typer(lab_app, name="lab", help="the local lab: two servers, a Cloudflare double, a live service")


_mount_lab()


def _is_usage_error(exc: Exception) -> bool:
    # Click's ClickException, whether typer vendors click or depends on it: both carry format_message().
    return callable(getattr(exc, "format_message", None)) and hasattr(exc, "exit_code")


def main(argv: list[str] | None = None) -> None:
    code: object = None
    try:
        # Outside standalone mode a `typer.Exit(n)` raised by a command comes back as the return value.
        code = app(args=argv, standalone_mode=False)
    except Exit as exc:
        if exc.message:
            err.print(redact(exc.message), markup=False)
        sys.exit(exc.code)
    except HookFailed as exc:
        err.print(redact(str(exc)), markup=False)
        sys.exit(exit_codes.FAILED)
    except (KeyboardInterrupt, EOFError, typer.Abort):
        err.print("interrupted")
        sys.exit(exit_codes.INTERRUPTED)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        if _is_usage_error(exc):
            if type(exc).__name__ != "NoArgsIsHelpError":  # the help was printed: that is the message
                err.print(f"error: {exc.format_message()} (see --help)", markup=False)  # type: ignore[attr-defined]
            sys.exit(exit_codes.BAD_INPUT)
        mlog.get_logger().error("internal error", exc_info=exc)
        detail = redact(" ".join(str(exc).split()))[:300] or type(exc).__name__
        err.print(
            f"internal error ({type(exc).__name__}): {detail}; `migrate status` shows the run's state", markup=False
        )
        sys.exit(exit_codes.INTERNAL)
    sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else exit_codes.OK)


if __name__ == "__main__":
    main()
