"""The database engines a plan may name (`database.engine`), apart from their implementations: the plan's model
imports this module alone, so checking a plan loads no engine and no driver. `engines.ENGINES` maps each name to its
implementation (a test keeps the two in step)."""

from __future__ import annotations

from typing import Literal, get_args

EngineName = Literal["mariadb", "mysql"]
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)
