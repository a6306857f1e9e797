"""`migrate apply` of a PostgreSQL lab in the replicate mode, under `lab load` through the front doors: `auto` picks
replicate from the servers' facts; the target is seeded by pg_basebackup, runs as a streaming standby, is compared
in chunks before the window; inside it the source's server is stopped by a fast shutdown, the standby replays its
last record and is promoted with proof. Nothing acknowledged is lost, no request fails, the window is reported. The
old primary follows the new one (no pg_rewind), so `migrate rollback` after the commit goes back over that reverse
standby, losing nothing. The window's fault paths (signals and kills at each of the switch's facts, the guard) are
tests/test_postgres_faults.py's.

One lab for the module, under /var/tmp (the clusters run as `postgres`, which cannot reach pytest's private
temporary directories).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from migrate_lab.state import LabState
from migrate_lab.verify import main_verify
from orchestrator import exit_codes
from orchestrator.database.pg import primitives as pg
from tests.pglab import postgres_lab
from tests.test_e2e import (
    PLAN_NAMES,
    dns_contents,
    migrate_apply,
    outcome,
    plan_name,
    run_report,
    wait_for_load_acks_on,
)
from tests.test_frontdoor_e2e import journal_of, no_failed_requests, requests_sent, start_load, stop_load, wait_for

pytestmark = pytest.mark.lab

TIMEOUT = 600.0


@pytest.fixture(scope="module")
def pg_lab() -> Iterator[LabState]:
    with postgres_lab("migrate-pg-repl-", db_size_mb=2) as lab:
        yield lab


def plan_copy(
    state: LabState, suffix: str, hook: str | None = None, cutover: dict[str, Any] | None = None, **replication: Any
) -> Path:
    """The lab's plan (cutover.mode auto: the servers' facts must resolve it to replicate) with its own name; `hook`:
    the body of its before-step hook; `cutover` and `replication`: settings of those sections."""
    yaml = YAML()
    data = yaml.load(state.plan_file.read_text())
    data["name"] = f"{data['name']}-{suffix}"
    for key, value in replication.items():
        data["replication"][key] = value
    for key, value in (cutover or {}).items():
        data["cutover"][key] = value
    if hook is not None:
        hooks_dir = state.path / f"hooks-{suffix}"
        hooks_dir.mkdir(exist_ok=True)
        path = hooks_dir / "before-step"
        path.write_text("#!/bin/bash\nset -u\n" + hook)
        path.chmod(0o755)
        data["hooks"] = {"dir": str(hooks_dir)}
    PLAN_NAMES.add(str(data["name"]))
    path = state.path / f"plan-{suffix}.yaml"
    with path.open("w") as out:
        yaml.dump(data, out)
    return path


def migrate(state: LabState, *args: str) -> Any:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY")}
    command = [str(Path(sys.executable).with_name("migrate")), *args, "--env-file", str(state.env_file)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def events_of(state: LabState, name: str) -> list[dict[str, Any]]:
    journal = state.path / ".migrate" / name / "journal.jsonl"
    return [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]


def completed(events: list[dict[str, Any]], step: str) -> dict[str, Any]:
    return next(ev["result"] for ev in events if ev.get("event") == "step_completed" and ev["step"] == step)


def in_recovery(state: LabState, host: Any) -> bool:
    password = state.secrets()[state.db_password_env]
    with pg.connect(pg.Endpoint(host.address, host.db_port, state.migrate_user, state.db_name), password) as conn:
        return pg.in_recovery(conn)


def test_replicate_under_load_then_rollback_after_the_commit_loses_nothing(pg_lab: LabState, tmp_path: Path) -> None:
    state = pg_lab
    plan = plan_copy(state, "repl", keep_reverse=3600)
    name = plan_name(plan)
    journal = journal_of(state, plan)
    load_dir = tmp_path / "load"
    load = start_load(state, load_dir, journal)
    try:
        acks = load_dir / "acks.jsonl"
        wait_for(lambda: acks.exists() and acks.read_text().count("\n") >= 10, "writes on the source", 60)
        forward = migrate_apply(state, plan, timeout=TIMEOUT)
        assert forward.returncode == exit_codes.OK, outcome(forward)
        assert dns_contents(state) == {n: state.target.address for n in state.records}
        wait_for_load_acks_on(load_dir, state.target.address, since=time.time())  # clients follow DNS there
        # The old primary follows the new one: a standby of the target, through the reverse tunnel.
        assert in_recovery(state, state.source) and not in_recovery(state, state.target)
        flipped = requests_sent(load_dir)
        back = migrate(state, "rollback", str(plan), "--yes")
        assert back.returncode == exit_codes.OK, outcome(back)
        wait_for_load_acks_on(load_dir, state.source.address, since=time.time())  # clients leave the target
        wait_for(lambda: requests_sent(load_dir) > flipped + 20, "requests after the rollback")
    finally:
        stop_load(load)

    assert dns_contents(state) == {n: state.source.address for n in state.records}
    events = events_of(state, name)
    steps = next(ev["steps"] for ev in events if ev.get("event") == "run_started")
    assert "repl_switch" in steps and "cutover" not in steps, steps  # auto chose replicate on the lab
    preflight = completed(events, "preflight")
    assert preflight["cutover_mode"] == "replicate" and preflight["mode_reason"].startswith("replicate"), preflight
    assert "wal_level replica" in preflight["mode_reason"], preflight["mode_reason"]  # PostgreSQL's own needs
    report = run_report(state, name)
    assert report["status"] == "completed", report["status"]
    switch = report["replicate"]
    # The promotion's proof: the standby replayed the source's last record (just past its shutdown checkpoint).
    assert switch["final_gtid"] and pg.Lsn.parse(switch["executed_gtid"]) >= pg.Lsn.parse(switch["final_gtid"])
    catchup = completed(events, "repl_catchup")
    assert catchup["compared_tables"] >= 2 and catchup["compared_chunks"] >= 2, catchup
    # The uploads' pass before the window was checked: the final pass listed only what changed after it.
    assert catchup["prewindow_trees"]["uploads"].get("since"), catchup["prewindow_trees"]
    kept = completed(events, "finish")["reverse_replication"]
    assert kept["healthy"] is True and kept["kept_until"], kept

    verify = main_verify(state, host="source", load_dir=load_dir, journal=journal)
    back_report = run_report(state, f"{name}-reverse")
    print(
        f"\nPostgreSQL replicate under load: writes blocked (report) {report['write_block_seconds']} s; switch "
        f"{switch.get('switch_seconds')} s (fence and stop {switch.get('read_only_seconds')} s, wait "
        f"{switch.get('wait_seconds')} s, promote {switch.get('promote_seconds')} s); window parts "
        f"{report['window_parts']}; the way back: writes blocked {back_report['write_block_seconds']} s; longest "
        f"write stall {verify.longest_write_stall_s} s; failed {verify.requests_failed}; acknowledged "
        f"{verify.reviews_acknowledged} reviews; lost {verify.acknowledged_lost}"
    )
    assert report["write_block_seconds"] > 0 and "repl_switch" in report["window_parts"]
    assert back_report["status"] == "completed"
    assert verify.error is None, verify.error
    assert verify.reviews_acknowledged > 0
    assert verify.acknowledged_lost == 0, verify.lost
    no_failed_requests(verify)
    # Writes were acknowledged on both sides: the target's, taken after the commit, came back with the rollback.
    assert set(verify.per_server) == {state.source.address, state.target.address}, verify.per_server
    assert not in_recovery(state, state.source)
