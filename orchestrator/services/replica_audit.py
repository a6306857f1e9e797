"""The replicate mode's after-commit audit: the source, read-only and frozen at its final position, against the
target's snapshot opened at the promotion, in the same primary-key chunks as repl_catchup's comparison.

repl_catchup compared the replica before the window; a change made on the replica after that comparison (a write
with the binary log off, by an account that may write through read_only, or by hand) reaches no GTID, so the
switch's proof (the replica executed exactly the source's final position) cannot see it. This audit can: after the
commit, nothing on the source changes (read_only, fenced, no replication into it until finish), and the target's
side is read in the consistent snapshot verify_target opened on the promoted, still fenced target (held on the
run's runtime, orchestrator/services/audit.py), so the target's writes since the commit are outside it.

Why that snapshot holds the target exactly as migrated: it is opened after the promotion (verify_target runs after
the switch has returned) and before the commit (the commit point, switch_traffic with a front door on the source or
else the DNS flip, lifts the target's fence after verify_target has returned): no write of the application can be
in it. A write made by another hand meanwhile is in it, and differs
from the source: that is what the audit is for. The session's isolation level is checked afterwards (a snapshot
under READ COMMITTED would see the writes since the commit): a session not in REPEATABLE READ is reported, not
compared. The source's side is proven frozen too: its own snapshot's binary-log position must be the final GTID
position the switch journaled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from orchestrator.database.mysql import compare, gtid
from orchestrator.database.protocol import DatabaseError, Session

# A table missing on one side (ER_NO_SUCH_TABLE).
NO_SUCH_TABLE = 1146
# The connection is gone: nothing more can be read on it (CR_SERVER_GONE_ERROR, CR_SERVER_LOST).
CONNECTION_GONE = (2006, 2013)
SNAPSHOT_STATEMENT = "START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT"
# The snapshot and the target's position in one round trip: a transaction begun inside a compound statement keeps
# its snapshot after it (MariaDB 10.11). The position is read after the read view is made: it cannot be behind it.
SNAPSHOT_AND_POSITION = f"BEGIN NOT ATOMIC {SNAPSHOT_STATEMENT}; SELECT @@GLOBAL.gtid_current_pos; END"
# The same once the server has applied a position (read beside the promotion that waits for it too): the snapshot is
# opened only once the wait reached it (NULL comes back otherwise, nothing opened).
SNAPSHOT_AND_POSITION_AFTER = (
    "BEGIN NOT ATOMIC IF MASTER_GTID_WAIT(%s, %s) = 0 THEN "
    f"{SNAPSHOT_STATEMENT}; SELECT @@GLOBAL.gtid_current_pos; ELSE SELECT NULL; END IF; END"
)


class AuditUnreadable(Exception):
    """One side could not be read at all (its connection is gone): nothing was proven."""


@dataclass
class ChunkedAudit:
    """What the chunked comparison found and what it cost."""

    differences: list[compare.ChunkDiff] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # tables the source has and the target's snapshot does not
    unread: dict[str, str] = field(default_factory=dict)  # table -> why it could not be compared
    tables: int = 0
    chunks: int = 0
    rows: int = 0  # the source's rows compared
    seconds: float = 0.0


def open_target_snapshot(conn: Session) -> None:
    """One statement, one round trip: the read view is made when it returns."""
    with conn.cursor() as cur:
        cur.execute(SNAPSHOT_STATEMENT)


class NotReached(Exception):
    """The target did not apply the awaited position within the wait: nothing was opened."""


def open_target_snapshot_at_position(
    conn: Session, after: tuple[gtid.GtidPosition, float] | None = None
) -> gtid.GtidPosition:
    """Open the snapshot and read the target's GTID position (gtid_current_pos) in one statement, one round trip;
    the position read just after the read view was made. `after` (a position, a wait in seconds): only once the
    server has applied it; NotReached when it was not in that time."""
    with conn.cursor() as cur:
        if after is None:
            cur.execute(SNAPSHOT_AND_POSITION)
        else:
            cur.execute(SNAPSHOT_AND_POSITION_AFTER, (str(after[0]), after[1]))
        row = cur.fetchone()
    if row is None:
        raise DatabaseError("no GTID position came back with the snapshot")
    if after is not None and row[0] is None:
        raise NotReached(f"the target did not apply {after[0]} within {after[1]:g} s")
    return gtid.GtidPosition.parse(str(row[0] or ""))


def snapshot_isolation(conn: Session) -> str:
    """The held session's isolation level ('REPEATABLE-READ' for a true consistent snapshot)."""
    with conn.cursor() as cur:
        cur.execute("SELECT @@SESSION.tx_isolation")
        row = cur.fetchone()
    return str(row[0]) if row else ""


def table_engines(conn: Session) -> dict[str, str]:
    """Each base table's engine, lower case, by 'schema.table'."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, ENGINE FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE'"
        )
        return {f"{schema}.{table}": str(engine or "").lower() for schema, table, engine in cur.fetchall()}


def _gone(exc: DatabaseError) -> bool:
    return bool(exc.args) and exc.args[0] in CONNECTION_GONE


def compare_snapshots(
    source: Session,
    target: Session,
    tables: Iterable[tuple[str, str]],
    *,
    chunk_rows: int,
    pause_ratio: float = 0.0,
    on_chunk: Callable[[str, int, int], None] | None = None,
) -> ChunkedAudit:
    """Both sides' checksums over the source's primary-key chunks (compare.chunk_bounds / compare.chunk_checksum, as
    repl_catchup compares). A table one side cannot read is listed with why and the others go on; a connection
    that is gone ends it (AuditUnreadable). `pause_ratio`: after each chunk, that many times its duration (the
    live target's share)."""
    found = ChunkedAudit()
    started = time.monotonic()
    for schema, table in tables:
        found.tables += 1
        name = f"{schema}.{table}"
        side = "source"
        try:
            shape = compare.table_shape(source, schema, table)
            chunks = compare.chunk_bounds(source, shape, chunk_rows)
            for chunk in chunks:
                began = time.monotonic()
                side = "source"
                ours = compare.chunk_checksum(source, shape, chunk)
                side = "target"
                theirs = compare.chunk_checksum(target, shape, chunk)
                found.chunks += 1
                found.rows += ours.rows
                if ours != theirs:
                    found.differences.append(compare.ChunkDiff(shape.name, chunk, shape.key, ours, theirs))
                if on_chunk is not None:
                    on_chunk(name, chunk.index + 1, len(chunks))
                if pause_ratio > 0:
                    time.sleep((time.monotonic() - began) * pause_ratio)
        except DatabaseError as exc:
            if _gone(exc):
                raise AuditUnreadable(f"the {side}'s connection is gone at {name}: {exc}") from None
            if side == "target" and exc.args and exc.args[0] == NO_SUCH_TABLE:
                found.missing.append(name)
            else:
                found.unread[name] = f"on the {side}: {exc}"
    found.seconds = round(time.monotonic() - started, 3)
    return found
