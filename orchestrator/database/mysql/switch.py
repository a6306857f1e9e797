"""The replicate window's switch: read_only on the source, its final GTID position, the wait, the promotion (STOP
SLAVE, RESET SLAVE ALL, read_only=0) and the proof that the target executed exactly the source's position.
"""

from __future__ import annotations

from dataclasses import dataclass

import pymysql

from orchestrator.database.mysql.gtid import (
    GtidPosition,
    PositionMismatch,
    ReplicationError,
    _run,
    _scalar,
    gtid_slave_pos,
    same_position,
)
from orchestrator.database.mysql.replica import stop_replica
from orchestrator.database.mysql.session import db_error, read_timeout
from orchestrator.database.protocol import Session

# --- the switch -------------------------------------------------------------------------------------------------


def set_read_only(conn: Session, on: bool, *, lock_wait_timeout: float) -> None:
    """SET GLOBAL read_only. Global: it outlives this session (unlike FLUSH TABLES WITH READ LOCK), so a run that
    dies leaves it set and its undo must clear it. Turning it on waits for running commits and table locks, at most
    `lock_wait_timeout`. Accounts with READ ONLY ADMIN (or SUPER before MariaDB 11.0.1) still write, as do the
    replication threads: the application's account must have neither."""
    seconds = max(1, int(lock_wait_timeout + 0.999))
    _run(
        conn,
        f"SET GLOBAL read_only = {int(on)}",
        f"SET SESSION lock_wait_timeout = {seconds}",
        f"SET GLOBAL read_only = {1 if on else 0}",
    )


def read_only_and_position(conn: Session, *, lock_wait_timeout: float) -> GtidPosition:
    """set_read_only(on) and then the position this server has written to its binlog (its final one: nothing
    without READ ONLY ADMIN commits after read_only), in one round trip: one compound statement (MariaDB's `BEGIN
    NOT ATOMIC`), whose statements run in order and stop at the first error (read_only not set: the lock wait's
    error, and no position)."""
    seconds = max(1, int(lock_wait_timeout + 0.999))
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"BEGIN NOT ATOMIC SET SESSION lock_wait_timeout = {seconds}; SET GLOBAL read_only = 1; "
                "SELECT @@GLOBAL.gtid_binlog_pos; END"
            )
            row = cur.fetchone()
    except pymysql.MySQLError as exc:
        raise ReplicationError(str(db_error("SET GLOBAL read_only = 1", exc))) from None
    if row is None:
        raise ReplicationError("SET GLOBAL read_only = 1: no binlog position came back")
    return GtidPosition.parse(str(row[0] or ""))


def is_read_only(conn: Session) -> bool:
    return int(str(_scalar(conn, "SELECT @@GLOBAL.read_only"))) == 1


def promote(conn: Session, expected: GtidPosition | None = None) -> GtidPosition:
    """The replica becomes a primary: replication stopped, the proof checked, replication forgotten, writes allowed.

    Returns the position it executed (gtid_slave_pos read after the stop). With `expected` (the source's final
    position), a replica that did not execute exactly that position is NOT promoted: it is left stopped and
    read-only, its replication settings intact, and PositionMismatch says where it stands (the source may be
    resumed, or the replica started again).
    """
    stop_replica(conn)
    executed = gtid_slave_pos(conn)
    if expected is not None and not same_position(expected, executed):
        raise PositionMismatch(
            f"the replica executed {executed or 'nothing'}, the source's final position is {expected}"
        )
    _run(conn, "promoting the replica", "RESET SLAVE ALL", "SET GLOBAL read_only = 0")
    return executed


@dataclass(frozen=True)
class Promotion:
    """What wait_and_promote did: the replica reached the position (within the wait) or not; when it did, it was
    stopped, and promoted only if it executed exactly that position."""

    reached: bool
    promoted: bool
    executed: GtidPosition  # gtid_slave_pos read after STOP SLAVE (empty when not reached)
    waited: float  # seconds the replica took to reach the position, on the server's clock


def wait_and_promote(conn: Session, expected: GtidPosition, wait: float) -> Promotion:
    """MASTER_GTID_WAIT(expected, wait) and, once reached, promote() with its proof, in one round trip: one compound
    statement (MariaDB's `BEGIN NOT ATOMIC`) that stops replication, reads what the replica executed, and only when
    that is exactly `expected` in each of its domains (same_position, checked on the server: gtid_slave_pos holds
    one GTID per domain, so `expected`'s GTID of a domain is in that list exactly when the replica stands there)
    forgets replication and allows writes. Checked again here from what it read. Not reached within `wait`:
    nothing changed (the caller waits in slices, then promotes, as before). Reached but not that position: left
    stopped and read-only, its replication settings intact, as promote() leaves it (PositionMismatch)."""
    proof = (
        " AND ".join(
            f"FIND_IN_SET('{int(g.domain)}-{int(g.server_id)}-{int(g.seq)}', REPLACE(executed, ' ', '')) > 0"
            for g in expected.gtids
        )
        or "TRUE"
    )
    block = (
        "BEGIN NOT ATOMIC "
        "DECLARE began DATETIME(6) DEFAULT SYSDATE(6); DECLARE reached INT DEFAULT NULL; "
        "DECLARE waited BIGINT DEFAULT 0; DECLARE executed TEXT DEFAULT ''; DECLARE promoted INT DEFAULT 0; "
        "SET reached = MASTER_GTID_WAIT(%s, %s); "
        "SET waited = TIMESTAMPDIFF(MICROSECOND, began, SYSDATE(6)); "
        "IF reached = 0 THEN "
        "STOP SLAVE; SET executed = @@GLOBAL.gtid_slave_pos; "
        f"IF {proof} THEN RESET SLAVE ALL; SET GLOBAL read_only = 0; SET promoted = 1; END IF; "
        "END IF; "
        "SELECT reached, promoted, executed, waited; "
        "END"
    )
    try:
        with read_timeout(conn, wait + 10), conn.cursor() as cur:
            cur.execute(block, (str(expected), max(0.0, wait)))
            row = cur.fetchone()
    except pymysql.MySQLError as exc:
        raise ReplicationError(str(db_error("promoting the replica", exc))) from None
    if row is None:
        raise ReplicationError("promoting the replica: nothing came back")
    reached, promoted = row[0] is not None and int(str(row[0])) == 0, int(str(row[1] or 0)) == 1
    executed = GtidPosition.parse(str(row[2] or "")) if reached else GtidPosition()
    outcome = Promotion(reached, promoted, executed, int(str(row[3] or 0)) / 1e6)
    if reached and not same_position(expected, executed):
        raise PositionMismatch(
            f"the replica executed {executed or 'nothing'}, the source's final position is {expected}"
            + (" (and the server promoted it: a defect of the proof)" if promoted else "")
        )
    return outcome
