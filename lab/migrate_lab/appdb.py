"""The demo app's database, per engine: how to connect, which errors mean what, the statements that differ.

The app (app.py) and `lab verify` (verify.py) ask `for_state(state)` and speak DB-API 2 through it: the same
`%s` placeholders work with pymysql and psycopg, so only what differs is here. MariaDB's is the default; a
PostgreSQL lab (`lab up --engine postgresql`) reaches its cluster through the host's socket directory as the app's
role, with psycopg.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pymysql
import pymysql.cursors

from migrate_lab import postgres as pglab
from migrate_lab.state import HostState, LabState

if TYPE_CHECKING:
    import psycopg

# Bounded so a write stuck behind a lock fails (503, the client retries) instead of hanging.
CONNECT_TIMEOUT = 3
STATEMENT_TIMEOUT_MS = 5000
ER_DUP_ENTRY = 1062


@dataclass(frozen=True)
class AppDb:
    """One engine's answers to what the app and verify need."""

    connect: Callable[[LabState, HostState, str], Any]  # a DB-API connection, autocommit off
    error: type[Exception]  # any database error
    integrity_error: type[Exception]
    down_errors: tuple[type[Exception], ...]  # the server did not answer, or the connection broke
    is_duplicate: Callable[[Exception], bool]
    dict_cursor: Callable[[Any], Any]
    # (cursor, name, size, sha256) → True when the row was inserted, False when it replaced one.
    upsert_upload: Callable[[Any, str, int, str], bool]
    where: Callable[[HostState], str]  # where the connection goes, for messages


def mariadb_connect(state: LabState, host: HostState, password: str) -> pymysql.connections.Connection:
    """A connection to the host's MariaDB through its unix socket, as the app user, with bounded timeouts."""
    return pymysql.connect(
        unix_socket=str(host.db_socket),
        user=state.app_user,
        password=password,
        database=state.db_name,
        charset="utf8mb4",
        autocommit=False,
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=5,
        write_timeout=5,
        # A unix socket needs no TLS; PyMySQL would otherwise build a TLS context (every CA certificate loaded)
        # per connection, which was most of the app's CPU.
        ssl_disabled=True,
    )


def _mariadb_upsert(cur: Any, name: str, size: int, digest: str) -> bool:
    cur.execute(
        "INSERT INTO uploads (name, size, sha256) VALUES (%s, %s, %s) "
        "ON DUPLICATE KEY UPDATE size = VALUES(size), sha256 = VALUES(sha256)",
        (name, size, digest),
    )
    return bool(cur.rowcount == 1)


def postgres_connect(state: LabState, host: HostState, password: str) -> psycopg.Connection:
    """A connection to the host's PostgreSQL through its socket directory, as the app's role."""
    import psycopg

    return psycopg.connect(
        host=str(pglab.socket_dir(host)),
        port=host.db_port,
        user=state.app_user,
        password=password,
        dbname=state.db_name,
        connect_timeout=CONNECT_TIMEOUT,
        options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
        autocommit=False,
    )


def _postgres_upsert(cur: Any, name: str, size: int, digest: str) -> bool:
    # xmax is 0 on a freshly inserted row version, set on one that replaced a conflicting row.
    cur.execute(
        "INSERT INTO uploads (name, size, sha256) VALUES (%s, %s, %s) "
        "ON CONFLICT (name) DO UPDATE SET size = EXCLUDED.size, sha256 = EXCLUDED.sha256 "
        "RETURNING (xmax = 0)",
        (name, size, digest),
    )
    row = cur.fetchone()
    return bool(row and row[0])


MARIADB = AppDb(
    connect=mariadb_connect,
    error=pymysql.err.MySQLError,
    integrity_error=pymysql.err.IntegrityError,
    down_errors=(pymysql.err.OperationalError, pymysql.err.InterfaceError),
    is_duplicate=lambda exc: bool(exc.args) and exc.args[0] == ER_DUP_ENTRY,
    dict_cursor=lambda conn: conn.cursor(pymysql.cursors.DictCursor),
    upsert_upload=_mariadb_upsert,
    where=lambda host: str(host.db_socket),
)


@functools.cache
def _postgres() -> AppDb:
    # psycopg is loaded only by a PostgreSQL lab's app and load: a MariaDB lab's processes never pay for it.
    import psycopg
    import psycopg.rows

    return AppDb(
        connect=postgres_connect,
        error=psycopg.Error,
        integrity_error=psycopg.IntegrityError,
        # A statement_timeout (QueryCanceled) is an OperationalError too: the write did not happen, 503.
        down_errors=(psycopg.OperationalError, psycopg.InterfaceError),
        is_duplicate=lambda exc: isinstance(exc, psycopg.errors.UniqueViolation),
        dict_cursor=lambda conn: conn.cursor(row_factory=psycopg.rows.dict_row),
        upsert_upload=_postgres_upsert,
        where=lambda host: f"{pglab.socket_dir(host)} port {host.db_port}",
    )


def for_state(state: LabState) -> AppDb:
    return _postgres() if state.engine == pglab.ENGINE else MARIADB
