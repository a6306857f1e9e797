"""The replication path's parts, proven on the lab under a write load: the seed (mariadb-backup streamed over the
source→target SSH hop), the target as a GTID replica through an SSH tunnel, the VDiff-style comparison, a replica
error in the replica's own words, the switch (read_only → final GTID → MASTER_GTID_WAIT → promote → proof) and
reverse replication back to the old source.

The tests share one replicated pair (module fixture) and run in file order; the switch comes last. Teardown leaves
the lab as the other tests expect it: the source live and writable, no replication, the target's database stopped
on its original datadir. Figures (seed time, the source's write stall, the switch's duration) are printed: run with
-s to see them (the brief's rule: no timing asserts in tests).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pymysql
import pytest
from ruamel.yaml import YAML

from migrate_lab import procs
from migrate_lab.state import HostState, LabState
from orchestrator.database.mysql import compare, gtid, replica, switch
from orchestrator.database.mysql import seed as mysql_seed
from orchestrator.plan.model import Plan
from orchestrator.secrets import redact
from orchestrator.transports.rsync import target_ssh_command
from orchestrator.transports.ssh import SshHost

ER_OPTION_PREVENTS_STATEMENT = 1290  # read_only refused the write
ER_DUP_ENTRY = 1062
CATCH_UP_TIMEOUT = 120.0


def load_plan(path: Path) -> Plan:
    return Plan.model_validate(YAML(typ="safe").load(path.read_text()))


def connect(host: HostState, user: str, password: str, database: str | None = None) -> pymysql.Connection:
    return pymysql.connect(
        host=host.address,
        port=host.db_port,
        user=user,
        password=password,
        database=database,
        autocommit=True,
        connect_timeout=10,
        read_timeout=120,
        write_timeout=60,
    )


@dataclass
class Write:
    started: float
    finished: float
    ok: bool
    code: int | None = None


@dataclass
class Writer:
    """A client of the source committing small inserts back to back (paced), every outcome recorded."""

    host: HostState
    user: str
    password: str
    database: str
    prefix: str
    pace: float = 0.005
    writes: list[Write] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"writer-{self.prefix}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        conn: pymysql.Connection | None = None
        n = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if conn is None:
                    conn = connect(self.host, self.user, self.password, self.database)
                n += 1
                with conn.cursor() as cur:
                    cur.execute(
                        "INSERT INTO reviews (id, author, course, rating, body) VALUES (%s, 'load', 'Databases', 4, "
                        "'written under the replication test')",
                        (f"{self.prefix}-{n:08d}",),
                    )
                self.writes.append(Write(started, time.monotonic(), True))
            except pymysql.MySQLError as exc:
                code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
                self.writes.append(Write(started, time.monotonic(), False, code))
                if code != ER_OPTION_PREVENTS_STATEMENT and conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                    conn = None
            self._stop.wait(self.pace)
        if conn is not None:
            conn.close()

    def longest_commit(self, start: float, end: float) -> float:
        """The longest time one write took among those running during [start, end]: the stall clients saw."""
        during = [w for w in self.writes if w.finished >= start and w.started <= end]
        return max((w.finished - w.started for w in during), default=0.0)


@dataclass
class Pair:
    lab: LabState
    plan: Plan
    source_ssh: SshHost
    target_ssh: SshHost
    seed: mysql_seed.SeedSpec
    tunnel: mysql_seed.TunnelSpec
    source: pymysql.Connection
    target: pymysql.Connection
    writer: Writer
    backup: mysql_seed.BackupPosition
    seed_bytes: int
    seed_estimate: int
    progress: list[int]
    seed_seconds: float
    seed_stall: float
    backup_stages: list[mysql_seed.BackupStage]
    backup_locks: mysql_seed.BackupLocks
    secrets: dict[str, str] = field(repr=False)

    def app_password(self) -> str:
        return self.secrets[self.lab.app_password_env]

    def repl_source(self, port: int) -> replica.ReplicaSource:
        return replica.ReplicaSource("127.0.0.1", port, self.lab.repl_user, self.secrets[self.lab.repl_password_env])

    def catch_up(self, timeout: float = CATCH_UP_TIMEOUT) -> replica.WaitResult:
        return replica.wait_for_position(self.target, gtid.gtid_binlog_pos(self.source), timeout)


def ssh_to_target(plan: Plan) -> tuple[str, ...]:
    login = f"{plan.target.user}@{plan.target.address}"
    return (*shlex.split(target_ssh_command(plan, control="no")), login)


def free_loopback_port() -> int:
    return procs.free_port(["127.0.0.1"])


@pytest.fixture(scope="module")
def pair(lab: LabState) -> Iterator[Pair]:
    plan = load_plan(lab.plan_file)
    secrets = lab.secrets()
    source_ssh = SshHost(plan.source, name="source", base_dir=lab.path, retry=plan.retry)
    target_ssh = SshHost(plan.target, name="target", base_dir=lab.path, retry=plan.retry)
    hop = ssh_to_target(plan)
    seed = mysql_seed.SeedSpec(
        source_datadir=str(lab.source.datadir),
        target_datadir=str(lab.target.datadir),
        ssh_to_target=hop,
        source_socket=str(lab.source.db_socket),
        source_user=lab.migrate_user,
        password_env=lab.db_password_env,
        no_defaults=True,
    )
    port = free_loopback_port()
    tunnel = mysql_seed.TunnelSpec(
        f"fwd-{port}", "remote", hop, port, lab.source.address, lab.source.db_port, control_dir=str(lab.source.run_dir)
    )
    target_ssh.run(str(lab.target.bin_dir / "db-stop"), timeout=120)
    source = connect(lab.source, lab.migrate_user, secrets[lab.db_password_env])
    writer = Writer(lab.source, lab.app_user, secrets[lab.app_password_env], lab.db_name, f"repl-load-{port}")
    target: pymysql.Connection | None = None
    try:
        writer.start()
        while len([w for w in writer.writes if w.ok]) < 20:  # the load runs before the seed starts
            time.sleep(0.01)

        # The seed, under the write load.
        estimate = mysql_seed.parse_size(source_ssh.run(mysql_seed.seed_size_command(seed)).stdout)
        progress: list[int] = []

        def on_line(line: str) -> None:
            streamed = mysql_seed.parse_seed_progress(line)
            if streamed is not None:
                progress.append(streamed)

        started = time.monotonic()
        streamed = source_ssh.stream(
            mysql_seed.seed_stream_command(seed),
            on_line,
            input=secrets[lab.db_password_env] + "\n",
            timeout=1800,
        )
        finished = time.monotonic()
        target_ssh.run(mysql_seed.prepare_command(seed), timeout=1800)
        target_ssh.run(mysql_seed.install_command(seed), timeout=600)
        backup = mysql_seed.parse_backup_position(
            target_ssh.run(mysql_seed.backup_position_command(seed.target_datadir)).stdout
        )
        target_ssh.run(str(lab.target.bin_dir / "db-start"), timeout=600)
        target = connect(lab.target, lab.migrate_user, secrets[lab.db_password_env])

        # The replica, through the tunnel.
        switch.set_read_only(target, True, lock_wait_timeout=3)
        replica.start_binlog_at(target, backup.gtid)
        source_ssh.run(mysql_seed.tunnel_up_command(tunnel), timeout=60)
        replica.point_replica(
            target, replica.ReplicaSource("127.0.0.1", port, lab.repl_user, secrets[lab.repl_password_env]), backup.gtid
        )
        replica.start_replica(target)
        yield Pair(
            lab=lab,
            plan=plan,
            source_ssh=source_ssh,
            target_ssh=target_ssh,
            seed=seed,
            tunnel=tunnel,
            source=source,
            target=target,
            writer=writer,
            backup=backup,
            seed_bytes=progress[-1] if progress else 0,
            seed_estimate=estimate,
            progress=progress,
            seed_seconds=finished - started,
            seed_stall=writer.longest_commit(started, finished),
            backup_stages=mysql_seed.parse_backup_stages(streamed.stdout),
            backup_locks=mysql_seed.parse_backup_locks(streamed.stdout),
            secrets=secrets,
        )
    finally:
        writer.stop()
        source_ssh.run(mysql_seed.tunnel_down_command(tunnel), check=False)
        with contextlib.suppress(Exception):
            replica.stop_replica(source)
        with contextlib.suppress(Exception), source.cursor() as cur:
            cur.execute("RESET SLAVE ALL")
        switch.set_read_only(source, False, lock_wait_timeout=3)
        source.close()
        if target is not None:
            target.close()
        target_ssh.run(str(lab.target.bin_dir / "db-stop"), timeout=300, check=False)
        target_ssh.run(mysql_seed.restore_previous_command(seed), check=False)
        target_ssh.run(mysql_seed.discard_staging_command(seed), check=False)
        source_ssh.close()
        target_ssh.close()


def count(conn: pymysql.Connection, sql: str, args: object = None) -> int:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return int(cur.fetchone()[0])


@pytest.mark.lab
def test_seed_streams_the_live_source_and_the_target_replicates_through_the_tunnel(pair: Pair) -> None:
    lab = pair.lab
    # The seed moved about the datadir's size, reported progress while it ran, and recorded where it stands.
    assert pair.seed_bytes > 0 and pair.progress == sorted(pair.progress)
    assert pair.backup.gtid and pair.backup.file.startswith("binlog.")
    assert {s.stage for s in pair.backup_stages} >= {"START", "BLOCK_COMMIT", "END"}
    # How long it held the live source's commits and DDL back, measured on its stamped log: both ends seen, the
    # commits' hold inside the DDL's, inside the seed.
    locks = pair.backup_locks
    assert locks.commits_blocked is not None and locks.ddl_blocked is not None, locks
    assert 0 <= locks.commits_blocked <= locks.ddl_blocked <= pair.seed_seconds, locks
    # The target replicates with GTIDs from 127.0.0.1:<tunnel port>, a port only the tunnel listens on.
    pid = mysql_seed.parse_tunnel_pid(pair.source_ssh.run(mysql_seed.tunnel_check_command(pair.tunnel)).stdout)
    assert pid is not None
    probe = pair.target_ssh.run(
        mysql_seed.tunnel_probe_command(pair.tunnel.listen_port, lab.repl_user, lab.repl_password_env),
        env={lab.repl_password_env: pair.secrets[lab.repl_password_env]},
        check=False,
    )
    assert mysql_seed.parse_probe(probe.stdout), probe.stdout
    caught = pair.catch_up()
    assert caught.outcome == "reached", caught
    status = replica.replica_status(pair.target)
    assert status is not None and status.replicating and status.error is None
    assert status.using_gtid == "Slave_Pos" and status.master_port == pair.tunnel.listen_port
    # Every write the source acknowledged so far is on the target.
    position = gtid.gtid_binlog_pos(pair.source)
    accepted = [w for w in pair.writer.writes if w.ok]
    assert replica.wait_for_position(pair.target, position, CATCH_UP_TIMEOUT).outcome == "reached"
    on_target = count(
        pair.target, f"SELECT COUNT(*) FROM {lab.db_name}.reviews WHERE id LIKE %s", (f"{pair.writer.prefix}-%",)
    )
    assert on_target >= len(accepted)
    print(
        f"\nseed: {pair.seed_bytes / 2**20:.1f} MiB streamed (estimate {pair.seed_estimate / 2**20:.1f} MiB) in "
        f"{pair.seed_seconds:.2f} s; commits held {pair.backup_locks.commits_blocked} s, DDL "
        f"{pair.backup_locks.ddl_blocked} s; longest source commit during it {pair.seed_stall * 1000:.0f} ms; "
        f"stages {[(s.stage, s.started[-8:], s.finished[-8:]) for s in pair.backup_stages]}"
    )


@pytest.mark.lab
def test_an_unprepared_copy_never_replaces_the_datadir(pair: Pair) -> None:
    """A seed cut short (the source died, the prepare never ran) leaves the target's datadir as it was."""
    staging = Path(pair.seed.staging_dir)
    staging.mkdir()
    (staging / "xtrabackup_checkpoints").write_text("backup_type = full-backuped\nfrom_lsn = 0\n")
    before = sorted(p.name for p in Path(pair.seed.target_datadir).iterdir())
    refused = pair.target_ssh.run(mysql_seed.install_command(pair.seed), check=False)
    assert refused.exit_status != 0 and "no prepared seed" in refused.stderr
    assert sorted(p.name for p in Path(pair.seed.target_datadir).iterdir()) == before
    pair.target_ssh.run(mysql_seed.discard_staging_command(pair.seed))
    assert not staging.exists()
    assert pair.catch_up().outcome == "reached"


