"""A pre-sync the live site does not feel: the live command's wrapping (process group, nocache) and, on the lab, the
pause on the source's load that engages above `transfer.max_load` while the copy still completes correctly."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from ruamel.yaml import YAML

from orchestrator.engine.step import StepContext
from orchestrator.lab.state import LabState
from orchestrator.plan.model import Plan
from orchestrator.results import DbPresyncResult, FilesResult
from orchestrator.runtime import Runtime
from orchestrator.steps.db_presync import DbPresync
from orchestrator.steps.files_presync import FilesPresync
from orchestrator.transports import rsync
from orchestrator.transports.ssh import TransportError

# --- offline ----------------------------------------------------------------------------------------------------


def test_load_check_reads_the_load_the_group_and_its_state() -> None:
    assert rsync.parse_load_check("0.52 0.40 0.33 2/301 4242\n4243\nT\n") == (0.52, 4243, "T")
    assert rsync.parse_load_check("1.00 0.40 0.33 2/301 4242\n\n") == (1.0, None, "")  # rsync not started yet
    with pytest.raises(TransportError):
        rsync.parse_load_check("")


def sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("nocache", [True, False])
def test_live_command_runs_in_its_own_group_and_keeps_the_exit_status(tmp_path: Path, nocache: bool) -> None:
    marker = tmp_path / "group"
    probe = "ps -o pgid= -p $$; exit 24"  # rsync's 'files vanished' exit must come back as it was
    done = sh(rsync.live_command(probe, nocache=nocache, group_marker=str(marker)))
    assert done.returncode == 24
    group = int(marker.read_text())
    assert int(done.stdout.strip()) == group  # the command ran in the group the marker names
    assert group != int(sh("ps -o pgid= -p $$").stdout.strip())  # not the caller's group


def test_live_command_under_nocache_when_installed() -> None:
    if shutil.which("nocache") is None:
        pytest.fail("nocache is in the Makefile's SYSTEM_PACKAGES: install it")
    done = sh(rsync.live_command('echo "$LD_PRELOAD"', nocache=True, group_marker=None))
    assert "nocache" in done.stdout
    assert "nocache" not in sh(rsync.live_command('echo "$LD_PRELOAD"', nocache=False, group_marker=None)).stdout


def test_live_command_stops_itself_before_the_copy_when_loaded(tmp_path: Path) -> None:
    """Above the threshold at the start, the command stops before running anything, until it is continued: a
    copy too short for the watcher's first look is paused all the same."""
    marker, ran = tmp_path / "group", tmp_path / "ran"
    proc = subprocess.Popen(["sh", "-c", rsync.live_command(f"touch {ran}", nocache=False, group_marker=str(marker),
                                                            max_load=-1.0)])  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        state = ""
        while time.monotonic() < deadline and state != "T":
            if marker.exists() and marker.read_text().strip():
                stat = Path(f"/proc/{marker.read_text().strip()}/stat")
                state = stat.read_text().rsplit(")", 1)[1].split()[0] if stat.exists() else ""
            time.sleep(0.05)
        assert state == "T" and not ran.exists()
        os.killpg(int(marker.read_text()), signal.SIGCONT)
        assert proc.wait(timeout=30) == 0 and ran.exists()
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(marker.read_text()), signal.SIGCONT)
            proc.kill()


# --- on the lab -------------------------------------------------------------------------------------------------


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


@pytest.fixture
def busy_source() -> Iterator[None]:
    """A process keeping one CPU busy, so the machine's (the source's) load average is above zero."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.fixture
def throttled_plan(lab: LabState, monkeypatch: pytest.MonkeyPatch) -> Plan:
    for key, value in lab.secrets().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CLOUDFLARE_EMAIL", raising=False)
    monkeypatch.delenv("CLOUDFLARE_API_KEY", raising=False)
    plan = Plan.model_validate(YAML(typ="safe").load(lab.plan_file.read_text()))
    # A threshold no busy host stays under: the pause engages as soon as rsync runs.
    transfer = plan.transfer.model_copy(
        update={"max_load": 0.0, "load_check_interval": 0.3, "max_pause": 0.6, "bwlimit": "2M"}
    )
    return plan.model_copy(update={"transfer": transfer})


def empty(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


@pytest.mark.lab
def test_presyncs_pause_above_max_load_and_still_copy_everything(
    lab: LabState, throttled_plan: Plan, busy_source: None
) -> None:
    rt = Runtime(throttled_plan, lab.plan_file)
    try:
        assert not rt.db_answers("target"), "the lab's target database must be stopped"
        empty(lab.target.uploads)
        results = {}
        for step in (FilesPresync(), DbPresync()):
            ctx = StepContext(run_id="test", step=step.name, dry_run=False, rt=rt, log=structlog.get_logger())
            results[step.name] = step.run(ctx)
    finally:
        rt.close()
    files = FilesResult.of(results["files_presync"])
    assert files.throttled_seconds > 0
    assert all(tree.throttled_seconds > 0 for tree in files.trees.values())
    assert DbPresyncResult.of(results["db_presync"]).throttled_seconds > 0
    # The copy completed correctly all the same, and no process group was left stopped.
    assert tree_digest(lab.target.uploads) == tree_digest(lab.source.uploads)
    stopped = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True, check=True).stdout
    assert not [line for line in stopped.splitlines() if line.startswith("T") and "rsync" in line]
    assert not list(Path("/tmp").glob("migrate-rsync-*.pgid"))
