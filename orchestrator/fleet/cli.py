"""`migrate fleet apply|status|report|validate|schema|confirm` and `migrate worker`: mounted by
orchestrator/cli/commands.py.

Errors leave as `run.RunError(code, message)`, which the main command line prints as one line and exits with.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from orchestrator import exit_codes
from orchestrator.fleet.loader import LoadedFleet, fleet_json_schema, load_fleet
from orchestrator.fleet.schedule import FleetEnd
from orchestrator.plan.loader import PlanError
from orchestrator.run.results import RunError

fleet_app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

FleetArg = Annotated[Path, typer.Argument(help="the fleet file (YAML)", show_default=False, metavar="FLEET")]
TemporalOpt = Annotated[
    str | None,
    typer.Option("--temporal", metavar="HOST:PORT", help="run on Temporal: the fleet a workflow, plans activities"),
]


def _say(line: str) -> None:
    typer.echo(line)


def _load(path: Path) -> LoadedFleet:
    try:
        return load_fleet(path)
    except PlanError as exc:
        raise RunError(exit_codes.BAD_INPUT, "\n".join(exc.lines)) from None


def _ask(prompt: str, expected: str) -> bool:
    return input(f"{prompt} ({expected}): ").strip() == expected


@fleet_app.command()
def validate(fleet_path: FleetArg) -> None:
    """Check a fleet file and every plan it names: one line per problem with file:line:col, exit 2 when invalid."""
    loaded = _load(fleet_path)
    waves = loaded.fleet.wave_list()
    _say(f"{fleet_path}: valid: fleet '{loaded.fleet.name}', {len(loaded.members)} plans in {len(waves)} waves")


@fleet_app.command()
def schema() -> None:
    """Print the JSON Schema of the fleet file (for editors)."""
    _say(json.dumps(fleet_json_schema(), indent=2))


@fleet_app.command()
def apply(
    fleet_path: FleetArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="confirm every plan's window now")] = False,
    temporal: TemporalOpt = None,
) -> None:
    """Run the fleet (or resume it): each plan exactly as `migrate apply` runs it, in waves, within the limits."""
    from orchestrator.fleet import embedded

    loaded = _load(fleet_path)
    fleet = loaded.fleet
    at_terminal = sys.stdin.isatty()
    confirmed_all = yes
    if not yes and fleet.confirm == "once":
        if not at_terminal:
            raise RunError(exit_codes.REFUSED, "the fleet's windows need a confirmation: --yes when not at a terminal")
        confirmed_all = _ask(f"Every plan of fleet '{fleet.name}' will block writes in its window. Type its name",
                             fleet.name)  # fmt: skip
        if not confirmed_all:
            raise RunError(exit_codes.REFUSED, "not confirmed: nothing was started")
    if temporal:
        from orchestrator.fleet.temporal import run_fleet

        def on_temporal() -> int:
            record = embedded.FleetRecord(loaded.state_dir)
            spec = embedded.spec_of(loaded)
            result = asyncio.run(run_fleet(temporal, spec, record.ended(loaded), confirmed_all=confirmed_all, say=_say))
            for end in result.ended.values():
                record.append("plan_ended", plan=end.name, exit_code=end.exit_code, run_id=end.run_id,
                              status=end.status)  # fmt: skip
            return _ended(result, embedded.exit_code(result))

        _leave_after_temporal(on_temporal)
    confirm = None
    if not confirmed_all:  # confirm: each, at a terminal
        if not at_terminal:
            raise RunError(exit_codes.REFUSED, "confirm: each needs a terminal to ask at, or --yes")

        async def confirm(name: str) -> bool:
            prompt = f"Plan '{name}' starts now; its window blocks writes. Type its name"
            return await asyncio.get_running_loop().run_in_executor(None, _ask, prompt, name)

    try:
        result = embedded.apply(loaded, say=_say, confirm=confirm)
    except embedded.FleetRefused as exc:
        raise RunError(exit_codes.REFUSED, str(exc)) from None
    raise typer.Exit(_ended(result, embedded.exit_code(result)))


def _ended(result: FleetEnd, code: int) -> int:
    done = sum(1 for e in result.ended.values() if e.ok)
    _say(f"fleet: {done} of {len(result.ended) + len(result.not_started)} plans completed")
    for end in result.ended.values():
        if not end.ok:
            _say(f"  {end.name}: exit {end.exit_code} ({end.status or 'no run'}) {end.message}".rstrip())
    if result.stopped:
        _say(f"stopped: {result.stopped}; not started: {', '.join(result.not_started) or 'none'}")
    return code


@fleet_app.command()
def status(
    fleet_path: FleetArg, as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False
) -> None:
    """Every plan's state and next action, read from its journal."""
    from orchestrator.fleet.status import fleet_status

    report = fleet_status(_load(fleet_path))
    if as_json:
        _say(json.dumps(report.as_dict(), indent=2))
        return
    if report.stopped:
        _say(f"fleet '{report.name}' stopped: {report.stopped}")
    for line in report.plans:
        where = f" at {line.step}" if line.step else ""
        run = f" run {line.run_id}" if line.run_id else ""
        _say(f"wave {line.wave}  {line.name:<20} {line.state}{where}{run}")
        _say(f"         next: {line.next_action}")