@pytest.mark.lab
def test_the_tunnel_comes_back_and_the_replica_resumes(pair: Pair) -> None:
    pair.source_ssh.run(mysql_seed.tunnel_down_command(pair.tunnel))
    assert pair.source_ssh.run(mysql_seed.tunnel_check_command(pair.tunnel), check=False).exit_status != 0
    before = gtid.gtid_binlog_pos(pair.source)
    pair.source_ssh.run(mysql_seed.tunnel_up_command(pair.tunnel), timeout=60)
    # Started twice: the second call finds it running and keeps it.
    first = mysql_seed.parse_tunnel_pid(
        pair.source_ssh.run(mysql_seed.tunnel_up_command(pair.tunnel), timeout=60).stdout
    )
    second = mysql_seed.parse_tunnel_pid(pair.source_ssh.run(mysql_seed.tunnel_check_command(pair.tunnel)).stdout)
    assert first is not None and first == second
    # The tunnel does not depend on our SSH session: a run that dies (kill -9) finds it still there on resume.
    pair.source_ssh.close()
    third = mysql_seed.parse_tunnel_pid(pair.source_ssh.run(mysql_seed.tunnel_check_command(pair.tunnel)).stdout)
    assert third == first
    # Writes made while it was down and after arrive (the replica reconnects by itself: MASTER_CONNECT_RETRY).
    assert replica.wait_for_position(pair.target, before, CATCH_UP_TIMEOUT).outcome == "reached"
    assert pair.catch_up().outcome == "reached"


