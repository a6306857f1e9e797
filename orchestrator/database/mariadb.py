"""The MariaDB (and MySQL) engine behind the `Database` protocol, over pymysql.

Its SQL lives in `database/mysql/`: `session.py` (sessions, figures, the lock session, positions), `gtid.py`,
`replica.py`, `switch.py`, `seed.py`, `compare.py` (the replica, the switch, the comparison) and `grants.py`; this
module is what the seam hands out.
Driver errors become `DatabaseError`s once, here: every statement and ping of a session goes through the session's
`query` / `ping`, which `_counted_and_wrapped` replaces, so a pymysql error leaves a session as a `DriverError`
(the seam's DatabaseError, still its pymysql class for the SQL modules that tell one from another).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import pymysql

from orchestrator.database.mysql import audit
from orchestrator.database.mysql import session as mysql
from orchestrator.database.mysql.switch import set_read_only
from orchestrator.database.protocol import (
    NON_TRANSACTIONAL,
    Blocker,
    DatabaseError,
    Figures,
    Replication,
    Session,
    TableLimit,
)
from orchestrator.services import probes, storage

if TYPE_CHECKING:
    from orchestrator.transports.meter import RoundTrips


class DriverError(DatabaseError):
    """A pymysql error as it left a session: `args` are the driver's (its error number first), so `str()` reads as
    it always did; `transient` and `code` as `mysql.db_error` judges them."""

    def __init__(self, *args: Any) -> None:
        Exception.__init__(self, *args)
        self.code = args[0] if args and isinstance(args[0], int) else None
        self.transient = mysql.db_error("", self).transient

    def about(self, what: str) -> str:
        return str(mysql.db_error(what, self))

    @property
    def server_answered(self) -> bool:
        return self.code is not None and self.code < mysql.CLIENT_ERRORS

    @property
    def connection_lost(self) -> bool:
        # The client's own errors (2000 and up: gone away, lost during a query, cannot connect) or a closed one.
        return isinstance(self, pymysql.err.InterfaceError) or (self.code or 0) >= mysql.CLIENT_ERRORS

    @property
    def statement_refused(self) -> bool:
        return isinstance(self, pymysql.err.ProgrammingError)


_WRAPPED: dict[type[BaseException], type[DriverError]] = {}


def wrapped(exc: pymysql.MySQLError) -> DriverError:
    """The same error as a DatabaseError: a class that is both the seam's DriverError and `exc`'s own class."""
    if isinstance(exc, DriverError):
        return exc
    kind = type(exc)
    cls = _WRAPPED.get(kind)
    if cls is None:
        cls = _WRAPPED[kind] = cast(type[DriverError], type(f"MariaDb{kind.__name__}", (DriverError, kind), {}))
    return cls(*exc.args)


def _counted_and_wrapped(conn: pymysql.Connection, meter: RoundTrips | None) -> None:
    """Count every statement (and ping) this session sends: each is one round trip through its tunnel; and turn the
    driver's errors into DatabaseErrors. Per session: pymysql has no hook for either."""
    query, ping = conn.query, conn.ping

    def counted_query(sql: str | bytes, unbuffered: bool = False) -> int:
        if meter is not None:
            meter.add("sql")
        try:
            return query(sql, unbuffered)
        except pymysql.MySQLError as exc:
            raise wrapped(exc) from None

    def counted_ping(*args: Any, **kwargs: Any) -> None:
        if meter is not None:
            meter.add("sql")
        try:
            ping(*args, **kwargs)
        except pymysql.MySQLError as exc:
            raise wrapped(exc) from None

    conn.query = counted_query  # type: ignore[method-assign]  # see above
    conn.ping = counted_ping  # type: ignore[method-assign]  # see above


def _raw(session: Session) -> pymysql.Connection:
    return cast(pymysql.Connection, session)


# The server's settings whose durability depends on fsync (preflight's storage comparison).
DURABILITY_VARIABLES = (*storage.DURABLE_SETTINGS, "innodb_flush_method")


