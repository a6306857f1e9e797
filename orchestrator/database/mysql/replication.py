"""MariaDB's replica control behind the seam's `Replication` protocol (database/protocol.py): GTID positions, the
replica (CHANGE MASTER, START/STOP SLAVE, MASTER_GTID_WAIT), read_only and the promotion with proof, the seed
(mariadb-backup) and the chunked comparison. A thin wrapper: the SQL and the commands stay in gtid, replica,
switch, seed and compare, so what the replicate steps send to the server is what they sent before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from orchestrator.database.mysql import audit, compare, compare_live, grants, gtid, host_stop, replica, seed, switch
from orchestrator.database.protocol import (
    ChunkedAudit,
    Comparison,
    DatabaseError,
    LocalLogin,
    ReplicaSource,
    ReplicaStatus,
    ReplicationError,
    SeedKit,
    ServerAccess,
    Session,
    WaitResult,
)

# Server variables the replicate mode depends on.
# What lets an application account write through the source's read_only, spelled as MariaDB 10.11 shows it.
WRITES_THROUGH_READ_ONLY = ("READ_ONLY ADMIN", "SUPER")
REPLICATION_VARIABLES = ("log_bin", "server_id", "log_slave_updates", "binlog_format", "gtid_strict_mode", "read_only")


def _on(value: str | None) -> bool:
    return (value or "").upper() in ("ON", "1", "YES")


class MariaDbSeed:
    """The seed's commands and parsers: database/mysql/seed.py's functions, as they are (mariadb-backup streamed
    through the source→target hop into mbstream, prepared and swapped in)."""

    secret = "database"  # mariadb-backup reads the source as the plan's account

    seed_size_command = staticmethod(seed.seed_size_command)
    parse_size = staticmethod(seed.parse_size)
    seed_stream_command = staticmethod(seed.seed_stream_command)
    parse_seed_progress = staticmethod(seed.parse_seed_progress)
    seed_locking_command = staticmethod(seed.seed_locking_command)
    prepare_command = staticmethod(seed.prepare_command)
    install_command = staticmethod(seed.install_command)
    finish_install_command = staticmethod(seed.finish_install_command)
    restore_previous_command = staticmethod(seed.restore_previous_command)
    discard_staging_command = staticmethod(seed.discard_staging_command)
    backup_position_command = staticmethod(seed.backup_position_command)
    parse_backup_position = staticmethod(seed.parse_backup_position)
    parse_backup_stages = staticmethod(seed.parse_backup_stages)
    parse_backup_locks = staticmethod(seed.parse_backup_locks)
    redo_lsn = staticmethod(seed.redo_lsn)
    redo_capacity = staticmethod(seed.redo_capacity)


class MariaDbReplication:
    """GTID replication between two MariaDB servers (10.5 and later; proven on the lab with 10.11)."""

    wait_slice = replica.WAIT_SLICE
    requirements = "binlog on, ROW format, GTID strict, log_slave_updates, distinct server ids"
    source_stops = False  # the source stays up, read-only: the audit compares it after the commit

    def __init__(self, engine: str = "mariadb") -> None:
        self.engine = engine
        self.seed: SeedKit = MariaDbSeed()

    def describe(self, part: str, plan: Any) -> list[str]:
        settings = plan.replication
        db = plan.database
        if part == "seed":
            throttle = f", --throttle={settings.seed_throttle}" if settings and settings.seed_throttle else ""
            nice = "nice/ionice, " if settings is None or settings.seed_nice else ""
            nice += "under nocache where installed, " if plan.transfer.nocache else ""
            return [
                f"on the source: mariadb-backup --backup --stream ({nice}--log-copy-interval=10{throttle}) of "
                f"{db.source.datadir} | ssh {plan.target.address} mbstream -x into "
                f"{db.target.datadir}.seed (the source keeps serving; its commits wait only during the "
                "backup's BLOCK_COMMIT stage, measured to the millisecond and reported)",
                f"on the target (database stopped): mariadb-backup --prepare, then the copy replaces "
                f"{db.target.datadir} (the old one kept as {db.target.datadir}.before-seed; for a "
                "datadir that is a symbolic link, the directory it points at is replaced and kept beside itself, the "
                "link stays)",
                "journal the copy's GTID position (the replica starts there)",
            ]
        if part == "replica":
            user = settings.user if settings else "(replication.user)"
            return [
                f"on the target: start the database ({db.target.start}), SET GLOBAL read_only = 1, "
                "its binlog starts at the seed's GTID position",
                f"CHANGE MASTER TO 127.0.0.1:<tunnel port> as {user} (password from its secret reference), "
                "MASTER_USE_GTID=slave_pos from the seed's position; START SLAVE",
            ]
        if part == "compare":
            rows = settings.chunk_rows if settings else 2000
            return [
                "stop the replica, open a consistent snapshot on the source at its GTID position, run the replica "
                f"to exactly that position, compare every table in chunks of {rows} rows (checksums); a difference "
                "stops the run naming the table and chunk"
            ]
        if part == "switch":
            c = plan.cutover
            return [
                f"SET GLOBAL read_only = 1 on the source database, waiting at most {c.lock_wait_timeout:g} s per try, "
                f"{c.lock_attempts} tries (running commits finish; the app's account must not hold READ ONLY ADMIN)",
                "read the source's final GTID position (journaled)",
                "on the target: MASTER_GTID_WAIT(final position), bounded by what is left of the budget",
                "promote the target: STOP SLAVE, proof that it executed exactly the final position, RESET SLAVE ALL, "
                "read_only = 0 (its services stay fenced until the DNS flip)",
            ]
        if part == "positions":
            return [
                "GTID positions: the source still at its final position, the target executed exactly it "
                "(the database was compared before the window; nothing inside it reads whole tables)"
            ]
        if part == "finish":  # the reverse path, and how it ends
            return [
                "reverse replication: ssh -L on the source reaches the target's database; the old source (read-only) "
                "becomes a GTID replica of the target from the switch's final position, and catches up",
                "STOP SLAVE, RESET SLAVE ALL (master.info, which holds the password, deleted)",
            ]
        return []

    # --- can this pair replicate? ---

    def programs(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        return (("source", ("mariadb-backup",)), ("target", ("mariadb-backup", "mbstream")))

    def writer_problems(self, conn: Session, app_users: list[str]) -> list[str]:
        """Accounts that write through read_only would keep writing on the source inside the window: READ_ONLY
        ADMIN (as MariaDB 10.11 spells it), SUPER (which holds it before 11.0.1) or ALL PRIVILEGES on *.*, held
        directly or through a role (granted, default or nested), read from SHOW GRANTS. One problem names them all,
        each account with its privilege and roles."""
        missing: list[str] = []
        held: list[str] = []
        try:
            show = grants.show_grants_on(conn)
            for user in app_users:
                accounts = grants.accounts_named(conn, user)
                if not accounts:
                    missing.append(user)
                for name, host in accounts:
                    held += [found.text() for found in grants.held(show, name, host, WRITES_THROUGH_READ_ONLY)]
        except DatabaseError as exc:
            return [
                f"replicate mode: {exc.about('the grants of replication.app_users')} (SHOW GRANTS FOR each"
                " of its accounts needs SELECT on the mysql schema)"
            ]
        problems: list[str] = []
        if held:
            problems.append(
                "replicate mode: application accounts would write through read_only inside the window: "
                + "; ".join(held)
                + ": REVOKE it"
            )
        if missing:
            problems.append(
                f"replicate mode: replication.app_users names {', '.join(missing)}, but the source has no account of"
                " that name: fix the name (read_only must be proven to stop every writer)"
            )
        return problems

    def server_facts(self, conn: Session) -> dict[str, str]:
        names = REPLICATION_VARIABLES
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN (" + ", ".join(["%s"] * len(names)) + ")", names)
            return {str(k).lower(): str(v) for k, v in cur.fetchall()}

    def problems(
        self, plan: Any, source: dict[str, str] | None, target: dict[str, str] | None, programs: dict[str, bool]
    ) -> list[str]:
        """log_bin and log_slave_updates need a server restart: that is the shutdown mode's job."""
        problems: list[str] = []
        if plan.replication is None:
            problems.append("the plan has no replication section (user, password)")
        if plan.database.engine != "mariadb":
            problems.append("database.engine is not mariadb")
        for name, present in sorted(programs.items()):
            if not present:
                problems.append(f"{name} is not installed")
        if source is None:
            problems.append("the source database did not answer")
            return problems
        for side, variables in (("source", source), ("target", target)):
            if variables is None:
                continue
            if not _on(variables.get("log_bin")):
                problems.append(f"the {side}'s binary log is off (log_bin needs a restart)")
            if not _on(variables.get("log_slave_updates")):
                problems.append(f"the {side} does not log replicated events (log_slave_updates needs a restart)")
            if (variables.get("binlog_format") or "").upper() != "ROW":
                problems.append(f"the {side}'s binlog_format is {variables.get('binlog_format')}, not ROW")
            if not _on(variables.get("gtid_strict_mode")):
                problems.append(f"the {side} runs without gtid_strict_mode")
        if source.get("server_id") in (None, "0"):
            problems.append("the source's server_id is 0")
        if target is not None and target.get("server_id") == source.get("server_id"):
            problems.append(f"source and target share server_id {source.get('server_id')}")
        return problems

    def pair_problems(self, source: dict[str, str], target: dict[str, str]) -> list[str]:
        source_id = source.get("server_id")
        if target.get("server_id") == source_id:
            return [
                f"the target's server_id is {source_id}, the same as the source's: give it its own (server_id in "
                "its configuration)"
            ]
        return []

    def seed_spec(
        self,
        plan: Any,
        *,
        source_datadir: str,
        target_datadir: str,
        ssh_to_target: tuple[str, ...],
        password_env: str | None,
    ) -> seed.SeedSpec:
        settings = plan.replication
        assert settings is not None
        db = plan.database
        return seed.SeedSpec(
            source_datadir=source_datadir,
            target_datadir=target_datadir,
            ssh_to_target=ssh_to_target,
            source_socket=db.source.socket,
            source_user=db.user,
            password_env=password_env,
            owner=settings.datadir_owner,
            throttle=settings.seed_throttle,
            nice=settings.seed_nice,
            no_defaults=False,
            target_sudo=plan.target.become == "sudo",
        )

    # --- positions ---

    def parse_position(self, text: str | None) -> gtid.GtidPosition:
        return gtid.GtidPosition.parse(text)

    def same_position(self, final: gtid.GtidPosition, executed: gtid.GtidPosition) -> bool:
        return gtid.same_position(final, executed)

    def write_position(self, conn: Session) -> gtid.GtidPosition:
        return gtid.gtid_binlog_pos(conn)

    def current_position(self, conn: Session) -> gtid.GtidPosition:
        return gtid.gtid_current_pos(conn)

    def current_position_after(self, conn: Session, wanted: gtid.GtidPosition, wait: float) -> gtid.GtidPosition | None:
        return gtid.gtid_current_pos_after(conn, wanted, wait)

    def executed_position(self, conn: Session) -> gtid.GtidPosition:
        return gtid.gtid_slave_pos(conn)

    # --- the replica ---

    def replica_status(self, conn: Session) -> ReplicaStatus | None:
        return replica.replica_status(conn)

    def follow(
        self,
        conn: Session | None,
        source: ReplicaSource,
        start_at: gtid.GtidPosition,
        *,
        seeded: bool,
        server: ServerAccess | None = None,
        primary: Session | None = None,
    ) -> None:
        if conn is None:
            raise ReplicationError("the server to make a replica does not run")
        if seeded:
            replica.start_binlog_at(conn, start_at)  # nothing applied yet: the binlog starts where the copy's data does
        replica.point_replica(conn, source, start_at)

    def start_replica(self, conn: Session) -> None:
        replica.start_replica(conn)

    def stop_replica(self, conn: Session) -> None:
        replica.stop_replica(conn)

    def forget_replication(self, conn: Session) -> None:
        replica.forget_replication(conn)

    def wait_for_position(self, conn: Session, wanted: gtid.GtidPosition, timeout: float) -> WaitResult:
        return replica.wait_for_position(conn, wanted, timeout)

    # --- the switch ---

    def is_read_only(self, conn: Session) -> bool:
        return switch.is_read_only(conn)

    def set_read_only(self, conn: Session, on: bool, *, lock_wait_timeout: float) -> None:
        switch.set_read_only(conn, on, lock_wait_timeout=lock_wait_timeout)

    def before_window(self, conn: Session) -> None:
        """Nothing: read_only is one statement."""

    def stop_writes(self, conn: Session | None, *, lock_wait_timeout: float, server: ServerAccess) -> gtid.GtidPosition:
        if conn is None:
            raise ReplicationError("the source's server does not answer: read_only cannot be set")
        return switch.read_only_and_position(conn, lock_wait_timeout=lock_wait_timeout)

    def host_stop(self, server: ServerAccess, login: LocalLogin) -> host_stop.MariaDbHostStop | None:
        return host_stop.host_stop(server, login)

    def wait_and_promote(
        self, conn: Session, expected: gtid.GtidPosition, wait: float, *, within: float | None = None
    ) -> switch.Promotion:
        # The compound statement is bounded by the session's read timeout (the budget and a margin).
        return switch.wait_and_promote(conn, expected, wait)

    def promote(self, conn: Session, expected: gtid.GtidPosition, *, within: float | None = None) -> gtid.GtidPosition:
        return switch.promote(conn, expected=expected)

    # --- the after-commit audit (database/mysql/audit.py) ---

    def open_audit_snapshot(self, conn: Session) -> None:
        audit.open_target_snapshot(conn)

    def audit_snapshot_and_position(
        self, conn: Session, after: tuple[gtid.GtidPosition, float] | None = None
    ) -> gtid.GtidPosition:
        return audit.open_target_snapshot_at_position(conn, after)

    def audit_chunks(
        self,
        snapshot: Session,
        source: Session,
        final: gtid.GtidPosition,
        schemas: list[str] | None,
        *,
        chunk_rows: int,
        pause_ratio: float,
        timeout: float,
        on_start: Callable[[int], None],
        on_chunk: Callable[[str, int, int], None],
    ) -> ChunkedAudit:
        return audit.audit_chunks(snapshot, source, final, schemas, chunk_rows=chunk_rows, pause_ratio=pause_ratio,
                                  timeout=timeout, on_start=on_start, on_chunk=on_chunk)  # fmt: skip

    # --- the comparison before the window ---

    def compare_cost(self, conn: Session, tables: list[tuple[str, str]], chunk_rows: int) -> tuple[float, int]:
        """information_schema's row estimates for the chunks; a chunk's checksum timed on the largest table."""
        with conn.cursor() as cur:
            cur.execute(
                "SELECT TABLE_SCHEMA, TABLE_NAME, COALESCE(TABLE_ROWS, 0) FROM information_schema.TABLES"
                " WHERE TABLE_TYPE = 'BASE TABLE'"
            )
            rows = {(str(a), str(b)): int(c) for a, b, c in cur.fetchall()}
        counts = {table: rows.get(table, 0) for table in tables}
        chunks = sum(max(1, -(-count // chunk_rows)) for count in counts.values())
        largest = max(counts, key=lambda table: counts[table])
        shape = compare.table_shape(conn, *largest)
        seconds, read = compare.sample_checksum_seconds(conn, shape, chunk_rows)
        # A chunk of chunk_rows rows: a smaller table's whole sample scaled up to a full chunk.
        return (seconds * chunk_rows / read if read else seconds), chunks

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
        # A non-transactional table is outside the snapshot: compared apart, at a moment nothing wrote to it.
        engines = compare_live.engines(snapshot_conn, tables)
        in_snapshot = [t for t in tables if engines[t] in compare_live.TRANSACTIONAL_ENGINES]
        live = [t for t in tables if engines[t] not in compare_live.TRANSACTIONAL_ENGINES]
        try:
            replica.stop_replica(target)  # before the snapshot: the replica must not be past it
            snapshot = compare.open_consistent_snapshot(snapshot_conn)
            stopped = compare.stop_replica_at(target, snapshot.gtid, timeout)
            if stopped.outcome != "reached":
                return Comparison(snapshot.gtid, error=stopped.error or "")
            diffs = compare.compare_tables(
                snapshot_conn, target, in_snapshot, chunk_rows=chunk_rows, pause_ratio=pause_ratio, on_chunk=on_chunk
            )
        finally:
            with contextlib.suppress(gtid.ReplicationError):
                compare.close_snapshot(snapshot_conn)
        unsettled: list[str] = []
        for schema, table in live if not diffs else []:
            try:
                outcome = compare_live.compare_live_table(
                    snapshot_conn, target, schema, table, chunk_rows=chunk_rows, timeout=timeout
                )
            except gtid.ReplicationError as exc:
                return Comparison(snapshot.gtid, list(diffs), error=str(exc))
            diffs = [*diffs, *outcome.differences]
            if outcome.unsettled:
                unsettled.append(outcome.describe())
            on_chunk(outcome.table, 1, 1)
        return Comparison(snapshot.gtid, list(diffs), not_compared=unsettled)


def open_replication(engine: str) -> MariaDbReplication:
    return MariaDbReplication(engine)