@pytest.mark.lab
def test_comparison_at_one_snapshot_finds_equal_data_then_a_planted_difference(pair: Pair) -> None:
    lab = pair.lab
    tables = [(lab.db_name, "reviews"), (lab.db_name, "uploads")]
    snapshot_conn = connect(lab.source, lab.migrate_user, pair.secrets[lab.db_password_env])
    planted = "seed-0000000150"
    try:
        replica.stop_replica(pair.target)  # before the snapshot: the replica must not be past it
        snapshot = compare.open_consistent_snapshot(snapshot_conn)
        assert snapshot.gtid and snapshot.binlog_file.startswith("binlog.")
        stopped = compare.stop_replica_at(pair.target, snapshot.gtid, CATCH_UP_TIMEOUT)
        assert stopped.outcome == "reached", stopped
        assert gtid.same_position(snapshot.gtid, gtid.gtid_slave_pos(pair.target))
        # The writer keeps writing on the source all along; the comparison still sees equal data.
        started = time.monotonic()
        assert compare.compare_tables(snapshot_conn, pair.target, tables, chunk_rows=500) == []
        compared = time.monotonic() - started

        # A row changed on the replica alone (not binlogged) is found, named by table and chunk.
        with pair.target.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute(f"UPDATE {lab.db_name}.reviews SET rating = rating + 1 WHERE id = %s", (planted,))
        diffs = compare.compare_tables(snapshot_conn, pair.target, tables, chunk_rows=500)
        shape = compare.table_shape(snapshot_conn, lab.db_name, "reviews")
        chunks = compare.chunk_bounds(snapshot_conn, shape, 500)
        expected = next(
            c
            for c in chunks
            if (c.lower is None or c.lower[0] <= planted) and (c.upper is None or planted < c.upper[0])
        )
        assert [(d.table, d.chunk.index) for d in diffs] == [(f"{lab.db_name}.reviews", expected.index)]
        assert diffs[0].source.rows == diffs[0].replica.rows
        assert f"{lab.db_name}.reviews chunk {expected.index} " in diffs[0].describe()
        print(f"\ncomparison: equal in {compared:.2f} s; planted: {diffs[0].describe()}")
    finally:
        with pair.target.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute(f"UPDATE {lab.db_name}.reviews SET rating = rating - 1 WHERE id = %s", (planted,))
            cur.execute("SET SESSION sql_log_bin = 1")
        with contextlib.suppress(Exception):
            compare.close_snapshot(snapshot_conn)
        snapshot_conn.close()
        replica.start_replica(pair.target)
    assert pair.catch_up().outcome == "reached"