class MariaDb:
    """The `Database` for `database.engine: mariadb` (and `mysql`, which speaks the same protocol)."""

    server_files: tuple[str, ...] = probes.INNODB_FILES
    server_programs: tuple[str, ...] = ("mariadbd", "mysqld")
    fence_name = "FLUSH TABLES WITH READ LOCK"
    fence_in_data = False
    checksum_name = "CHECKSUM TABLE"
    file_settings: tuple[str, ...] = mysql.FILE_VARIABLES
    needed_privileges: tuple[str, ...] = ("RELOAD", "SELECT", "SHUTDOWN", "PROCESS")
    grant_hint = "GRANT them ON *.*"

    def __init__(self, name: str = "mariadb", *, meter: RoundTrips | None = None) -> None:
        self.name = name
        self.meter = meter

    def configure(self, settings: Any) -> None:
        return None  # every session reaches every schema

    # --- sessions ---

    def connect(
        self,
        host: str,
        port: int,
        *,
        user: str,
        password: str | None,
        connect_timeout: float,
        read_timeout: float,
        write_timeout: float,
    ) -> Session:
        conn = mysql.connect(
            host,
            port,
            user=user,
            password=password,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
        )
        self.adopt(conn)
        return conn

    def adopt(self, conn: Session) -> None:
        """Count and wrap a session opened elsewhere (connect does it to its own)."""
        _counted_and_wrapped(_raw(conn), self.meter)

    def bounded(self, session: Session, seconds: float | None) -> contextlib.AbstractContextManager[None]:
        return mysql.read_timeout(session, seconds)

    def set_timeouts(self, session: Session, seconds: float) -> None:
        # pymysql has no public setter; its stubs leave these attributes out.
        session._read_timeout = session._write_timeout = seconds  # type: ignore[attr-defined]  # see above

    def ping(self, session: Session) -> None:
        try:
            _raw(session).ping(reconnect=False)
        except pymysql.MySQLError as exc:  # a session not opened by connect (the lab's, a test's)
            raise wrapped(exc) from None

    def revive(self, session: Session, seconds: float) -> None:
        # The bounds are the client's own (no round trip): the ping is the one.
        with self.bounded(session, seconds):
            self.ping(session)
        self.set_timeouts(session, seconds)

    def alive(self, session: Session) -> bool:
        return mysql.session_alive(session)

    def answers(self, session: Session) -> bool:
        return mysql.answers(session)

    def round_trip(self, session: Session) -> None:
        mysql.ping(session)

    def close_quietly(self, session: Session) -> None:
        mysql.close_quietly(session)

    # --- what the server is and holds ---

    def server_version(self, session: Session) -> str:
        return mysql.server_version(session)

    def major_version(self, version: str) -> str:
        return mysql.major_version(version)

    def data_bytes(self, session: Session) -> int | None:
        with session.cursor() as cur:
            # The user's schemas only: opening the server's own (Aria) tables would make it write their headers.
            cur.execute(
                "SELECT COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables"
                " WHERE table_schema NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')"
            )
            row = cur.fetchone()
            return int(row[0]) if row else None

    def missing_privileges(self, session: Session, needed: Iterable[str]) -> set[str]:
        return mysql.missing_privileges(session, needed)

    def error_log_path(self, session: Session) -> str:
        return mysql.error_log_path(session)

    def list_tables(self, session: Session, schemas: list[str] | None = None) -> list[tuple[str, str]]:
        return mysql.list_tables(session, schemas)

    def row_counts(
        self, session: Session, tables: Iterable[tuple[str, str]], *, limit: TableLimit | None = None
    ) -> dict[str, int]:
        return mysql.row_counts(session, tables, limit=limit)

    def checksums(
        self, session: Session, tables: Iterable[tuple[str, str]], *, limit: TableLimit | None = None
    ) -> dict[str, int | None]:
        return mysql.checksums(session, tables, limit=limit)

    # --- the fence ---

    def set_lock_wait_timeout(self, session: Session, seconds: float) -> None:
        mysql.set_lock_wait_timeout(session, seconds)

    def lock_writes(self, session: Session) -> bool:
        return mysql.flush_tables_with_read_lock(session)

    def find_blockers(self, session: Session) -> list[Blocker]:
        return mysql.find_blockers(session)

    def find_lock_holders(self, session: Session, waited: float = 0.0) -> list[Blocker]:
        return mysql.find_lock_holders(session, waited)

    def tables_in_use(self, session: Session, limit: int = 10) -> list[str]:
        return mysql.tables_in_use(session, limit)

    def summarize_blockers(
        self, blockers: list[Blocker], in_use: list[str] | None = None, *, holders: list[Blocker] | None = None
    ) -> str:
        return mysql.summarize_blockers(blockers, in_use, holders=holders)

    def is_read_only(self, session: Session) -> bool:
        return mysql.is_read_only(session)

    def set_read_only(self, session: Session, on: bool, *, lock_wait_timeout: float) -> None:
        set_read_only(session, on, lock_wait_timeout=lock_wait_timeout)

    def open_snapshot(self, session: Session, schemas: list[str] | None) -> dict[str, str]:
        return mysql.open_snapshot(session, schemas)

    def snapshot_figures(
        self, session: Session, tables: list[str], *, counts: bool, checksums: bool, timeout: float
    ) -> Figures:
        return audit.snapshot_figures(session, tables, counts=counts, checksums=checksums, timeout=timeout)

    def isolated_figures(
        self,
        host: Any,
        launch: Any,
        datadir: str,
        tables: list[str],
        *,
        counts: bool,
        checksums: bool,
        timeout: float,
        started: Callable[[str | None], None],
    ) -> Figures:
        """Its own command line, isolated (database/mysql/audit.py); `datadir` is in that command line already."""
        return audit.isolated_figures(host, launch, tables, counts=counts, checksums=checksums, timeout=timeout,
                                      started=started)  # fmt: skip

    def stop_isolated(self, host: Any, directory: str) -> None:
        audit.stop_isolated(audit.IsolatedServer(host, directory))

    def lift_fence(self, session: Session) -> list[str]:
        return []  # the fence is FTWRL and read_only: neither lives in the data a copy carries

    # --- positions ---

    def final_position(self, session: Session) -> dict[str, Any] | None:
        return mysql.binlog_position(session)

    # --- preflight ---

    def _variables(self, session: Session, names: Iterable[str]) -> dict[str, str]:
        names = list(names)
        with session.cursor() as cur:
            cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN (" + ", ".join(["%s"] * len(names)) + ")", names)
            return {str(name): str(value or "") for name, value in cur.fetchall()}

    def datadir_settings(self, session: Session) -> tuple[str, dict[str, str]]:
        with session.cursor() as cur:
            cur.execute("SELECT @@datadir")
            row = cur.fetchone()
        datadir = str(row[0]) if row else ""
        return datadir, self._variables(session, (*mysql.DIRECTORY_VARIABLES, *mysql.FILE_VARIABLES))

    def durability_settings(self, session: Session) -> dict[str, str]:
        return self._variables(session, DURABILITY_VARIABLES)

    def installed_version(self) -> probes.Probe[str]:
        return probes.database_server_version()

    def preflight_notes(self, session: Session) -> tuple[list[str], dict[str, Any]]:
        """No refusal; the tables outside the snapshots, said (NON_TRANSACTIONAL)."""
        tables = mysql.non_transactional_tables(session)
        return [], ({NON_TRANSACTIONAL: tables} if tables else {})

    def replication(self) -> Replication | None:
        """GTID replication (database/mysql/replication.py), imported when a replicate run first needs it."""
        from orchestrator.database.mysql.replication import open_replication

        return open_replication(self.name)


def open_database(name: str, *, meter: RoundTrips | None = None) -> MariaDb:
    return MariaDb(name, meter=meter)
