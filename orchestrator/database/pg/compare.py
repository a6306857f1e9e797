"""The comparison before the window, for a PostgreSQL standby: every table in primary-key chunks, source against
standby, while both run.

A physical standby cannot be stopped at an arbitrary source position the way a MariaDB replica can (`START SLAVE
UNTIL`), and a source snapshot cannot be tied to one WAL position. So each chunk is compared where both sides agree
on what it holds: its count and sum of row hashes read on the source in one statement together with the source's
WAL position then (every commit that statement sees lies below it), the standby waited for until it replayed that
position, then the same chunk read there. A standby that replayed more may have seen a later write to the chunk, so
a chunk that differs is read again, up to `TRIES` times. One still differing (a chunk written to all the time) is
compared once more with the table held still: on the source, in a transaction, `LOCK TABLE … IN SHARE MODE` (reads
go on; writers of that table wait, and the lock itself waits at most `LOCK_WAIT` for the writers already in flight,
tried `LOCK_TRIES` times; an autovacuum of that table, whose lock SHARE waits for, is cancelled first: it would
give way only after deadlock_timeout, and starts again later), the chunk read and the WAL position taken, the
standby waited for (it caught up just before, unlocked; at most `HELD_WAIT` locked, else released and tried
again) and read, then the lock released: no write to the table commits in between, so both sides hold exactly
the same rows and a difference then is real. Writers of that table wait for the one chunk's two reads.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from orchestrator.database.pg import primitives as pg
from orchestrator.database.protocol import Comparison, DatabaseError, Session

TRIES = 3
LOCK_NOT_AVAILABLE = "55P03"
# The held comparison: how long the lock may wait for the table's writers in flight, and how often it is tried.
LOCK_WAIT = 0.2
# How long the held table waits for the standby to replay the chunk's position (it caught up just before).
HELD_WAIT = 0.5
LOCK_TRIES = 20


@dataclass(frozen=True)
class PgChunkDiff:
    table: str
    index: int
    low: str
    high: str
    source: tuple[int, int]
    replica: tuple[int, int]

    def describe(self) -> str:
        span = f"keys {self.low or '(start)'} to {self.high or '(end)'}"
        return (
            f"{self.table} chunk {self.index + 1} ({span}): source {self.source[0]} rows, sum {self.source[1]}; "
            f"standby {self.replica[0]} rows, sum {self.replica[1]}"
        )


def _rows(conn: Session, query: sql.Composable, args: Any = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(query, args)
        return list(cur.fetchall())


def primary_key(conn: Session, schema: str, table: str) -> list[str]:
    query = sql.SQL(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid"
        " AND a.attnum = ANY(i.indkey) WHERE i.indrelid = ({}::regclass) AND i.indisprimary"
        " ORDER BY array_position(i.indkey, a.attnum)"
    ).format(sql.Literal(f'"{schema.replace(chr(34), chr(34) * 2)}"."{table.replace(chr(34), chr(34) * 2)}"'))
    return [str(r[0]) for r in _rows(conn, query)]


def _key(columns: list[str]) -> sql.Composable:
    return sql.SQL("({})").format(sql.SQL(", ").join(sql.Identifier(c) for c in columns))


def chunk_bounds(conn: Session, name: sql.Composable, key: list[str], chunk_rows: int) -> list[tuple[Any, ...]]:
    """The lower key of every chunk after the first (each chunk: from its bound to the next one's)."""
    if not key:
        return []
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in key)
    query = sql.SQL(
        "SELECT {cols} FROM (SELECT {cols}, row_number() OVER (ORDER BY {cols}) AS n FROM {t}) s"
        " WHERE n % {rows} = 1 AND n > 1 ORDER BY {cols}"
    ).format(cols=cols, t=name, rows=sql.Literal(chunk_rows))
    return [tuple(r) for r in _rows(conn, query)]


def _where(
    key: list[str], low: tuple[Any, ...] | None, high: tuple[Any, ...] | None
) -> tuple[sql.Composable, list[Any]]:
    parts: list[sql.Composable] = []
    args: list[Any] = []
    if low is not None:
        parts.append(sql.SQL("{} >= ({})").format(_key(key), sql.SQL(", ").join(sql.Placeholder() * len(low))))
        args += list(low)
    if high is not None:
        parts.append(sql.SQL("{} < ({})").format(_key(key), sql.SQL(", ").join(sql.Placeholder() * len(high))))
        args += list(high)
    where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(parts) if parts else sql.SQL("")
    return where, args


def _sums(conn: Session, name: sql.Composable, where: sql.Composable, args: list[Any], *, with_lsn: bool) -> Any:
    lsn = sql.SQL(", pg_current_wal_lsn()::text") if with_lsn else sql.SQL("")
    query = sql.SQL("SELECT count(*), coalesce(sum(hashtext(t::text)::bigint), 0){} FROM {} t{}").format(
        lsn, name, where
    )
    return _rows(conn, query, args)[0]


AUTOVACUUM_CANCEL = (
    "SELECT pg_cancel_backend(a.pid) FROM pg_stat_activity a"
    " WHERE a.backend_type = 'autovacuum worker' AND a.pid IN ("
    "SELECT pid FROM pg_stat_progress_vacuum WHERE relid = {table}::regclass"
    " UNION SELECT pid FROM pg_stat_progress_analyze WHERE relid = {table}::regclass)"
)


def _regclass(name: sql.Composable) -> str:
    return name.as_string(None)


