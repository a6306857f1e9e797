"""The `migrate` command line: parses arguments, hands them to orchestrator/run, prints what comes back (through
cli_render and cli_support) and maps it to an exit code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from orchestrator import exit_codes, run
from orchestrator.cli import render, root
from orchestrator.cli.support import (
    EnvFileOpt,
    Exit,
    JsonOpt,
    PlanArg,
    ReverseOpt,
    StateDirOpt,
    VerboseOpt,
    applied,
    ask_before_downtime,
    err,
    is_usage_error,
    out,
    print_rows,
    say,
    typed_plan_name,
)
from orchestrator.engine.hooks import HookFailed
from orchestrator.output import logging as mlog
from orchestrator.redaction import printable, redact
from orchestrator.run import compose
from orchestrator.run.watch import watch as watch_run

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help=(
        "Move a web service (uploaded files, a MariaDB/MySQL or PostgreSQL database, its Cloudflare name) to new"
        " servers with writes paused for a fraction of a second and nothing lost: validate, rehearse, apply."
    ),
    pretty_exceptions_enable=False,
)


# -------------------------------------------------------------------------------------------------- commands
@app.command()
def validate(plan_path: PlanArg) -> None:
    """Check a plan: one line per problem with file:line:col, exit 2 when it is invalid."""
    loaded = run.load(plan_path)
    steps = compose.steps_factory(loaded.plan)
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
    no_estimate: Annotated[
        bool,
        typer.Option(
            "--no-estimate",
            help="with --dry-run: contact no host (no read-only estimate of bytes, durations and the window)",
        ),
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="resume even though the plan changed")] = False,
    env_file: EnvFileOpt = None,
    state_dir: StateDirOpt = None,
    reverse: ReverseOpt = False,
    verbose: VerboseOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Run the migration (or resume an unfinished one): live bars and a phase line on a terminal, lines otherwise."""
    mlog.configure(verbose=verbose, output="json" if as_json else "auto")
    if dry_run:
        described = run.describe(
            plan_path, env_file=env_file, state_dir=state_dir, reverse=reverse, estimate=not no_estimate
        )
        render.print_description(out, described)
        return
    result = run.apply(
        plan_path,
        ask=ask_before_downtime(yes),
        say=say,
        force=force,
        env_file=env_file,
        state_dir=state_dir,
        reverse=reverse,
    )
    raise Exit(applied(result))


@app.command()
def status(
    plan_path: PlanArg,
    as_json: JsonOpt = False,
    watch: Annotated[
        bool, typer.Option("--watch", help="follow the running apply until it ends; exit with its outcome")
    ] = False,
    state_dir: StateDirOpt = None,
    reverse: ReverseOpt = False,
    env_file: EnvFileOpt = None,
) -> None:
    """Where the run stands: each step's state and duration, where every DNS record points, and the next action."""
    if watch:
        raise Exit(_watch(plan_path, as_json=as_json, state_dir=state_dir, reverse=reverse))
    report = run.status(plan_path, state_dir=state_dir, reverse=reverse, env_file=env_file)
    if as_json:
        out.print_json(json.dumps(report.as_dict(), default=str))
        return
    render.print_status(out, report)


def _watch(plan_path: Path, *, as_json: bool, state_dir: Path | None, reverse: bool) -> int:
    last = render.follow(out, watch_run(plan_path, state_dir=state_dir, reverse=reverse), as_json=as_json)
    return last.exit_code if last is not None and last.exit_code is not None else exit_codes.OK


