"""Change tracking, offline: the event records, the trust verdicts and the rsync command lines."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from migrate_lab.uploads_tree import TREE_SEED, file_path, write_tree
from orchestrator.services import tracking
from orchestrator.services.tracking import (
    changed_paths,
    final_pass_command,
    parse_event,
    stderr_problems,
    trust_from_probe,
    untrusted_filesystems,
    verify_listed_command,
)

READY = "Setting up watches.  Beware: since -r was given, this may take a while!\nWatches established.\n"
LOCAL_MOUNTS = "ext4 /\nproc /proc\ntmpfs /run\n"


def healthy_probe(**changes: str) -> dict[str, str]:
    probe = {"started": "1", "alive": "1", "events_bytes": "120", "overflows": "0", "root_gone": "0"}
    probe["statfs"] = "ext2/ext3"
    return {**probe, **changes}


def test_event_records_keep_any_name_whole() -> None:
    assert parse_event("CLOSE_WRITE,CLOSE ./a/b/f.bin") == (frozenset({"CLOSE_WRITE", "CLOSE"}), "a/b/f.bin")
    assert parse_event("CREATE ./with space [1]\nand newline") == (
        frozenset({"CREATE"}),
        "with space [1]\nand newline",
    )
    # The root itself (a chmod of the tree) and a directory's own event (trailing slash).
    assert parse_event("ATTRIB,ISDIR ./") == (frozenset({"ATTRIB", "ISDIR"}), ".")
    assert parse_event("MOVE_SELF ./a/e/") == (frozenset({"MOVE_SELF"}), "a/e")
    assert parse_event("Q_OVERFLOW ") == (frozenset({"Q_OVERFLOW"}), ".")
    with pytest.raises(ValueError):
        parse_event("./no-events")
    with pytest.raises(ValueError):
        parse_event("lower ./x")


def test_changed_paths_are_unique_sorted_and_skip_the_overflow_marker() -> None:
    records = [
        "CREATE ./a/x",
        "CLOSE_WRITE,CLOSE ./a/x",
        "MOVED_FROM,ISDIR ./a/d",
        "MOVED_TO,ISDIR ./a/e",
        "MOVE_SELF ./a/e/",
        "DELETE ./a/x",
        "Q_OVERFLOW ",
        "CREATE ./b\nc",
    ]
    assert changed_paths(records) == ["a/d", "a/e", "a/x", "b\nc"]


def test_paths_below_a_listed_directory_are_left_to_its_recursion() -> None:
    records = ["DELETE ./a/b/x", "DELETE,ISDIR ./a/b", "DELETE,ISDIR ./a", "CREATE ./a-b", "CREATE ./ab/c"]
    assert changed_paths(records) == ["a", "a-b", "ab/c"]
    assert changed_paths(["CREATE ./x", "ATTRIB,ISDIR ./"]) == ["."]


def test_stderr_names_lost_watches() -> None:
    limit = (
        "Setting up watches.  Beware: since -r was given, this may take a while!\n"
        "Failed to watch .; upper limit on inotify watches reached!\n"
        "Please increase the amount of inotify watches allowed per user via `/proc/sys/fs/inotify/max_user_watches'.\n"
    )
    problems = stderr_problems(limit)
    assert len(problems) == 1 and "watch limit" in problems[0]
    later = READY + "Couldn't watch new directory ./a/new: No space left on device\n"
    assert stderr_problems(later) == ["a directory is not watched: Couldn't watch new directory ./a/new: "
                                      "No space left on device"]  # fmt: skip
    assert stderr_problems(READY) == []


def test_a_healthy_tracker_is_trusted() -> None:
    trust = trust_from_probe("/srv/uploads", healthy_probe(), READY, LOCAL_MOUNTS)
    assert trust.trusted and trust.reasons == () and trust.events_bytes == 120


@pytest.mark.parametrize(
    ("probe", "stderr", "says"),
    [
        (healthy_probe(alive="0"), READY, "not running"),
        (healthy_probe(overflows="1"), READY, "overflowed"),
        (healthy_probe(root_gone="1"), READY, "moved, deleted or unmounted"),
        (healthy_probe(), "Setting up watches.  Beware: since -r was given, this may take a while!\n", "setting up"),
        (healthy_probe(started="0"), "", "no tracker"),
        (healthy_probe(gaps="1"), READY, "started again"),
    ],
)
def test_each_reason_for_distrust_is_named(probe: dict[str, str], stderr: str, says: str) -> None:
    trust = trust_from_probe("/srv/uploads", probe, stderr, LOCAL_MOUNTS)
    assert not trust.trusted
    assert any(says in reason for reason in trust.reasons), trust.reasons


def test_network_filesystems_are_not_trusted() -> None:
    # findmnt -rn -o FSTYPE,TARGET escapes spaces as \x20.
    mounts = "ext4 /\nnfs4 /srv\nfuse.sshfs /mnt/remote\\x20share\next4 /srv/local\ncifs /srv/uploads/archive\n"
    assert untrusted_filesystems("/srv/uploads", mounts, "nfs") == [
        "/srv is on nfs4",
        "/srv/uploads/archive is on cifs",
    ]
    assert untrusted_filesystems("/mnt/remote share/files", mounts, "fuse") == ["/mnt/remote share is on fuse.sshfs"]
    # A local mount nearer the root wins over the network one above it.
    assert untrusted_filesystems("/srv/local/up", mounts, "ext2/ext3") == []
    # Without findmnt, the filesystem type of the root alone still says it.
    assert untrusted_filesystems("/srv/uploads", "", "nfs") == ["/srv/uploads is on nfs"]
    assert untrusted_filesystems("/data", "fuseblk /data\n", "fuseblk") == []
    trust = trust_from_probe("/srv/uploads", healthy_probe(statfs="nfs"), READY, mounts)
    assert not trust.trusted and any("other clients' writes" in r for r in trust.reasons)


def test_final_pass_command_copies_and_deletes_only_the_listed_paths() -> None:
    ssh = "ssh -o BatchMode=yes -p 2222"
    command = final_pass_command(
        "/srv/up load",
        "root@10.0.0.3:/srv/uploads",
        "/var/tmp/list",
        ssh=ssh,
        exclude=["*.tmp"],
        chown="www-data:www-data",
        timeout=30,
        whole_file=True,
    )
    argv = shlex.split(command)
    assert argv[0] == "rsync" and argv[-2:] == ["/srv/up load/", "root@10.0.0.3:/srv/uploads/"]
    for flag in ("-a", "-r", "--delete", "--delete-missing-args", "--from0", "--files-from=/var/tmp/list",
                 "--modify-window=-1", "--chown=www-data:www-data", "--timeout=30", "--whole-file",
                 "--exclude=*.tmp", "--stats"):  # fmt: skip
        assert flag in argv, flag
    assert argv[argv.index("-e") + 1] == ssh
    assert "--dry-run" not in argv and "--no-inc-recursive" not in argv


def test_verify_command_checksums_only_the_listed_paths_and_changes_nothing() -> None:
    argv = shlex.split(verify_listed_command("/a", "/b", "/l", exclude=["x"]))
    for flag in ("--dry-run", "--checksum", "--itemize-changes", "--files-from=/l", "--from0",
                 "--delete-missing-args", "-r", "--exclude=x"):  # fmt: skip
        assert flag in argv, flag
    assert "-e" not in argv and argv[-2:] == ["/a/", "/b/"]


def test_start_command_records_the_trackers_own_pid_and_asks_for_overflows() -> None:
    tracker = tracking.ChangeTracker(_NoHost(), "/srv/up's", "/var/lib/migrate/track", name="uploads")
    command = tracker.start_command()
    assert "echo $$ >" in command and "exec inotifywait -m -r --no-newline" in command
    assert "-e q_overflow" in command and "setsid" in command
    assert tracker.events_file == "/var/lib/migrate/track/uploads/events"
    with pytest.raises(ValueError):
        tracking.ChangeTracker(_NoHost(), "relative", "/x", name="a")
    with pytest.raises(ValueError):
        tracking.ChangeTracker(_NoHost(), "/x", "/y", name="../a")


class _NoHost:
    def run(self, command: str, *, timeout: float | None = None, check: bool = True) -> tracking.CommandResult:
        raise AssertionError("no command runs here")


def test_uploads_tree_is_reproducible_and_spread(tmp_path: Path) -> None:
    assert write_tree(tmp_path / "a", 300) == 300
    assert write_tree(tmp_path / "b", 300, seed=TREE_SEED) == 300
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.bin"))
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*.bin"))
    assert files_a == files_b and len(files_a) == 300
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files_a)
    sizes = [(tmp_path / "a" / f).stat().st_size for f in files_a]
    assert min(sizes) >= 1024 and max(sizes) <= 16 * 1024
    assert len({f.parts[0] for f in files_a}) > 8 and all(len(f.parts) == 3 for f in files_a)
    assert file_path(tmp_path / "a", 0).exists()
    # Made again: nothing rewritten.
    assert write_tree(tmp_path / "a", 300) == 0


def test_a_tree_of_smaller_files_keeps_its_names_and_sizes_within_the_bounds(tmp_path: Path) -> None:
    assert write_tree(tmp_path / "small", 300, sizes=(64, 512)) == 300
    sizes = [path.stat().st_size for path in (tmp_path / "small").rglob("*.bin")]
    assert len(sizes) == 300 and min(sizes) >= 64 and max(sizes) <= 512 and len(set(sizes)) > 10
    assert (tmp_path / "small" / file_path(Path(), 7)).is_file()
    with pytest.raises(ValueError, match="file sizes"):
        write_tree(tmp_path / "bad", 1, sizes=(512, 64))


def test_a_command_after_the_list_rides_its_round_trip(tmp_path: Path) -> None:
    """`changes(then=...)`: the final pass runs in the list's own command once the list is made and not empty,
    after the trust probe; what it printed and its exit come back apart from the list's figures."""
    from tests.fakes import LocalHost

    root, state = tmp_path / "tree", tmp_path / "state"
    root.mkdir()
    tracker = tracking.ChangeTracker(LocalHost(), str(root), str(state), name="t")
    assert tracker.start(timeout=30)
    try:
        tracker.wait_ready(timeout=30)
        empty = tracker.changes(timeout=30, then="echo never")
        assert empty.count == 0 and empty.then is None and empty.trust.trusted
        (root / "a file").write_text("x")
        then = f"tr '\\000' '\\n' < {tracker.list_file}; echo 'Number of files: 1'; exit 3"
        changes = tracker.changes(timeout=30, then=then)
        assert changes.count >= 1 and changes.trust.trusted, changes.trust.reasons
        assert changes.then is not None and changes.then[0] == 3
        assert "a file\n" in changes.then[1] and changes.then[1].endswith("Number of files: 1\n")
    finally:
        tracker.stop()


