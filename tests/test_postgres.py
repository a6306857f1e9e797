"""The PostgreSQL transport's parsers and commands, offline (the lab proves them on real clusters:
tests/test_postgres_lab.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from migrate_lab import hosts
from orchestrator.database.pg import primitives as pg

CONTROLDATA = """pg_control version number:            1300
Catalog version number:               202209061
Database system identifier:           7441612365483851234
Database cluster state:               shut down
pg_control last modified:             Fri 27 Nov 2026 04:50:01 AM UTC
Latest checkpoint location:           0/3000028
Latest checkpoint's REDO location:    0/3000028
Latest checkpoint's REDO WAL file:    000000010000000000000003
Latest checkpoint's TimeLineID:       1
Latest checkpoint's PrevTimeLineID:   1
wal_log_hints setting:                off
Data page checksum version:           1
"""


def test_lsn_parses_orders_and_prints_as_postgres_does() -> None:
    a, b = pg.Lsn.parse("0/3000148"), pg.Lsn.parse("16/B374D848")
    assert a < b and str(b) == "16/B374D848" and str(a) == "0/3000148"
    assert pg.Lsn.parse("1/0").minus(pg.Lsn.parse("0/FFFFFFFF")) == 1
    with pytest.raises(pg.PostgresError, match="not a WAL position"):
        pg.Lsn.parse("3000148")


def test_controldata_of_a_clean_shutdown() -> None:
    data = pg.parse_controldata(CONTROLDATA)
    assert data.clean and data.timeline == 1 and data.checkpoint == pg.Lsn.parse("0/3000028")
    assert data.data_checksums and not data.wal_log_hints
    running = pg.parse_controldata(CONTROLDATA.replace("shut down", "in production"))
    assert not running.clean
    with pytest.raises(pg.PostgresError, match="Latest checkpoint location"):
        pg.parse_controldata("Database cluster state: shut down\n")


def test_follow_without_rewind_only_when_the_old_primary_stopped_before_the_switch_point() -> None:
    old = pg.parse_controldata(CONTROLDATA)
    history = pg.parse_history("1\t0/30000A0\tno recovery target specified\n")
    assert history == {1: pg.Lsn.parse("0/30000A0")}
    assert pg.follow_check(old, history).ok
    late = pg.parse_history("1\t0/3000028\tno recovery target specified\n")
    assert "pg_rewind" in pg.follow_check(old, late).reason
    dirty = pg.parse_controldata(CONTROLDATA.replace("shut down", "in production"))
    assert not pg.follow_check(dirty, history).ok
    assert not pg.follow_check(old, {}).ok


def test_seed_runs_as_the_owner_with_a_passfile_and_refuses_a_used_data_directory() -> None:
    cluster = pg.Cluster("/srv/pg data/main", 5433)
    spec = pg.SeedSpec(cluster, "127.0.0.1", 40123, "repl", "migrate_standby", max_rate="32M")
    command = pg.seed_command(spec)
    assert "runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_basebackup" in command
    assert "-X stream -S migrate_standby -R" in command and "-r 32M" in command
    words = shlex.split(command)
    conninfo = words[words.index("-d") + 1]
    assert "passfile='/srv/pg data/main.pgpass'" in conninfo and "port='40123'" in conninfo
    assert "PG_VERSION" in command and "exit 3" in command
    # The password never goes on a command line: it goes on stdin into a 0600 file.
    assert pg.passfile_line("127.0.0.1", "repl", "s3:cr\\et") == "127.0.0.1:*:*:repl:s3\\:cr\\\\et\n"
    assert "umask 077" in pg.passfile_command(cluster)


def test_follow_command_appends_standby_settings_and_starts() -> None:
    cluster = pg.Cluster("/d", 5432, log_file="/l/pg.log", options=("-c", "listen_addresses=127.0.0.2"))
    conninfo = pg.primary_conninfo("127.0.0.1", 4000, "repl", "/d.pgpass", "old_primary")
    command = pg.follow_command(cluster, conninfo, "slot_o'k")
    words = shlex.split(command)
    settings = next(w for w in words if w.startswith("primary_conninfo"))
    assert "recovery_target_timeline = 'latest'" in settings and "primary_slot_name = 'slot_o''k'" in settings
    assert "passfile=''/d.pgpass''" in settings  # the conninfo's quotes doubled inside the setting's
    assert "touch /d/standby.signal" in command
    assert words[-1] == "start" and "-p 5432 -c listen_addresses=127.0.0.2" in words


def test_facts_name_every_problem_in_one_line() -> None:
    facts = pg.ServerFacts(15, "minimal", 0, 0, False, False, False, "/d")
    problems = facts.problems(other_major=16)
    assert len(problems) == 5 and all("\n" not in p for p in problems)
    assert not facts.rewind_possible
    good = pg.ServerFacts(15, "replica", 10, 10, True, False, True, "/d")
    assert good.problems(other_major=15) == [] and good.rewind_possible
    assert pg.parse_majors("15\n16\nmain\n") == [15, 16]


def test_lab_up_refuses_an_unknown_engine_and_wordpress_on_postgres(tmp_path: Path) -> None:
    with pytest.raises(hosts.LabRefused, match="--engine must be one of mariadb, postgresql"):
        hosts.up(tmp_path / "lab", engine="oracle")
    with pytest.raises(hosts.LabRefused, match="WordPress runs on MariaDB only"):
        hosts.up(tmp_path / "lab", engine="postgresql", app="wordpress")
    assert not (tmp_path / "lab").exists()


def _pid_file_of(data: Path, pid: int) -> Path:
    data.mkdir(exist_ok=True)
    pidfile = data / "postmaster.pid"
    pidfile.write_text(f"{pid}\n{data}\n")
    return pidfile


def test_the_fast_shutdown_signals_a_postmaster_and_waits_until_its_pid_file_is_gone(tmp_path: Path) -> None:
    """A stand-in postmaster (a shell whose executable is named `postgres`, as the server's is) removes its
    postmaster.pid on SIGINT and exits, as a fast shutdown ends: the command (run by `sh`, as on a host) returns
    once it is gone."""
    import subprocess

    postgres = tmp_path / "postgres"
    postgres.symlink_to("/bin/bash")
    data = tmp_path / "data"
    pidfile = data / "postmaster.pid"
    server = subprocess.Popen(
        [str(postgres), "-c", f'trap "rm -f {pidfile}; exit 0" INT; while :; do sleep 0.01; done']
    )
    try:
        _pid_file_of(data, server.pid)
        done = subprocess.run(["sh", "-c", pg.fast_shutdown_command(pg.Cluster(str(data), 0), 20)],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert not pidfile.exists()
        assert server.wait(timeout=10) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_the_fast_shutdown_leaves_alone_a_stale_pid_files_process_and_bounds_its_wait(tmp_path: Path) -> None:
    import subprocess

    data = tmp_path / "data"
    other = subprocess.Popen(["sleep", "60"])
    try:
        _pid_file_of(data, other.pid)  # a stale file naming a pid another program has now
        done = subprocess.run(["sh", "-c", pg.fast_shutdown_command(pg.Cluster(str(data), 0), 20)],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert other.poll() is None  # not signalled
    finally:
        other.kill()
        other.wait()
    postgres = tmp_path / "postgres"
    postgres.symlink_to("/bin/bash")  # comm is the link's name: a postmaster that ignores the signal
    deaf = subprocess.Popen([str(postgres), "-c", 'trap "" INT; while :; do sleep 0.01; done'])
    try:
        _pid_file_of(data, deaf.pid)
        done = subprocess.run(["sh", "-c", pg.fast_shutdown_command(pg.Cluster(str(data), 0), 1)],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert done.returncode == 3 and "still shuts down after 1 s" in done.stderr, done
    finally:
        deaf.kill()
        deaf.wait()
