"""Change tracking on the lab: inotifywait runs on the source through SSH, rsync on the source pushes to the target.

Each test uses its own tree on both hosts and removes it (and stops its tracker) at the end.
"""

from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from migrate_lab.load import ACKS_FILE, main_load
from migrate_lab.state import LabState
from migrate_lab.uploads_tree import file_path, write_tree
from migrate_lab.verify import main_verify, read_acks
from orchestrator.plan.model import Plan
from orchestrator.runtime import Runtime
from orchestrator.services.tracking import ChangeTracker, TrackingError, final_pass_command, verify_listed_command
from orchestrator.transports import rsync

pytestmark = pytest.mark.lab
SEEDED = 3000
MAX_CHURN = 600  # changes during the pre-sync: a few hundred, as in a real store between pre-sync and cut-over
_DIR_TIMES_ONLY = re.compile(r"^\.d\.\.t[.\s]*$")


@dataclass
class Tree:
    rt: Runtime
    name: str
    source: Path
    target: Path
    state_dir: Path
    trackers: list[ChangeTracker] = field(default_factory=list)

    @property
    def plan(self) -> Plan:
        return self.rt.plan

    def tracker(self, program: str = "inotifywait") -> ChangeTracker:
        tracker = ChangeTracker(self.rt.source, str(self.source), str(self.state_dir), name=self.name, program=program)
        self.trackers.append(tracker)
        return tracker

    def on_source(self, command: str, timeout: float = 300) -> str:
        result = self.rt.source.run(command, timeout=timeout, check=False)
        assert result.exit_status == 0, (command, result.stderr)
        return result.stdout

    def presync(self) -> None:
        """The pre-sync: a full rsync of the tree, run on the source; files vanishing under it are normal."""
        argv = ["rsync", "-a", "--delete", "-e", rsync.target_ssh_command(self.plan), f"{self.source}/"]
        command = shlex.join([*argv, rsync.target_spec(self.plan, str(self.target))])
        result = self.rt.source.run(command, timeout=300, check=False)
        problems = [line for line in result.stderr.splitlines() if "vanished" not in line and "rsync error" not in line]
        assert result.exit_status in (0, 23, 24) and not problems, (result.exit_status, result.stderr)

    def differences(self) -> list[str]:
        """Everything a full rsync --dry-run --checksum --delete would change (nothing: the trees are equal).

        As in verify_target, a directory whose only difference is its mtime holds no different data: the tree's
        root is never in a change list (listing it would recurse the whole tree), so its mtime may differ."""
        argv = ["rsync", "-a", "--delete", "--dry-run", "--checksum", "--itemize-changes"]
        argv += ["-e", rsync.target_ssh_command(self.plan), f"{self.source}/"]
        out = self.on_source(shlex.join([*argv, rsync.target_spec(self.plan, str(self.target))]))
        lines = [line for line in out.splitlines() if line.strip()]
        return [line for line in lines if not _DIR_TIMES_ONLY.match(line.partition(" ")[0])]

    def final_pass(self, list_file: str) -> str:
        command = final_pass_command(
            str(self.source),
            rsync.target_spec(self.plan, str(self.target)),
            list_file,
            ssh=rsync.target_ssh_command(self.plan),
        )
        return self.on_source(command)

    def verify_listed(self, list_file: str) -> list[str]:
        command = verify_listed_command(
            str(self.source),
            rsync.target_spec(self.plan, str(self.target)),
            list_file,
            ssh=rsync.target_ssh_command(self.plan),
        )
        lines = [line for line in self.on_source(command).splitlines() if line.strip()]
        return [line for line in lines if not _DIR_TIMES_ONLY.match(line.partition(" ")[0])]

    def tracker_pid(self) -> int:
        return int((self.state_dir / self.name / "pid").read_text())


def load_plan(path: Path) -> Plan:
    return Plan.model_validate(YAML(typ="safe").load(path.read_text()))


