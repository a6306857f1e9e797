"""The database seam, offline: the engine chosen by `database.engine` through one registry and factory, a plan
naming an engine the registry does not know refused with one line, and the driver's errors leaving a session as
the one DatabaseError (still their driver's class inside the engine's own SQL modules)."""

from __future__ import annotations

import ast
import socket
import typing
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
import structlog

from orchestrator.database import engines, mariadb, postgresql
from orchestrator.database.mysql import session as mysql
from orchestrator.database.names import EngineName
from orchestrator.database.protocol import Database, DatabaseError
from orchestrator.plan.loader import PlanError, load_plan
from orchestrator.plan.model import Database as DatabaseSection
from orchestrator.plan.model import static_mode
from orchestrator.runtime import DatabaseUnreachable, Runtime
from orchestrator.transports.meter import RoundTrips
from orchestrator.transports.ssh import TransportError
from tests.fakes import plan

PLAN_FILE = Path(__file__).resolve().parents[1] / "plans" / "course-review.yaml"


def offline_session(failing: BaseException | None = None) -> pymysql.Connection:
    """A real pymysql connection never connected (every statement fails as on a closed one), or one whose every
    statement fails with `failing` as the server would answer it."""
    conn = pymysql.connect(host="127.0.0.1", user="nobody", defer_connect=True, autocommit=True)
    if failing is not None:

        def refused(sql: str | bytes, unbuffered: bool = False) -> int:
            raise failing

        conn.query = refused  # type: ignore[method-assign]  # the server's answer, without a server
    return conn


# --- the registry and the factory ---------------------------------------------------------------------------------


def test_the_plan_accepts_exactly_the_engines_the_registry_opens() -> None:
    accepted = typing.get_args(DatabaseSection.model_fields["engine"].annotation)
    assert accepted == typing.get_args(EngineName) == ("mariadb", "mysql", "postgresql")
    assert set(engines.ENGINES) == set(accepted)
    meter = RoundTrips()
    example = plan()
    for name in accepted:
        section = example.database.model_copy(update={"engine": name, "schemas": ["shop"]})
        engine = engines.open_database(example.model_copy(update={"database": section}), meter=meter)
        assert isinstance(engine, Database) and engine.name == name
        assert engine.meter is meter  # type: ignore[attr-defined]  # both engines keep it
        if name == "postgresql":
            assert isinstance(engine, postgresql.PostgreSql) and engine.dbname == "shop"  # schemas name the database
        else:
            assert isinstance(engine, mariadb.MariaDb)  # MySQL speaks MariaDB's SQL here


def test_every_engine_has_every_member_of_the_protocol() -> None:
    members = {n for n in vars(Database) if not n.startswith("_")} | set(Database.__annotations__)
    for module in {engines.ENGINES[name] for name in engines.ENGINES}:
        engine = engines.open_engine(next(n for n, m in engines.ENGINES.items() if m == module))
        missing = sorted(n for n in members if not hasattr(engine, n))
        assert not missing, f"{module} lacks {missing}"


def test_a_postgresql_error_leaves_a_session_as_a_database_error() -> None:
    lost = postgresql.wrapped(psycopg.OperationalError("connection refused"))
    assert isinstance(lost, DatabaseError) and lost.connection_lost and lost.transient and not lost.server_answered
    missing = postgresql.wrapped(psycopg.errors.lookup("42P01")('relation "nope" does not exist'))
    assert missing.statement_refused and missing.server_answered and not missing.connection_lost
    assert missing.about("reading nope") == 'reading nope: relation "nope" does not exist (SQLSTATE 42P01)'
    starting = postgresql.wrapped(psycopg.errors.lookup("57P03")("the database system is starting up"))
    assert not starting.server_answered and starting.transient  # not up yet: wait, as for no answer at all
    denied = postgresql.wrapped(psycopg.errors.lookup("28P01")("password authentication failed"))
    assert denied.server_answered and not denied.transient
    where = denied.prefixed("source")
    assert type(where) is type(denied) and str(where) == "source password authentication failed"
    assert where.sqlstate == "28P01" and where.server_answered


