"""The comparison's non-transactional tables (MyISAM, Aria, MEMORY, ...): outside every snapshot, so a read of one
on the live source is a read of now, not of the snapshot's position.

Such a table is compared at a moment nothing wrote to it: the source read live between two binlog positions, the
replica run to exactly the second and read there. Equal: nothing differs. Different while the binlog between the
two positions holds no event naming the table (read with SHOW BINLOG EVENTS): a real difference. Different while
one does (or the events cannot be read, or the binlog rotated in between): the read raced a write, and it is tried
again, a bounded number of times; then the table is left "not compared before the window" with its figures, for
the after-commit audit (which reads such tables live too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pymysql

from orchestrator.database.mysql.compare import (
    Chunk,
    ChunkDiff,
    ChunkSum,
    TableShape,
    chunk_bounds,
    chunk_checksum,
    stop_replica_at,
    table_shape,
)
from orchestrator.database.mysql.gtid import GtidPosition, ReplicationError
from orchestrator.database.mysql.session import binlog_position, db_error
from orchestrator.database.protocol import Session

# Storage engines whose tables are inside `START TRANSACTION WITH CONSISTENT SNAPSHOT` (lower case).
TRANSACTIONAL_ENGINES = ("innodb",)
# Reads of one table tried before it is left to the after-commit audit.
TRIES = 5
# Events read between the two positions before the answer is taken as "written" (a busy binlog).
MAX_EVENTS = 20000


@dataclass(frozen=True)
class LiveOutcome:
    """One non-transactional table: `differences` (real ones), or `unsettled` (every read raced a write)."""

    table: str
    tries: int
    differences: list[ChunkDiff]
    unsettled: bool

    def describe(self) -> str:
        return (
            f"{self.table}: not compared before the window (written during each of {self.tries} reads); the "
            "after-commit audit reads it live"
        )


def engines(conn: Session, tables: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Each table's storage engine, lower case."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, LOWER(COALESCE(ENGINE, '')) FROM information_schema.TABLES"
            " WHERE TABLE_TYPE = 'BASE TABLE'"
        )
        found = {(str(schema), str(table)): str(engine) for schema, table, engine in cur.fetchall()}
    return {table: found.get(table, "") for table in tables}


def compare_live_table(
    source: Session, replica: Session, schema: str, table: str, *, chunk_rows: int, timeout: float
) -> LiveOutcome:
    """`source` outside any transaction (each read sees now); `replica` stopped at or before the source's
    position. Leaves the replica stopped at the position of its last read. Raises ReplicationError when a side
    cannot be read or the replica cannot be held at a position."""
    try:
        return _compare_live_table(source, replica, schema, table, chunk_rows=chunk_rows, timeout=timeout)
    except pymysql.MySQLError as exc:
        raise ReplicationError(str(db_error(f"comparing {schema}.{table} (read live)", exc))) from None


def _compare_live_table(
    source: Session, replica: Session, schema: str, table: str, *, chunk_rows: int, timeout: float
) -> LiveOutcome:
    shape = table_shape(source, schema, table)
    for attempt in range(1, TRIES + 1):
        before = binlog_position(source)
        chunks = chunk_bounds(source, shape, chunk_rows)
        ours = [chunk_checksum(source, shape, chunk) for chunk in chunks]
        after = binlog_position(source)
        if before is None or after is None or "gtid" not in after:
            raise ReplicationError("the source's binary log position cannot be read")
        reached = stop_replica_at(replica, GtidPosition.parse(str(after["gtid"])), timeout)
        if reached.outcome != "reached":
            raise ReplicationError(reached.error or f"the replica did not reach {after['gtid']}")
        theirs = [chunk_checksum(replica, shape, chunk) for chunk in chunks]
        diffs = _differences(shape, chunks, ours, theirs)
        if not diffs:
            return LiveOutcome(shape.name, attempt, [], unsettled=False)
        if not _written_between(source, shape, before, after):
            return LiveOutcome(shape.name, attempt, diffs, unsettled=False)
    return LiveOutcome(shape.name, TRIES, [], unsettled=True)


def _differences(
    shape: TableShape, chunks: list[Chunk], ours: list[ChunkSum], theirs: list[ChunkSum]
) -> list[ChunkDiff]:
    return [
        ChunkDiff(shape.name, chunk, shape.key, mine, other)
        for chunk, mine, other in zip(chunks, ours, theirs, strict=True)
        if mine != other
    ]


def _written_between(source: Session, shape: TableShape, before: dict[str, object], after: dict[str, object]) -> bool:
    """Whether the binlog between the two positions may hold a write to the table: an event naming it (a row
    event's table map, or a statement's text), the binlog rotated, or the events not readable. Cautious: True
    whenever it cannot tell."""
    if before["file"] != after["file"]:
        return True
    if before["position"] == after["position"]:
        return False
    # The table's name as a whole word (a row event's map names it schema.table; a statement, as written).
    named = re.compile(rf"(?<![\w$]){re.escape(shape.table)}(?![\w$])", re.IGNORECASE)
    try:
        with source.cursor() as cur:
            cur.execute(
                f"SHOW BINLOG EVENTS IN %s FROM {int(str(before['position']))} LIMIT {MAX_EVENTS}", (before["file"],)
            )
            events = cur.fetchall()
    except pymysql.MySQLError:
        return True
    end = int(str(after["position"]))
    for event in events:
        # Log_name, Pos, Event_type, Server_id, End_log_pos, Info
        if int(str(event[1])) >= end:
            return False
        if named.search(str(event[5])):
            return True
    return len(events) >= MAX_EVENTS