def test_the_one_process_list_is_the_documented_list_and_its_probe_the_shells(tmp_path: Path) -> None:
    """The change list's command (one perl process and sort) lists what `changed_paths` says for the same events,
    names with newlines, spaces and backslashes whole, the extra list added, a directory's children left to its
    recursion; and its trust probe prints what `probe_command`'s shell prints, the mounts (findmnt's) included."""
    from tests.fakes import LocalHost

    root, state = tmp_path / "tree", tmp_path / "state"
    root.mkdir()
    host = LocalHost()
    tracker = tracking.ChangeTracker(host, str(root), str(state), name="t")
    assert tracker.start(timeout=30)
    try:
        (root / "d").mkdir()
        (root / "d" / "inner").write_text("x")
        (root / "line\nbreak").write_text("x")
        (root / "a b\\c").write_text("x")
        (root / "gone").write_text("x")
        (root / "gone").unlink()
        (root / "e").mkdir()
        (root / "e" / "f").write_text("x")
        Path(tracker.extra_file).write_bytes(b"extra/one\0e/f\0")
        changes = tracker.changes(timeout=30)
        assert changes.trust.trusted, changes.trust.reasons
        events = Path(tracker.events_file).read_bytes().decode("utf-8", "surrogateescape").split("\0")
        records = [r for r in events if r and tracking.BARRIER_PREFIX not in r]
        expected = changed_paths([*records, "CREATE ./extra/one", "CREATE ./e/f"])
        listed = Path(tracker.list_file).read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1]
        assert listed == expected and changes.count == len(expected)
        assert {"d", "line\nbreak", "a b\\c", "gone", "e", "extra/one"} <= set(listed) and "d/inner" not in listed
        # The probe: the same as the shell's, read right after (nothing new in between but a barrier).
        shell = host.run(tracker.probe_command(), check=False).stdout
        perl = host.run(tracker.changes_command(tracker.list_file, wait=30), check=False).stdout
        perl_probe = perl.partition(f"\n{tracking.PROBE_MARK}\n")[2]
        head, _, rest = shell.partition("--stderr--\n")
        perl_head, _, perl_rest = perl_probe.partition("--stderr--\n")
        # (events_bytes grows by the second barrier's records; statfs is read only without a mount table)
        same = {"statfs": "", "events_bytes": ""}
        assert tracking.parse_probe(perl_head) | same == tracking.parse_probe(head) | same
        stderr, _, mounts = rest.partition("--mounts--\n")
        perl_stderr, _, perl_mounts = perl_rest.partition("--mounts--\n")
        assert perl_stderr == stderr and mine(perl_mounts, tmp_path) == mine(mounts, tmp_path)
    finally:
        tracker.stop()