@pytest.mark.lab
def test_a_replica_error_is_reported_in_the_replicas_own_words(pair: Pair) -> None:
    lab = pair.lab
    row = f"conflict-{pair.tunnel.listen_port}"
    insert = f"INSERT INTO {lab.db_name}.reviews (id, author) VALUES (%s, 'planted')"
    with pair.target.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(insert, (row,))
        cur.execute("SET SESSION sql_log_bin = 1")
    with pair.source.cursor() as cur:
        cur.execute(insert, (row,))
    failed = pair.catch_up(timeout=CATCH_UP_TIMEOUT)
    assert failed.outcome == "replica_failed"
    assert failed.error is not None and f"error {ER_DUP_ENTRY}" in failed.error and "Duplicate entry" in failed.error
    assert row in failed.error
    status = replica.replica_status(pair.target)
    assert status is not None and not status.sql_running and status.last_sql_errno == ER_DUP_ENTRY
    print(f"\nreplica error: {failed.error[:200]}")
    # Repaired (the planted row removed on the replica alone), the replica applies the source's row and goes on.
    with pair.target.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute(f"DELETE FROM {lab.db_name}.reviews WHERE id = %s", (row,))
        cur.execute("SET SESSION sql_log_bin = 1")
    replica.start_replica(pair.target)
    assert pair.catch_up().outcome == "reached"
    assert (
        count(pair.target, f"SELECT COUNT(*) FROM {lab.db_name}.reviews WHERE id = %s AND author IS NULL", (row,)) == 0
    )


@pytest.mark.lab
def test_the_replication_password_stays_out_of_every_file_we_write_and_every_status(pair: Pair) -> None:
    lab = pair.lab
    password = pair.secrets[lab.repl_password_env]
    assert redact(f"x {password} y") == "x *** y"  # registered when the replica was pointed at its source
    public = [lab.path / "lab.json", lab.plan_file, Path(pair.tunnel.log_path)]
    for host in (lab.source, lab.target):
        public += [*host.bin_dir.iterdir(), *host.log_dir.glob("*")]
    for path in public:
        if path.is_file():
            assert password not in path.read_text(errors="replace"), f"the replication password leaked into {path}"
    with pair.target.cursor() as cur:
        cur.execute("SHOW SLAVE STATUS")
        assert password not in repr(cur.fetchall())


@pytest.mark.lab
def test_read_only_waits_for_a_table_lock_no_longer_than_told(pair: Pair) -> None:
    lab = pair.lab
    holder = connect(lab.source, lab.migrate_user, pair.secrets[lab.db_password_env], lab.db_name)
    fence = connect(lab.source, lab.migrate_user, pair.secrets[lab.db_password_env])
    try:
        with holder.cursor() as cur:
            cur.execute("LOCK TABLES uploads WRITE")
        with pytest.raises(gtid.ReplicationError) as failed:
            switch.set_read_only(fence, True, lock_wait_timeout=1)
        assert "error 1205" in str(failed.value)  # lock wait timeout: the fence gave up, nothing changed
        assert not switch.is_read_only(fence)
        # The same in one round trip with the final position: the compound statement stops at the lock's error.
        with pytest.raises(gtid.ReplicationError) as failed:
            switch.read_only_and_position(fence, lock_wait_timeout=1)
        assert "error 1205" in str(failed.value)
        assert not switch.is_read_only(fence)
    finally:
        holder.close()
        fence.close()


