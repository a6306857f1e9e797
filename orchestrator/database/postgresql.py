"""The PostgreSQL engine behind the `Database` protocol, over psycopg (the shutdown cut-over mode).

Its SQL and host commands live in `database/pg/primitives.py`; this module is what the seam hands out. A plan's
`database.schemas` names the PostgreSQL database (one) the run connects to and verifies: every table of its
non-system schemas is listed, counted and checksummed. Sessions are psycopg connections whose cursors count each
statement and turn every psycopg error into a `PgDriverError` (a DatabaseError), once, here.

The write fence is the catalog's, not a session's: every application role (can log in, neither superuser nor
replication, not ours) is marked, made NOLOGIN and its sessions ended (`pg/primitives.fence_marked`), then a
CHECKPOINT keeps the clean shutdown that follows short. NOLOGIN travels with the data directory, so the target
starts fenced; `lift_fence` lets the marked roles in again (the target at its start, the source at a rollback).
"""

from __future__ import annotations

import contextlib
import posixpath
import shlex
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

import psycopg
from psycopg import sql

from orchestrator.database.pg import primitives as pg
from orchestrator.database.protocol import Blocker, DatabaseError, Figures, Replication, Session, TableLimit
from orchestrator.services.probes import Probe

if TYPE_CHECKING:
    from orchestrator.plan.model import Database as DatabaseSettings
    from orchestrator.transports.meter import RoundTrips

# SQLSTATEs: the server is starting up or shutting down (not yet / no longer answering), a lost connection's class,
# the server's own end of a session.
CANNOT_CONNECT_NOW = "57P03"
ADMIN_SHUTDOWN = ("57P01", "57P02")
CONNECTION_CLASS = "08"
QUERY_CANCELED = "57014"
LOCK_NOT_AVAILABLE = "55P03"
TRANSIENT_STATES = (CANNOT_CONNECT_NOW, "40001", "40P01", LOCK_NOT_AVAILABLE, *ADMIN_SHUTDOWN)
SYSTEM_SCHEMAS = ("pg_catalog", "information_schema")
# The audit's isolated source: any port (its socket lives in a private directory, no TCP), its bounds.
ISOLATED_PORT = 5432
ISOLATED_START_TIMEOUT = 180.0
# The data directory's files the server's processes hold open while it runs (WAL segments, relations): once no
# process holds any, the server is gone and its directory quiet.
SERVER_FILES = ("pg_wal/*", "base/*/*", "global/*")
# Settings whose durability depends on fsync (preflight's storage comparison).
DURABILITY_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes", "wal_sync_method")


class PgDriverError(DatabaseError):
    """A psycopg error as it left a session: its SQLSTATE (`sqlstate`, None when no server answered)."""

    def __init__(self, message: str, sqlstate: str | None, *, lost: bool, refused: bool) -> None:
        answered = sqlstate is not None and sqlstate != CANNOT_CONNECT_NOW and not sqlstate.startswith("08")
        transient = sqlstate is None or sqlstate in TRANSIENT_STATES or sqlstate.startswith(CONNECTION_CLASS)
        super().__init__(message, transient, None, server_answered=answered)
        self.sqlstate = sqlstate
        self._lost = lost
        self._refused = refused

    @property
    def connection_lost(self) -> bool:
        return self._lost

    @property
    def statement_refused(self) -> bool:
        return self._refused

    def about(self, what: str) -> str:
        state = f" (SQLSTATE {self.sqlstate})" if self.sqlstate else ""
        return f"{what}: {self}{state}"

    def __reduce__(self) -> tuple[Any, ...]:
        # copy (DatabaseError.prefixed) and pickling rebuild it from its message and figures, not from __init__'s.
        return (_restored, (str(self), dict(self.__dict__)))


def _restored(message: str, state: dict[str, Any]) -> PgDriverError:
    error = PgDriverError.__new__(PgDriverError)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


