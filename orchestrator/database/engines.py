"""The one factory of database engines: the plan's `database.engine` → its implementation (a `Database`).

`ENGINES` maps every engine a plan may name (`names.EngineName`, which the plan's model accepts and nothing else:
one line with file:line:col otherwise) to the module that implements it. A second engine is a sibling module of
`mariadb.py` with an `open_database(name, *, meter)`, its name added to `EngineName` and its line here. Each engine
is imported only when a run first needs it: a plan check or a dry-run does not load its driver.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

from orchestrator.database.names import EngineName

if TYPE_CHECKING:
    from orchestrator.database.protocol import Database
    from orchestrator.plan.model import Plan
    from orchestrator.transports.meter import RoundTrips

# Engine name (as a plan spells it) → the module implementing it. MySQL speaks MariaDB's protocol and SQL here.
ENGINES: dict[EngineName, str] = {
    "mariadb": "orchestrator.database.mariadb",
    "mysql": "orchestrator.database.mariadb",
    "postgresql": "orchestrator.database.postgresql",
}


def engine_problem(name: str) -> str | None:
    """Why a plan cannot name this engine, or None when the registry knows it."""
    if name in ENGINES:
        return None
    return f"unknown database engine {name!r} (known: {', '.join(sorted(ENGINES))})"


def open_engine(name: str, *, meter: RoundTrips | None = None) -> Database:
    """The engine registered under `name`; its sessions' statements counted on `meter`."""
    problem = engine_problem(name)
    if problem is not None:
        raise ValueError(problem)
    module = importlib.import_module(ENGINES[cast(EngineName, name)])
    return cast("Database", module.open_database(name, meter=meter))


def open_database(plan: Plan, *, meter: RoundTrips | None = None) -> Database:
    """The engine the plan's `database.engine` names, told the plan's database section (PostgreSQL connects to the
    database `schemas` names)."""
    database = open_engine(plan.database.engine, meter=meter)
    database.configure(plan.database)
    return database
