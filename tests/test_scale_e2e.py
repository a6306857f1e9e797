"""A migration of 100,000 uploads under load: inside the window, the final pass and the verification touch only what
changed since the pre-sync; when the change tracking cannot be trusted, the run scans the whole tree, says so, and
still loses nothing.

Its own lab (`lab up --files 100000`), brought up once for this module and taken down after it: the session lab
stays small for the rest of the suite. The killed tracker's run uses the session lab: the fallback and the loss of
nothing do not depend on the tree's size.
"""

from __future__ import annotations

import hashlib
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from migrate_lab import hosts
from migrate_lab.state import LabState
from migrate_lab.verify import main_verify
from orchestrator import exit_codes
from tests.test_e2e import (
    deleted_uploads,
    dns_contents,
    live_lab,
    migrate_apply,
    outcome,
    plan_copy,
    plan_name,
    restore_source_live,
    rewritten_uploads,
    run_report,
    start_load,
    wait_for_load_ack,
    wait_for_load_acks_on,
)

pytestmark = pytest.mark.lab
__all__ = ["live_lab"]
FILES = 100_000
# What is proven is how the work grows with the number of files, not their bytes: small files (about 30 MB in all,
# not 850) make the same tree faster to write, pre-sync and compare before the window.
FILE_SIZES = (64, 512)

# A before-cutover hook that kills the uploads tree's change tracker: the tracker's state directory comes from the
# run's journal (files_presync journals it before starting it), the pid from there, checked to be an inotifywait.
KILL_TRACKER_HOOK = """#!{python}
import json, os, sys, time
refs = {{}}
for line in open(os.environ["MIGRATE_JOURNAL"]):
    event = json.loads(line)
    if event.get("event") == "step_saved" and event.get("key") == "trackers":
        refs = event["value"]
ref = refs["uploads"]
pid = int(open(os.path.join(ref["state_dir"], ref["name"], "pid")).read())
if not os.path.exists(f"/proc/{{pid}}"):
    print("the tracker was already gone", pid)  # the run must scan the whole tree all the same
    sys.exit(0)
assert open(f"/proc/{{pid}}/comm").read().strip() == "inotifywait", pid
os.kill(pid, 9)
while os.path.exists(f"/proc/{{pid}}") and "Z" not in open(f"/proc/{{pid}}/stat").read().split(")")[1][:3]:
    time.sleep(0.05)
print("killed the tracker", pid)
"""


@pytest.fixture(scope="module")
def big_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    lab_dir = tmp_path_factory.mktemp("lab-100k")
    started = time.monotonic()
    try:
        state = hosts.up(lab_dir, default_ports=False, files=FILES, file_sizes=FILE_SIZES)
        print(f"lab up with {FILES} files in {time.monotonic() - started:.1f} s")
        yield state
    finally:
        hosts.down(lab_dir)


@pytest.fixture
def live_big_lab(big_lab: LabState) -> Iterator[LabState]:
    restore_source_live(big_lab)
    try:
        yield big_lab
    finally:
        restore_source_live(big_lab)