@pytest.fixture
def tree(lab: LabState, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tree]:
    for key, value in lab.secrets().items():
        monkeypatch.setenv(key, value)
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:60]
    rt = Runtime(load_plan(lab.plan_file), lab.plan_file)
    made = Tree(
        rt,
        name,
        lab.source.path / f"tracked-{name}",
        lab.target.path / f"tracked-{name}",
        lab.source.path / "tracker-state",
    )
    made.source.mkdir(parents=True)
    made.target.mkdir(parents=True)
    try:
        yield made
    finally:
        for tracker in made.trackers:
            tracker.stop()
            tracker.remove()
        rt.close()
        shutil.rmtree(made.source, ignore_errors=True)
        shutil.rmtree(made.target, ignore_errors=True)


def wait_for(condition: object, what: str, timeout: float = 60.0) -> None:
    """Wait until `condition()` holds (an event we caused shows up), failing after `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def listed(list_file: str) -> list[str]:
    data = Path(list_file).read_bytes()
    return [name.decode("utf-8", "surrogateescape") for name in data.split(b"\0") if name]


class Churn:
    """Writes like a live upload store while the pre-sync runs: new files (written to a temporary name then renamed,
    as the app does), overwrites at the same size, renames to another directory, deletions. Records every path."""

    def __init__(self, root: Path, seeded: int) -> None:
        self.root = root
        self.seeded = seeded
        self.touched: set[str] = set()
        self.rng = random.Random(7)
        self.stop = threading.Event()
        self.ops = 0
        self.thread = threading.Thread(target=self.run, name="churn", daemon=True)

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def seeded_file(self) -> Path | None:
        path = file_path(self.root, self.rng.randrange(self.seeded))
        return path if path.exists() else None

    def run(self) -> None:
        while not self.stop.is_set() and self.ops < MAX_CHURN:
            self.step()
            self.ops += 1
            if self.ops % 50 == 0:
                time.sleep(0.01)  # a live store, not a benchmark: let the pre-sync make progress

    def step(self) -> None:
        kind = self.ops % 4
        if kind == 0:
            parent = file_path(self.root, self.rng.randrange(self.seeded)).parent
            final = parent / f"new-{self.ops}.bin"
            tmp = parent / f".new-{self.ops}.bin.uploading"
            tmp.write_bytes(self.rng.randbytes(self.rng.randint(1024, 16384)))
            tmp.rename(final)
            self.touched |= {self.rel(tmp), self.rel(final)}
            return
        path = self.seeded_file()
        if path is None:
            return
        self.touched.add(self.rel(path))
        if kind == 1:
            path.write_bytes(self.rng.randbytes(path.stat().st_size))
        elif kind == 2:
            moved = file_path(self.root, self.rng.randrange(self.seeded)).parent / f"moved-{self.ops}.bin"
            path.rename(moved)
            self.touched.add(self.rel(moved))
        else:
            path.unlink()

    def __enter__(self) -> Churn:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def test_the_tracked_list_makes_the_target_equal_under_churn(tree: Tree) -> None:
    """Changes made during and after the pre-sync (creations, overwrites, renames of files and directories,
    deletions, odd names) are all in the tracked list; its final pass makes the target equal to the source."""
    write_tree(tree.source, SEEDED)
    tracker = tree.tracker()
    assert tracker.start(timeout=120) is True
    assert tracker.trust().trusted
    with Churn(tree.source, SEEDED) as churn:
        wait_for(lambda: churn.ops > 20, "the churn to start")
        tree.presync()
    assert churn.ops > 20
    touched = set(churn.touched)

    root = tree.source
    odd = ["with space.bin", "bracket[1].bin", "new\nline.bin", "ü-utf8 *?.bin"]
    for name in odd:
        (root / name).write_bytes(name.encode() * 100)
    touched |= set(odd)
    (root / "fresh" / "deep").mkdir(parents=True)
    (root / "fresh" / "deep" / "a.bin").write_bytes(b"a" * 5000)
    touched |= {"fresh", "fresh/deep", "fresh/deep/a.bin"}
    # A directory renamed (its files never touched one by one), another deleted whole, a chmod.
    renamed_from = file_path(root, 1).parent
    renamed_to = renamed_from.with_name(renamed_from.name + "-renamed")
    renamed_from.rename(renamed_to)
    touched |= {str(renamed_from.relative_to(root)), str(renamed_to.relative_to(root))}
    deleted_dir = file_path(root, 2).parent
    if deleted_dir in (renamed_from, renamed_to):
        deleted_dir = file_path(root, 5).parent
    touched |= {str(deleted_dir.relative_to(root))} | {str(p.relative_to(root)) for p in deleted_dir.iterdir()}
    shutil.rmtree(deleted_dir)
    chmodded = file_path(root, 3)
    if chmodded.exists():
        chmodded.chmod(0o600)
        touched.add(str(chmodded.relative_to(root)))
    created_then_gone = root / "ephemeral.bin"
    created_then_gone.write_bytes(b"x")
    created_then_gone.unlink()
    touched.add("ephemeral.bin")

    assert tree.differences(), "the changes after the pre-sync must be visible to a full comparison"
    changes = tracker.changes(timeout=120)
    assert changes.trust.trusted, changes.trust.reasons
    names = listed(changes.path)
    assert changes.count == len(names) > 0
    extra = set(names) - touched
    assert not extra, f"listed paths nobody changed: {sorted(extra)[:10]}"
    assert set(odd) <= set(names) and "ephemeral.bin" in names
    assert changes.count <= len(touched) < SEEDED / 2, "the list is O(changes), not O(files)"

    stats = rsync.parse_stats(tree.final_pass(changes.path))
    assert stats.files_transferred <= len(touched)
    assert tree.verify_listed(changes.path) == []
    assert tree.differences() == []
    assert (tree.target / "new\nline.bin").read_bytes() == (root / "new\nline.bin").read_bytes()
    assert not (tree.target / renamed_from.relative_to(root)).exists()
    assert not (tree.target / deleted_dir.relative_to(root)).exists()


def test_in_window_verification_sees_a_wrong_listed_file(tree: Tree) -> None:
    """The verification of only the listed files finds a listed file that differs on the target."""
    write_tree(tree.source, 200)
    tracker = tree.tracker()
    tracker.start(timeout=60)
    tree.presync()
    changed = file_path(tree.source, 10)
    changed.write_bytes(b"new" * 1000)
    changes = tracker.changes(timeout=60)
    assert listed(changes.path) == [str(changed.relative_to(tree.source))]
    tree.final_pass(changes.path)
    assert tree.verify_listed(changes.path) == []
    # Same size, same mtime, other bytes: only a checksum sees it.
    copy = tree.target / changed.relative_to(tree.source)
    stat = copy.stat()
    copy.write_bytes(b"old" * 1000)
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    differing = tree.verify_listed(changes.path)
    assert len(differing) == 1 and differing[0].endswith(str(changed.relative_to(tree.source)))


def test_in_window_verification_sees_a_deleted_file_left_on_the_target(tree: Tree) -> None:
    """Files and a directory deleted on the source since the pre-sync are in the list the verification reads: the
    final pass deletes them on the target, and one planted back there (a leftover) is a difference."""
    write_tree(tree.source, 200)
    tracker = tree.tracker()
    tracker.start(timeout=60)
    tree.presync()
    gone_file = file_path(tree.source, 10)
    gone_dir = file_path(tree.source, 20).parent
    if gone_file.parent == gone_dir:
        gone_dir = file_path(tree.source, 30).parent
    gone_file.unlink()
    shutil.rmtree(gone_dir)
    changes = tracker.changes(timeout=60)
    rel_file, rel_dir = str(gone_file.relative_to(tree.source)), str(gone_dir.relative_to(tree.source))
    assert {rel_file, rel_dir} <= set(listed(changes.path))
    stats = rsync.parse_stats(tree.final_pass(changes.path))
    assert stats.deleted >= 2 and not (tree.target / rel_file).exists() and not (tree.target / rel_dir).exists()
    assert tree.verify_listed(changes.path) == []
    assert tree.differences() == []

    # Leftovers: the deleted file back on the target, and the deleted directory with one file in it.
    (tree.target / rel_file).write_bytes(b"stale")
    (tree.target / rel_dir).mkdir()
    (tree.target / rel_dir / "stale.bin").write_bytes(b"stale")
    differing = tree.verify_listed(changes.path)
    assert any(line.startswith("*deleting") and line.endswith(rel_file) for line in differing), differing
    assert any(line.startswith("*deleting") and f"{rel_dir}/stale.bin" in line for line in differing), differing


def test_a_resumed_run_finds_the_running_tracker_and_stop_kills_only_it(tree: Tree) -> None:
    write_tree(tree.source, 50)
    first = tree.tracker()
    assert first.start(timeout=60) is True
    pid = tree.tracker_pid()
    again = tree.tracker()
    assert again.start(timeout=60) is False, "a second start must find the running tracker"
    assert tree.tracker_pid() == pid and again.trust().trusted
    # A pid file that names another process (pid reuse): stop() leaves it alone.
    other = subprocess.Popen(["sleep", "300"])
    try:
        (tree.state_dir / tree.name / "pid").write_text(f"{other.pid}\n")
        assert again.stop() is False
        assert other.poll() is None
        (tree.state_dir / tree.name / "pid").write_text(f"{pid}\n")
        assert again.stop() is True
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), "the tracker to exit")
    finally:
        other.kill()
        other.wait()
    assert any("not running" in reason for reason in again.trust().reasons)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_killed_tracker_is_detected(tree: Tree) -> None:
    write_tree(tree.source, 100)
    tracker = tree.tracker()
    tracker.start(timeout=60)
    tree.presync()
    file_path(tree.source, 1).write_bytes(b"changed")
    os.kill(tree.tracker_pid(), signal.SIGKILL)
    wait_for(lambda: not tracker.trust().trusted, "the death to show")
    file_path(tree.source, 2).write_bytes(b"changed while nobody watched")
    changes = tracker.changes(timeout=60)
    assert not changes.trust.trusted
    assert any("not running" in reason for reason in changes.trust.reasons), changes.trust.reasons
    # Started again (a resumed run): the gap while nobody watched stays reported.
    assert tracker.start(timeout=60) is True
    trust = tracker.trust()
    assert any("started again" in reason for reason in trust.reasons), trust.reasons
    # Only a fresh start (with a new pre-sync) is trusted again.
    tracker.stop()
    tracker.remove()
    tracker.start(timeout=60)
    assert tracker.trust().trusted


def test_a_queue_overflow_is_detected(tree: Tree) -> None:
    """More events than the kernel queues while the tracker cannot read: the overflow is recorded and reported."""
    write_tree(tree.source, 20)
    tracker = tree.tracker()
    tracker.start(timeout=60)
    queue = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    pid = tree.tracker_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        burst = file_path(tree.source, 0).parent
        for index in range(queue // 2 + 100):  # a create and a close_write each
            (burst / f"burst-{index}").write_bytes(b"")
    finally:
        os.kill(pid, signal.SIGCONT)
    events = tree.state_dir / tree.name / "events"
    wait_for(lambda: b"Q_OVERFLOW \0" in events.read_bytes(), "the overflow record")
    trust = tracker.trust()
    assert any("overflowed" in reason for reason in trust.reasons), trust.reasons
    assert not tracker.changes(timeout=60).trust.trusted


def namespaced_inotifywait(tree: Tree, limit: int) -> str:
    """An inotifywait in its own user namespace whose inotify watch limit is `limit`: the machine's limit is never
    touched (a user namespace's limit binds only the processes inside it)."""
    script = tree.source.parent / f"inotifywait-limit-{tree.name}"
    script.write_text(
        "#!/bin/sh\n"
        "exec unshare -U -r sh -c "
        f'\'echo {limit} > /proc/sys/user/max_inotify_watches && exec inotifywait "$@"\' inotifywait "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


def directories(root: Path) -> int:
    return 1 + sum(1 for p in root.rglob("*") if p.is_dir())


def test_the_watch_limit_reached_at_start_is_detected(tree: Tree) -> None:
    write_tree(tree.source, 100)
    tracker = tree.tracker(namespaced_inotifywait(tree, limit=5))
    with pytest.raises(TrackingError, match="watch limit"):
        tracker.start(timeout=60)
    trust = tracker.trust()
    assert any("watch limit was reached" in reason for reason in trust.reasons), trust.reasons
    assert any("not running" in reason for reason in trust.reasons)
    assert int(Path("/proc/sys/fs/inotify/max_user_watches").read_text()) > 5, "the machine's limit is untouched"


def test_a_new_directory_past_the_watch_limit_is_detected(tree: Tree) -> None:
    write_tree(tree.source, 100)
    tracker = tree.tracker(namespaced_inotifywait(tree, limit=directories(tree.source)))
    tracker.start(timeout=60)
    assert tracker.trust().trusted
    (tree.source / "later" / "deeper").mkdir(parents=True)
    changes = tracker.changes(timeout=60)  # the barrier: the tracker has handled the new directory by now
    assert any("not watched" in reason for reason in changes.trust.reasons), changes.trust.reasons


def test_the_load_rewrites_uploads_in_place_and_verify_checks_the_last_version(lab: LabState, tmp_path: Path) -> None:
    out = tmp_path / "load"
    stats = main_load(lab, duration=3, rate=40, clients=2, dns_ttl=1, upload_every=1, out=out, overwrite_every=2)
    uploads = [a for a in read_acks(out / ACKS_FILE) if a["kind"] == "upload"]
    names = [a["name"] for a in uploads]
    rewritten = {name for name in names if names.count(name) > 1}
    assert rewritten, "some uploads must have been written again under the same name"
    last = {a["name"]: a["sha256"] for a in uploads}
    assert any(a["sha256"] != last[a["name"]] for a in uploads if a["name"] in rewritten)
    assert stats.uploads_acked == len(uploads)
    report = main_verify(lab, host="source", load_dir=out)
    assert report.ok, report.lost
    assert report.uploads_acknowledged == len(last)


def test_the_load_deletes_uploads_and_verify_sees_a_deleted_one_come_back(lab: LabState, tmp_path: Path) -> None:
    out = tmp_path / "load"
    stats = main_load(lab, duration=4, rate=40, clients=2, dns_ttl=1, upload_every=1, out=out, delete_every=2)
    acks = read_acks(out / ACKS_FILE)
    deleted = [a["name"] for a in acks if a["kind"] == "upload_deleted"]
    assert deleted and stats.uploads_deleted == len(deleted)
    assert all(not (lab.source.uploads / name).exists() for name in deleted)
    report = main_verify(lab, host="source", load_dir=out)
    assert report.ok and report.uploads_deleted == len(set(deleted)), report.lost
    # A deleted upload back on disk (what a final pass that missed the delete would leave) is an acknowledged write
    # lost.
    back = lab.source.uploads / deleted[0]
    back.write_bytes(b"stale")
    try:
        report = main_verify(lab, host="source", load_dir=out)
    finally:
        back.unlink()
    assert report.deletes_undone == 1 and report.acknowledged_lost == 1
    assert report.lost == [f"deleted upload {deleted[0]} is back (file)"]
