"""The comparison (after Vitess VDiff): a consistent snapshot on the source at a known GTID position, the replica
stopped at that same position, and checksums of both sides over the same primary-key ranges.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pymysql

from orchestrator.database.mysql.gtid import GtidPosition, ReplicationError, _rows, _run, gtid_slave_pos, same_position
from orchestrator.database.mysql.replica import WaitResult, replica_status, wait_for_position
from orchestrator.database.mysql.session import db_error
from orchestrator.database.protocol import Session

# --- the comparison (VDiff) -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """A consistent snapshot open on a source connection and where it stands in the binlog."""

    binlog_file: str
    binlog_position: int
    gtid: GtidPosition


def open_consistent_snapshot(conn: Session) -> Snapshot:
    """START TRANSACTION WITH CONSISTENT SNAPSHOT on this connection (it stays open: read the source's side of the
    comparison on it, then `close_snapshot`) and the binlog position it sees, as a GTID position.

    It blocks no writer; it holds InnoDB's purge back while open, so keep the comparison bounded.
    """
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
            status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
            file, position = status["binlog_snapshot_file"], int(status["binlog_snapshot_position"])
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, position))
            row = cur.fetchone()
    except pymysql.MySQLError as exc:
        raise ReplicationError(str(db_error("opening a consistent snapshot", exc))) from None
    gtid = GtidPosition.parse(str(row[0]) if row and row[0] is not None else "")
    return Snapshot(file, position, gtid)


def close_snapshot(conn: Session) -> None:
    _run(conn, "closing the snapshot", "COMMIT")


def stop_replica_at(conn: Session, position: GtidPosition, timeout: float) -> WaitResult:
    """Run the replica up to exactly `position` and leave it stopped there.

    Stop the replica BEFORE opening the source's snapshot: the replica must not be past the snapshot already.
    """
    _run(conn, "START SLAVE UNTIL", "STOP SLAVE", f"START SLAVE UNTIL master_gtid_pos = '{position}'")
    result = wait_for_position(conn, position, timeout, require_running=False)
    if result.outcome != "reached":
        return result
    # The SQL thread stops by itself right after the UNTIL position; wait for that before reading the data.
    deadline = time.monotonic() + max(1.0, timeout - result.waited)
    while True:
        status = replica_status(conn)
        if status is None or not status.sql_running:
            break
        if time.monotonic() > deadline:
            return WaitResult("timed_out", result.waited, gtid_slave_pos(conn))
        time.sleep(0.02)
    _run(conn, "STOP SLAVE", "STOP SLAVE")
    executed = gtid_slave_pos(conn)
    if not same_position(position, executed):
        return WaitResult("replica_failed", result.waited, executed, f"stopped at {executed}, not at {position}")
    return WaitResult("reached", result.waited, executed)


@dataclass(frozen=True)
class TableShape:
    schema: str
    table: str
    key: tuple[str, ...]  # primary key (or first unique NOT NULL key) columns; empty: compared as one chunk
    columns: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def quoted(self) -> str:
        return f"{_ident(self.schema)}.{_ident(self.table)}"


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def table_shape(conn: Session, schema: str, table: str) -> TableShape:
    columns = _rows(
        conn,
        "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
        "ORDER BY ORDINAL_POSITION",
        (schema, table),
    )
    indexes = _rows(
        conn,
        "SELECT s.INDEX_NAME, s.COLUMN_NAME, c.IS_NULLABLE FROM information_schema.STATISTICS s "
        "JOIN information_schema.COLUMNS c ON c.TABLE_SCHEMA = s.TABLE_SCHEMA AND c.TABLE_NAME = s.TABLE_NAME "
        "AND c.COLUMN_NAME = s.COLUMN_NAME "
        "WHERE s.TABLE_SCHEMA = %s AND s.TABLE_NAME = %s AND s.NON_UNIQUE = 0 "
        "ORDER BY s.INDEX_NAME <> 'PRIMARY', s.INDEX_NAME, s.SEQ_IN_INDEX",
        (schema, table),
    )
    unique: dict[str, list[tuple[str, bool]]] = {}
    for index, column, nullable in indexes:
        unique.setdefault(str(index), []).append((str(column), nullable == "YES"))
    # The primary key, else the first unique key without a nullable column (NULLs may repeat in a unique key).
    key = next(([c for c, _ in cols] for cols in unique.values() if not any(n for _, n in cols)), [])
    return TableShape(schema, table, tuple(key), tuple(str(c[0]) for c in columns))


@dataclass(frozen=True)
class ChunkSum:
    rows: int
    digest: int


@dataclass(frozen=True)
class Chunk:
    index: int
    lower: tuple[object, ...] | None  # first key of the chunk (None: from the table's start)
    upper: tuple[object, ...] | None  # first key of the next chunk (None: to the table's end)


@dataclass(frozen=True)
class ChunkDiff:
    table: str
    chunk: Chunk
    key: tuple[str, ...]
    source: ChunkSum
    replica: ChunkSum

    def describe(self) -> str:
        lower = "the start" if self.chunk.lower is None else _key_text(self.chunk.lower)
        upper = "the end" if self.chunk.upper is None else f"before {_key_text(self.chunk.upper)}"
        keys = ", ".join(self.key) or "whole table"
        if self.source.rows != self.replica.rows:
            what = f"{self.source.rows} rows on the source, {self.replica.rows} on the replica"
        else:
            what = f"{self.source.rows} rows on both, contents differ"
        return f"{self.table} chunk {self.chunk.index} ({keys} from {lower} to {upper}): {what}"


def _key_text(values: tuple[object, ...]) -> str:
    return ", ".join(repr(v) for v in values) if len(values) > 1 else repr(values[0])


def _key_compare(key: tuple[str, ...], op: str) -> str:
    columns = ", ".join(_ident(c) for c in key)
    marks = ", ".join(["%s"] * len(key))
    return f"({columns}) {op} ({marks})" if len(key) > 1 else f"{columns} {op} %s"


def chunk_bounds(conn: Session, shape: TableShape, chunk_rows: int) -> list[Chunk]:
    """Primary-key ranges of about `chunk_rows` rows each, read on `conn` (the source's snapshot)."""
    if not shape.key:
        return [Chunk(0, None, None)]
    columns = ", ".join(_ident(c) for c in shape.key)
    starts: list[tuple[object, ...]] = []
    last: tuple[object, ...] | None = None
    while True:
        where = f"WHERE {_key_compare(shape.key, '>=')}" if last is not None else ""
        sql = f"SELECT {columns} FROM {shape.quoted} {where} ORDER BY {columns} LIMIT 1 OFFSET {chunk_rows}"
        rows = _rows(conn, sql, last)
        if not rows:
            break
        last = tuple(rows[0])
        starts.append(last)
    bounds: list[tuple[object, ...] | None] = [None, *starts, None]
    return [Chunk(i, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def _row_digest(shape: TableShape) -> str:
    # One 64-bit digest per row (MD5's first half), XORed over the chunk with the count beside it (as
    # pt-table-checksum does). The NULL flags keep NULL apart from an empty string, which CONCAT_WS skips.
    values = ", ".join(_ident(c) for c in shape.columns)
    nulls = ", ".join(f"ISNULL({_ident(c)})" for c in shape.columns)
    return f"CAST(CONV(LEFT(MD5(CONCAT_WS('#', {values}, CONCAT({nulls}))), 16), 16, 10) AS UNSIGNED)"


def chunk_checksum(conn: Session, shape: TableShape, chunk: Chunk) -> ChunkSum:
    conditions: list[str] = []
    args: list[object] = []
    if chunk.lower is not None:
        conditions.append(_key_compare(shape.key, ">="))
        args += list(chunk.lower)
    if chunk.upper is not None:
        conditions.append(_key_compare(shape.key, "<"))
        args += list(chunk.upper)
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    sql = f"SELECT COUNT(*), COALESCE(BIT_XOR({_row_digest(shape)}), 0) FROM {shape.quoted} {where}"
    rows = _rows(conn, sql, args)
    count, digest = rows[0]
    return ChunkSum(int(str(count)), int(str(digest)))


def sample_checksum_seconds(conn: Session, shape: TableShape, rows: int) -> tuple[float, int]:
    """A chunk's checksum over the table's first `rows` rows in key order, as compare_tables computes it, timed:
    (seconds, rows read). Read-only; what one chunk of the comparison costs on this server now."""
    order = f"ORDER BY {', '.join(_ident(c) for c in shape.key)}" if shape.key else ""
    sql = (
        f"SELECT COUNT(*), COALESCE(BIT_XOR({_row_digest(shape)}), 0) FROM "
        f"(SELECT * FROM {shape.quoted} {order} LIMIT {int(rows)}) AS sample"
    )
    started = time.monotonic()
    found = _rows(conn, sql)
    return time.monotonic() - started, int(str(found[0][0])) if found else 0


def compare_tables(
    source: Session,
    replica: Session,
    tables: Iterable[tuple[str, str]],
    *,
    chunk_rows: int = 2000,
    pause_ratio: float = 0.0,
    on_chunk: Callable[[str, int, int], None] | None = None,
) -> list[ChunkDiff]:
    """Checksums of both sides over the same key ranges; every chunk that differs, named by table and chunk.

    `source` must be inside `open_consistent_snapshot`, `replica` stopped at its position (`stop_replica_at`).
    `pause_ratio`: after each chunk, sleep that many times the chunk's duration (the live source's share).
    `on_chunk(table, done, total)` reports progress.
    """
    diffs: list[ChunkDiff] = []
    for schema, table in tables:
        shape = table_shape(source, schema, table)
        chunks = chunk_bounds(source, shape, chunk_rows)
        for chunk in chunks:
            started = time.monotonic()
            ours, theirs = chunk_checksum(source, shape, chunk), chunk_checksum(replica, shape, chunk)
            if ours != theirs:
                diffs.append(ChunkDiff(shape.name, chunk, shape.key, ours, theirs))
            if on_chunk is not None:
                on_chunk(shape.name, chunk.index + 1, len(chunks))
            if pause_ratio > 0:
                time.sleep((time.monotonic() - started) * pause_ratio)
    return diffs
