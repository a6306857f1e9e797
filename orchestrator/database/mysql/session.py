"""MySQL/MariaDB over pymysql: connections (through SSH tunnels) and the read-only figures steps compare.

Always call these from an ordinary thread (never the SSH event loop's) and always with a read timeout: a
blocking call through a tunnel whose peer vanished must end, not hang.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from typing import Any, cast

import pymysql

from orchestrator.database.protocol import Blocker, DatabaseError, Session, TableLimit
from orchestrator.secrets import redact

SYSTEM_SCHEMAS = ("mysql", "information_schema", "performance_schema", "sys")
# Client error codes meaning "could not reach / lost the server": trying again may help.
_TRANSIENT_CODES = {2002, 2003, 2006, 2013, 2055, 1040, 1053, 1205, 1213}
ER_LOCK_WAIT_TIMEOUT = 1205
# The client library's error numbers start here (below: the server's own answers).
CLIENT_ERRORS = 2000
QUERY_SUMMARY_CHARS = 80
# A statement that may carry a password (SET PASSWORD, IDENTIFIED BY [PASSWORD] / AS / USING / VIA, PASSWORD(),
# MASTER_PASSWORD=, ...) has EVERY string literal masked: listing the forms one by one always misses one.
_SECRET_STATEMENT = re.compile(r"PASSWORD|IDENTIFIED|\bUSING\s+['\"]", re.IGNORECASE)
# A quoted literal with its escapes ('it''s', 'a\'b'), or an unterminated one (a truncated query) to the end.
_LITERAL = re.compile(r"""'(?:[^'\\]|\\.|'')*(?:'|$)|"(?:[^"\\]|\\.|"")*(?:"|$)""", re.DOTALL)


class DbError(DatabaseError):
    """A MariaDB failure (the seam's DatabaseError): a one-line message (no secrets), whether retrying may help."""

    @property
    def server_answered(self) -> bool:
        return self.code is not None and self.code < CLIENT_ERRORS


# Server variables naming where the database keeps files: a directory each, or a file whose directory counts.
# Only those the server has are checked (MySQL has no aria_log_dir_path, binary logging may be off).
DIRECTORY_VARIABLES = (
    "innodb_log_group_home_dir",
    "innodb_undo_directory",
    "innodb_data_home_dir",
    "aria_log_dir_path",
)
FILE_VARIABLES = ("log_bin_basename", "log_bin_index")


def db_error(what: str, exc: BaseException) -> DbError:
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    text = exc.args[1] if len(exc.args) > 1 else str(exc)
    return DbError(f"{what}: {text}" + (f" (error {code})" if code else ""), code in _TRANSIENT_CODES, code)


def connect(
    host: str,
    port: int,
    *,
    user: str,
    password: str | None,
    connect_timeout: float,
    read_timeout: float,
    write_timeout: float,
    database: str | None = None,
) -> Session:
    """An autocommit connection; raises DbError.

    Without TLS: the address is always the near end of an SSH tunnel (the runtime's), which already encrypts and
    authenticates the way. PyMySQL otherwise tries TLS by default and builds a TLS context for every connection,
    loading every system CA certificate: tens of milliseconds of CPU per connect, some of them inside the window.
    """
    try:
        return pymysql.connect(
            host=host,
            port=port,
            user=user,
            password=password or "",
            database=database,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            autocommit=True,
            charset="utf8mb4",
            ssl_disabled=True,
        )
    except pymysql.MySQLError as exc:
        raise db_error(f"cannot connect to the database as {user}", exc) from None


def _scalar(conn: Session, sql: str, args: object = None) -> object:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        row = cur.fetchone()
    return row[0] if row else None


def server_version(conn: Session) -> str:
    """The full version string, e.g. '10.11.6-MariaDB-0+deb12u1'."""
    return str(_scalar(conn, "SELECT VERSION()"))


def major_version(version: str) -> str:
    """'10.11.6-MariaDB...' or 'mariadbd  Ver 10.11.6-MariaDB ...' → '10.11'."""
    match = re.search(r"(\d+)\.(\d+)\.\d+", version)
    if not match:
        raise ValueError(f"no version number in {version!r}")
    return f"{match.group(1)}.{match.group(2)}"


def user_grants(conn: Session) -> list[str]:
    with conn.cursor() as cur:
        cur.execute("SHOW GRANTS")
        return [str(row[0]) for row in cur.fetchall()]


_GRANT = re.compile(r"^GRANT (?P<privs>.+?) ON (?P<on>\S+) TO ", re.IGNORECASE)


def missing_privileges(conn: Session, needed: Iterable[str]) -> set[str]:
    """Global privileges (ON *.*) among `needed` that the current user lacks."""
    return missing_from_grants(user_grants(conn), needed)


def missing_from_grants(grants: Iterable[str], needed: Iterable[str]) -> set[str]:
    """Privileges among `needed` that no global (ON *.*) grant in SHOW GRANTS' lines gives."""
    held: set[str] = set()
    for grant in grants:
        match = _GRANT.match(grant)
        if not match or match.group("on") != "*.*":
            continue
        privs = {p.strip().upper() for p in match.group("privs").split(",")}
        if "ALL PRIVILEGES" in privs or "ALL" in privs:
            return set()
        held |= privs
    return {p.upper() for p in needed} - held


def list_tables(conn: Session, schemas: list[str] | None = None) -> list[tuple[str, str]]:
    """Base tables (no views) of the given schemas, or of every non-system schema, sorted."""
    sql = "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE'"
    args: list[str] = list(SYSTEM_SCHEMAS)
    sql += " AND TABLE_SCHEMA NOT IN (" + ", ".join(["%s"] * len(SYSTEM_SCHEMAS)) + ")"
    if schemas is not None:
        if not schemas:
            return []
        sql += " AND TABLE_SCHEMA IN (" + ", ".join(["%s"] * len(schemas)) + ")"
        args += schemas
    sql += " ORDER BY TABLE_SCHEMA, TABLE_NAME"
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return [(str(s), str(t)) for s, t in cur.fetchall()]


def non_transactional_tables(conn: Session) -> list[str]:
    """The base tables outside InnoDB's snapshots (MyISAM, Aria, MEMORY, ...) of every non-system schema, one line
    each: name, engine, size and when last written (where the engine tells)."""
    marks = ", ".join(["%s"] * len(SYSTEM_SCHEMAS))
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, ENGINE, COALESCE(DATA_LENGTH, 0) + COALESCE(INDEX_LENGTH, 0),"
            " UPDATE_TIME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE'"
            f" AND LOWER(COALESCE(ENGINE, '')) <> 'innodb' AND TABLE_SCHEMA NOT IN ({marks})"
            " ORDER BY TABLE_SCHEMA, TABLE_NAME",
            list(SYSTEM_SCHEMAS),
        )
        rows = cur.fetchall()
    return [
        f"{schema}.{table} ({engine}, {int(size) / 1048576:.1f} MiB, last written {written or 'unknown'})"
        for schema, table, engine, size, written in rows
    ]


