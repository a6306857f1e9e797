"""MariaDB GTID positions, their parsing and comparison, and the small SQL helpers the replication modules share.

What runs in SQL takes an open pymysql connection (autocommit, from database/mysql/session.py) and returns typed
values; call it from an ordinary thread, never the SSH event loop's. Errors are one `ReplicationError` line, with
the server's own words and no secret.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pymysql

from orchestrator.database.mysql.session import db_error

# The replicate mode's errors are the seam's (every engine raises them); named here too for this package's modules.
from orchestrator.database.protocol import PositionMismatch, ReplicationError, Session

__all__ = ["PositionMismatch", "ReplicationError"]


# --- GTID positions ---------------------------------------------------------------------------------------------

_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")


@dataclass(frozen=True, order=True)
class Gtid:
    domain: int
    server_id: int
    seq: int

    def __str__(self) -> str:
        return f"{self.domain}-{self.server_id}-{self.seq}"


@dataclass(frozen=True)
class GtidPosition:
    """A GTID position (one GTID per replication domain), as in @@gtid_binlog_pos: '0-1-42,1-3-7'."""

    gtids: tuple[Gtid, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> GtidPosition:
        items = [part.strip() for part in (text or "").split(",") if part.strip()]
        gtids: dict[int, Gtid] = {}
        for item in items:
            match = _GTID.match(item)
            if not match:
                raise ValueError(f"not a GTID: {item!r}")
            gtid = Gtid(*(int(g) for g in match.groups()))
            if gtid.domain in gtids:
                raise ValueError(f"two GTIDs for domain {gtid.domain} in {text!r}")
            gtids[gtid.domain] = gtid
        return cls(tuple(sorted(gtids.values())))

    def __str__(self) -> str:
        return ",".join(str(g) for g in self.gtids)

    def __bool__(self) -> bool:
        return bool(self.gtids)

    def seq_by_domain(self) -> dict[int, int]:
        return {g.domain: g.seq for g in self.gtids}

    def reached(self, wanted: GtidPosition) -> bool:
        """Every domain of `wanted` is at or past its sequence number here (what MASTER_GTID_WAIT waits for)."""
        mine = self.seq_by_domain()
        return all(mine.get(g.domain, -1) >= g.seq for g in wanted.gtids)


# --- SQL helpers ------------------------------------------------------------------------------------------------


def _rows(conn: Session, sql: str, args: object = None) -> list[tuple[object, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def _scalar(conn: Session, sql: str, args: object = None) -> object:
    rows = _rows(conn, sql, args)
    return rows[0][0] if rows else None


def _run(conn: Session, what: str, *statements: str) -> None:
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    except pymysql.MySQLError as exc:
        raise ReplicationError(str(db_error(what, exc))) from None


def gtid_binlog_pos(conn: Session) -> GtidPosition:
    """What this server has written to its binlog: what a replica of it receives."""
    return GtidPosition.parse(str(_scalar(conn, "SELECT @@GLOBAL.gtid_binlog_pos") or ""))


def gtid_current_pos(conn: Session) -> GtidPosition:
    return GtidPosition.parse(str(_scalar(conn, "SELECT @@GLOBAL.gtid_current_pos") or ""))


def gtid_current_pos_after(conn: Session, expected: GtidPosition, wait: float) -> GtidPosition | None:
    """The position once the server has applied `expected` (MASTER_GTID_WAIT, at most `wait` seconds), in one
    statement: None when it was not reached in that time."""
    found = _scalar(
        conn, "SELECT IF(MASTER_GTID_WAIT(%s, %s) = 0, @@GLOBAL.gtid_current_pos, NULL)", (str(expected), wait)
    )
    return None if found is None else GtidPosition.parse(str(found))


def gtid_slave_pos(conn: Session) -> GtidPosition:
    """What this server has applied as a replica."""
    return GtidPosition.parse(str(_scalar(conn, "SELECT @@GLOBAL.gtid_slave_pos") or ""))


def same_position(source_final: GtidPosition, executed: GtidPosition) -> bool:
    """The target executed exactly the source's final position: in every domain of the source, the same GTID."""
    mine = {g.domain: g for g in executed.gtids}
    return all(mine.get(g.domain) == g for g in source_final.gtids)