@pytest.mark.lab
def test_a_replica_behind_the_final_position_is_not_promoted(pair: Pair) -> None:
    lab = pair.lab
    assert pair.catch_up().outcome == "reached"
    replica.stop_replica(pair.target)
    with pair.source.cursor() as cur:
        cur.execute(
            f"INSERT INTO {lab.db_name}.reviews (id, author) VALUES (%s, 'late')", (f"late-{pair.tunnel.listen_port}",)
        )
    final = gtid.gtid_binlog_pos(pair.source)
    # The one-round-trip form does not reach it (the replica is stopped behind): nothing changed.
    first = switch.wait_and_promote(pair.target, final, 0.2)
    assert not first.reached and not first.promoted
    assert replica.replica_status(pair.target) is not None and switch.is_read_only(pair.target)
    with pytest.raises(gtid.PositionMismatch):
        switch.promote(pair.target, expected=final)
    # Not promoted: still a read-only replica of the source, which resumes and catches up.
    status = replica.replica_status(pair.target)
    assert status is not None and status.master_port == pair.tunnel.listen_port and switch.is_read_only(pair.target)
    replica.start_replica(pair.target)
    assert pair.catch_up().outcome == "reached"


@pytest.mark.lab
def test_a_replica_past_the_final_position_is_not_promoted_by_the_servers_proof(pair: Pair) -> None:
    """MASTER_GTID_WAIT is satisfied by any later position: the proof inside the compound statement must still
    refuse a replica that executed more than the source's final position (a write past it), leaving it stopped,
    read-only and a replica (its settings intact)."""
    lab = pair.lab
    assert pair.catch_up().outcome == "reached"
    stale_final = gtid.gtid_binlog_pos(pair.source)
    with pair.source.cursor() as cur:
        cur.execute(
            f"INSERT INTO {lab.db_name}.reviews (id, author) VALUES (%s, 'past')", (f"past-{pair.tunnel.listen_port}",)
        )
    assert pair.catch_up().outcome == "reached"
    with pytest.raises(gtid.PositionMismatch, match="final position is " + str(stale_final)):
        switch.wait_and_promote(pair.target, stale_final, 2.0)
    status = replica.replica_status(pair.target)
    assert status is not None and not status.sql_running and status.master_port == pair.tunnel.listen_port
    assert switch.is_read_only(pair.target)
    replica.start_replica(pair.target)
    assert pair.catch_up().outcome == "reached"


@pytest.mark.lab
def test_the_switch_loses_nothing_and_the_old_source_replicates_back(pair: Pair) -> None:
    lab = pair.lab
    assert pair.catch_up().outcome == "reached"
    fence = connect(lab.source, lab.migrate_user, pair.secrets[lab.db_password_env])

    # The window as the switch makes it: read_only on the source with its final position (one round trip), the
    # target's wait for it with the promotion and its proof (one more).
    began = time.monotonic()
    final = switch.read_only_and_position(fence, lock_wait_timeout=3)
    fenced = time.monotonic()
    promotion = switch.wait_and_promote(pair.target, final, replica.WAIT_SLICE)
    if not promotion.reached:  # the replica needed longer than a slice: the switch's own fallback
        assert replica.wait_for_position(pair.target, final, timeout=30).outcome == "reached"
        promotion = switch.Promotion(True, True, switch.promote(pair.target, expected=final), 0.0)
    executed = promotion.executed
    ended = time.monotonic()
    assert promotion.promoted and replica.replica_status(pair.target) is None
    assert gtid.same_position(final, executed), (final, executed)
    assert not switch.is_read_only(pair.target)

    # read_only is the server's, not our session's: with the fencing session gone, the app still cannot write.
    fence.close()
    app = connect(lab.source, lab.app_user, pair.app_password(), lab.db_name)
    with pytest.raises(pymysql.MySQLError) as refused, app.cursor() as cur:
        cur.execute("INSERT INTO reviews (id) VALUES ('after-the-fence')")
    assert refused.value.args[0] == ER_OPTION_PREVENTS_STATEMENT
    app.close()
    # Nothing committed on the source after the final position was read.
    assert gtid.gtid_binlog_pos(pair.source) == final
    pair.writer.stop()
    refused_writes = [w for w in pair.writer.writes if w.code == ER_OPTION_PREVENTS_STATEMENT]
    assert refused_writes
    # Every write the source accepted is on the target.
    accepted = len([w for w in pair.writer.writes if w.ok])
    on_target = count(
        pair.target, f"SELECT COUNT(*) FROM {lab.db_name}.reviews WHERE id LIKE %s", (f"{pair.writer.prefix}-%",)
    )
    assert on_target == accepted

    # Reverse replication: the old source follows the new primary from the same position, through a -L tunnel.
    port = free_loopback_port()
    back = mysql_seed.TunnelSpec(
        f"rev-{port}",
        "local",
        pair.tunnel.ssh_to_target,
        port,
        lab.target.address,
        lab.target.db_port,
        control_dir=str(lab.source.run_dir),
    )
    try:
        pair.source_ssh.run(mysql_seed.tunnel_up_command(back), timeout=60)
        replica.point_replica(pair.source, pair.repl_source(port), final)
        replica.start_replica(pair.source)
        app = connect(lab.target, lab.app_user, pair.app_password(), lab.db_name)
        with app.cursor() as cur:
            cur.execute("INSERT INTO reviews (id, author) VALUES (%s, 'after the switch')", (f"on-target-{port}",))
        app.close()
        back_to_source = replica.wait_for_position(pair.source, gtid.gtid_binlog_pos(pair.target), CATCH_UP_TIMEOUT)
        assert back_to_source.outcome == "reached", back_to_source
        assert (
            count(pair.source, f"SELECT COUNT(*) FROM {lab.db_name}.reviews WHERE id = %s", (f"on-target-{port}",)) == 1
        )
        status = replica.replica_status(pair.source)
        assert status is not None and status.replicating and status.master_port == port
        assert switch.is_read_only(pair.source)  # the old source stays fenced while it follows
        # A CHANGE MASTER the server refuses says why, never with the password.
        password = pair.secrets[lab.repl_password_env]
        refused_source = replica.ReplicaSource("127.0.0.1", port, lab.repl_user, password, heartbeat_period=5_000_000)
        with pytest.raises(gtid.ReplicationError) as failed:
            replica.point_replica(pair.source, refused_source, final)
        assert "heartbeat" in str(failed.value).lower() and password not in str(failed.value)
    finally:
        pair.source_ssh.run(mysql_seed.tunnel_down_command(back), check=False)
    print(
        f"\nswitch: read_only took {(fenced - began) * 1000:.0f} ms, wait {promotion.waited * 1000:.0f} ms, "
        f"read_only → promoted {(ended - began) * 1000:.0f} ms; {len(refused_writes)} writes refused by read_only"
    )