def open_snapshot(conn: Session, schemas: list[str] | None) -> dict[str, str]:
    """A read-only consistent snapshot on `conn` (kept open by the caller), and each table's engine, lower case."""
    with conn.cursor() as cur:
        cur.execute("START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT")
    tables = list_tables(conn, schemas)
    engines: dict[str, str] = {}
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, ENGINE FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE'"
        )
        for schema, table, engine in cur.fetchall():
            engines[f"{schema}.{table}"] = str(engine or "").lower()
    return {f"{s}.{t}": engines.get(f"{s}.{t}", "innodb") for s, t in tables}


def _quoted(schema: str, table: str) -> str:
    return "`" + schema.replace("`", "``") + "`.`" + table.replace("`", "``") + "`"


@contextlib.contextmanager
def read_timeout(conn: Session, seconds: float | None) -> Iterator[None]:
    """Bound the reads of the next statements to `seconds` (None: unchanged); the connection's timeout after.

    pymysql applies `_read_timeout` to its socket before every read, so changing it bounds the next query. A query
    that outlives it ends with error 2013 and the connection is closed (the server stops the query on its own
    once it notices).
    """
    if seconds is None:
        yield
        return
    # pymysql has no public setter for a connection's socket read timeout; its stubs leave the attribute out.
    before = conn._read_timeout  # type: ignore[attr-defined]  # private in pymysql's stubs, see above
    conn._read_timeout = seconds  # type: ignore[attr-defined]  # as above
    try:
        yield
    finally:
        conn._read_timeout = before  # type: ignore[attr-defined]  # as above


def _per_table(
    conn: Session, tables: Iterable[tuple[str, str]], sql: str, limit: TableLimit | None
) -> dict[str, tuple[object, ...] | None]:
    rows: dict[str, tuple[object, ...] | None] = {}
    with conn.cursor() as cur:
        for schema, table in tables:
            name = f"{schema}.{table}"
            seconds = limit(name) if limit is not None else None
            with read_timeout(conn, seconds):
                cur.execute(sql.format(table=_quoted(schema, table)))
                rows[name] = cur.fetchone()
    return rows


def row_counts(conn: Session, tables: Iterable[tuple[str, str]], *, limit: TableLimit | None = None) -> dict[str, int]:
    """Exact row counts (COUNT(*)), keyed "schema.table". `limit`: see TableLimit (one query per table)."""
    rows = _per_table(conn, tables, "SELECT COUNT(*) FROM {table}", limit)
    return {name: int(str(row[0])) if row else 0 for name, row in rows.items()}


