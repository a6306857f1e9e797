"""PostgreSQL's replicate mode behind the seam, offline: the seed's install and its undo run by bash on directories
(every state a crash can leave), the parsers of what pg_basebackup prints and leaves, the preflight's judgement of
the servers' facts, the plan's acceptance (the lab proves the rest: tests/test_postgres_replicate.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.database.engines import open_engine
from orchestrator.database.names import replicate_refusal
from orchestrator.database.pg import primitives as pg
from orchestrator.database.pg.replication import PgReplication, slot_name
from orchestrator.database.pg.seed import PgSeed, PgSeedSpec
from orchestrator.database.protocol import Replication, ReplicationError

SEED = PgSeed()


def spec(datadir: Path) -> PgSeedSpec:
    return PgSeedSpec("/src/data", str(datadir), ("ssh", "root@127.0.0.3"), "127.0.0.2", 5432, "repl", "migrate_x")


def bash(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)


def cluster(path: Path, mark: str) -> None:
    path.mkdir()
    (path / "PG_VERSION").write_text("15\n")
    (path / "mark").write_text(mark)


def test_the_install_swaps_the_copy_in_and_its_undo_puts_the_previous_directory_back(tmp_path: Path) -> None:
    data = tmp_path / "data"
    s = spec(data)
    cluster(data, "before")
    cluster(Path(s.staging_dir), "copy")
    assert bash(SEED.install_command(s)).returncode == 0
    assert (data / "mark").read_text() == "copy" and (Path(s.previous_dir) / "mark").read_text() == "before"
    assert bash(SEED.install_command(s)).returncode == 0  # again (a resume): nothing moves
    assert (data / "mark").read_text() == "copy"
    assert bash(SEED.restore_previous_command(s)).returncode == 0
    assert (data / "mark").read_text() == "before" and not Path(s.previous_dir).exists()


def test_a_crash_inside_the_install_is_finished_or_undone_without_losing_the_previous_directory(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    s = spec(data)
    # Killed between its two renames: the previous directory aside, the copy still staged.
    cluster(Path(s.previous_dir), "before")
    cluster(Path(s.staging_dir), "copy")
    assert bash(SEED.restore_previous_command(s)).returncode == 0
    assert (data / "mark").read_text() == "before" and Path(s.staging_dir).exists()
    # The same state finished instead (a resume): the copy in, the previous directory kept beside it.
    (data / "mark").write_text("before")
    bash(f"mv {data} {s.previous_dir}")
    assert bash(SEED.finish_install_command(s)).returncode == 0
    assert (data / "mark").read_text() == "copy" and (Path(s.previous_dir) / "mark").read_text() == "before"


def test_a_target_without_a_cluster_gets_the_copy_and_loses_it_again_on_undo(tmp_path: Path) -> None:
    data = tmp_path / "data"
    s = spec(data)
    cluster(Path(s.staging_dir), "copy")
    assert bash(SEED.install_command(s)).returncode == 0
    assert (data / "mark").read_text() == "copy" and not Path(s.previous_dir).exists()
    assert bash(SEED.restore_previous_command(s)).returncode == 0
    assert not data.exists()
    nothing = bash(SEED.install_command(s))  # nothing staged, nothing installed: said, not taken for done
    assert nothing.returncode != 0 and "no copy installed" in nothing.stderr


def test_the_seeds_position_progress_and_locks_as_pg_basebackup_leaves_them() -> None:
    label = "START WAL LOCATION: 0/2000028 (file 000000010000000000000002)\nCHECKPOINT LOCATION: 0/2000060\n"
    position = SEED.parse_backup_position(label)
    assert position.gtid == pg.Lsn.parse("0/2000028") and position.file == "000000010000000000000002"
    with pytest.raises(ReplicationError, match="no backup_label"):
        SEED.parse_backup_position("")
    assert SEED.parse_seed_progress("  2048/31245 kB (6%), 0/1 tablespace") == 2048 * 1024
    assert SEED.parse_seed_progress("pg_basebackup: checkpoint completed") is None
    assert SEED.parse_backup_locks("").commits_blocked == 0.0 and SEED.parse_backup_stages("") == []


def test_the_seed_command_carries_no_password_and_names_the_password_file(tmp_path: Path) -> None:
    command = SEED.seed_stream_command(spec(tmp_path / "data"))
    assert "pg_basebackup" in command and "-X stream -C -S migrate_x -R" in command
    assert "ExitOnForwardFailure=yes" in command and "127.0.0.1:$port:127.0.0.2:5432" in command
    remote = SEED._remote(spec(tmp_path / "data"))  # the target's part, quoted twice inside the command
    assert f"passfile='{tmp_path}/data.pgpass'" in remote and "password=" not in command + remote
    assert SEED.secret == "replication"


FACTS = {
    "major": "15", "wal_level": "replica", "max_wal_senders": "10", "max_replication_slots": "10",
    "data_checksums": "on", "wal_log_hints": "on", "data_directory": "/d", "hba_replication_roles": "repl",
}  # fmt: skip


def plan(user: str = "repl") -> SimpleNamespace:
    return SimpleNamespace(replication=SimpleNamespace(user=user))


def test_the_preflight_names_each_missing_fact_and_accepts_a_ready_pair() -> None:
    rep = PgReplication()
    assert rep.problems(plan(), FACTS, {**FACTS}, {}) == []
    assert rep.problems(plan(), FACTS, None, {}) == []  # a target with no cluster yet: the seed makes it
    found = rep.problems(plan("other"), {**FACTS, "wal_level": "minimal", "max_wal_senders": "0"}, {**FACTS,
                         "major": "16"}, {})  # fmt: skip
    assert any("wal_level is minimal" in p for p in found), found
    assert any("max_wal_senders is 0" in p for p in found), found
    assert any("pg_hba.conf lets no replication connection in" in p for p in found), found
    assert any("major versions differ" in p for p in found), found
    assert rep.problems(SimpleNamespace(replication=None), None, None, {})[:2] == [
        "the plan has no replication section (user, password)",
        "the source database did not answer",
    ]
    assert rep.pair_problems(FACTS, {**FACTS, "major": "14"}) != [] and rep.pair_problems(FACTS, FACTS) == []


def test_both_engines_hand_out_their_replication_and_positions_round_trip_through_the_journal() -> None:
    for name in ("mariadb", "postgresql"):
        rep = open_engine(name).replication()
        assert isinstance(rep, Replication) and replicate_refusal(name) is None
        assert rep.source_stops is (name == "postgresql")
    assert replicate_refusal("mysql") is not None
    rep = PgReplication()
    final = rep.parse_position("0/3000029")
    assert rep.parse_position(str(final)) == final
    assert rep.same_position(final, pg.Lsn.parse("0/30000A0")) and not rep.same_position(
        final, pg.Lsn.parse("0/3000028")
    )
    assert not rep.same_position(final, rep.parse_position(""))
    assert slot_name("Course-Review lab") == "migrate_course_review_lab"


def test_the_dry_run_of_a_postgresql_replicate_plan_says_what_postgresql_does(tmp_path: Path) -> None:
    from migrate_lab import hosts, planfile
    from migrate_lab import postgres as pglab
    from orchestrator.run.commands import describe

    state = hosts.new_state(tmp_path, hosts.SOURCE_ADDRESS, hosts.TARGET_ADDRESS, default_ports=False)
    state.engine = pglab.ENGINE
    state.cf_port = 8443
    state.save()
    path = planfile.write_plan(state, "replicate")
    described = describe(path, estimate=False)
    lines = {step.name: " ".join(step.lines) for step in described.steps}
    assert "pg_basebackup -X stream -C -S migrate_" in lines["repl_seed"], lines["repl_seed"]
    assert "primary_conninfo" in lines["repl_replica"] and "chunks of 2000 rows" in lines["repl_catchup"]
    assert "a fast shutdown of the database" in lines["repl_switch"] and "pg_promote" in lines["repl_switch"]
    said = " ".join(lines.values())
    assert "mariadb-backup" not in said and "MASTER_GTID_WAIT" not in said and "CHANGE MASTER" not in said
    assert "GTID" not in said and "RESET SLAVE" not in said and "pg_controldata" in lines["finish"]
