"""What the `migrate` command itself answers (`--version`, bare `migrate`) and the lab's commands, mounted when the lab
distribution is installed beside the orchestrator (a source checkout's `make venv`), else one line saying how to get it.
"""

from __future__ import annotations

import platform
from importlib import metadata
from typing import Annotated

import typer

from orchestrator import exit_codes
from orchestrator.cli.support import Exit, out

PACKAGE = "migrate"
# The libraries whose behaviour a run depends on, as an operator would quote them in a report.
LIBRARIES = ("asyncssh", "cryptography", "cloudflare", "pymysql", "psycopg", "temporalio")
LAB_HELP = "the local lab: two servers, a Cloudflare double, a live service"
LAB_MISSING = (
    "the lab is not installed: it is the distribution in lab/ of migrate's source repository"
    " (`pip install ./lab` from a clone, or `make venv` there)"
)


def installed(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def version_lines(verbose: bool) -> list[str]:
    head = f"migrate {installed(PACKAGE)}"
    if not verbose:
        return [head]
    return [head, f"python {platform.python_version()}", *(f"{name} {installed(name)}" for name in LIBRARIES)]


def root(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", help="print the version (with -v: of Python and the libraries too)")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="with --version: the versions it runs on")] = False,
) -> None:
    if version:
        for line in version_lines(verbose):
            out.print(line, markup=False, highlight=False)
        raise Exit(exit_codes.OK)
    if ctx.invoked_subcommand is None:
        out.print(ctx.get_help(), markup=False, highlight=False)
        raise Exit(exit_codes.BAD_INPUT)


def lab_missing(ctx: typer.Context) -> None:
    raise Exit(exit_codes.BAD_INPUT, f"error: {LAB_MISSING}")


def mount(app: typer.Typer) -> None:
    app.callback(invoke_without_command=True)(root)
    try:
        from migrate_lab.cli import lab_app
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("migrate_lab"):
            raise
        extra = {"allow_extra_args": True, "ignore_unknown_options": True}
        app.command(name="lab", help=LAB_HELP, context_settings=extra)(lab_missing)
        return
    app.add_typer(lab_app, name="lab", help=LAB_HELP)