def checksums(
    conn: Session, tables: Iterable[tuple[str, str]], *, limit: TableLimit | None = None
) -> dict[str, int | None]:
    """CHECKSUM TABLE of each table (reads whole tables), keyed "schema.table"; None for a missing table."""
    rows = _per_table(conn, tables, "CHECKSUM TABLE {table}", limit)
    return {name: None if not row or row[1] is None else int(str(row[1])) for name, row in rows.items()}


def answers(conn: Session) -> bool:
    try:
        return _scalar(conn, "SELECT 1") == 1
    except pymysql.MySQLError:
        return False


# --- the cut-over's lock session ---


def set_lock_wait_timeout(conn: Session, seconds: float) -> None:
    """Bound this session's wait for a lock (whole seconds: MariaDB refuses a fractional lock_wait_timeout)."""
    with conn.cursor() as cur:
        cur.execute("SET SESSION lock_wait_timeout = %s", (max(1, round(seconds)),))


def flush_tables_with_read_lock(conn: Session) -> bool:
    """FLUSH TABLES WITH READ LOCK: True once held (until the session closes), False when the wait timed out.

    Any other failure raises DbError (message redacted).
    """
    try:
        with conn.cursor() as cur:
            cur.execute("FLUSH TABLES WITH READ LOCK")
    except pymysql.err.OperationalError as exc:
        if exc.args and exc.args[0] == ER_LOCK_WAIT_TIMEOUT:
            return False
        raise DbError(f"FLUSH TABLES WITH READ LOCK failed: {exc.args[-1] if exc.args else exc}", False) from None
    return True


def is_read_only(conn: Session) -> bool:
    """Is the server refusing writes to accounts without READ ONLY ADMIN (SET GLOBAL read_only)?"""
    return int(str(_scalar(conn, "SELECT @@GLOBAL.read_only"))) == 1


def ping(conn: Session) -> None:
    """One round trip to the server (SELECT 1)."""
    _scalar(conn, "SELECT 1")


def error_log_path(conn: Session) -> str:
    """The server's error log (@@log_error): absolute, relative to the datadir, or empty (stderr / the journal)."""
    return str(_scalar(conn, "SELECT @@GLOBAL.log_error") or "").strip()


def session_alive(conn: Session) -> bool:
    """Does this session's server still answer? (A session dies with its server.)"""
    try:
        cast(pymysql.Connection, conn).ping(reconnect=False)
    except (pymysql.err.MySQLError, OSError):
        return False
    return True


def close_quietly(conn: Session) -> None:
    """Close a session (releasing its locks); a server already gone released them too."""
    with contextlib.suppress(pymysql.err.MySQLError, OSError):
        conn.close()


