"""MySQL/MariaDB over pymysql: connections (through SSH tunnels) and the read-only figures steps compare.

Always call these from an ordinary thread (never the SSH event loop's) and always with a read timeout: a
blocking call through a tunnel whose peer vanished must end, not hang.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable, Iterator

import pymysql

from orchestrator.secrets import redact

SYSTEM_SCHEMAS = ("mysql", "information_schema", "performance_schema", "sys")
# Client error codes meaning "could not reach / lost the server": trying again may help.
_TRANSIENT_CODES = {2002, 2003, 2006, 2013, 2055, 1040, 1053, 1205, 1213}


class DbError(Exception):
    """A database failure with a one-line message (no secrets) and whether retrying may help."""

    def __init__(self, message: str, transient: bool, code: int | None = None) -> None:
        super().__init__(redact(message))
        self.transient = transient
        self.code = code

    @property
    def server_answered(self) -> bool:
        """The server itself refused (e.g. access denied), as opposed to nothing answering at all."""
        return self.code is not None and self.code < 2000


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
) -> pymysql.Connection:
    """An autocommit connection; raises DbError."""
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
        )
    except pymysql.MySQLError as exc:
        raise db_error(f"cannot connect to the database as {user}", exc) from None


def _scalar(conn: pymysql.Connection, sql: str, args: object = None) -> object:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        row = cur.fetchone()
    return row[0] if row else None


def server_version(conn: pymysql.Connection) -> str:
    """The full version string, e.g. '10.11.6-MariaDB-0+deb12u1'."""
    return str(_scalar(conn, "SELECT VERSION()"))


def major_version(version: str) -> str:
    """'10.11.6-MariaDB...' or 'mariadbd  Ver 10.11.6-MariaDB ...' → '10.11'."""
    match = re.search(r"(\d+)\.(\d+)\.\d+", version)
    if not match:
        raise ValueError(f"no version number in {version!r}")
    return f"{match.group(1)}.{match.group(2)}"


def user_grants(conn: pymysql.Connection) -> list[str]:
    with conn.cursor() as cur:
        cur.execute("SHOW GRANTS")
        return [str(row[0]) for row in cur.fetchall()]


_GRANT = re.compile(r"^GRANT (?P<privs>.+?) ON (?P<on>\S+) TO ", re.IGNORECASE)


def missing_privileges(conn: pymysql.Connection, needed: Iterable[str]) -> set[str]:
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


def has_privileges(conn: pymysql.Connection, needed: Iterable[str]) -> bool:
    return not missing_privileges(conn, needed)


def list_tables(conn: pymysql.Connection, schemas: list[str] | None = None) -> list[tuple[str, str]]:
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


def _quoted(schema: str, table: str) -> str:
    return "`" + schema.replace("`", "``") + "`.`" + table.replace("`", "``") + "`"


# Called before each table's query with "schema.table": may raise to stop there, and returns how many seconds that
# query may take (None: the connection's own read timeout).
TableLimit = Callable[[str], float | None]


@contextlib.contextmanager
def read_timeout(conn: pymysql.Connection, seconds: float | None) -> Iterator[None]:
    """Bound the reads of the next statements to `seconds` (None: unchanged); the connection's timeout after.

    pymysql applies `_read_timeout` to its socket before every read, so changing it bounds the next query. A query
    that outlives it ends with error 2013 and the connection is closed (the server stops the query on its own
    once it notices).
    """
    if seconds is None:
        yield
        return
    before = conn._read_timeout
    conn._read_timeout = seconds
    try:
        yield
    finally:
        conn._read_timeout = before


def _per_table(
    conn: pymysql.Connection, tables: Iterable[tuple[str, str]], sql: str, limit: TableLimit | None
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


def row_counts(
    conn: pymysql.Connection, tables: Iterable[tuple[str, str]], *, limit: TableLimit | None = None
) -> dict[str, int]:
    """Exact row counts (COUNT(*)), keyed "schema.table". `limit`: see TableLimit (one query per table)."""
    rows = _per_table(conn, tables, "SELECT COUNT(*) FROM {table}", limit)
    return {name: int(str(row[0])) if row else 0 for name, row in rows.items()}


def checksums(
    conn: pymysql.Connection, tables: Iterable[tuple[str, str]], *, limit: TableLimit | None = None
) -> dict[str, int | None]:
    """CHECKSUM TABLE of each table (reads whole tables), keyed "schema.table"; None for a missing table."""
    rows = _per_table(conn, tables, "CHECKSUM TABLE {table}", limit)
    return {name: None if not row or row[1] is None else int(str(row[1])) for name, row in rows.items()}


def answers(conn: pymysql.Connection) -> bool:
    try:
        return _scalar(conn, "SELECT 1") == 1
    except pymysql.MySQLError:
        return False