# --- pure logic (no lab) ----------------------------------------------------------------------------------------


def test_gtid_positions_parse_compare_and_refuse_garbage() -> None:
    pos = gtid.GtidPosition.parse("1-3-7, 0-1-42")
    assert str(pos) == "0-1-42,1-3-7"
    assert pos.reached(gtid.GtidPosition.parse("0-1-41")) and not pos.reached(gtid.GtidPosition.parse("0-1-43"))
    assert not pos.reached(gtid.GtidPosition.parse("2-1-1"))  # a domain it never saw
    assert gtid.same_position(gtid.GtidPosition.parse("0-1-42"), pos)
    assert not gtid.same_position(gtid.GtidPosition.parse("0-2-42"), pos)  # same number, another server's GTID
    assert not gtid.GtidPosition.parse("")
    for bad in ("0-1", "a-b-c", "0-1-2,0-1-3"):
        with pytest.raises(ValueError):
            gtid.GtidPosition.parse(bad)


def test_backup_outputs_parse() -> None:
    position = mysql_seed.parse_backup_position("binlog.000002\t3877\t0-1-38\n")
    assert (position.file, position.position, str(position.gtid)) == ("binlog.000002", 3877, "0-1-38")
    with pytest.raises(gtid.ReplicationError):
        mysql_seed.parse_backup_position("binlog.000002\t3877\n")  # no GTID: the source's binlog is off
    assert mysql_seed.parse_seed_progress("270386822 bytes (270 MB, 258 MiB) copied, 6.4 s, 41.7 MB/s") == 270386822
    assert mysql_seed.parse_seed_progress("0+569 records in") is None
    stages = mysql_seed.parse_backup_stages(
        "backup: [00] 2026-11-23 12:17:26 Starting BACKUP STAGE BLOCK_COMMIT\n"
        "backup: [00] 2026-11-23 12:17:26 Acquired locks for BACKUP STAGE BLOCK_COMMIT\n"
        "backup: [00] 2026-11-23 12:17:27 Finishing BACKUP STAGE BLOCK_COMMIT\n"
    )
    assert stages == [mysql_seed.BackupStage("BLOCK_COMMIT", "2026-11-23 12:17:26", "2026-11-23 12:17:27")]
    # The stamped log (each line after the moment it was written): the locks to the millisecond, whatever the
    # locale's decimal point; a log without its stamps or its end gives no figure rather than a wrong one.
    stamped = (
        "backup: 1764158245.100000 [00] 2026-11-26 12:17:25 Started BACKUP STAGE BLOCK_DDL\n"
        "backup: 1764158245.290500 [00] 2026-11-26 12:17:25 Finished BACKUP STAGE BLOCK_DDL\n"
        "backup: 1764158245,300000 [00] 2026-11-26 12:17:25 Starting BACKUP STAGE BLOCK_COMMIT\n"
        "backup: 1764158245.301000 [00] 2026-11-26 12:17:25 Acquired locks for BACKUP STAGE BLOCK_COMMIT\n"
        "backup: 1764158245.330000 [00] 2026-11-26 12:17:25 Executing BACKUP STAGE END\n"
        "backup: 1764158245.342000 [00] 2026-11-26 12:17:25 All tables unlocked\n"
    )
    assert mysql_seed.parse_backup_locks(stamped) == mysql_seed.BackupLocks(
        0.042, 0.242, commits_blocked_from=1764158245.3
    )
    assert [s.stage for s in mysql_seed.parse_backup_stages(stamped)] == ["BLOCK_DDL", "END"]
    unstamped = "backup: [00] 2026-11-26 12:17:25 Starting BACKUP STAGE BLOCK_COMMIT\n"
    assert mysql_seed.parse_backup_locks(unstamped) == mysql_seed.BackupLocks(None, None)
    cut = stamped.rsplit("backup:", 1)[0]  # no "All tables unlocked"
    assert mysql_seed.parse_backup_locks(cut) == mysql_seed.BackupLocks(None, None)


