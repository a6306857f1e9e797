"""The replicate mode without a lab: its plan section, which servers allow it, the mode a run resolves to and keeps
(from its journal), and the reverse plan. The mode itself is proven on the lab in test_replicate_e2e.py."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator import exit_codes
from orchestrator.cli.commands import main
from orchestrator.database.mysql import gtid, replica, seed
from orchestrator.engine.journal import Journal
from orchestrator.plan.loader import PlanError, load_plan
from orchestrator.run import compose
from orchestrator.run.commands import describe
from orchestrator.steps import build_steps
from orchestrator.steps.repl_common import (
    REVERSE_KEPT,
    TORN_DOWN,
    mode_reason,
    replica_problem,
    replication_problems,
    reverse_kept_until,
)
from tests.test_plan import SMALL_PLAN, write

REPLICATION = """replication:
  user: repl
  password: {env: SHOP_REPL_PASSWORD}
  max_lag: 0.5
  app_users: [shop]
"""
GOOD = {
    "log_bin": "ON",
    "server_id": "1",
    "log_slave_updates": "ON",
    "binlog_format": "ROW",
    "gtid_strict_mode": "ON",
    "read_only": "OFF",
}
PROGRAMS = {"mariadb-backup on the source": True, "mbstream on the target": True}


def plan_with(tmp_path: Path, mode: str, replication: str = REPLICATION) -> Path:
    text = SMALL_PLAN.replace("  max_write_block: 60\n", f"  max_write_block: 60\n  mode: {mode}\n") + replication
    return write(tmp_path, text)


def test_the_replicate_mode_needs_its_section_and_says_where(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as caught:
        load_plan(plan_with(tmp_path, "replicate", replication=""))
    assert caught.value.lines == [f"{tmp_path / 'plan.yaml'}:26:3: cutover.mode: 'replicate' needs a replication "
                                  "section (user, password)"]  # fmt: skip
    loaded = load_plan(plan_with(tmp_path, "replicate")).plan
    assert loaded.replication is not None and loaded.replication.max_lag == 0.5
    names = [s.name for s in build_steps(loaded)]
    start = names.index("repl_seed")
    assert names[start - 1] == "files_presync"
    assert names[start : start + 4] == ["repl_seed", "repl_replica", "repl_catchup", "repl_switch"]


def test_the_replication_section_refuses_a_password_value_and_bad_numbers(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as caught:
        load_plan(plan_with(tmp_path, "auto", REPLICATION.replace("{env: SHOP_REPL_PASSWORD}", "hunter2")))
    assert "hunter2" not in " ".join(caught.value.lines) and "replication.password" in caught.value.lines[0]
    with pytest.raises(PlanError) as caught:
        load_plan(plan_with(tmp_path, "auto", REPLICATION.replace("max_lag: 0.5", "max_lag: 0")))
    assert "replication.max_lag" in caught.value.lines[0]


def test_which_servers_allow_replication() -> None:
    from orchestrator.plan.model import Plan

    plan = Plan.model_validate(
        {
            "name": "p", "source": {"address": "10.0.0.1"}, "target": {"address": "10.0.0.2"},
            "database": {
                "source": {"datadir": "/var/lib/mysql", "start": "a", "stop": "b"},
                "target": {"datadir": "/var/lib/mysql", "start": "a", "stop": "b"},
            },
            "dns": {"api_token": {"env": "T"}, "zone": "example.com", "records": ["example.com"]},
            "replication": {"user": "repl", "password": {"env": "R"}},
        }
    )  # fmt: skip
    assert replication_problems(plan, GOOD, {**GOOD, "server_id": "2"}, PROGRAMS) == []
    assert replication_problems(plan, GOOD, None, PROGRAMS) == []  # a stopped target is checked when it starts
    found = replication_problems(
        plan, {**GOOD, "log_bin": "OFF", "binlog_format": "MIXED"}, {**GOOD, "gtid_strict_mode": "OFF"},
        {**PROGRAMS, "mbstream on the target": False},
    )  # fmt: skip
    assert found == [
        "mbstream on the target is not installed",
        "the source's binary log is off (log_bin needs a restart)",
        "the source's binlog_format is MIXED, not ROW",
        "the target runs without gtid_strict_mode",
        "source and target share server_id 1",
    ]
    assert replication_problems(plan, None, None, PROGRAMS) == ["the source database did not answer"]
    reason = mode_reason("shutdown", found[:1], "auto")
    assert reason.startswith("shutdown (chosen by 'auto')") and "mbstream" in reason and "\n" not in reason
    assert mode_reason("replicate", [], "auto").startswith("replicate (chosen by 'auto')")


def journal_of(tmp_path: Path, steps: list[str], status_events: list[str]) -> Path:
    path = tmp_path / "journal.jsonl"
    events = [{"seq": 1, "ts": 1.0, "event": "run_started", "run_id": "r1", "plan_path": "p", "plan_name": "shop",
               "plan_sha256": "h", "plan_text": "", "steps": steps, "dry_run": False}]  # fmt: skip
    events += [{"seq": i + 2, "ts": 2.0 + i, "event": name} for i, name in enumerate(status_events)]
    path.write_text("".join(json.dumps(ev) + "\n" for ev in events))
    return path


def test_a_run_keeps_the_mode_it_began_with(tmp_path: Path) -> None:
    path = plan_with(tmp_path, "auto")
    plan = load_plan(path).plan
    # A run in flight: its journaled step list decides, whatever the servers look like now (no probe is made).
    replicating = journal_of(tmp_path, ["preflight", "repl_seed", "repl_switch", "finish"], [])
    assert compose.resolve_mode(plan, path, replicating, probe=False).cutover.mode == "replicate"
    shutting = journal_of(tmp_path, ["preflight", "db_presync", "cutover", "finish"], [])
    assert compose.resolve_mode(plan, path, shutting, probe=False).cutover.mode == "shutdown"
    # No run (or a rolled-back one) and no probe: still auto (a dry-run shows the replicate steps).
    assert compose.resolve_mode(plan, path, tmp_path / "none.jsonl", probe=False).cutover.mode == "auto"
    rolled_back = journal_of(tmp_path, ["preflight", "cutover"], ["rollback_started", "rollback_completed"])
    assert compose.resolve_mode(plan, path, rolled_back, probe=False).cutover.mode == "auto"
    # A declared mode is never changed.
    fixed = load_plan(plan_with(tmp_path, "shutdown")).plan
    assert compose.resolve_mode(fixed, path, replicating, probe=False).cutover.mode == "shutdown"


def test_the_reverse_plan_swaps_the_replication_endpoints_and_goes_back_over_the_reverse_replica(
    tmp_path: Path,
) -> None:
    section = REPLICATION + "  source: {host: 10.1.0.1, port: 3306}\n  target: {host: 10.2.0.2, port: 3307}\n"
    fences = "  target_fence: {enable: touch /srv/m, disable: rm -f /srv/m}\n"
    text = plan_with(tmp_path, "replicate", section).read_text().replace("services:\n", "services:\n" + fences)
    path = write(tmp_path, text)
    plan = load_plan(path).plan
    back = plan.reversed()
    assert back.cutover.mode == "replicate" and back.reverse_of == plan.name and plan.reverse_of is None
    # Its steps: nothing stopped, seeded or set up on the old source (its replica exists); the switch swapped.
    names = [step.name for step in build_steps(back)]
    assert "prepare_target" not in names and "repl_seed" not in names and "repl_replica" not in names
    assert names.index("repl_catchup") < names.index("repl_switch") < names.index("dns_flip")
    # Without a forward run keeping its reverse path, a reverse run goes back in the shutdown mode.
    journal = tmp_path / ".migrate" / back.name / "journal.jsonl"
    resolved = compose.resolve_mode(back, path, journal, probe=False)
    assert resolved.cutover.mode == "shutdown" and resolved.reverse_of == plan.name
    assert back.replication is not None and plan.replication is not None
    assert back.replication.source == plan.replication.target and back.replication.target == plan.replication.source


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_the_installed_copy_takes_the_owner_of_the_datadir_it_replaces(tmp_path: Path) -> None:
    datadir = tmp_path / "mysql"
    datadir.mkdir()
    (datadir / "ibdata1").write_text("old")
    os.chown(datadir, 65534, 65534)
    spec = seed.SeedSpec("/unused", str(datadir), ("ssh", "unused"))
    staging = Path(spec.staging_dir)
    staging.mkdir()
    (staging / "xtrabackup_checkpoints").write_text("backup_type = log-applied\n")
    (staging / "ibdata1").write_text("new")
    subprocess.run(seed.install_command(spec), shell=True, check=True)
    assert (datadir / "ibdata1").read_text() == "new" and (datadir / "ibdata1").stat().st_uid == 65534
    assert (Path(spec.previous_dir) / "ibdata1").read_text() == "old"
    # A crash between the two renames: finishing the install moves the copy in and keeps the previous datadir.
    subprocess.run(seed.restore_previous_command(spec), shell=True, check=True)
    staging.mkdir()
    (staging / "xtrabackup_checkpoints").write_text("backup_type = log-applied\n")
    datadir.rename(spec.previous_dir)
    subprocess.run(seed.finish_install_command(spec), shell=True, check=True)
    assert (datadir / "xtrabackup_checkpoints").exists() and (Path(spec.previous_dir) / "ibdata1").read_text() == "old"
    subprocess.run(seed.finish_install_command(spec), shell=True, check=True)  # done: nothing more to do
    assert (Path(spec.previous_dir) / "ibdata1").read_text() == "old"


def test_the_reverse_path_is_usable_only_while_the_old_source_replicates() -> None:
    running = replica.ReplicaStatus(
        "Yes", True, 0, gtid.GtidPosition(), 0, "", 0, "", "127.0.0.1", 40000, "Slave_Pos", ""
    )
    assert replica_problem(running) is None
    assert "not a replica" in str(replica_problem(None))
    stopped = replace(running, io_running="No", sql_running=False)
    assert "not running (IO thread No, SQL thread No)" in str(replica_problem(stopped))
    failed = replace(stopped, last_sql_errno=1062, last_sql_error="Duplicate entry 'x'")
    assert "Duplicate entry 'x'" in str(replica_problem(failed))
    # Kept until the journaled time, unless torn down since (`migrate finish`, the reverse run).
    assert reverse_kept_until({REVERSE_KEPT: 1000.0}) == 1000.0
    assert reverse_kept_until({REVERSE_KEPT: 1000.0, TORN_DOWN: True}) is None
    assert reverse_kept_until({}) is None and reverse_kept_until(None) is None


def test_the_dry_run_of_the_way_back_shows_the_reverse_switch_while_the_forward_run_keeps_its_reverse_path(
    tmp_path: Path,
) -> None:
    fences = "  target_fence: {enable: touch /srv/m, disable: rm -f /srv/m}\n"
    text = plan_with(tmp_path, "replicate").read_text().replace("services:\n", "services:\n" + fences)
    path = write(tmp_path, text)
    forward = load_plan(path).plan
    (tmp_path / ".migrate" / forward.name).mkdir(parents=True)
    journal = Journal(tmp_path / ".migrate" / forward.name / "journal.jsonl")
    journal.append("run_started", run_id="r1", plan_sha256="x", plan_path=str(path), steps=["repl_switch", "finish"])
    journal.append("step_completed", step="repl_switch", result={}, commit_point=False)
    journal.append("step_saved", step="finish", key=REVERSE_KEPT, value=time.time() + 600)
    journal.append("step_completed", step="finish", result={}, commit_point=False)
    journal.append("run_completed")
    assert compose.forward_kept_until(path, forward.name) is not None
    described = describe(path, reverse=True)
    steps = [step.name for step in described.steps]
    assert steps[:5] == ["preflight", "lower_ttl", "files_presync", "repl_catchup", "repl_switch"], steps
    text = " ".join(line for step in described.steps for line in step.lines)
    assert "no comparison" in text and "the forward run's replication ends" in text, text
    assert "enough free space" not in text  # no datadir moves on the way back over the replica
    # `migrate finish` ends the path (journaled); afterwards the way back is the shutdown mode's.
    journal.append("step_saved", step="finish", key=TORN_DOWN, value=True)
    assert compose.forward_kept_until(path, forward.name) is None
    assert "cutover" in [step.name for step in describe(path, reverse=True).steps]


def test_a_rollback_after_the_flip_whose_reverse_path_is_over_refuses_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fences = "  target_fence: {enable: touch /srv/m, disable: rm -f /srv/m}\n"
    text = plan_with(tmp_path, "replicate").read_text().replace("services:\n", "services:\n" + fences)
    path = write(tmp_path, text)
    forward = load_plan(path).plan
    (tmp_path / ".migrate" / forward.name).mkdir(parents=True)
    journal = Journal(tmp_path / ".migrate" / forward.name / "journal.jsonl")
    journal.append("run_started", run_id="r1", plan_sha256="x", plan_path=str(path),
                   steps=["repl_switch", "dns_flip", "finish"])  # fmt: skip
    journal.append("step_completed", step="repl_switch", result={}, commit_point=False)
    journal.append("step_completed", step="dns_flip", result={}, commit_point=True)
    journal.append("step_saved", step="finish", key=TORN_DOWN, value=True)
    journal.append("step_completed", step="finish", result={}, commit_point=False)
    journal.append("run_completed")
    before = journal.path.read_bytes() if journal.path else b""
    with pytest.raises(SystemExit) as exited:
        main(["rollback", str(path), "--yes"])
    assert exited.value.code == exit_codes.REFUSED
    flat = " ".join(capsys.readouterr().err.split())  # one message (the console wraps it at its width)
    assert "past the DNS flip and its reverse replication is over (torn down)" in flat, flat
    assert "--reverse" in flat and "--discard-target-writes" in flat and "nothing was changed" in flat, flat
    assert journal.path is not None and journal.path.read_bytes() == before
    assert not (tmp_path / ".migrate" / f"{forward.name}-reverse").exists()
