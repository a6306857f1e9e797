"""The PostgreSQL primitives (orchestrator/database/pg/primitives.py) proven on a lab made with `--engine postgresql`:
the shutdown mode's copy of the data directory, a standby seeded with pg_basebackup through the SSH tunnel under a
writer, the fence (a write by the app's role refused, a reconnecting session cannot undo it), the LSN handshake, the
promotion with proof, the old primary re-attached as a standby of the new one without pg_rewind, and every
acknowledged write on both (`lab verify` of the lab's load through the app).

The tests share one lab (module fixture, its own directory under /var/tmp: the `postgres` account that runs the
clusters must reach it) and run in file order. Figures (seed, LSN wait, promotion) are printed: run with -s.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from ruamel.yaml import YAML

from migrate_lab import hosts, load, procs, verify
from migrate_lab import postgres as pglab
from migrate_lab.state import HostState, LabState
from orchestrator.database.mysql import seed
from orchestrator.database.pg import primitives as pg
from orchestrator.database.pg.replication import PgReplication
from orchestrator.database.postgresql import PostgreSql
from orchestrator.plan.model import Plan
from orchestrator.transports.rsync import target_ssh_command
from orchestrator.transports.ssh import SshHost
from tests.pglab import postgres_lab

pytestmark = pytest.mark.lab

SLOT = "migrate_standby"
FIGURES: dict[str, float] = {}


@dataclass
class Writer:
    """The app's writer: one INSERT per commit as the app's role, reconnecting after errors, every acknowledged id
    recorded (acknowledged = the COMMIT returned)."""

    host: HostState
    state: LabState
    password: str
    prefix: str
    acked: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def run(self) -> None:
        n = 0
        conn: psycopg.Connection | None = None
        while not self.stop.is_set():
            n += 1
            rid = f"{self.prefix}-{n:06d}"
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(
                        host=self.host.address, port=self.host.db_port, user=self.state.app_user,
                        password=self.password, dbname=self.state.db_name, connect_timeout=3,
                    )  # fmt: skip
                conn.execute("INSERT INTO reviews (id, author) VALUES (%s, 'writer')", (rid,))
                conn.commit()
                self.acked.append(rid)
            except psycopg.Error as exc:
                self.failed.append(type(exc).__name__)
                with contextlib.suppress(Exception):
                    if conn is not None:
                        conn.close()
                conn = None
                time.sleep(0.02)
            time.sleep(0.005)
        if conn is not None:
            conn.close()

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def halt(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=30)


@dataclass
class PgPair:
    lab: LabState
    source_ssh: SshHost
    target_ssh: SshHost
    tunnel: seed.TunnelSpec
    secrets: dict[str, str]
    writer: Writer
    load_stop: threading.Event = field(default_factory=threading.Event)
    load_thread: threading.Thread | None = None
    fence: pg.FenceState | None = None
    final: pg.Lsn | None = None
    back: seed.TunnelSpec | None = None

    def connect(self, host: HostState, user: str | None = None, dbname: str | None = None) -> psycopg.Connection:
        user = user or self.lab.migrate_user
        password = self.secrets[self.lab.app_password_env if user == self.lab.app_user else self.lab.db_password_env]
        return pg.connect(pg.Endpoint(host.address, host.db_port, user, dbname or self.lab.db_name), password)


def load_plan(path: Path) -> Plan:
    return Plan.model_validate(YAML(typ="safe").load(path.read_text()))


@pytest.fixture(scope="module")
def pair() -> Iterator[PgPair]:
    started = time.monotonic()
    with postgres_lab("migrate-pg-lab-", db_size_mb=2) as lab:
        FIGURES["lab up"] = time.monotonic() - started
        yield from _pair_on(lab)


def _pair_on(lab: LabState) -> Iterator[PgPair]:
    plan = load_plan(lab.plan_file)
    source_ssh = SshHost(plan.source, name="source", base_dir=lab.path, retry=plan.retry)
    target_ssh = SshHost(plan.target, name="target", base_dir=lab.path, retry=plan.retry)
    hop = (*shlex.split(target_ssh_command(plan, control="no")), f"{plan.target.user}@{plan.target.address}")
    port = procs.free_port(["127.0.0.1"])
    tunnel = seed.TunnelSpec(
        f"pg-{port}", "remote", hop, port, lab.source.address, lab.source.db_port, control_dir=str(lab.source.run_dir)
    )
    secrets = lab.secrets()
    writer = Writer(lab.source, lab, secrets[lab.app_password_env], f"w{port}")
    p = PgPair(lab, source_ssh, target_ssh, tunnel, secrets, writer)
    try:
        yield p
    finally:
        writer.halt()
        p.load_stop.set()
        if p.load_thread is not None:
            p.load_thread.join(timeout=60)
        for spec in (tunnel, p.back):
            if spec is not None:
                with contextlib.suppress(Exception):
                    source_ssh.run(seed.tunnel_down_command(spec), timeout=30)
        source_ssh.close()
        target_ssh.close()
        print("\nPostgreSQL lab figures: " + ", ".join(f"{k} {v:.3f} s" for k, v in FIGURES.items()))


def test_preflight_facts_of_the_lab_source(pair: PgPair) -> None:
    with pair.connect(pair.lab.source, dbname="postgres") as conn:
        facts = pg.server_facts(conn, pair.lab.repl_user)
    assert facts.problems(other_major=facts.major) == []
    assert facts.wal_level == "replica" and facts.data_checksums and facts.rewind_possible
    assert facts.problems(other_major=facts.major + 1)[-1].startswith("major versions differ")
    majors = pg.parse_majors(pair.target_ssh.run(pg.installed_majors().command).stdout)
    assert facts.major in majors
    # What preflight and the estimate ask the engine, read only: the app's role is one the fence stops (a superuser
    # or a replication role would escape it), the comparison's cost on the largest table, the database's size.
    rep = PgReplication()
    with pair.connect(pair.lab.source) as conn:
        assert rep.writer_problems(conn, [pair.lab.app_user]) == []
        escaping = rep.writer_problems(conn, [pair.lab.migrate_user, pair.lab.repl_user, "no_such_role"])
        assert (
            f"{pair.lab.migrate_user} (SUPERUSER)" in escaping[0]
            and f"{pair.lab.repl_user} (REPLICATION)" in escaping[0]
        )
        assert "no_such_role" in escaping[1] and len(escaping) == 2
        seconds, chunks = rep.compare_cost(conn, [("public", "reviews"), ("public", "uploads")], 2000)
        assert seconds > 0 and chunks >= 2
        size = PostgreSql().data_bytes(conn)
        assert size is not None and size > 1_000_000


def rsync_datadir(pair: PgPair, *, checksum: bool) -> None:
    """The source's data directory pushed to the target's from the source, over its SSH hop to the target."""
    source, target = pglab.cluster(pair.lab.source), pglab.cluster(pair.lab.target)
    ssh_argv, login = pair.tunnel.ssh_to_target[:-1], pair.tunnel.ssh_to_target[-1]
    argv = ["rsync", "-a", "--delete", *(f"--exclude={e}" for e in pg.DATADIR_EXCLUDES), "-e", shlex.join(ssh_argv)]
    argv += ["--checksum"] if checksum else []
    argv += [source.data_dir + "/", f"{login}:{target.data_dir}/"]
    pair.source_ssh.run(shlex.join(argv), timeout=600)


def test_shutdown_mode_copy_of_the_data_directory(pair: PgPair) -> None:
    """The shutdown mode's database part: a live pre-sync, then in the window the fence, a clean stop and the
    final pass of a data directory nothing writes to; the copy starts on the target with every acknowledged write.
    Then rolled back (the target's copy removed, the source started and opened) for the tests after it."""
    lab = pair.lab
    source, target = pglab.cluster(lab.source), pglab.cluster(lab.target)
    pair.writer.start()
    while len(pair.writer.acked) < 20:
        time.sleep(0.01)
    rsync_datadir(pair, checksum=False)  # live: inconsistent, and that is fine
    with pair.connect(lab.source, dbname="postgres") as admin:
        pg.checkpoint(admin)
        saved = pg.fence(admin, [lab.app_user])
    acked = list(pair.writer.acked)
    started = time.monotonic()
    pair.source_ssh.run(pg.pg_ctl_command(source, "stop"), timeout=120)
    assert pg.parse_controldata(pair.source_ssh.run(pg.controldata_command(source)).stdout).clean
    rsync_datadir(pair, checksum=True)
    pair.target_ssh.run(pg.pg_ctl_command(target, "start"), timeout=120)
    FIGURES["shutdown-mode stop + final pass + start"] = time.monotonic() - started
    try:
        with pair.connect(lab.target) as copy:
            assert not pg.in_recovery(copy)
            rows = copy.execute("SELECT id FROM reviews WHERE id LIKE %s", (f"{pair.writer.prefix}-%",)).fetchall()
            assert [a for a in acked if a not in {r[0] for r in rows}] == []
    finally:
        pair.target_ssh.run(pg.pg_ctl_command(target, "stop"), timeout=120)
        pglab.remove_cluster(lab.target)
        pair.source_ssh.run(pg.pg_ctl_command(source, "start"), timeout=120)
        with pair.connect(lab.source, dbname="postgres") as admin:
            pg.lift_fence(admin, saved)


def test_seed_a_standby_through_the_tunnel_under_a_writer(pair: PgPair) -> None:
    lab, target = pair.lab, pglab.cluster(pair.lab.target)
    if pair.writer.thread is None:
        pair.writer.start()
    # The lab's own load too: clients that find the app through DNS and write through it (the app on psycopg).
    pair.load_thread = threading.Thread(
        target=load.main_load,
        kwargs=dict(
            state=lab, duration=600, rate=20, clients=2, dns_ttl=1, upload_every=0, out=None, stop=pair.load_stop
        ),
        daemon=True,
    )
    pair.load_thread.start()
    while len(pair.writer.acked) < 20:
        time.sleep(0.01)
    pair.source_ssh.run(seed.tunnel_up_command(pair.tunnel), timeout=60)
    with pair.connect(lab.source, dbname="postgres") as conn:
        pg.create_slot(conn, SLOT)
    line = pg.passfile_line("127.0.0.1", lab.repl_user, pair.secrets[lab.repl_password_env])
    pair.target_ssh.run(pg.passfile_command(target), input=line)
    spec = pg.SeedSpec(target, "127.0.0.1", pair.tunnel.listen_port, lab.repl_user, SLOT)
    started = time.monotonic()
    pair.target_ssh.run(pg.seed_command(spec), timeout=600)
    FIGURES["seed"] = time.monotonic() - started
    auto_conf = Path(target.data_dir, "postgresql.auto.conf").read_text()
    assert "passfile=" in auto_conf and pair.secrets[lab.repl_password_env] not in auto_conf
    pair.target_ssh.run(pg.pg_ctl_command(target, "start"), timeout=120)
    with pair.connect(lab.target) as standby, pair.connect(lab.source, dbname="postgres") as primary:
        assert pg.in_recovery(standby)
        deadline = time.monotonic() + 30
        while not primary.execute("SELECT 1 FROM pg_stat_replication WHERE state = 'streaming'").fetchone():
            assert time.monotonic() < deadline, "the standby never streamed"
            time.sleep(0.05)
        assert pg.wait_for_replay(standby, pg.current_wal_lsn(primary), 30).reached
        # The wait and the read in one round trip (verify_target's, beside the promotion): a position replayed, one
        # the standby never reaches within the wait, and a primary, which replays nothing and is read as written.
        now = pg.current_wal_lsn(primary)
        reached = pg.position_after(standby, now, 30)
        assert reached.recovering and reached.replayed is not None and reached.replayed >= now
        beyond = pg.Lsn(now.value + (1 << 32))
        short = pg.position_after(standby, beyond, 0.2)
        assert short.recovering and short.replayed is not None and short.replayed < beyond
        written = pg.position_after(primary, beyond, 30)
        assert not written.recovering and written.replayed is None
        assert written.written is not None and written.written >= now


def test_a_read_only_default_is_no_fence(pair: PgPair) -> None:
    """Why the fence is not `default_transaction_read_only`: a session of the role sets it back and writes."""
    lab = pair.lab
    with pair.connect(lab.source, dbname="postgres") as admin:
        admin.execute(f"ALTER ROLE {lab.app_user} SET default_transaction_read_only = on")
        try:
            with pair.connect(lab.source, lab.app_user) as app:
                with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                    app.execute("INSERT INTO reviews (id) VALUES ('read-only-default-1')")
                app.execute("SET default_transaction_read_only = off")
                app.execute("INSERT INTO reviews (id) VALUES ('read-only-default-2')")  # written all the same
                assert app.execute("SELECT 1 FROM reviews WHERE id = 'read-only-default-2'").fetchone()
        finally:
            admin.execute(f"ALTER ROLE {lab.app_user} RESET default_transaction_read_only")


def test_the_fence_holds_against_the_app_role(pair: PgPair) -> None:
    lab = pair.lab
    before = len(pair.writer.acked)
    while len(pair.writer.acked) < before + 20:
        time.sleep(0.01)
    app_session = pair.connect(lab.source, lab.app_user)
    with pair.connect(lab.source, dbname="postgres") as admin:
        admin.execute("CHECKPOINT")  # the shutdown checkpoint in the window is then short
        started = time.monotonic()
        pair.fence = pg.fence(admin, [lab.app_user])
        pair.final = pg.current_wal_lsn(admin)
        FIGURES["fence"] = time.monotonic() - started
        assert pg.fenced_roles(admin, [lab.app_user]) == [lab.app_user]
    assert pair.fence.sessions_ended >= 1  # the writer's and ours
    # The open session was ended: its next statement fails.
    with pytest.raises(psycopg.OperationalError):
        app_session.execute("INSERT INTO reviews (id) VALUES ('after-fence-open')")
    # A new session cannot even start, so it cannot SET its way back to writing.
    with pytest.raises(pg.PostgresError, match="not permitted to log in"):
        pair.connect(lab.source, lab.app_user)
    acked_at_fence = len(pair.writer.acked)
    time.sleep(0.3)
    assert len(pair.writer.acked) == acked_at_fence  # the writer keeps trying and is refused


def test_lsn_handshake_and_promotion_with_proof(pair: PgPair) -> None:
    lab = pair.lab
    assert pair.final is not None
    source, target = pglab.cluster(lab.source), pglab.cluster(lab.target)
    with pair.connect(lab.target) as standby:
        waited = pg.wait_for_replay(standby, pair.final, 30)
        assert waited.reached
        FIGURES["lsn wait"] = waited.seconds
        # The source stopped cleanly (the replicate switch's fast shutdown, through the host's `sh`): its walsender
        # streams the shutdown checkpoint before it exits.
        started = time.monotonic()
        pair.source_ssh.run(pg.fast_shutdown_command(source, 60), timeout=120)
        FIGURES["source stop"] = time.monotonic() - started
        old = pg.parse_controldata(pair.source_ssh.run(pg.controldata_command(source)).stdout)
        assert old.clean and old.checkpoint >= pair.final
        promotion = pg.promote(standby, pg.Lsn(old.checkpoint.value + 1), wait=30)
        FIGURES["promote"] = promotion.seconds
        FIGURES["checkpoint wait"] = promotion.waited
        assert promotion.replayed >= pg.Lsn(old.checkpoint.value + 1)
        assert promotion.timeline_after == promotion.timeline_before + 1
        assert not pg.in_recovery(standby)
        # The fence came along with the WAL: lifted on the new primary, the app writes there.
        assert pg.fenced_roles(standby, [lab.app_user]) == [lab.app_user]
        assert pair.fence is not None
        pg.lift_fence(standby, pair.fence)
    with pair.connect(lab.target, lab.app_user) as app:
        app.execute("INSERT INTO reviews (id, author) VALUES ('on-new-primary', 'after the switch')")
    history = pg.parse_history(pair.target_ssh.run(pg.history_command(target, promotion.timeline_after)).stdout)
    check = pg.follow_check(old, history)
    assert check.ok, check.reason


def test_old_primary_follows_the_new_one_and_nothing_acknowledged_is_lost(pair: PgPair) -> None:
    lab = pair.lab
    source = pglab.cluster(lab.source)
    pair.writer.halt()
    pair.load_stop.set()
    assert pair.load_thread is not None
    pair.load_thread.join(timeout=60)
    port = procs.free_port(["127.0.0.1"])
    pair.back = seed.TunnelSpec(
        f"pg-back-{port}", "local", pair.tunnel.ssh_to_target, port, lab.target.address, lab.target.db_port,
        control_dir=str(lab.source.run_dir),
    )  # fmt: skip
    pair.source_ssh.run(seed.tunnel_up_command(pair.back), timeout=60)
    line = pg.passfile_line("127.0.0.1", lab.repl_user, pair.secrets[lab.repl_password_env])
    pair.source_ssh.run(pg.passfile_command(source), input=line)
    with pair.connect(lab.target, dbname="postgres") as new_primary:
        pg.create_slot(new_primary, "migrate_old_primary")
    conninfo = pg.primary_conninfo("127.0.0.1", port, lab.repl_user, source.passfile, "migrate_old_primary")
    pair.source_ssh.run(pg.follow_command(source, conninfo, "migrate_old_primary"), timeout=120)
    with pair.connect(lab.target) as new_primary, pair.connect(lab.source) as old_primary:
        assert pg.in_recovery(old_primary)
        assert pg.wait_for_replay(old_primary, pg.current_wal_lsn(new_primary), 30).reached
        assert pg.timeline(old_primary) == pg.timeline(new_primary)
        acked = pair.writer.acked
        assert len(acked) > 40
        for conn in (new_primary, old_primary):
            rows = conn.execute("SELECT id FROM reviews WHERE id LIKE %s", (f"{pair.writer.prefix}-%",)).fetchall()
            present = {r[0] for r in rows}
            assert [a for a in acked if a not in present] == []
            assert conn.execute("SELECT 1 FROM reviews WHERE id = 'on-new-primary'").fetchone()
    # `lab verify` (the app's acknowledged reviews, read back through psycopg as the app) on both hosts.
    for host in ("target", "source"):
        report = verify.main_verify(lab, host=host, trees=False)
        assert report.error is None and report.reviews_acknowledged > 10 and report.reviews_lost == 0, report


def test_the_hosts_db_scripts_stop_and_start_a_cluster(pair: PgPair) -> None:
    target = pair.lab.target
    hosts.run_script(target, "db-stop")
    assert pglab.pid(target) is None
    hosts.run_script(target, "db-stop")  # nothing running: nothing to do
    hosts.run_script(target, "db-start")
    assert pglab.pid(target) is not None
    with pair.connect(target) as conn:
        assert not pg.in_recovery(conn)