def test_a_niced_backup_gets_its_priority_back_once_it_locks_the_source_and_its_log_is_stamped(
    tmp_path: Path,
) -> None:
    """The reader of a niced seed's log, on its own: once the backup's log shows its locking stage, the process
    named mariadb-backup runs at niceness 0 in the best-effort I/O class (a starved BLOCK_COMMIT would hold every
    commit of the live site); every line of its log is kept with the moment it was written, and the script finds
    them all once the backup is over. The process here only logs that line and reports its priority: what is tested
    is the reader's shell, which finds it by name among the script's children."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    backup = bin_dir / "mariadb-backup"
    backup.write_text(
        "#!/bin/bash\n"
        f"echo \"[00] $(date '+%F %T') {mysql_seed.LOCKING_STAGE}\" >&2\n"
        # The reader renices, then ionices: both are waited for (one alone may be seen between the two).
        "for i in $(seq 200); do [ \"$(ps -o ni= -p $$ | tr -d ' ')\" = 0 ] && ionice -p $$ | grep -q best-effort"
        " && break; sleep 0.02; done\n"
        "echo \"nice $(ps -o ni= -p $$ | tr -d ' ') io $(ionice -p $$)\"\n"
        "echo \"[00] $(date '+%F %T') All tables unlocked\" >&2\n"
    )
    backup.chmod(0o755)
    log = tmp_path / "backup.log"
    script = (
        f"set -o pipefail\nlog={log}\n"
        + mysql_seed.stamp_log(True)
        + "\n"
        + " ".join(mysql_seed.NICE)
        + " mariadb-backup 2>&5 5>&- | cat\n"
        + mysql_seed.stamp_log_end()
        + '\ncat "$log" >&2\n'
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    before = time.time()
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=True)
    if os.geteuid() == 0:
        assert done.stdout.split() == ["nice", "0", "io", "best-effort:", "prio", "4"], done.stdout + done.stderr
    else:  # lowering a niceness needs root or CAP_SYS_NICE: the backup stays niced, and the script still succeeds
        assert done.stdout.split()[:2] == ["nice", "19"], done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1] == mysql_seed.STAMPED_END, done.stderr
    stamps = [float(line.split()[0]) for line in lines[:-1]]
    assert len(stamps) == 2 and before <= stamps[0] <= stamps[1] <= time.time(), done.stderr
    assert mysql_seed.LOCKING_STAGE in lines[0] and "All tables unlocked" in lines[1]
    assert "renice" not in mysql_seed.seed_stream_command(mysql_seed.SeedSpec("/a", "/b", ("ssh", "t"), nice=False))


def test_the_logs_stamps_wait_for_no_priority_change_and_a_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    """The reader of the seed's log stamps the locking stages' lines as they arrive, even when giving the backup its
    priority back is slow (a `renice` taking 2 s here, done beside the reading): the hold on commits it measures is
    the backup's own (1 s here), not shortened by that wait. A last line without its newline (a crash's message)
    is kept."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "renice").write_text("#!/bin/bash\nsleep 2\n")
    backup = bin_dir / "mariadb-backup"
    backup.write_text(
        "#!/bin/bash\n"
        f"echo '[00] 2026-11-26 12:00:00 {mysql_seed.LOCKING_STAGE}' >&2\n"
        "echo '[00] 2026-11-26 12:00:00 Starting BACKUP STAGE BLOCK_COMMIT' >&2\n"
        "sleep 1\n"
        "echo '[00] 2026-11-26 12:00:01 All tables unlocked' >&2\n"
        "printf 'fatal: the last words' >&2\n"
    )
    for tool in (backup, bin_dir / "renice"):
        tool.chmod(0o755)
    log = tmp_path / "backup.log"
    script = (
        f"set -o pipefail\nlog={log}\n{mysql_seed.stamp_log(True)}\n"
        f"{' '.join(mysql_seed.NICE)} mariadb-backup 2>&5 5>&- | cat\n"
        f"{mysql_seed.stamp_log_end()}\n"
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=True)
    lines = log.read_text().splitlines()
    locks = mysql_seed.parse_backup_locks("\n".join(lines))
    assert locks.commits_blocked is not None and locks.commits_blocked >= 0.5, lines
    assert lines[-2].split(" ", 1)[1] == "fatal: the last words" and lines[-1] == mysql_seed.STAMPED_END, lines


