"""PostgreSQL's replica control behind the seam's `Replication` protocol: a physical streaming standby, seeded by
pg_basebackup (seed.py), its source's server stopped cleanly inside the window and the standby promoted with proof.

Positions are WAL positions (`pg/primitives.Lsn`). The switch, in the order the steps call it:

1. `before_window`: a CHECKPOINT on the source, so the clean shutdown inside the window has little to flush;
2. `stop_writes`: one command on the source's host: a fast shutdown (SIGINT to the postmaster, waited for at a
   5 ms grain: pg/primitives.fast_shutdown_command; its walsender streams every WAL record up to and including
   the shutdown checkpoint to the standby before the server exits), then pg_controldata: "shut down", and the
   final position is just past that checkpoint's record (nothing of the source's can follow it);
3. `wait_and_promote`: one statement on the standby: its replay of the final position (the shutdown checkpoint
   included) waited for, the promotion asked for and waited for, both server-side at a 2 ms grain, then its proof
   (out of recovery, the timeline went up by one, the replayed position at or past the final one). The app's own
   target fence still holds writes until the commit.

Since the source's last record is its shutdown checkpoint and the standby replayed it before branching off, the old
primary can follow the new one without pg_rewind (`follow` of a stopped server checks its clean shutdown first; the
new timeline's branch point is then proven by the standby replaying on it).
"""

from __future__ import annotations

import math
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from orchestrator.database.pg import compare
from orchestrator.database.pg import primitives as pg
from orchestrator.database.pg.seed import BIN_DIR, PgSeed, PgSeedSpec
from orchestrator.database.protocol import (
    ChunkedAudit,
    Comparison,
    LocalLogin,
    PositionMismatch,
    ReplicaSource,
    ReplicationError,
    SeedKit,
    ServerAccess,
    Session,
)
from orchestrator.secrets import register

# The source is stopped inside the window and follows the target after it: there is no frozen source to audit.
NO_AUDIT = "PostgreSQL's replicate mode has no after-commit audit (its source is stopped inside the window)"

SLOT_PREFIX = "migrate_"
REVERSE_SLOT = "migrate_reverse"
STOP_TIMEOUT = 300.0
# Beyond the stop's own bound, for the round trip and pg_controldata.
STOP_MARGIN = 10.0
# How long the end of recovery may take once asked for when the caller gives no bound (the switch gives what is
# left of the budget: milliseconds usually, seconds on a host busy with fsyncs).
PROMOTE_WAIT = 60.0
# The replay's wait of a standby that already reached the final position (the protocol's `promote`).
REPLAYED_WAIT = 5.0


_raw = pg.connection_of
_scalar = pg.session_scalar


def _lsn(value: Any) -> pg.Lsn:
    return pg.Lsn.parse(str(value)) if value else pg.Lsn(0)


def slot_name(plan_name: str) -> str:
    """The forward standby's slot on the source: ours by its prefix, the plan's by its name (63 bytes at most)."""
    return (SLOT_PREFIX + re.sub(r"[^a-z0-9_]", "_", plan_name.lower()))[:63]


@dataclass(frozen=True)
class PgReplicaStatus:
    """A standby's state: its WAL receiver (pg_stat_wal_receiver) and its replay."""

    io_running: str  # the WAL receiver's status ("streaming", "starting", ...) or "No" when it does not run
    sql_running: bool  # replay not paused
    seconds_behind: int | None
    gtid_io_pos: pg.Lsn  # received up to
    master_port: int  # the port the receiver reads its primary through (the tunnel's)
    replay: pg.Lsn

    @property
    def replicating(self) -> bool:
        return self.io_running == "streaming" and self.sql_running

    @property
    def error(self) -> str | None:
        return None  # a standby keeps retrying its primary; its errors are in its log, the lag says the rest


@dataclass(frozen=True)
class PgWait:
    outcome: str
    waited: float
    position: pg.Lsn
    error: str | None = None


@dataclass(frozen=True)
class PgPromotion:
    reached: bool
    promoted: bool
    executed: pg.Lsn
    waited: float