def mine(mounts: str, tmp_path: Path) -> list[str]:
    """The mount table's lines but those of other tests' own directories (the table is the machine's: a test
    running beside this one may mount or unmount its tmpfs between the two reads)."""
    return sorted(line for line in mounts.splitlines() if "/pytest-of-" not in line or str(tmp_path) in line)


def test_a_list_since_an_earlier_ones_end_holds_only_later_changes_and_the_extra_list(tmp_path: Path) -> None:
    """What the final pass asks after the replicate mode's checked pre-window pass: the changes recorded after that
    pass's list ended, and the extra list (what its check found different), nothing of before."""
    from tests.fakes import LocalHost

    root, state = tmp_path / "tree", tmp_path / "state"
    root.mkdir()
    tracker = tracking.ChangeTracker(LocalHost(), str(root), str(state), name="t")
    assert tracker.start(timeout=30)
    try:
        tracker.wait_ready(timeout=30)
        (root / "before").write_text("x")
        first = tracker.changes(timeout=30)
        assert first.trust.trusted and first.count == 1 and first.end is not None
        (root / "after").write_text("x")
        Path(tracker.extra_file).write_bytes(b"still-different\0")
        later = tracker.changes(timeout=30, since=first.end)
        listed = Path(tracker.list_file).read_bytes().split(b"\0")[:-1]
        assert later.trust.trusted and sorted(listed) == [b"after", b"still-different"], listed
        assert later.end is not None and later.end > first.end
        everything = tracker.changes(timeout=30)  # since 0: the whole story, as before
        assert sorted(Path(tracker.list_file).read_bytes().split(b"\0")[:-1]) == [b"after", b"before",
                                                                               b"still-different"]  # fmt: skip
        assert everything.count == 3
    finally:
        tracker.stop()
