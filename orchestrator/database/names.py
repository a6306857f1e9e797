"""The database engines a plan may name (`database.engine`), apart from their implementations: the plan's model
imports this module alone, so checking a plan loads no engine and no driver. `engines.ENGINES` maps each name to its
implementation (a test keeps the two in step)."""

from __future__ import annotations

from typing import Literal, get_args

EngineName = Literal["mariadb", "mysql", "postgresql"]
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)
# The engines the replicate cut-over mode runs on (MariaDB: mariadb-backup and GTID replication; PostgreSQL:
# pg_basebackup and a streaming standby); the others (mysql): shutdown only.
REPLICATE_ENGINES: tuple[str, ...] = ("mariadb", "postgresql")


def replicate_refusal(engine: str) -> str | None:
    """Why the replicate mode cannot run on this engine (one line), None when it can."""
    if engine in REPLICATE_ENGINES:
        return None
    return (
        f"the replicate mode runs on MariaDB and PostgreSQL only (database.engine {engine}): use cutover.mode shutdown"
    )