@dataclass(frozen=True)
class PgHostStop:
    """The source's server stopped cleanly and its final position read from its control file, as one command on
    its host (protocol.HostStop): stop_writes runs it on its own, the window's first command on the source runs it
    once the fence is up."""

    datadir: str
    local_cost: float = 0.0

    def command(self, *, lock_wait_timeout: float) -> str:
        bound = max(1, math.ceil(lock_wait_timeout))
        cluster = pg.Cluster(self.datadir.rstrip("/"), 0)
        data = shlex.quote(cluster.data_dir)
        return (
            f"{pg.fast_shutdown_command(cluster, bound)} && B={BIN_DIR} && LC_ALL=C runuser -u postgres -- "
            f'"$B/pg_controldata" -D {data}'
        )

    def parse(self, status: int | None, output: str) -> pg.Lsn:
        if status != 0:
            last = (output.strip().splitlines() or [f"exit status {status}"])[-1]
            raise ReplicationError(f"stopping the source's server: {last}")
        try:
            control = pg.parse_controldata(output)
        except pg.PostgresError as exc:
            raise ReplicationError(f"the source's server stopped, its final position unread: {exc}") from None
        if not control.clean:
            raise ReplicationError(f"the source's server did not shut down cleanly (state: {control.state})")
        return pg.Lsn(control.checkpoint.value + 1)