def migrate_under_load(state: LabState, plan: Path, load_dir: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    # New uploads, some rewritten in place, some deleted: the final pass and its check handle all three.
    load = start_load(state, load_dir, duration=600, overwrite_every=3, delete_every=4)
    try:
        # Writes, rewrites and deletes flowing to the source before the migration begins: the load's first
        # acknowledged delete (each client's fourth upload), however short the run that follows turns out.
        wait_for_load_ack(load_dir, lambda ack: ack.get("kind") == "upload_deleted", "no delete acknowledged", 120)
        result = migrate_apply(state, plan, timeout=600)
        if result.returncode == exit_codes.OK:  # clients with a cached answer move to the target
            wait_for_load_acks_on(load_dir, state.target.address, since=time.time())
    finally:
        load.send_signal(signal.SIGTERM)
        load_output, _ = load.communicate(timeout=60)
    return result, load_output


def tree_digests(root: Path) -> dict[str, str]:
    """Each file's sha256 (the bytes of 100,000 files are not held at once)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def assert_nothing_lost(state: LabState, load_dir: Path, report: dict[str, Any], seeded: int = FILES) -> None:
    assert dns_contents(state) == {name: state.target.address for name in state.records}
    verify = main_verify(state, host="target", load_dir=load_dir)
    print(
        f"writes blocked (report) {report['write_block_seconds']} s, longest write stall "
        f"{verify.longest_write_stall_s} s, uploads acknowledged {verify.uploads_acknowledged}, deleted "
        f"{verify.uploads_deleted}, "
        f"peak RSS {report['peak_rss_mib']} MiB"
    )
    assert verify.error is None, verify.error
    assert verify.reviews_acknowledged > 0 and verify.uploads_acknowledged > 0 and verify.uploads_deleted > 0
    assert verify.acknowledged_lost == 0, verify.lost
    # Every file the source held at the fence is on the target: the `seeded` ones byte for byte, the load's
    # rewritten ones in their last version (checked by main_verify), but those its clients deleted on the target
    # after the flip (main_verify checked every acknowledged delete is gone from the target).
    source_files, target_files = tree_digests(state.source.uploads), tree_digests(state.target.uploads)
    deleted = deleted_uploads(load_dir)
    assert len(source_files) >= seeded and source_files.keys() - deleted <= target_files.keys()
    differing = {name for name, digest in source_files.items() if name not in deleted and target_files[name] != digest}
    assert differing <= rewritten_uploads(load_dir), sorted(differing)[:5]


def test_a_hundred_thousand_files_cost_only_their_changes_in_the_window(live_big_lab: LabState, tmp_path: Path) -> None:
    state = live_big_lab
    plan = plan_copy(state, "scale", {})
    started = time.monotonic()
    result, load_output = migrate_under_load(state, plan, tmp_path / "load")
    print(f"migration of {FILES} files under load: {time.monotonic() - started:.1f} s\n{load_output}")
    assert result.returncode == exit_codes.OK, outcome(result)
    report = run_report(state, plan_name(plan))
    assert report["status"] == "completed"

    uploads = report["final_pass_trees"]["uploads"]
    assert uploads["mode"] == "tracked", uploads
    # What changed during the pre-sync and its comparison: the load's few hundred uploads and their directories,
    # against a tree of more than 100,000 entries.
    assert uploads["tree_entries"] > FILES
    assert 0 < uploads["paths_listed"] < FILES // 100, uploads
    assert uploads["files_copied"] <= uploads["paths_listed"]
    where = {check["check"]: check["where"] for check in report["checks"]}
    assert where["tree uploads: every file's checksum"] == "before"
    inside = [c for c in report["checks"] if c["where"] == "inside" and c["check"].startswith("tree uploads")]
    scope = f"the {uploads['paths_listed']} path(s) the final pass copied or deleted"
    assert inside and scope in inside[0]["check"], inside
    assert inside[0]["differing"] == 0
    assert_nothing_lost(state, tmp_path / "load", report)


def test_a_killed_tracker_makes_the_run_scan_the_whole_tree_and_lose_nothing(
    live_lab: LabState, tmp_path: Path
) -> None:
    """On the suite's own (small) lab: what is proven is the fallback and that nothing is lost, at any size; the
    full scan's cost at scale is bench/window.py's business."""
    state = live_lab
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    hook = hooks / "before-cutover"
    hook.write_text(KILL_TRACKER_HOOK.format(python=sys.executable))
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)
    plan = plan_copy(state, "scale-untracked", {"hooks": {"dir": str(hooks)}})
    result, load_output = migrate_under_load(state, plan, tmp_path / "load")
    print(load_output)
    assert result.returncode == exit_codes.OK, outcome(result)
    report = run_report(state, plan_name(plan))
    uploads = report["final_pass_trees"]["uploads"]
    assert uploads["mode"] == "full_scan", uploads
    assert "tracker is not running" in uploads["fallback_reason"], uploads
    inside = [c for c in report["checks"] if c["where"] == "inside" and c["check"].startswith("tree uploads")]
    assert inside and "the whole tree" in inside[0]["check"] and inside[0]["differing"] == 0, inside
    # The operator was told, in the run's own words: why, and what the full scan costs.
    said = result.stdout + result.stderr
    assert "final_pass_full_scan" in said and "tracker is not running" in said, outcome(result)
    assert_nothing_lost(state, tmp_path / "load", report, seeded=0)