@app.command()
def report(
    plan_path: PlanArg,
    open_browser: Annotated[bool, typer.Option("--open", help="open the page in a browser")] = False,
    clients: Annotated[
        Path | None, typer.Option("--clients", help="a `migrate lab verify --json` report to show")
    ] = None,
) -> None:
    """Write the page of the plan's latest run (HTML, self-contained) and print where it is."""
    from orchestrator.report.html import ReportError, report_command

    try:
        page = report_command(plan_path, open_browser, clients)
    except ReportError as exc:
        raise Exit(exit_codes.BAD_INPUT, str(exc)) from None
    out.print(str(page))


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
    verbose: VerboseOpt = False,
) -> None:
    """Undo the run: compensations in reverse order, so the source serves as before. After the DNS flip of a
    replicate run whose reverse replication is healthy: a reverse cut-over through it, losing nothing."""
    mlog.configure(verbose=verbose)
    route = run.rollback_route(
        plan_path, discard_target_writes=discard_target_writes, reverse=reverse, env_file=env_file, state_dir=state_dir
    )
    if route is not None:
        out.print(route)
        outcome = run.apply(
            plan_path, ask=ask_before_downtime(yes), say=say, env_file=env_file, reverse=True, over_replica=True
        )
        raise Exit(applied(outcome))
    result = run.rollback(
        plan_path,
        discard_target_writes=discard_target_writes,
        confirmed=lambda plan: yes or typed_plan_name(plan, "to discard the target's writes"),
        env_file=env_file,
        state_dir=state_dir,
        reverse=reverse,
    )
    if result.rolled_back:
        out.print(result.message)
        raise Exit(exit_codes.OK)
    if result.message:
        err.print(result.message)
    print_rows(f"run {result.run_id}: needs attention", result.rows)
    err.print(f"next: {result.next_action}")
    raise Exit(exit_codes.NEEDS_ATTENTION)


@app.command()
def finish(
    plan_path: PlanArg,
    when_due: Annotated[
        bool,
        typer.Option("--when-due", help="wait until replication.keep_reverse runs out (what apply starts detached)"),
    ] = False,
    env_file: EnvFileOpt = None,
    state_dir: StateDirOpt = None,
) -> None:
    """End now the reverse path a completed replicate run keeps (replication.keep_reverse): replication stopped
    and forgotten on both sides, tunnels closed. Afterwards the way back is `migrate apply --reverse`."""
    mlog.configure()
    if when_due:
        out.print(run.finish_when_due(plan_path, env_file=env_file, state_dir=state_dir))
        return
    out.print(run.end_reverse_path(plan_path, env_file=env_file, state_dir=state_dir))


@app.command()
def rehearse(
    plan_path: PlanArg,
    for_real: Annotated[
        bool,
        typer.Option("--for-real", help="pre-sync, start the target fenced on a copy, check it (source only read)"),
    ] = False,
    clean: Annotated[bool, typer.Option("--clean", help="with --for-real: leave the target empty, not warm")] = False,
    env_file: EnvFileOpt = None,
    state_dir: StateDirOpt = None,
) -> None:
    """Estimate what the migration would move and how long, and predict the window (reads and rsync dry-runs);
    with --for-real, do everything up to the window on the target and time it."""
    from orchestrator.run import rehearse as rehearsal

    if for_real:
        performed = rehearsal.rehearse_for_real(plan_path, clean=clean, env_file=env_file, state_dir=state_dir)
        for line in performed.lines():
            out.print(redact(line), markup=False)
        raise Exit(exit_codes.FAILED if performed.failures else exit_codes.OK)
    for line in rehearsal.lines(rehearsal.rehearse(plan_path, env_file=env_file, state_dir=state_dir)):
        out.print(redact(line), markup=False)


root.mount(app)
from orchestrator.fleet.cli import fleet_app, worker  # noqa: E402 (the fleet's commands, in their own module)

app.add_typer(fleet_app, name="fleet", help="many plans in waves: embedded, or on Temporal with --temporal")
app.command()(worker)


def main(argv: list[str] | None = None) -> None:
    code: object = None
    try:
        # Outside standalone mode a `typer.Exit(n)` raised by a command comes back as the return value.
        code = app(args=argv, standalone_mode=False)
    except (Exit, run.RunError) as exc:
        if exc.message:
            err.print(printable(redact(exc.message)))
        sys.exit(exc.code)
    except HookFailed as exc:
        err.print(printable(redact(str(exc))))
        sys.exit(exit_codes.FAILED)
    except (KeyboardInterrupt, EOFError, typer.Abort):
        err.print("interrupted")
        sys.exit(exit_codes.INTERRUPTED)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        if is_usage_error(exc):
            if type(exc).__name__ != "NoArgsIsHelpError":  # the help was printed: that is the message
                err.print(f"error: {exc.format_message()} (see --help)")  # type: ignore[attr-defined]  # click's, see is_usage_error
            sys.exit(exit_codes.BAD_INPUT)
        mlog.record_defect(exc)
        detail = redact(" ".join(str(exc).split()))[:300] or type(exc).__name__
        err.print(f"internal error ({type(exc).__name__}): {detail}; `migrate status` shows the run's state")
        sys.exit(exit_codes.INTERNAL)
    sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else exit_codes.OK)


if __name__ == "__main__":
    main()