class PgReplication:
    """Streaming replication between two PostgreSQL clusters of one major version (13 and later; proven on the
    lab with 15)."""

    wait_slice = 0.5
    requirements = (
        "wal_level replica, WAL senders and slots, pg_hba.conf letting the replication account in through the "
        "tunnel, one major version; the source is stopped cleanly inside the window and its standby promoted"
    )
    source_stops = True

    def __init__(self) -> None:
        self.seed: SeedKit = PgSeed()

    def describe(self, part: str, plan: Any) -> list[str]:
        settings = plan.replication
        db = plan.database
        user = settings.user if settings else "(replication.user)"
        if part == "seed":
            return [
                f"on the source: ssh -R 127.0.0.1:<random port>:… {plan.target.address} (for this command only), "
                f"and there: the password of {user} into {db.target.datadir}.pgpass (0600, from stdin), then "
                f"pg_basebackup -X stream -C -S {slot_name(plan.name)} -R -c fast into {db.target.datadir}.seed (a "
                "slot on the source keeps the WAL the standby needs; the source keeps serving, nothing is locked)",
                f"on the target (database stopped): the copy replaces {db.target.datadir} (the old one kept as "
                f"{db.target.datadir}.before-seed)",
                "journal the copy's WAL position (backup_label)",
            ]
        if part == "replica":
            return [
                f"on the target: start the database ({db.target.start}): a hot standby (standby.signal), read-only",
                f"ALTER SYSTEM SET primary_conninfo to 127.0.0.1:<tunnel port> as {user} (the password file named, "
                "never the password), reloaded: it streams from the source",
            ]
        if part == "compare":
            rows = settings.chunk_rows if settings else 2000
            return [
                f"compare every table in chunks of {rows} rows (count and sum of row hashes): each chunk read on the "
                "source with its WAL position, the standby waited for until it replayed it, the chunk read there; "
                "a chunk that differs is read again (up to 5 times), then stops the run naming the table and chunk"
            ]
        if part == "switch":
            return [
                "before the window: CHECKPOINT on the source (its shutdown inside the window has little to flush)",
                f"on {plan.source.address}, one command: a fast shutdown of the database in {db.source.datadir} "
                "(SIGINT to its postmaster: every session ended, whatever its role; its last WAL record, the shutdown "
                "checkpoint, streamed to the standby), bounded by what is left of the budget; pg_controldata: the "
                "final position just past that record (journaled)",
                "on the target, one statement: wait until it replayed the final position (bounded by what is left of "
                "the budget), pg_promote, proof (out of recovery, timeline + 1, replayed up to the final position); "
                "its services stay fenced until the commit",
            ]
        if part == "positions":
            return [
                "WAL positions: the target replayed the source's last record (its shutdown checkpoint, proven by the "
                "promotion); the stopped source is not read (the tables were compared before the window)"
            ]
        if part == "finish":
            return [
                "the old primary follows the new one: checked shut down cleanly (pg_controldata), its password file, "
                "primary_conninfo through ssh -L on the source, recovery_target_timeline latest, a slot on the new "
                "primary, standby.signal, started: it replays the new timeline, no pg_rewind",
                "the standby's primary_conninfo reset, the unused slots dropped",
            ]
        return []

    # --- can this pair replicate? ---

    def programs(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        return ()  # the server's own programs (the installed major is preflight's check)

    def writer_problems(self, conn: Session, app_users: list[str]) -> list[str]:
        """The fence makes every login role NOLOGIN and ends its sessions, except superusers and replication roles
        (pg/primitives.app_roles): an application role among those would keep writing."""
        rows = (
            _raw(conn)
            .execute("SELECT rolname, rolsuper, rolreplication FROM pg_roles WHERE rolname = ANY(%s)", (app_users,))
            .fetchall()
        )
        found = {str(name): (bool(su), bool(rep)) for name, su, rep in rows}
        problems: list[str] = []
        escaping = [f"{name} ({'SUPERUSER' if su else 'REPLICATION'})" for name, (su, rep) in sorted(found.items())
                    if su or rep]  # fmt: skip
        if escaping:
            problems.append(
                "replicate mode: application roles the fence does not stop (NOLOGIN spares superusers and "
                f"replication roles): {'; '.join(escaping)}: ALTER ROLE ... NOSUPERUSER NOREPLICATION"
            )
        missing = [user for user in app_users if user not in found]
        if missing:
            problems.append(
                f"replicate mode: replication.app_users names {', '.join(missing)}, but the source has no role of "
                "that name: fix the name (the fence must be proven to stop every writer)"
            )
        return problems

    def server_facts(self, conn: Session) -> dict[str, str]:
        """The settings replication needs, and the replication roles pg_hba.conf lets in from 127.0.0.1 (the
        tunnel's end)."""
        row = _raw(conn).execute(pg.FACTS_SQL).fetchone()
        if row is None:
            raise ReplicationError("the server returned no settings")
        roles = [str(r[0]) for r in _raw(conn).execute("SELECT rolname FROM pg_roles WHERE rolreplication")]
        allowed = [role for role in roles if _scalar(conn, pg.HBA_SQL, (role,))]
        return {
            "major": str(row[0]),
            "wal_level": str(row[1]),
            "max_wal_senders": str(row[2]),
            "max_replication_slots": str(row[3]),
            "data_checksums": "on" if row[4] else "off",
            "wal_log_hints": "on" if row[5] else "off",
            "data_directory": str(row[6]),
            "hba_replication_roles": ",".join(allowed),
        }

    @staticmethod
    def _facts(found: dict[str, str], user: str) -> pg.ServerFacts:
        return pg.ServerFacts(
            major=int(found.get("major") or 0),
            wal_level=found.get("wal_level", ""),
            max_wal_senders=int(found.get("max_wal_senders") or 0),
            max_replication_slots=int(found.get("max_replication_slots") or 0),
            data_checksums=found.get("data_checksums") == "on",
            wal_log_hints=found.get("wal_log_hints") == "on",
            hba_replication=user in found.get("hba_replication_roles", "").split(","),
            data_directory=found.get("data_directory", ""),
        )

    def problems(
        self, plan: Any, source: dict[str, str] | None, target: dict[str, str] | None, programs: dict[str, bool]
    ) -> list[str]:
        problems: list[str] = []
        if plan.replication is None:
            problems.append("the plan has no replication section (user, password)")
        for name, present in sorted(programs.items()):
            if not present:
                problems.append(f"{name} is not installed")
        if source is None:
            problems.append("the source database did not answer")
            return problems
        user = plan.replication.user if plan.replication is not None else ""
        other = int(target["major"]) if target and target.get("major") else None
        problems += [f"the source: {p}" for p in self._facts(source, user).problems(other_major=other)]
        return problems

    def pair_problems(self, source: dict[str, str], target: dict[str, str]) -> list[str]:
        if source.get("major") != target.get("major"):
            return [f"major versions differ (source {source.get('major')}, target {target.get('major')})"]
        return []

    def seed_spec(
        self,
        plan: Any,
        *,
        source_datadir: str,
        target_datadir: str,
        ssh_to_target: tuple[str, ...],
        password_env: str | None,
    ) -> PgSeedSpec:
        settings = plan.replication
        assert settings is not None
        far = settings.source or plan.database.source
        return PgSeedSpec(
            source_datadir=source_datadir,
            target_datadir=target_datadir,
            ssh_to_target=ssh_to_target,
            source_host=far.host,
            source_port=far.port,
            repl_user=settings.user,
            slot=slot_name(plan.name),
        )

    # --- positions ---

    def parse_position(self, text: str | None) -> pg.Lsn:
        return _lsn(text)

    def same_position(self, final: pg.Lsn, executed: pg.Lsn) -> bool:
        """`final` lies just past the source's last record (its shutdown checkpoint): a standby that replayed that
        record stands there, and nothing of the source's can lie beyond it."""
        return executed.value > 0 and executed >= final

    def write_position(self, conn: Session) -> pg.Lsn:
        if pg.in_recovery(_raw(conn)):
            return pg.replay_lsn(_raw(conn)) or pg.Lsn(0)
        return pg.current_wal_lsn(_raw(conn))

    def current_position(self, conn: Session) -> pg.Lsn:
        """What the server's data stands at: its replay position (static once promoted: the promotion's proof
        reads it) or, for a server never in recovery, its write position."""
        replayed = pg.replay_lsn(_raw(conn))
        return replayed if replayed is not None else pg.current_wal_lsn(_raw(conn))

    def current_position_after(self, conn: Session, wanted: pg.Lsn, wait: float) -> pg.Lsn | None:
        """A standby waits to replay `wanted`; a promoted server replays no more: its position is what the
        promotion proved, and below `wanted` it never gets there. The wait and the read: one round trip."""
        after = pg.position_after(_raw(conn), wanted, wait)
        current = after.replayed if after.replayed is not None else after.written
        return current if current is not None and current >= wanted else None

    def executed_position(self, conn: Session) -> pg.Lsn:
        return pg.replay_lsn(_raw(conn)) or pg.Lsn(0)

    # --- the replica ---

    def replica_status(self, conn: Session) -> PgReplicaStatus | None:
        raw = _raw(conn)
        if not pg.in_recovery(raw):
            return None
        row = raw.execute(
            "SELECT r.status, r.sender_port, r.flushed_lsn::text, pg_is_wal_replay_paused(),"
            " pg_last_wal_replay_lsn()::text, pg_last_wal_receive_lsn()::text,"
            " extract(epoch FROM now() - pg_last_xact_replay_timestamp())::int"
            " FROM (SELECT 1) one LEFT JOIN pg_stat_wal_receiver r ON true"
        ).fetchone()
        assert row is not None
        status, port, flushed, paused, replay, received, behind = row
        replayed, got = _lsn(replay), _lsn(flushed or received)
        caught_up = got.value > 0 and replayed >= got
        return PgReplicaStatus(
            io_running=str(status) if status else "No",
            sql_running=not bool(paused),
            seconds_behind=0 if caught_up else (None if behind is None else int(behind)),
            gtid_io_pos=got,
            master_port=int(port or 0),
            replay=replayed,
        )

    def follow(
        self,
        conn: Session | None,
        source: ReplicaSource,
        start_at: pg.Lsn,
        *,
        seeded: bool,
        server: ServerAccess | None = None,
        primary: Session | None = None,
    ) -> None:
        """A running standby: its primary_conninfo set to `source` (the tunnel's end; the password file beside its
        data directory, written by the seed) and reloaded. A stopped server (an old primary): checked shut down
        cleanly, its password file written, then it starts as a standby of `source` on the latest timeline, from a
        slot on `primary`."""
        register(source.password)
        if conn is not None:
            datadir = str(_scalar(conn, "SHOW data_directory"))
            conninfo = pg.primary_conninfo(source.host, source.port, source.user, pg.Cluster(datadir, 0).passfile,
                                           "migrate_standby")  # fmt: skip
            raw = _raw(conn)
            raw.execute(sql.SQL("ALTER SYSTEM SET primary_conninfo = {}").format(sql.Literal(conninfo)))
            raw.execute("SELECT pg_reload_conf()")
            return
        if server is None:
            raise ReplicationError("the server to make a standby does not run, and where it runs was not given")
        if primary is not None:
            pg.create_slot(_raw(primary), REVERSE_SLOT)
        self._follow_stopped(server, source)

    def _follow_stopped(self, server: ServerAccess, source: ReplicaSource) -> None:
        cluster = pg.Cluster(server.datadir.rstrip("/"), 0)
        data = shlex.quote(cluster.data_dir)
        control = server.host.run(
            f'B={BIN_DIR}; LC_ALL=C runuser -u postgres -- "$B/pg_controldata" -D {data}', timeout=60
        ).stdout
        old = pg.parse_controldata(control)
        if not old.clean:
            raise ReplicationError(
                f"the old primary was not shut down cleanly (state: {old.state}): it cannot follow without pg_rewind"
            )
        line = pg.passfile_line("127.0.0.1", source.user, source.password)
        server.host.run(pg.passfile_command(cluster), input=line, timeout=60)
        conninfo = pg.primary_conninfo(source.host, source.port, source.user, cluster.passfile, "migrate_old_primary")
        settings = [
            f"primary_conninfo = '{_conf_quote(conninfo)}'",
            "recovery_target_timeline = 'latest'",
            f"primary_slot_name = '{REVERSE_SLOT}'",
        ]
        auto = shlex.quote(cluster.data_dir + "/postgresql.auto.conf")
        signal = shlex.quote(cluster.data_dir + "/standby.signal")
        lines = "".join(f"{s}\n" for s in settings)
        server.host.run(
            f"set -e; printf %s {shlex.quote(lines)} >> {auto}; touch {signal}; chown postgres {auto} {signal}; "
            f"{server.start}",
            timeout=STOP_TIMEOUT,
        )

    def start_replica(self, conn: Session) -> None:
        if pg.in_recovery(_raw(conn)):
            _raw(conn).execute("SELECT pg_wal_replay_resume()")

    def stop_replica(self, conn: Session) -> None:
        _raw(conn).execute("SELECT pg_wal_replay_pause()")

    def forget_replication(self, conn: Session) -> None:
        """A standby stops following (its primary_conninfo reset, reloaded: the receiver exits; it stays a
        read-only standby); on any server, the slots this tool made that nobody uses are dropped (a forgotten slot
        keeps WAL forever)."""
        raw = _raw(conn)
        if pg.in_recovery(raw):
            raw.execute("ALTER SYSTEM RESET primary_conninfo")
            raw.execute("SELECT pg_reload_conf()")
        raw.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name LIKE %s AND NOT active",
            (SLOT_PREFIX.replace("_", "\\_") + "%",),
        )

    def wait_for_position(self, conn: Session, wanted: pg.Lsn, timeout: float) -> PgWait:
        started = time.monotonic()
        raw = _raw(conn)
        if not pg.in_recovery(raw):
            return PgWait("replica_failed", 0.0, pg.Lsn(0), "the server is not a standby")
        waited = pg.wait_for_replay(raw, wanted, timeout)
        position = waited.position or pg.Lsn(0)
        if waited.reached:
            return PgWait("reached", time.monotonic() - started, position)
        return PgWait("timed_out", time.monotonic() - started, position)

    # --- the switch ---

    def is_read_only(self, conn: Session) -> bool:
        raw = _raw(conn)
        return pg.in_recovery(raw) or bool(pg.marked_roles(raw))

    def set_read_only(self, conn: Session, on: bool, *, lock_wait_timeout: float) -> None:
        """A standby takes no writes whatever this says; a primary's application roles fenced (on) or let in."""
        raw = _raw(conn)
        if pg.in_recovery(raw):
            return
        try:
            if on:
                pg.fence_marked(raw)
            else:
                pg.unfence_marked(raw)
        except pg.PostgresError as exc:
            raise ReplicationError(str(exc)) from None

    def before_window(self, conn: Session) -> None:
        pg.checkpoint(_raw(conn))

    def stop_writes(self, conn: Session | None, *, lock_wait_timeout: float, server: ServerAccess) -> pg.Lsn:
        """The source's server stopped cleanly, and the final position read from its control file (just past its
        shutdown checkpoint), in one command on its host. `conn` None: stopped already (a resumed switch).

        Why the fast shutdown alone is airtight: it refuses new connections and ends every session, whatever its
        role (superusers and the app's table owners too), rolling back what had not committed; every commit is in
        the WAL before it, and the walsender streams every record up to the shutdown checkpoint to the standby
        before the server exits. No role is made NOLOGIN on the way (so nothing needs putting back when the guard or
        a rollback starts the source again). The wait is bounded by `lock_wait_timeout` (what is left of the
        budget): a server still shutting down then fails this try, and the next try waits again."""
        stop = PgHostStop(server.datadir)
        bound = max(1, math.ceil(lock_wait_timeout))
        result = server.host.run(
            stop.command(lock_wait_timeout=lock_wait_timeout), timeout=bound + STOP_MARGIN, check=False
        )
        return stop.parse(result.exit_status, f"{result.stdout}\n{result.stderr}")

    def host_stop(self, server: ServerAccess, login: LocalLogin) -> PgHostStop:
        """stop_writes is a command on the source's host already: it rides the window's first command there at no
        cost of its own."""
        return PgHostStop(server.datadir)

    def wait_and_promote(
        self, conn: Session, expected: pg.Lsn, wait: float, *, within: float | None = None
    ) -> PgPromotion:
        started = time.monotonic()
        try:
            promotion = self._promote(conn, expected, wait, within)
        except pg.NotReplayed:
            return PgPromotion(False, False, pg.Lsn(0), time.monotonic() - started)
        return PgPromotion(True, True, promotion.replayed, promotion.waited)

    def promote(self, conn: Session, expected: pg.Lsn, *, within: float | None = None) -> pg.Lsn:
        try:
            return self._promote(conn, expected, REPLAYED_WAIT, within).replayed
        except pg.NotReplayed as exc:
            raise PositionMismatch(str(exc)) from None

    def _promote(self, conn: Session, expected: pg.Lsn, wait: float, within: float | None) -> pg.Promotion:
        """The standby's replay waited for, the promotion and its proof: one round trip (pg/primitives.promote),
        the end of recovery waited for at most `within` (what is left of the budget), PROMOTE_WAIT without one."""
        raw = _raw(conn)
        bound = max(1, math.ceil(within if within is not None else PROMOTE_WAIT))
        try:
            promotion = pg.promote(raw, expected, wait=wait, promote_wait=bound)
        except pg.NotReplayed:
            raise
        except pg.ProofFailed as exc:
            raise PositionMismatch(str(exc)) from None
        if promotion.replayed < expected:
            raise PositionMismatch(f"promoted having replayed {promotion.replayed}, not the final position {expected}")
        if promotion.marked_roles:
            pg.unfence_marked(raw)  # a NOLOGIN fence that came with the WAL (a target fenced at a rollback)
        return promotion

    # --- the after-commit audit: none (the switch stops the source: `source_stops`, the mode does not run it) ---

    def open_audit_snapshot(self, conn: Session) -> None:
        raise ReplicationError(NO_AUDIT)

    def audit_snapshot_and_position(self, conn: Session, after: tuple[pg.Lsn, float] | None = None) -> pg.Lsn:
        raise ReplicationError(NO_AUDIT)

    def audit_chunks(
        self,
        snapshot: Session,
        source: Session,
        final: pg.Lsn,
        schemas: list[str] | None,
        *,
        chunk_rows: int,
        pause_ratio: float,
        timeout: float,
        on_start: Callable[[int], None],
        on_chunk: Callable[[str, int, int], None],
    ) -> ChunkedAudit:
        raise ReplicationError(NO_AUDIT)

    # --- the comparison before the window ---

    def compare_cost(self, conn: Session, tables: list[tuple[str, str]], chunk_rows: int) -> tuple[float, int]:
        """pg_class's row estimates for the chunks; a chunk's sum timed on the largest table."""
        return compare.compare_cost(conn, tables, chunk_rows)

    def compare(
        self,
        snapshot_conn: Session,
        target: Session,
        tables: list[tuple[str, str]],
        *,
        chunk_rows: int,
        pause_ratio: float,
        timeout: float,
        on_chunk: Callable[[str, int, int], None],
    ) -> Comparison:
        return compare.compare_tables(snapshot_conn, target, tables, chunk_rows=chunk_rows, pause_ratio=pause_ratio,
                                      timeout=timeout, on_chunk=on_chunk)  # fmt: skip


def _conf_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "''")


def open_replication() -> PgReplication:
    return PgReplication()
