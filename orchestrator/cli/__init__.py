"""The `migrate` command line: commands.py (the typer app), render.py (how results are drawn), support.py (the
consoles, shared options, an apply's outcome mapped to its exit code).

`main` is the console script's entry point (`orchestrator.cli:main` in pyproject.toml). It imports the commands when
called, so importing a helper of this package does not load the whole command line (and `python -m
orchestrator.cli.commands` does not import that module twice).
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    from orchestrator.cli.commands import main as run_main

    run_main(argv)