def mask_query(text: str | None, limit: int = QUERY_SUMMARY_CHARS) -> str:
    """One line of a query, secrets masked, truncated: safe for logs and error messages."""
    if not text:
        return ""
    line = " ".join(text.split())
    if _SECRET_STATEMENT.search(line):
        line = _LITERAL.sub("'***'", line)
    line = redact(line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def blockers_from_rows(rows: Iterable[tuple[Any, ...]]) -> list[Blocker]:
    """PROCESSLIST rows (ID, USER, COMMAND, TIME, STATE, INFO) → blockers, queries masked."""
    return [
        Blocker(
            id=int(row[0]),
            user=str(row[1] or ""),
            command=str(row[2] or ""),
            seconds=int(row[3] or 0),
            state=str(row[4] or ""),
            query=mask_query(row[5]),
        )
        for row in rows
    ]


def find_blockers(conn: Session) -> list[Blocker]:
    """Sessions other than ours that are running something, longest first."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT ID, USER, COMMAND, TIME, STATE, INFO FROM information_schema.PROCESSLIST "
            "WHERE ID <> CONNECTION_ID() AND COMMAND NOT IN ('Sleep', 'Daemon', 'Binlog Dump', 'Killed') "
            "ORDER BY TIME DESC LIMIT 10"
        )
        return blockers_from_rows(cur.fetchall())


# States of sessions waiting for a lock someone else holds (metadata locks, LOCK TABLES, FTWRL's backup lock).
_WAITING_STATES = ("Waiting for table metadata lock", "Waiting for backup lock", "Waiting for table level lock",
                   "Waiting for global read lock")  # fmt: skip


def find_lock_holders(conn: Session, waited: float = 0.0) -> list[Blocker]:
    """Sessions holding the locks others wait for, even idle ones (LOCK TABLES … WRITE then nothing).

    Where the server shows metadata locks (information_schema.METADATA_LOCK_INFO, a MariaDB plugin) they name the
    holder exactly; otherwise a holder is an idle session with an open transaction, or idle for at least as long
    as the oldest waiter has waited (our own lock attempt, `waited` seconds, counts as a waiter): the sessions that
    can be holding it are named. Waiters themselves are never named as holders.
    """
    with conn.cursor() as cur:
        try:
            cur.execute(
                "SELECT DISTINCT p.ID, p.USER, p.COMMAND, p.TIME, p.STATE, p.INFO "
                "FROM information_schema.METADATA_LOCK_INFO m JOIN information_schema.PROCESSLIST p "
                "ON p.ID = m.THREAD_ID WHERE m.THREAD_ID <> CONNECTION_ID() "
                "AND m.LOCK_TYPE LIKE '%%table lock%%' ORDER BY p.TIME DESC LIMIT 10"
            )
            exact = blockers_from_rows(cur.fetchall())
            if exact:
                return exact
        except pymysql.err.MySQLError:
            pass  # the plugin is not installed: infer from the process list
        states = ", ".join(["%s"] * len(_WAITING_STATES))
        cur.execute(
            f"SELECT MAX(TIME) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND STATE IN ({states})",
            _WAITING_STATES,
        )
        row = cur.fetchone()
        longest_wait = max(int(row[0]) if row and row[0] is not None else 0, int(waited))
        if longest_wait <= 0:
            return []
        cur.execute(
            "SELECT p.ID, p.USER, p.COMMAND, p.TIME, 'idle, holding a lock or an open transaction', p.INFO "
            "FROM information_schema.PROCESSLIST p LEFT JOIN information_schema.INNODB_TRX t "
            "ON t.trx_mysql_thread_id = p.ID WHERE p.ID <> CONNECTION_ID() AND p.COMMAND = 'Sleep' "
            # Our own other sessions (this run's pooled connections) hold nothing that blocks our lock.
            "AND p.USER <> SUBSTRING_INDEX(USER(), '@', 1) "
            "AND (t.trx_id IS NOT NULL OR p.TIME >= %s) ORDER BY t.trx_started IS NULL, p.TIME DESC LIMIT 10",
            (longest_wait,),
        )
        return blockers_from_rows(cur.fetchall())


def tables_in_use(conn: Session, limit: int = 10) -> list[str]:
    """Tables some session holds open or locked (LOCK TABLES leaves no running query to show)."""
    with conn.cursor() as cur:
        cur.execute("SHOW OPEN TABLES WHERE In_use > 0")
        rows = cur.fetchall()
    return [f"{row[0]}.{row[1]}" for row in rows[:limit]]


def summarize_blockers(
    blockers: list[Blocker], in_use: list[str] | None = None, limit: int = 3, *, holders: list[Blocker] | None = None
) -> str:
    """Who holds the lock first (idle or not), then who waits behind it, then the tables in use."""
    parts: list[str] = []
    holder_ids = {h.id for h in holders or []}
    if holders:
        parts.append("held by " + "; ".join(h.summary() for h in holders[:limit]))
    waiting = [b for b in blockers if b.id not in holder_ids and b.state in _WAITING_STATES]
    running = [b for b in blockers if b.id not in holder_ids and b.state not in _WAITING_STATES]
    if running:
        parts.append("; ".join(b.summary() for b in running[:limit]))
        if len(running) > limit:
            parts.append(f"and {len(running) - limit} more")
    if waiting:
        parts.append(f"{len(waiting)} session(s) waiting behind it")
    if in_use:
        parts.append("tables in use: " + ", ".join(in_use))
    if not parts:
        return "no running query seen (the blocker may have finished)"
    return "; ".join(parts)


# --- positions ---

# Spellings of "where the binary log ends", newest first: MySQL 8.4 dropped SHOW MASTER STATUS.
BINLOG_STATUS_STATEMENTS = ("SHOW BINLOG STATUS", "SHOW BINARY LOG STATUS", "SHOW MASTER STATUS")


def binlog_position(conn: Session) -> dict[str, Any] | None:
    """The binlog file and position (and GTID when known), or None when binary logging is off."""
    row: tuple[Any, ...] | None = None
    for statement in BINLOG_STATUS_STATEMENTS:
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
                row = cur.fetchone()
            break
        except pymysql.err.ProgrammingError:
            continue  # syntax this server does not know: try the next spelling
    if not row:
        return None
    position: dict[str, Any] = {"file": row[0], "position": int(row[1])}
    gtid = gtid_binlog_pos(conn)
    if gtid:
        position["gtid"] = gtid
    return position


def gtid_binlog_pos(conn: Session) -> str | None:
    """MariaDB's GTID of the last event in the binary log (None where the server has no such variable)."""
    try:
        value = _scalar(conn, "SELECT @@GLOBAL.gtid_binlog_pos")
    except pymysql.err.MySQLError:
        return None
    return str(value) if value else None
