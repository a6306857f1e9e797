"""The storage preflight on the lab, over real SSH: a target datadir on a filesystem made slow on purpose.

The slow filesystem is an ext4 image on a loop device (direct I/O to its image file) mounted with `sync` and
`data=journal`: every write goes through two filesystems and the journal, as in the LXC directory-storage
post-mortem. The fast one is a tmpfs. Both are mounted under the test's temporary directory and always unmounted.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from ruamel.yaml import YAML

from migrate_lab.state import LabState
from orchestrator.engine.step import StepContext
from orchestrator.plan.model import Plan, Preflight
from orchestrator.runtime import Runtime
from orchestrator.steps.preflight import Preflight as PreflightStep
from orchestrator.steps.preflight import Problems


@dataclass(frozen=True)
class Mounts:
    fast: Path
    slow: Path
    loop_device: str


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout.strip()


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[Mounts]:
    fast, slow, image = tmp_path / "fast", tmp_path / "slow", tmp_path / "slow.img"
    fast.mkdir()
    slow.mkdir()
    mounted: list[Path] = []
    loop = ""
    try:
        _run("mount", "-t", "tmpfs", "-o", "size=32M", "tmpfs", str(fast))
        mounted.append(fast)
        with image.open("wb") as out:
            out.truncate(96 * 1024 * 1024)
        _run("mkfs.ext4", "-q", str(image))
        try:
            loop = _run("losetup", "--find", "--show", "--direct-io=on", str(image))
        except subprocess.CalledProcessError as exc:
            pytest.fail(f"no loop device available here ({exc.stderr.strip()}): this proof needs one")
        _run("mount", "-o", "sync,data=journal", loop, str(slow))
        mounted.append(slow)
        for directory in (fast / "mysql", slow / "mysql"):
            directory.mkdir()
        yield Mounts(fast / "mysql", slow / "mysql", loop)
    finally:
        for point in reversed(mounted):
            subprocess.run(["umount", str(point)], check=False, capture_output=True, timeout=60)
        if loop:
            subprocess.run(["losetup", "-d", loop], check=False, capture_output=True, timeout=60)


@pytest.fixture
def lab_plan(lab: LabState, monkeypatch: pytest.MonkeyPatch) -> Plan:
    for key, value in lab.secrets().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CLOUDFLARE_EMAIL", raising=False)
    monkeypatch.delenv("CLOUDFLARE_API_KEY", raising=False)
    return Plan.model_validate(YAML(typ="safe").load(lab.plan_file.read_text()))


def on_mounts(plan: Plan, mounts: Mounts, policy: str) -> Plan:
    """The lab's plan with the source's datadir on the fast filesystem and the target's on the slow one."""
    database = plan.database.model_copy(
        update={
            "source": plan.database.source.model_copy(update={"datadir": str(mounts.fast)}),
            "target": plan.database.target.model_copy(update={"datadir": str(mounts.slow)}),
        }
    )
    checks = Preflight(storage=policy, max_fsync_ratio=3.0, min_fsync_ms=0.0, fsync_writes=100)  # type: ignore[arg-type]
    return plan.model_copy(update={"database": database, "preflight": checks})


def storage_check(plan: Plan, plan_path: Path) -> tuple[list[str], dict[str, Any]]:
    rt = Runtime(plan, plan_path)
    try:
        step = PreflightStep()
        ctx = StepContext(run_id="test", step=step.name, dry_run=False, rt=rt, log=structlog.get_logger())
        problems, figures = Problems(), {}
        step._storage(ctx, problems, figures)
        return problems.items, figures
    finally:
        rt.close()


@pytest.mark.lab
def test_a_slow_target_datadir_is_reported_and_refused_when_the_plan_says_refuse(
    lab: LabState, lab_plan: Plan, mounts: Mounts
) -> None:
    problems, figures = storage_check(on_mounts(lab_plan, mounts, "refuse"), lab.plan_file)
    report = figures["storage"]
    source_fsync, target_fsync = report["source"]["fsync"], report["target"]["fsync"]
    assert report["source"]["mounts"]["datadir"]["fstype"] == "tmpfs"
    target_mount = report["target"]["mounts"]["datadir"]
    assert target_mount["device"] == mounts.loop_device and "sync" in target_mount["options"]
    assert target_fsync["p50_ms"] > source_fsync["p50_ms"] * 3
    slow = [f for f in report["findings"] if f["kind"] == "slow"]
    assert len(slow) == 1 and slow[0]["side"] == "target" and "slower than the source's" in slow[0]["text"]
    assert "lxc-directory-storage-fsync" in slow[0]["protects_against"]
    assert any(f["kind"] == "layout" and "loop device" in f["text"] for f in report["findings"])
    assert len(problems) == 1 and problems[0].startswith("storage: target datadir") and "slower" in problems[0]
    # The probes cleaned up after themselves: nothing was left in either datadir.
    assert list(mounts.fast.iterdir()) == [] and list(mounts.slow.iterdir()) == []


@pytest.mark.lab
def test_a_slow_target_only_warns_when_the_plan_says_warn(lab: LabState, lab_plan: Plan, mounts: Mounts) -> None:
    problems, figures = storage_check(on_mounts(lab_plan, mounts, "warn"), lab.plan_file)
    assert problems == []
    assert [f["kind"] for f in figures["storage"]["findings"] if f["kind"] == "slow"] == ["slow"]


@pytest.mark.lab
def test_the_lab_preflight_reports_both_hosts_storage(lab: LabState, lab_plan: Plan) -> None:
    """The whole preflight on the lab as it is: storage figures for the datadir and each tree on both hosts, and the
    source's durability settings read from its server."""
    rt = Runtime(lab_plan, lab.plan_file)
    try:
        step = PreflightStep()
        ctx = StepContext(run_id="test", step=step.name, dry_run=False, rt=rt, log=structlog.get_logger())
        figures = step.run(ctx)
    finally:
        rt.close()
    assert figures is not None
    report = figures["storage"]
    roles = {"datadir", *(f"tree {tree.name}" for tree in lab_plan.files)}
    for side in ("source", "target"):
        assert set(report[side]["mounts"]) == roles
        assert report[side]["fsync"]["writes"] > 0
    assert set(report["source"]["settings"]) >= {"innodb_flush_log_at_trx_commit", "sync_binlog"}
    assert report["source"]["settings_origin"] == "server"
