"""The MariaDB replica: CHANGE MASTER TO … MASTER_USE_GTID=slave_pos after SET GLOBAL gtid_slave_pos, START/STOP
SLAVE, SHOW SLAVE STATUS parsed, MASTER_GTID_WAIT in slices that notice a broken replica.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, cast

import pymysql

from orchestrator.database.mysql.gtid import GtidPosition, ReplicationError, _run, _scalar, gtid_slave_pos
from orchestrator.database.mysql.session import db_error, read_timeout
from orchestrator.database.protocol import ReplicaSource, Session
from orchestrator.secrets import redact, register

# How long one MASTER_GTID_WAIT call may block before the replica's health is looked at again.
WAIT_SLICE = 0.5


# --- the replica ------------------------------------------------------------------------------------------------


def start_binlog_at(conn: Session, position: GtidPosition) -> None:
    """On a freshly seeded server: its binlog starts at the copy's position (RESET MASTER, gtid_binlog_state).

    The copy carries no binlog. With this, the target's first binlog lists the source's last GTID, so after the
    promotion an old source asking to replicate from exactly that position (nothing written between the seed and
    the switch) finds it there, and the target's own @@gtid_binlog_pos starts where its data does. (On the lab,
    MariaDB 10.11 also accepted that request without it; the GTID docs make no such promise under
    gtid_strict_mode.)
    """
    _run(conn, "setting the seeded binlog state", "RESET MASTER", f"SET GLOBAL gtid_binlog_state = '{position}'")


def point_replica(conn: Session, source: ReplicaSource, start_at: GtidPosition) -> None:
    """Make this server a GTID replica of `source` from `start_at` (not started: see start_replica).

    The password goes into CHANGE MASTER as a bound parameter and is registered for redaction; an error message
    never carries it. The server keeps it in its master.info (in the datadir), as every MariaDB replica does.
    """
    register(source.password)
    try:
        with conn.cursor() as cur:
            cur.execute("STOP SLAVE")
            cur.execute("RESET SLAVE ALL")
            cur.execute("SET GLOBAL gtid_slave_pos = %s", (str(start_at),))
            cur.execute(
                "CHANGE MASTER TO MASTER_HOST = %s, MASTER_PORT = %s, MASTER_USER = %s, MASTER_PASSWORD = %s, "
                "MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = %s, MASTER_HEARTBEAT_PERIOD = %s",
                (source.host, source.port, source.user, source.password, source.connect_retry, source.heartbeat_period),
            )
    except pymysql.MySQLError as exc:
        message = str(db_error("pointing the replica at its source", exc)).replace(source.password, "***")
        raise ReplicationError(redact(message)) from None


def forget_replication(conn: Session) -> None:
    """STOP SLAVE and RESET SLAVE ALL: no more replication, and master.info (which holds the replication password
    in clear) deleted. A no-op on a server that is not a replica."""
    if replica_status(conn) is None:
        return
    _run(conn, "forgetting replication", "STOP SLAVE", "RESET SLAVE ALL")


def start_replica(conn: Session) -> None:
    _run(conn, "START SLAVE", "START SLAVE")


def stop_replica(conn: Session) -> None:
    _run(conn, "STOP SLAVE", "STOP SLAVE")


@dataclass(frozen=True)
class ReplicaStatus:
    """SHOW SLAVE STATUS, the parts a run decides on."""

    io_running: str  # Yes, No, Connecting
    sql_running: bool
    seconds_behind: int | None
    gtid_io_pos: GtidPosition
    last_io_errno: int
    last_io_error: str
    last_sql_errno: int
    last_sql_error: str
    master_host: str
    master_port: int
    using_gtid: str
    until_condition: str

    @property
    def replicating(self) -> bool:
        return self.io_running == "Yes" and self.sql_running

    @property
    def error(self) -> str | None:
        """The replica's own words for what stopped it, or None."""
        if self.last_sql_errno:
            return f"replica SQL thread error {self.last_sql_errno}: {self.last_sql_error}"
        if self.last_io_errno:
            return f"replica IO thread error {self.last_io_errno}: {self.last_io_error}"
        return None


def replica_status(conn: Session) -> ReplicaStatus | None:
    """None when the server is not a replica."""
    with cast(pymysql.Connection, conn).cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute("SHOW SLAVE STATUS")
        row = cur.fetchone()
    if not row:
        return None
    behind = row.get("Seconds_Behind_Master")
    return ReplicaStatus(
        io_running=str(row.get("Slave_IO_Running") or "No"),
        sql_running=row.get("Slave_SQL_Running") == "Yes",
        seconds_behind=None if behind is None else int(behind),
        gtid_io_pos=GtidPosition.parse(str(row.get("Gtid_IO_Pos") or "")),
        last_io_errno=int(row.get("Last_IO_Errno") or 0),
        last_io_error=redact(str(row.get("Last_IO_Error") or "")),
        last_sql_errno=int(row.get("Last_SQL_Errno") or 0),
        last_sql_error=redact(str(row.get("Last_SQL_Error") or "")),
        master_host=str(row.get("Master_Host") or ""),
        master_port=int(row.get("Master_Port") or 0),
        using_gtid=str(row.get("Using_Gtid") or ""),
        until_condition=str(row.get("Until_Condition") or ""),
    )


WaitOutcome = Literal["reached", "timed_out", "replica_failed"]


@dataclass(frozen=True)
class WaitResult:
    outcome: WaitOutcome
    waited: float
    position: GtidPosition  # gtid_slave_pos when the wait ended
    error: str | None = None  # the replica's own error when it failed


def wait_for_position(
    conn: Session, wanted: GtidPosition, timeout: float, *, require_running: bool = True
) -> WaitResult:
    """MASTER_GTID_WAIT(wanted), at most `timeout` seconds, in slices: a replica that stops with an error ends the
    wait at once with its error (MASTER_GTID_WAIT alone would sit out the whole timeout)."""
    started = time.monotonic()
    while True:
        left = timeout - (time.monotonic() - started)
        chunk = max(0.0, min(WAIT_SLICE, left))
        with read_timeout(conn, chunk + 10):
            got = _scalar(conn, "SELECT MASTER_GTID_WAIT(%s, %s)", (str(wanted), chunk))
        if got is not None and int(str(got)) == 0:
            return WaitResult("reached", time.monotonic() - started, gtid_slave_pos(conn))
        status = replica_status(conn)
        if require_running and (status is None or not status.sql_running):
            error = status.error if status else "the server is not a replica"
            return WaitResult("replica_failed", time.monotonic() - started, gtid_slave_pos(conn), error or "stopped")
        if left <= 0:
            return WaitResult("timed_out", time.monotonic() - started, gtid_slave_pos(conn))