def _held(
    source: Session, standby: Session, name: sql.Composable, where: sql.Composable, args: list[Any], timeout: float
) -> tuple[tuple[int, int], tuple[int, int]] | str:
    """Both sides' sums of one chunk with the table held still on the source (the module's last resort); or why
    it could not be held."""
    for _ in range(LOCK_TRIES):
        # The standby caught up first, unlocked: the locked wait below is then for the last few records only.
        now = pg.current_wal_lsn(source)  # type: ignore[arg-type]  # an engine session is a psycopg connection
        if not pg.wait_for_replay(standby, now, timeout).reached:  # type: ignore[arg-type]
            return f"the standby did not replay {now} within {timeout:g} s"
        with source.cursor() as cur:
            # An autovacuum of the table holds a lock SHARE waits for (for minutes on a large table); it gives way
            # by itself only after deadlock_timeout, so it is asked to now (it starts again later, unharmed).
            cur.execute(sql.SQL(AUTOVACUUM_CANCEL).format(table=sql.Literal(_regclass(name))))
            cur.execute("BEGIN")
            try:
                cur.execute("SELECT set_config('lock_timeout', %s, true)", (str(round(LOCK_WAIT * 1000)),))
                try:
                    cur.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(name))
                except DatabaseError as exc:
                    if getattr(exc, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                        raise
                    cur.execute("ROLLBACK")
                    continue  # the table's writers in flight did not finish in time: again, a moment later
                count, total_sum, at = _sums(source, name, where, args, with_lsn=True)
                # Bounded: the table's writers wait meanwhile. A standby slower than that: released, tried again.
                waited = pg.wait_for_replay(standby, pg.Lsn.parse(str(at)), HELD_WAIT)  # type: ignore[arg-type]
                if not waited.reached:
                    continue
                theirs = _sums(standby, name, where, args, with_lsn=False)
                return (int(count), int(total_sum)), (int(theirs[0]), int(theirs[1]))
            finally:
                with contextlib.suppress(DatabaseError):
                    cur.execute("ROLLBACK")  # the lock released (a no-op once rolled back)
    return (
        f"{LOCK_TRIES} tries of LOCK TABLE … IN SHARE MODE waited out their {LOCK_WAIT:g} s each, or the standby "
        f"did not replay the chunk's position within {HELD_WAIT:g} s"
    )


def compare_tables(
    source: Session,
    standby: Session,
    tables: list[tuple[str, str]],
    *,
    chunk_rows: int,
    pause_ratio: float,
    timeout: float,
    on_chunk: Callable[[str, int, int], None],
) -> Comparison:
    """Each chunk of each table compared as the module says; the position: the source's when the comparison began."""
    began = pg.current_wal_lsn(source)  # type: ignore[arg-type]  # an engine session is a psycopg connection
    diffs: list[PgChunkDiff] = []
    for schema, table in tables:
        label = f"{schema}.{table}"
        name = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))
        key = primary_key(source, schema, table)
        bounds = chunk_bounds(source, name, key, chunk_rows)
        edges: list[tuple[Any, ...] | None] = [None, *bounds, None]
        total = len(edges) - 1
        for index in range(total):
            started = time.monotonic()
            where, args = _where(key, edges[index], edges[index + 1])
            ours: tuple[int, int] = (0, 0)
            theirs: tuple[int, int] = (0, 0)
            for _ in range(TRIES):
                count, total_sum, at = _sums(source, name, where, args, with_lsn=True)
                ours = (int(count), int(total_sum))
                waited = pg.wait_for_replay(standby, pg.Lsn.parse(str(at)), timeout)  # type: ignore[arg-type]
                if not waited.reached:
                    return Comparison(began, diffs, error=f"the standby did not replay {at} within {timeout:g} s")
                count, total_sum = _sums(standby, name, where, args, with_lsn=False)
                theirs = (int(count), int(total_sum))
                if ours == theirs:
                    break
            else:
                held = _held(source, standby, name, where, args, timeout)
                if isinstance(held, str):
                    return Comparison(began, diffs, error=held)
                ours, theirs = held
            if ours != theirs:
                low, high = edges[index], edges[index + 1]
                diffs.append(PgChunkDiff(label, index, "" if low is None else str(low), "" if high is None else
                                         str(high), ours, theirs))  # fmt: skip
            on_chunk(label, index + 1, total)
            if pause_ratio > 0:
                time.sleep((time.monotonic() - started) * pause_ratio)
    return Comparison(began, diffs)


def compare_cost(conn: Session, tables: list[tuple[str, str]], chunk_rows: int) -> tuple[float, int]:
    """The estimate's figures (read only): one chunk's sum over the largest table's first `chunk_rows` rows in key
    order, as `_sums` computes it, timed and scaled to a full chunk; the chunks pg_class's row estimates make."""
    estimate = sql.SQL(
        "SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s"
    )
    counts = {}
    for schema, table in tables:
        found = _rows(conn, estimate, (schema, table))
        counts[(schema, table)] = int(found[0][0]) if found else 0
    chunks = sum(max(1, -(-count // chunk_rows)) for count in counts.values())
    schema, table = max(counts, key=lambda name: counts[name])
    key = primary_key(conn, schema, table)
    order = sql.SQL(" ORDER BY {}").format(_key(key)) if key else sql.SQL("")
    sample = sql.SQL("(SELECT * FROM {}{} LIMIT {})").format(sql.Identifier(schema, table), order,
                                                            sql.Literal(chunk_rows))  # fmt: skip
    started = time.monotonic()
    rows, _ = _sums(conn, sample, sql.SQL(""), [], with_lsn=False)
    seconds = time.monotonic() - started
    return (seconds * chunk_rows / rows if rows else seconds), chunks