@fleet_app.command()
def report(
    fleet_path: FleetArg,
    clients_dir: Annotated[
        Path | None,
        typer.Option("--clients-dir", help="a directory of `<plan>.json` reports of `migrate lab verify --json`"),
    ] = None,
) -> None:
    """Write the fleet's page (HTML, self-contained): every plan's figures and timeline side by side."""
    from orchestrator.fleet.page import write_page

    _say(str(write_page(_load(fleet_path), clients_dir)))


@fleet_app.command()
def confirm(
    fleet_path: FleetArg,
    plan: Annotated[str, typer.Argument(help="the plan's name in the fleet")],
    temporal: TemporalOpt = None,
) -> None:
    """On Temporal, with `confirm: each`: let the plan's window begin."""
    loaded = _load(fleet_path)
    if plan not in loaded.fleet.plan_names():
        raise RunError(exit_codes.BAD_INPUT, f"{fleet_path}: no plan named '{plan}'")
    if not temporal:
        raise RunError(exit_codes.BAD_INPUT, "confirm is for a fleet on Temporal: give --temporal HOST:PORT")
    from orchestrator.fleet.temporal import confirm_plan

    def on_temporal() -> int:
        asyncio.run(confirm_plan(temporal, loaded.fleet.name, plan))
        _say(f"plan '{plan}' confirmed")
        return exit_codes.OK

    _leave_after_temporal(on_temporal)


def worker(
    temporal: Annotated[str, typer.Option("--temporal", metavar="HOST:PORT", help="the Temporal server's frontend")],
) -> None:
    """Run fleets' plans for a Temporal server: the fleet workflow and the plan activity (each a `migrate apply`)."""
    from orchestrator.fleet.temporal import serve

    def on_temporal() -> int:
        asyncio.run(serve(temporal, say=_say))
        return exit_codes.OK

    _leave_after_temporal(on_temporal)


def _leave_after_temporal(work: Callable[[], int]) -> NoReturn:
    """Run `work` (which talks to Temporal), print its error as one line, and end the process at once.

    The SDK's Rust core keeps threads that may call into Python while the interpreter finalizes, which aborts the
    process (SIGABRT, "PyGILState_Release") after a failed connection: so no finalization — output flushed, then
    `os._exit` with the command's exit code."""
    from orchestrator.fleet.temporal import TemporalError

    code = exit_codes.INTERNAL
    try:
        code = work()
    except TemporalError as exc:
        typer.echo(str(exc), err=True)
        code = exit_codes.FAILED
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        code = exit_codes.INTERRUPTED
    except Exception as exc:
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        typer.echo(f"internal error ({type(exc).__name__}): {detail}", err=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
