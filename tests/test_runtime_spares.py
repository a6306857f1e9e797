"""The database connections kept for the window (Runtime.keep_spare): as many as asked, each handed out once, and
handed out without its ping when the caller's first statement is the check (no real database needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.plan.loader import load_plan
from orchestrator.runtime import Runtime

PLAN_FILE = Path(__file__).resolve().parents[1] / "plans" / "course-review.yaml"


class FakeConnection:
    def __init__(self, number: int) -> None:
        self.number = number
        self.pings = 0
        self._read_timeout: float | None = None
        self._write_timeout: float | None = None

    def ping(self, reconnect: bool = False) -> None:
        self.pings += 1

    def close(self) -> None:
        pass


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Runtime:
    rt = Runtime(load_plan(PLAN_FILE).plan, PLAN_FILE)
    opened: list[FakeConnection] = []

    def new_db(which: str, **_: Any) -> FakeConnection:
        opened.append(FakeConnection(len(opened)))
        return opened[-1]

    monkeypatch.setattr(rt, "_new_db", new_db)
    rt.opened = opened  # type: ignore[attr-defined]  # the test's view of what was opened
    return rt


def test_keep_spare_keeps_as_many_connections_as_asked(runtime: Runtime) -> None:
    runtime.keep_spare("target", 2)
    opened = runtime.opened  # type: ignore[attr-defined]
    assert len(opened) == 2
    first, second = runtime.db("target"), runtime.db("target")
    assert {first, second} == set(opened)  # two spares, each handed out once
    assert len(opened) == 2
    runtime.db("target")
    assert len(opened) == 3  # none left: a new connection


def test_a_spare_handed_out_unpinged_costs_no_round_trip(runtime: Runtime) -> None:
    runtime.keep_spare("source", 1)
    conn: Any = runtime.db("source", ping_spare=False)
    assert conn.pings == 0
    runtime.keep_spare("source", 1)
    conn = runtime.db("source")
    assert conn.pings == 1


class StatementLog:
    """A PostgreSQL session as the engine's statements see it: each statement recorded, each answered with one row."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, Any]] = []

    def cursor(self) -> StatementLog:
        return self

    def __enter__(self) -> StatementLog:
        return self

    def __exit__(self, *_: Any) -> None:
        pass

    def execute(self, query: str, args: Any = None) -> None:
        self.statements.append((query, args))

    def fetchone(self) -> tuple[str]:
        return ("5000",)


def test_a_postgresql_spare_is_revived_in_one_statement_that_sets_its_bound() -> None:
    """Inside the window each statement is a round trip: taking a spare must not cost the four of a bounded ping
    (read the old bound, set it, ping, put it back) before the caller's own statement."""
    from orchestrator.database.postgresql import PostgreSql

    session = StatementLog()
    PostgreSql().revive(session, 5.0)  # type: ignore[arg-type]  # the statements are what is looked at
    assert session.statements == [("SELECT set_config('statement_timeout', %s, false)", ("5000",))]