def wrapped(exc: BaseException, conn: psycopg.Connection | None = None) -> PgDriverError:
    if isinstance(exc, PgDriverError):
        return exc
    sqlstate = getattr(exc, "sqlstate", None)
    closed = conn is not None and bool(conn.closed)
    lost = (
        closed
        or isinstance(exc, psycopg.InterfaceError)
        or (isinstance(exc, psycopg.OperationalError) and sqlstate is None)
        or (sqlstate or "").startswith(CONNECTION_CLASS)
        or sqlstate in ADMIN_SHUTDOWN
    )
    refused = isinstance(exc, psycopg.ProgrammingError) or (sqlstate or "").startswith("42")
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return PgDriverError(text, sqlstate, lost=lost, refused=refused)


class _Cursor(psycopg.Cursor[Any]):
    """Counts each statement as a round trip and wraps the driver's errors."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        meter = getattr(self.connection, "meter", None)
        if meter is not None:
            meter.add("sql")
        try:
            return super().execute(query, params, **kwargs)
        except psycopg.Error as exc:
            raise wrapped(exc, self.connection) from None


class _Connection(psycopg.Connection[Any]):
    meter: RoundTrips | None = None


_raw = pg.connection_of
_scalar = pg.session_scalar


def _run(session: Session, query: str) -> None:
    """A statement that returns no rows."""
    with session.cursor() as cur:
        cur.execute(query)


def _quoted(schema: str, table: str) -> sql.Composable:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))


class PostgreSql:
    """The `Database` for `database.engine: postgresql`."""

    server_files: tuple[str, ...] = SERVER_FILES
    server_programs: tuple[str, ...] = ("postgres",)  # every backend runs it too: the oldest pid, the postmaster
    fence_name = "the app roles' fence (NOLOGIN, their sessions ended, then CHECKPOINT)"
    fence_in_data = True
    checksum_name = "a sum of every row's hashtext"
    file_settings: tuple[str, ...] = ()  # it keeps every file in its data directory
    needed_privileges: tuple[str, ...] = ("SUPERUSER",)
    grant_hint = "ALTER ROLE <user> SUPERUSER"

    def __init__(self, name: str = "postgresql", *, meter: RoundTrips | None = None) -> None:
        self.name = name
        self.meter = meter
        self.dbname = "postgres"

    def configure(self, settings: DatabaseSettings) -> None:
        """The plan's database section: `schemas` names the database the run connects to."""
        if settings.schemas:
            self.dbname = settings.schemas[0]

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
        if self.meter is not None:
            self.meter.add("sql")
        try:
            conn = _Connection.connect(
                host=host,
                port=port,
                user=user,
                password=password,
                dbname=self.dbname,
                connect_timeout=max(1, round(connect_timeout)),
                application_name="migrate",
                autocommit=True,
                cursor_factory=_Cursor,
                # A statement that outlives the session's bound is ended by the server itself.
                options=f"-c statement_timeout={max(1, round(read_timeout * 1000))}",
            )
        except psycopg.Error as exc:
            raise wrapped(exc).prefixed(f"cannot connect to {host}:{port} as {user}:") from None
        conn.meter = self.meter
        return cast(Session, conn)

    @contextlib.contextmanager
    def _statement_timeout(self, session: Session, seconds: float | None) -> Iterator[None]:
        if seconds is None:
            yield
            return
        before = _scalar(session, "SHOW statement_timeout")
        _scalar(session, "SELECT set_config('statement_timeout', %s, false)", (str(max(1, round(seconds * 1000))),))
        try:
            yield
        finally:
            with contextlib.suppress(DatabaseError):
                _scalar(session, "SELECT set_config('statement_timeout', %s, false)", (str(before),))

    def bounded(self, session: Session, seconds: float | None) -> contextlib.AbstractContextManager[None]:
        return self._statement_timeout(session, seconds)

    def set_timeouts(self, session: Session, seconds: float) -> None:
        _scalar(session, "SELECT set_config('statement_timeout', %s, false)", (str(max(1, round(seconds * 1000))),))

    def ping(self, session: Session) -> None:
        _scalar(session, "SELECT 1")

    def revive(self, session: Session, seconds: float) -> None:
        # The bound is the server's (statement_timeout): setting it is the round trip that proves the session alive
        # (bounded() around a ping would cost four: read the old bound, set, ping, put it back).
        self.set_timeouts(session, seconds)

    def alive(self, session: Session) -> bool:
        return self.answers(session)

    def answers(self, session: Session) -> bool:
        try:
            return _scalar(session, "SELECT 1") == 1
        except (DatabaseError, psycopg.Error):
            return False

    def round_trip(self, session: Session) -> None:
        _scalar(session, "SELECT 1")

    def close_quietly(self, session: Session) -> None:
        with contextlib.suppress(psycopg.Error, OSError):
            session.close()

    # --- what the server is and holds ---

    def server_version(self, session: Session) -> str:
        return str(_scalar(session, "SHOW server_version"))

    def major_version(self, version: str) -> str:
        """'15.4 (Debian 15.4-1)' → '15' (from version 10 on, the first number is the major)."""
        head = version.strip().split(" ", 1)[0].split(".", 1)[0]
        if not head.isdigit():
            raise ValueError(f"not a PostgreSQL version: {version!r}")
        return head

    def data_bytes(self, session: Session) -> int | None:
        return int(_scalar(session, "SELECT pg_database_size(current_database())"))

    def missing_privileges(self, session: Session, needed: Iterable[str]) -> set[str]:
        """PostgreSQL's fence, checkpoint and settings need a superuser: SUPERUSER when the account is not one."""
        return (
            set()
            if bool(_scalar(session, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"))
            else {"SUPERUSER"}
        )

    def error_log_path(self, session: Session) -> str:
        return ""  # pg_ctl's -l file or the logging collector's: nothing the stop's timing reads

    def list_tables(self, session: Session, schemas: list[str] | None = None) -> list[tuple[str, str]]:
        """Every base table of the connected database's non-system schemas (`schemas` names databases here)."""
        with session.cursor() as cur:
            cur.execute(
                "SELECT table_schema, table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'"
                " AND table_schema <> ALL(%s) AND table_schema NOT LIKE 'pg\\_%%' ORDER BY 1, 2",
                (list(SYSTEM_SCHEMAS),),
            )
            return [(str(s), str(t)) for s, t in cur.fetchall()]

    def _per_table(
        self, session: Session, tables: Iterable[tuple[str, str]], query: str, limit: TableLimit | None
    ) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for schema, table in tables:
            name = f"{schema}.{table}"
            seconds = limit(name) if limit is not None else None
            with self._statement_timeout(session, seconds):
                found[name] = _scalar(session, sql.SQL(query).format(table=_quoted(schema, table)))
        return found

    def row_counts(
        self, session: Session, tables: Iterable[tuple[str, str]], *, limit: TableLimit | None = None
    ) -> dict[str, int]:
        counts = self._per_table(session, tables, "SELECT count(*) FROM {table}", limit)
        return {name: int(value or 0) for name, value in counts.items()}

    def checksums(
        self, session: Session, tables: Iterable[tuple[str, str]], *, limit: TableLimit | None = None
    ) -> dict[str, int | None]:
        """An order-independent sum of every row's hash (PostgreSQL has no CHECKSUM TABLE): comparable between
        servers of one major version, as the datadir copy needs anyway."""
        query = "SELECT coalesce(sum(hashtext(t::text)::bigint), 0) FROM {table} t"
        sums = self._per_table(session, tables, query, limit)
        return {name: None if value is None else int(value) for name, value in sums.items()}

    def open_snapshot(self, session: Session, schemas: list[str] | None) -> dict[str, str]:
        """A read-only repeatable-read transaction (its snapshot taken by the first query in it, the tables' list),
        kept open by the caller; every table is a heap (MVCC: all of it in the snapshot)."""
        _run(session, "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        return {f"{schema}.{table}": "heap" for schema, table in self.list_tables(session, schemas)}

    # --- the fence ---

    def set_lock_wait_timeout(self, session: Session, seconds: float) -> None:
        _scalar(session, "SELECT set_config('lock_timeout', %s, false)", (str(max(1, round(seconds * 1000))),))

    def lock_writes(self, session: Session) -> bool:
        """The application roles marked, NOLOGIN, their sessions ended, then a CHECKPOINT (the clean shutdown that
        follows has little left to flush). Not a session's lock: it holds until `lift_fence`."""
        try:
            pg.fence_marked(_raw(session))
        except pg.PostgresError as exc:
            raise PgDriverError(f"the fence failed: {exc}", None, lost=False, refused=False) from None
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                return False
            raise wrapped(exc, _raw(session)) from None
        except DatabaseError as exc:
            if isinstance(exc, PgDriverError) and exc.sqlstate == LOCK_NOT_AVAILABLE:
                return False
            raise
        _run(session, "CHECKPOINT")
        return True

    def find_blockers(self, session: Session) -> list[Blocker]:
        with session.cursor() as cur:
            cur.execute(
                "SELECT pid, coalesce(usename, ''), coalesce(backend_type, ''),"
                " coalesce(extract(epoch FROM now() - query_start), 0)::int, coalesce(state, ''),"
                " left(coalesce(query, ''), 200) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND state = 'active' AND backend_type = 'client backend'"
                " ORDER BY query_start"
            )
            rows = cur.fetchall()
        return [Blocker(int(r[0]), str(r[1]), str(r[2]), int(r[3]), str(r[4]), "") for r in rows]

    def find_lock_holders(self, session: Session, waited: float = 0.0) -> list[Blocker]:
        return []

    def tables_in_use(self, session: Session, limit: int = 10) -> list[str]:
        return []

    def summarize_blockers(
        self, blockers: list[Blocker], in_use: list[str] | None = None, *, holders: list[Blocker] | None = None
    ) -> str:
        sessions = [b.summary() for b in (holders or []) + blockers]
        return "; ".join(sessions) if sessions else "no session seen"

    def is_read_only(self, session: Session) -> bool:
        """Are application roles fenced (marked NOLOGIN)?"""
        return bool(pg.marked_roles(_raw(session)))

    def set_read_only(self, session: Session, on: bool, *, lock_wait_timeout: float) -> None:
        if on:
            self.lock_writes(session)
        else:
            self.lift_fence(session)

    def lift_fence(self, session: Session) -> list[str]:
        """The roles the fence marked log in again (none marked: nothing to do); the roles let in."""
        return pg.unfence_marked(_raw(session))

    # --- positions ---

    def final_position(self, session: Session) -> dict[str, Any] | None:
        return None  # a binary log position has no meaning here (a resume after the shutdown began rolls back)

    def wal_position(self, session: Session) -> str:
        return str(pg.current_wal_lsn(_raw(session)))

    # --- the after-commit audit ---

    def snapshot_figures(
        self, session: Session, tables: list[str], *, counts: bool, checksums: bool, timeout: float
    ) -> Figures:
        """One table at a time through row_counts and checksums; a table that cannot be read is left out."""
        got_counts: dict[str, int] = {}
        got_sums: dict[str, int | None] = {}
        with self.bounded(session, timeout):
            for name in tables:
                schema, _, table = name.partition(".")
                try:
                    if counts:
                        got_counts.update(self.row_counts(session, [(schema, table)]))
                    if checksums:
                        got_sums.update(self.checksums(session, [(schema, table)]))
                except DatabaseError as exc:
                    if not exc.statement_refused:
                        raise
        return got_counts, got_sums

    def stop_isolated(self, host: Any, directory: str) -> None:
        """Not needed: `isolated_figures` never hands a directory to `started` (it stops its server in the same
        call; a run killed meanwhile leaves it reachable only through that private socket)."""

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
        """The stopped source's figures: its server started on its own data directory as its owner, unreachable but
        through a socket in a private directory (no TCP), every transaction read-only, no autovacuum, no archiving,
        read with psql, then stopped again (whatever happened) and the directory removed. Its shutdown adds a
        checkpoint record to the old source's WAL: nothing else is written."""
        binary, owner = launch.binary, launch.user or "postgres"
        made = host.run(
            'd=$(mktemp -d "${TMPDIR:-/tmp}/migrate-audit.XXXXXX") && chmod 700 "$d" && '
            f'chown {shlex.quote(owner)} "$d" && printf %s "$d"',
            timeout=30.0,
        ).stdout.strip()
        if not made.startswith("/"):
            raise PgDriverError("no private directory for the isolated source on its host", None, lost=False,
                                refused=False)  # fmt: skip
        options = (f"-c listen_addresses='' -c unix_socket_directories={made} -c default_transaction_read_only=on"
                   " -c autovacuum=off -c archive_mode=off",)  # fmt: skip
        cluster = pg.Cluster(data_dir=datadir, port=ISOLATED_PORT, bin_dir=posixpath.dirname(binary),
                             os_user=owner, log_file=f"{made}/postgresql.log", options=options)  # fmt: skip
        try:
            host.run(pg.pg_ctl_command(cluster, "start", wait=int(ISOLATED_START_TIMEOUT)),
                     timeout=ISOLATED_START_TIMEOUT + 30)  # fmt: skip
            psql = [cluster.program("psql"), "-X", "-q", "-A", "-t", "-F", "\t", "-h", made, "-p", str(ISOLATED_PORT),
                    "-d", self.dbname]  # fmt: skip
            out = host.run(cluster.as_owner(psql), input=_figures_sql(tables, counts, checksums),
                           timeout=timeout, check=False).stdout  # fmt: skip
            return _parse_figures(out, tables)
        finally:
            host.run(f"{pg.pg_ctl_command(cluster, 'stop')}; rm -rf {shlex.quote(made)}",
                     timeout=ISOLATED_START_TIMEOUT + 30, check=False)  # fmt: skip

    # --- preflight ---

    def datadir_settings(self, session: Session) -> tuple[str, dict[str, str]]:
        """The server's data directory and the directories it keeps files in outside it (none: pg_wal is inside,
        a symbolic link there is one preflight's link check refuses)."""
        return str(_scalar(session, "SHOW data_directory")), {}

    def durability_settings(self, session: Session) -> dict[str, str]:
        with session.cursor() as cur:
            cur.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", (list(DURABILITY_SETTINGS),))
            return {str(n): str(v) for n, v in cur.fetchall()}

    def installed_version(self) -> Probe[str]:
        """A host's installed server (its newest major, '' when none)."""
        return Probe(pg.installed_majors_command(), _newest_major, check=False)

    def preflight_notes(self, session: Session) -> tuple[list[str], dict[str, Any]]:
        """Problems for the shutdown mode (none beyond the common checks) and facts to report: data checksums and
        wal_log_hints (what a later pg_rewind would need)."""
        row = None
        with session.cursor() as cur:
            cur.execute("SELECT current_setting('data_checksums'), current_setting('wal_log_hints')")
            row = cur.fetchone()
        facts = {"data_checksums": str(row[0]) if row else "", "wal_log_hints": str(row[1]) if row else ""}
        return [], facts

    def replication(self) -> Replication | None:
        """Streaming replication (database/pg/replication.py), imported when a replicate run first needs it."""
        from orchestrator.database.pg.replication import open_replication

        return open_replication()


def _figures_sql(tables: list[str], counts: bool, checksums: bool) -> str:
    """One marked row per table and figure: a table that fails (missing) leaves its figure out, nothing shifts."""
    lines = []
    for i, name in enumerate(tables):
        schema, _, table = name.partition(".")
        quoted = '"' + schema.replace('"', '""') + '"."' + table.replace('"', '""') + '"'
        if counts:
            lines.append(f"SELECT 'count#{i}', count(*) FROM {quoted};")
        if checksums:
            lines.append(f"SELECT 'checksum#{i}', coalesce(sum(hashtext(t::text)::bigint), 0) FROM {quoted} t;")
    return "\n".join(lines) + "\n"


def _parse_figures(output: str, tables: list[str]) -> tuple[dict[str, int], dict[str, int | None]]:
    found_counts: dict[str, int] = {}
    found_sums: dict[str, int | None] = {}
    for line in output.splitlines():
        head, _, value = line.partition("\t")
        kind, _, index = head.partition("#")
        if not index.isdigit() or int(index) >= len(tables):
            continue
        if kind == "count":
            found_counts[tables[int(index)]] = int(value)
        elif kind == "checksum":
            found_sums[tables[int(index)]] = int(value)
    return found_counts, found_sums


def _newest_major(text: str) -> str:
    majors = pg.parse_majors(text)
    return str(majors[-1]) if majors else ""


def open_database(name: str, *, meter: RoundTrips | None = None) -> PostgreSql:
    return PostgreSql(name, meter=meter)
