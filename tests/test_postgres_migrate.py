"""`migrate apply` of a PostgreSQL lab (`lab up --engine postgresql`) in the shutdown mode: a run failing inside the
window rolls back and the source takes writes again; a run under the lab's load, through the front doors, keeps
every acknowledged write and its audit finds the target equal to the source; and a plan asking the replicate mode
without its replication section is refused in one line.

One lab for the module, under /var/tmp (the clusters run as `postgres`, which cannot reach pytest's private
temporary directories).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from migrate_lab.load import ACKS_FILE
from migrate_lab.state import LabState
from migrate_lab.verify import main_verify, read_acks
from orchestrator import exit_codes
from tests.pglab import postgres_lab

pytestmark = pytest.mark.lab

MIGRATE = Path(sys.executable).with_name("migrate")
DNS_TTL = 3.0


@pytest.fixture(scope="module")
def pg_lab() -> Iterator[LabState]:
    with postgres_lab("migrate-pg-apply-", db_size_mb=1) as lab:
        yield lab


def migrate(state: LabState, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY")}
    return subprocess.run(
        [str(MIGRATE), *args, "--env-file", str(state.env_file)], env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def outcome(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"


def wait_for_ack(load_dir: Path, address: str, since: float, timeout: float = 120.0) -> None:
    """Until the load has a write acknowledged by `address` after `since`: an order of events, not a sleep."""
    deadline = time.monotonic() + timeout
    acks = load_dir / ACKS_FILE
    while time.monotonic() < deadline:
        if acks.exists() and any(
            a.get("server") == address and float(a.get("ack_ts", 0)) > since for a in read_acks(acks)
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"no write acknowledged by {address} within {timeout:g} s")


def test_a_replicate_plan_without_its_replication_section_is_refused_in_one_line(pg_lab: LabState) -> None:
    yaml = YAML()
    data = yaml.load(pg_lab.plan_file.read_text())
    data["cutover"]["mode"] = "replicate"
    del data["replication"]
    plan = pg_lab.path / "plan-replicate.yaml"
    with plan.open("w") as out:
        yaml.dump(data, out)
    refused = migrate(pg_lab, "apply", str(plan), "--yes")
    assert refused.returncode == exit_codes.BAD_INPUT, outcome(refused)
    lines = [line for line in (refused.stdout + refused.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "'replicate' needs a replication section" in lines[0] and f"{plan}:" in lines[0], lines[0]


def test_a_failed_run_lets_the_roles_in_again_then_a_run_under_load_loses_no_acknowledged_write(
    pg_lab: LabState,
) -> None:
    state = pg_lab
    # First a run whose health check fails inside the window: the rollback starts the source's server again and
    # lets the app's roles (fenced NOLOGIN, marked) log in again, so the source's app takes writes.
    failed = migrate(state, "apply", str(plan_copy(state, "failing", failing_health_check)), "--yes")
    assert failed.returncode == exit_codes.FAILED, outcome(failed)
    assert latest_report(state)["status"] == "rolled_back"
    status, body = post_review(state)
    assert status == 201, f"the source refused a write after the rollback: {status} {body[:200]!r}"
    load_dir = state.path / "load"
    load = subprocess.Popen(
        [sys.executable, "-m", "migrate_lab.load", "--lab", str(state.path), "--duration", "300",
         "--rate", "20", "--clients", "4", "--dns-ttl", str(DNS_TTL), "--upload-every", "5", "--out", str(load_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for_ack(load_dir, state.source.address, since=0.0)
        result = migrate(state, "apply", str(plan_copy(state, "checksum", with_checksums)), "--yes")
        assert result.returncode == exit_codes.OK, outcome(result)
        wait_for_ack(load_dir, state.target.address, since=time.time())  # clients followed the records
    finally:
        load.send_signal(signal.SIGTERM)
        load.communicate(timeout=60)
    report = latest_report(state)
    assert report["status"] == "completed"
    journal = state.path / ".migrate" / "course-review-lab" / "journal.jsonl"
    verify = main_verify(state, host="target", load_dir=load_dir, journal=journal if journal.exists() else None)
    print(
        f"\nPostgreSQL shutdown mode under load: writes blocked {report['write_block_seconds']} s, longest write "
        f"stall {verify.longest_write_stall_s} s, failed write attempts {verify.write_attempts_failed}, "
        f"acknowledged {verify.reviews_acknowledged} reviews / {verify.uploads_acknowledged} uploads, "
        f"lost {verify.acknowledged_lost}"
    )
    assert verify.error is None, verify.error
    assert verify.reviews_acknowledged > 0
    assert verify.acknowledged_lost == 0, verify.lost
    assert report["write_block_seconds"] > 0
    # After the commit: the target's snapshot at the commit against the stopped source, started isolated.
    assert report["audit"]["status"] == "equal", report["audit"]
    assert report["audit"]["tables"] == len(report["row_counts"]) > 0
    assert report["audit"]["checksums_compared"] == len(report["row_counts"]), report["audit"]
    # The app's roles were fenced on the source and travelled with the copy; the target let them in again.
    assert set(verify.per_server) == {state.source.address, state.target.address}, verify.per_server


def plan_copy(state: LabState, name: str, change: Callable[[Any], None]) -> Path:
    """The lab's plan with `change` made to it, beside it (same plan name: the same journal and reports)."""
    yaml = YAML()
    data = yaml.load(state.plan_file.read_text())
    data["cutover"]["mode"] = "shutdown"  # this module runs the shutdown mode (the lab's plan says auto)
    change(data)
    plan = state.path / f"plan-{name}.yaml"
    with plan.open("w") as out:
        yaml.dump(data, out)
    return plan


def with_checksums(data: Any) -> None:
    data["database"]["verify"] = {"row_counts": True, "checksum": True}  # the lab's compares row counts only


def failing_health_check(data: Any) -> None:
    data["health"]["checks"][1]["expect"] = "2"  # there is 1 review at least, never 2 from EXISTS
    data["health"]["attempts"] = 1


def post_review(state: LabState) -> tuple[int, bytes]:
    review = {"id": f"after-rollback-{uuid.uuid4().hex[:8]}", "author": "check", "course": "pg", "rating": 5,
              "body": "written after the rollback"}  # fmt: skip
    request = urllib.request.Request(
        f"http://{state.source.address}:{state.source.app_port}/reviews", data=json.dumps(review).encode(),
        method="POST", headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def latest_report(state: LabState) -> dict[str, Any]:
    reports = sorted((state.path / ".migrate").glob("*/report-*.json"), key=lambda p: p.stat().st_mtime)
    assert reports, "no run report"
    return dict(json.loads(reports[-1].read_text()))