def test_the_replicate_mode_is_refused_for_mysql_and_auto_resolves_to_shutdown_there(tmp_path: Path) -> None:
    """PostgreSQL and MariaDB replicate (auto asks the servers); MySQL is refused in one line, auto takes shutdown."""
    base = PLAN_FILE.read_text()
    assert "\n  mode: shutdown\n" in base
    section = "\nreplication:\n  user: repl\n  password: {env: REPL_PASSWORD}\n"
    for engine, resolved in (("postgresql", "auto"), ("mysql", "shutdown")):
        text = base.replace("database:\n  engine: mariadb\n", f"database:\n  engine: {engine}\n", 1)
        auto = tmp_path / f"auto-{engine}.yaml"
        auto.write_text(text.replace("\n  mode: shutdown\n", "\n  mode: auto\n") + section)
        assert load_plan(auto).plan.replication is not None
        assert static_mode(load_plan(auto).plan) == resolved  # mysql: even with a replication section
    text = base.replace("database:\n  engine: mariadb\n", "database:\n  engine: mysql\n", 1)
    replicate = tmp_path / "replicate.yaml"
    replicate.write_text(text.replace("\n  mode: shutdown\n", "\n  mode: replicate\n"))
    with pytest.raises(PlanError) as caught:
        load_plan(replicate)
    assert str(caught.value).count("\n") == 0
    assert "the replicate mode runs on MariaDB and PostgreSQL only (database.engine mysql)" in str(caught.value)


def test_an_engine_the_registry_does_not_know_is_refused_in_one_line(tmp_path: Path) -> None:
    assert engines.engine_problem("oracle") == "unknown database engine 'oracle' (known: mariadb, mysql, postgresql)"
    with pytest.raises(ValueError, match="unknown database engine 'oracle'"):
        engines.open_engine("oracle")
    text = PLAN_FILE.read_text().replace("database:\n  engine: mariadb\n", "database:\n  engine: oracle\n", 1)
    assert "engine: oracle" in text
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    line = next(number for number, row in enumerate(text.splitlines(), 1) if row == "  engine: oracle")
    assert str(caught.value) == (
        f"{path}:{line}:3: database.engine: must be 'mariadb', 'mysql' or 'postgresql', got 'oracle'"
    )


def test_the_runtime_opens_the_plans_engine_once_its_sessions_counted_on_the_run() -> None:
    rt = Runtime(plan(), PLAN_FILE, dry_run=True)
    try:
        assert rt.database is rt.database
        assert isinstance(rt.database, mariadb.MariaDb) and rt.database.meter is rt.round_trips
    finally:
        rt.close()


# --- one error type --------------------------------------------------------------------------------------------


def test_a_driver_error_leaves_a_session_as_a_database_error_its_text_unchanged() -> None:
    meter = RoundTrips()
    engine = mariadb.MariaDb(meter=meter)
    conn = offline_session()
    engine.adopt(conn)
    with structlog.contextvars.bound_contextvars(step="verify_target"), pytest.raises(DatabaseError) as caught:
        engine.server_version(conn)
    error = caught.value
    assert isinstance(error, pymysql.err.InterfaceError)  # the engine's own modules still tell it apart
    assert error.connection_lost and not error.statement_refused and error.code == 0
    assert str(error) == str(pymysql.err.InterfaceError(0, ""))
    with structlog.contextvars.bound_contextvars(step="verify_target"):
        with pytest.raises(DatabaseError):
            engine.ping(conn)
        assert not engine.alive(conn)
        assert not engine.answers(conn)
    # Every statement and ping sent counts as a round trip, failed or not (what the window's figures count).
    assert meter.by_step() == {"verify_target": {"sql": 4}}


