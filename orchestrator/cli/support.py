"""What the `migrate` command line shares between its commands: the two consoles, the options several commands take,
the question before the downtime, and how an apply's outcome is printed and mapped to an exit code.

Nothing user-supplied is ever read as console markup or emoji: both consoles print text as it is (names, paths and
values may contain `[red]`, `[/]` or `:smile:`), and table cells are plain `Text`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from orchestrator import exit_codes, run
from orchestrator.cli import render
from orchestrator.engine.step import Step
from orchestrator.plan.model import Plan


def _console(*, stderr: bool) -> Console:
    # Piped into a log or CI, rich would wrap everything at 80 columns: give tables room instead.
    stream = sys.stderr if stderr else sys.stdout
    return Console(
        stderr=stderr,
        markup=False,
        emoji=False,
        highlight=False,
        soft_wrap=True,
        width=None if stream.isatty() else 200,
    )


out = _console(stderr=False)
err = _console(stderr=True)


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
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="debug detail on the console")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable: JSON lines (the console log as records)")]


def print_rows(title: str, rows: list[run.StepRow]) -> None:
    out.print(render.rows_table(title, rows))


def say(line: str) -> None:
    out.print(line)


def typed_plan_name(plan: Plan, purpose: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(f"Type the plan's name ({plan.name}) {purpose}: ").strip() == plan.name


def ask_before_downtime(yes: bool) -> Callable[[Plan, Step], bool]:
    def ask(plan: Plan, step: Step) -> bool:
        if yes:
            return True
        if not sys.stdin.isatty():
            err.print(Text("the next step begins the downtime; confirm with --yes when not at a terminal", "yellow"))
            return False
        err.print(Text.assemble((f"Next: {step.title}.", "bold"), " This begins the downtime: writes to the service "
                                "stop until the target serves."))  # fmt: skip
        return typed_plan_name(plan, "to go on")

    return ask


def applied(result: run.ApplyResult) -> int:
    """Print an apply's outcome; its exit code."""
    if result.message:
        out.print(result.message)
    if result.report_text is not None:
        out.print(result.report_text)
        out.print(f"report: {result.report_path}")
    code = {
        run.ApplyEnd.COMPLETED: exit_codes.OK,
        run.ApplyEnd.NOTHING_TO_DO: exit_codes.OK,
        run.ApplyEnd.ROLLED_BACK: exit_codes.FAILED,
        run.ApplyEnd.DECLINED: exit_codes.REFUSED,
        run.ApplyEnd.NEEDS_ATTENTION: exit_codes.NEEDS_ATTENTION,
    }[result.end]
    if code != exit_codes.OK and result.rows:
        print_rows(f"run {result.run_id}: {result.end.value}", result.rows)
        err.print(f"next: {result.next_action}")
    return code


def is_usage_error(exc: Exception) -> bool:
    # Click's ClickException, whether typer vendors click or depends on it: both carry format_message().
    return callable(getattr(exc, "format_message", None)) and hasattr(exc, "exit_code")