def test_a_failing_backup_ends_the_seeds_stderr_in_its_own_words(tmp_path: Path) -> None:
    """The seed's command around a backup that fails: it exits non-zero and its stderr ends with the backup's own
    last line as written (no stamp, not the log reader's end marker): an error message shows that line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    backup = bin_dir / "mariadb-backup"
    backup.write_text(
        "#!/bin/bash\n"
        "echo '[00] 2026-11-26 12:00:00 Connecting to server host: localhost' >&2\n"
        "echo '[00] 2026-11-26 12:00:00 Error: failed to connect to the server' >&2\n"
        "exit 1\n"
    )
    backup.chmod(0o755)
    command = mysql_seed.seed_stream_command(
        mysql_seed.SeedSpec("/a", "/b", ("sh", "-c", "cat >/dev/null"), nice=False)
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1, done
    last = done.stderr.splitlines()[-1]
    assert last == "[00] 2026-11-26 12:00:00 Error: failed to connect to the server", done.stderr


def test_commands_keep_secrets_off_command_lines_and_our_ssh_options_first() -> None:
    hop = ("ssh", "-o", "ControlMaster=auto", "-o", "ControlPath=/var/lib/migrate/ssh-%C", "-p", "22", "root@t")
    seed = mysql_seed.SeedSpec("/var/lib/mysql", "/var/lib/mysql", hop, source_user="migrate", password_env="DB_PW")
    command = mysql_seed.seed_stream_command(seed)
    # The password: stdin's first line, kept in an unexported variable, written by the shell's own printf into an
    # option file of a private directory that mariadb-backup alone reads (first option), removed at the end: in no
    # environment (MYSQL_PWD) and on no command line.
    assert "MYSQL_PWD" not in command and "--password" not in command and "DB_PW" not in command
    assert 'mariadb-backup --defaults-extra-file="$login" --backup' in command and "private=$(mktemp -d)" in command
    assert 'rm -rf "$private"' in command and "export" not in command
    assert "--throttle" not in command and "nice -n19 ionice -c3 mariadb-backup" in command
    assert "--throttle=20" in mysql_seed.seed_stream_command(mysql_seed.SeedSpec("/a", "/b", hop, throttle=20))
    tunnel = mysql_seed.TunnelSpec("fwd", "remote", hop, 40000, "127.0.0.1", 3306)
    up = mysql_seed.tunnel_up_command(tunnel)
    # ssh keeps an option's first value: the tunnel's own control socket must come before the plan's.
    assert up.index("ControlPath=/var/lib/migrate/migrate-tunnel-fwd.ctl") < up.index(
        "ControlPath=/var/lib/migrate/ssh-%C"
    )
    assert "-R 127.0.0.1:40000:127.0.0.1:3306" in up
    probe = mysql_seed.tunnel_probe_command(40000, "repl", "REPL_PW")
    assert "${REPL_PW}" in probe and "-p" not in probe.split()


def test_the_seeds_database_password_reaches_mariadb_backup_alone(tmp_path: Path) -> None:
    """Given on the seed script's stdin, the password reaches mariadb-backup through the option file its first
    option names (a private directory's, mode 0600), read back as the client reads it (quotes and backslashes
    kept); it is in no environment (mariadb-backup's, the hop's) and on no command line, and the file is gone after."""
    password = 'seed-pw-"q\\b ' + os.urandom(6).hex()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    backup = bin_dir / "mariadb-backup"
    # Records what it was given: its environment, its first option, and that file as MariaDB's option parser reads it.
    backup.write_text(
        "#!/bin/bash\n"
        f'tr "\\0" "\\n" </proc/$$/environ > {tmp_path}/backup.env\n'
        f'file="${{1#--defaults-extra-file=}}"; echo "$file" > {tmp_path}/backup.file\n'
        f'stat -c %a "$file" > {tmp_path}/backup.mode\n'
        f'my_print_defaults --defaults-file="$file" client > {tmp_path}/backup.options\n'
        "echo data\n"
    )
    backup.chmod(0o755)
    hop = ("sh", "-c", f'tr "\\0" "\\n" </proc/$$/environ > {tmp_path}/hop.env; cat >/dev/null')
    spec = mysql_seed.SeedSpec("/a", "/b", hop, source_user="migrate", password_env="DB_PW", nice=False)
    command = mysql_seed.seed_stream_command(spec)
    assert password not in command
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", command], env=env, input=password + "\n", capture_output=True, text=True,
                          timeout=30)  # fmt: skip
    assert done.returncode == 0, done
    assert (tmp_path / "backup.options").read_text().splitlines() == [f"--password={password}"]
    assert (tmp_path / "backup.mode").read_text().strip() == "600"
    assert not Path((tmp_path / "backup.file").read_text().strip()).exists(), "the option file outlived the seed"
    for seen in ("backup.env", "hop.env"):
        assert password not in (tmp_path / seen).read_text() and "MYSQL_PWD" not in (tmp_path / seen).read_text()