@pytest.mark.parametrize(
    ("error", "transient", "lost", "refused"),
    [
        (pymysql.err.OperationalError(2013, "Lost connection to server during query"), True, True, False),
        (pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"), True, False, False),
        (pymysql.err.ProgrammingError(1146, "Table 'app.gone' doesn't exist"), False, False, True),
        (pymysql.err.OperationalError(1045, "Access denied for user 'migrate'"), False, False, False),
    ],
)
def test_each_driver_error_keeps_its_number_and_says_what_a_caller_may_do(
    error: pymysql.MySQLError, transient: bool, lost: bool, refused: bool
) -> None:
    wrapped = mariadb.wrapped(error)
    assert isinstance(wrapped, DatabaseError) and isinstance(wrapped, type(error))
    assert wrapped.args == error.args and str(wrapped) == str(error)
    assert (wrapped.transient, wrapped.connection_lost, wrapped.statement_refused) == (transient, lost, refused)
    assert wrapped.code == error.args[0]
    assert wrapped.server_answered == (error.args[0] < 2000)
    assert type(mariadb.wrapped(error)) is type(wrapped)  # one class per driver class, made once
    assert wrapped.about("reading") == f"reading: {error.args[1]} (error {error.args[0]})"


def test_the_fence_still_reads_a_lock_wait_timeout_as_not_held_and_anything_else_as_a_database_error() -> None:
    engine = mariadb.MariaDb()
    timed_out = offline_session(pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"))
    engine.adopt(timed_out)
    assert engine.lock_writes(timed_out) is False
    denied = offline_session(pymysql.err.OperationalError(1227, "Access denied; you need the RELOAD privilege"))
    engine.adopt(denied)
    with pytest.raises(DatabaseError, match="FLUSH TABLES WITH READ LOCK failed: Access denied"):
        engine.lock_writes(denied)


def test_a_server_nobody_answers_for_is_a_transient_database_error() -> None:
    # A bound socket that does not listen: connecting to it is refused, and nobody else can take the port meanwhile.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        with pytest.raises(DatabaseError) as caught:
            mariadb.MariaDb().connect(
                "127.0.0.1", port, user="migrate", password="s3cret-pw", connect_timeout=2, read_timeout=2,
                write_timeout=2,
            )  # fmt: skip
    assert caught.value.transient and caught.value.code == 2003 and not caught.value.server_answered
    assert "s3cret-pw" not in str(caught.value)


def test_a_tunnel_that_cannot_open_is_a_database_error_and_still_the_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rt = Runtime(plan(), PLAN_FILE, dry_run=True)

    def no_way(which: str) -> Any:
        raise TransportError("ssh source: connection refused", True)

    monkeypatch.setattr(rt, "_tunnel", no_way)
    monkeypatch.setattr(rt, "db_password", lambda: None)
    try:
        with pytest.raises(DatabaseError) as caught:
            rt.db("source", retry=False)
        assert isinstance(caught.value, DatabaseUnreachable) and isinstance(caught.value, TransportError)
        assert str(caught.value) == "ssh source: connection refused" and caught.value.transient
        # Whether the database answers is no question while its host cannot be reached: the host's error stands.
        with pytest.raises(TransportError):
            rt.db_answers("source")
    finally:
        rt.close()


def test_a_refused_login_says_which_side_and_still_counts_as_the_server_answering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rt = Runtime(plan(), PLAN_FILE, dry_run=True)

    def refused(*_: Any, **__: Any) -> Any:
        raise mysql.DbError("cannot connect to the database as migrate: Access denied (error 1045)", False, 1045)

    monkeypatch.setattr(rt, "_tunnel", lambda which: ("127.0.0.1", 9))
    monkeypatch.setattr(rt, "db_password", lambda: None)
    monkeypatch.setattr(rt.database, "connect", refused)
    try:
        with pytest.raises(DatabaseError) as caught:
            rt.db("target", retry=False)
        assert str(caught.value) == "target cannot connect to the database as migrate: Access denied (error 1045)"
        assert caught.value.server_answered and caught.value.code == 1045 and not caught.value.transient
        assert rt.db_answers("target"), "a server that refuses our login is up"
    finally:
        rt.close()


def test_only_the_mariadb_engine_and_the_lab_import_the_driver() -> None:
    package = Path(__file__).resolve().parents[1] / "orchestrator"
    importers = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(name == "pymysql" or name.startswith("pymysql.") for name in names):
                importers.add(path.relative_to(package).as_posix())
    engine = {"database/mariadb.py"} | {
        f"database/mysql/{name}.py" for name in ("session", "gtid", "replica", "switch", "compare", "compare_live")
    }
    assert {name for name in importers if not name.startswith("lab/")} == engine
