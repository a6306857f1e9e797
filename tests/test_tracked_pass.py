"""The tracked final pass's pure parts: rsync's vanished-file exits, itemized paths, the incremental trust scan, and
what the report says about where each check ran; the datadir's warm-up before the window."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from orchestrator.plan.model import FileTree
from orchestrator.report.build import build_report, checks_where, final_pass_trees
from orchestrator.results import TreeFigures
from orchestrator.services.tracking import ChangeTracker, tracker_name
from orchestrator.steps.db_presync import warm_command, warm_outcome
from orchestrator.steps.files_final import compared_after_pass, pass_then_compare
from orchestrator.steps.verify_target import VerifyTarget, tree_verification
from orchestrator.transports import rsync
from tests.fakes import LocalHost
from tests.test_transports import minimal_plan

PLAN = minimal_plan()
TREE = FileTree.model_validate({"name": "uploads", "source": "/srv/uploads", "target": "/srv/uploads"})
SCOPE = "the 40 path(s) the final pass copied or deleted, 3 of them deleted on the target"
UPLOADS = {"mode": "tracked", "listed": 40, "files": 31, "deleted": 3, "bytes": 9000, "change_list": "/x/l"}


def test_exit_23_counts_as_vanished_only_when_every_error_is_a_vanished_file() -> None:
    vanished = (
        'file has vanished: "/srv/up/a/b.bin"\n'
        "rsync error: some files/attrs were not transferred (see previous errors) (code 23) at main.c(1338)\n"
    )
    assert rsync.only_vanished(vanished)
    denied = vanished + 'rsync: [sender] send_files failed to open "/srv/up/c": Permission denied (13)\n'
    assert not rsync.only_vanished(denied)
    assert not rsync.only_vanished("rsync error: some files/attrs were not transferred (code 23)\n")
    assert not rsync.only_vanished("")


def test_itemized_lines_give_their_paths_and_directory_times_are_not_differences() -> None:
    assert rsync.item_path(">f.st...... a/b c.bin") == "a/b c.bin"
    assert rsync.item_path("*deleting   gone/") == "gone"
    assert rsync.item_path("cd+++++++++ new/") == "new"
    assert rsync.item_path(".d..t...... old/") is None
    assert rsync.item_path("     1,234  45%    1.00MB/s    0:00:01 (xfr#1, to-chk=0/3)") is None


def test_trust_reads_each_event_once_and_a_record_still_being_written_next_time(tmp_path: Path) -> None:
    root, state = tmp_path / "tree", tmp_path / "state"
    root.mkdir()
    tracker = ChangeTracker(LocalHost(), str(root), str(state), name="t")  # type: ignore[arg-type]
    Path(tracker.dir).mkdir(parents=True)
    Path(tracker.pid_file).write_text("0\n")
    events = Path(tracker.events_file)
    events.write_bytes(b"CREATE ./a\0MODIFY ./b\0Q_OVERF")  # the last record is cut mid-write
    first = tracker.trust()
    assert not any("overflowed" in r for r in first.reasons), first
    assert Path(tracker.scan_file).read_text().split() == ["22", "0", "0"]
    with events.open("ab") as out:
        out.write(b"LOW \0DELETE_SELF ./\0")
    second = tracker.trust()
    assert any("overflowed" in r for r in second.reasons), second
    assert any("moved, deleted or unmounted" in r for r in second.reasons), second
    assert Path(tracker.scan_file).read_text().split() == [str(events.stat().st_size), "1", "1"]


def test_tracker_names_differ_per_root_and_stay_plain() -> None:
    one = tracker_name("shop", "uploads", "/srv/a")
    assert one != tracker_name("shop", "uploads", "/srv/b")
    assert tracker_name("shop prod/é", "up loads", "/srv/a").replace("-", "").replace("_", "").isalnum()


def test_the_in_window_check_covers_the_paths_deleted_since_the_presync() -> None:
    """The tracked verification reads the same list as the final pass, deletions included (rsync itemizes a listed
    path gone from the source but still on the target as '*deleting'), and says how many were deleted."""
    command, scope = tree_verification(PLAN, TREE, TreeFigures.model_validate(UPLOADS))
    argv = shlex.split(command or "")
    assert {"--dry-run", "--checksum", "--delete-missing-args", "--files-from=/x/l"} <= set(argv)
    assert scope == SCOPE
    stats = rsync.parse_stats("Number of files: 4 (reg: 3, dir: 1)\nNumber of deleted files: 3 (reg: 2, dir: 1)\n")
    assert stats.deleted == 3


def test_the_comparison_rides_the_pass_and_its_answer_is_the_verification(tmp_path: Path) -> None:
    """Run for real: the pass over the list, then in the same command the --dry-run --checksum of the same paths;
    the pass's figures and status come back as before, the comparison's items apart (none: equal). A comparison that
    fails is no answer (verify_target compares then), and a failed pass runs no comparison."""
    from orchestrator.services.tracking import final_pass_command, verify_listed_command

    src, dst, other = tmp_path / "src", tmp_path / "dst", tmp_path / "other"
    for d in (src, dst, other):
        d.mkdir()
    (src / "a.jpg").write_text("new")
    (src / "b.jpg").write_text("b")
    (other / "a.jpg").write_text("old")
    listed = tmp_path / "list"
    listed.write_bytes(b"a.jpg\0b.jpg\0gone.jpg\0")

    def run(command: str) -> tuple[int, str]:
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr

    passing = final_pass_command(str(src), str(dst), str(listed))
    code, out = run(pass_then_compare(passing, verify_listed_command(str(src), str(dst), str(listed))))
    output, differing = compared_after_pass(out)
    assert code == 0 and differing == [] and (dst / "a.jpg").read_text() == "new"
    assert rsync.parse_stats(output).files_transferred == 2
    code, out = run(pass_then_compare(passing, verify_listed_command(str(src), str(other), str(listed))))
    found = compared_after_pass(out)[1] or []
    assert code == 0 and [item.split(" ", 1)[1] for item in found] == ["a.jpg", "b.jpg"]
    code, out = run(pass_then_compare(passing, "false"))
    assert code == 0 and compared_after_pass(out)[1] is None
    code, out = run(pass_then_compare("exit 12", "echo '>fcsT.... never'"))
    assert code == 12 and compared_after_pass(out) == (out.partition("--compared--\n")[0], None)


def test_verify_reads_the_comparison_made_with_the_pass(tmp_path: Path) -> None:
    """A tree the pass's command compared: verify_target runs no command of its own and reports what it found."""
    from types import SimpleNamespace

    from orchestrator.engine.step import StepContext
    from orchestrator.results import FilesResult
    from tests.fakes import RecordingHost
    from tests.test_frontdoor import QuietLog

    figures = TreeFigures.model_validate({**UPLOADS, "differing": 7, "differing_items": [f"f{i}" for i in range(7)]})
    plan = PLAN.model_copy(update={"files": [TREE]})
    source = RecordingHost()
    rt = SimpleNamespace(plan=plan, source=source, target=RecordingHost())
    ctx = StepContext(run_id="r", step="verify_target", dry_run=False, rt=rt, log=QuietLog())
    ctx.window = SimpleNamespace(check=lambda *_: None, timeout=lambda *_: None)  # type: ignore[assignment]
    ctx.output = lambda step: FilesResult(trees={"uploads": figures}).journal()  # type: ignore[method-assign]
    found, problems = VerifyTarget().trees(ctx)
    assert source.commands == []
    assert found["trees_differing_items"] == {"uploads": 7} and found["trees_verified"] == {"uploads": SCOPE}
    assert problems == ["tree uploads differs: f0, f1, f2, f3, f4 and 2 more"]


def test_the_report_says_how_the_final_pass_worked_and_where_each_check_ran() -> None:
    uploads = TreeFigures.model_validate(UPLOADS)
    outputs = {
        "files_presync": {"trees": {"uploads": {"entries": 100_100, "compared": {"differing": 12, "seconds": 9.5}}}},
        "files_final": {
            "trees": {
                "uploads": UPLOADS,
                "media": {"mode": "full_scan", "fallback_reason": "the tracker is not running", "entries": 7},
            }
        },
        "verify_target": {
            "health_tries": {"http": 1},
            "trees_differing_items": {"uploads": 0, "media": 0},
            "trees_verified": {"uploads": tree_verification(PLAN, TREE, uploads)[1], "media": "the whole tree"},
        },
    }
    trees = final_pass_trees(outputs)
    assert trees["uploads"]["mode"] == "tracked" and trees["uploads"]["paths_listed"] == 40
    assert trees["uploads"]["deleted"] == 3
    assert trees["media"]["fallback_reason"] == "the tracker is not running"
    where = {c["check"]: c["where"] for c in checks_where(outputs)}
    assert where == {
        "tree uploads: every file's checksum": "before",
        f"tree uploads: checksums of {SCOPE}": "inside",
        "tree media: checksums of the whole tree": "inside",
        "health checks": "inside",
    }


def test_the_report_carries_the_peak_rss_finish_recorded() -> None:
    events = [
        {"event": "run_started", "run_id": "r1", "ts": 1.0, "plan_sha256": "0", "plan_path": "p.yaml"},
        {"event": "step_started", "step": "finish", "ts": 2.0},
        {"event": "step_completed", "step": "finish", "ts": 3.0, "result": {"peak_rss_mib": 81.5}},
        {"event": "run_completed", "ts": 4.0},
    ]
    assert build_report(events, now=5.0)["peak_rss_mib"] == 81.5


def test_peak_rss_is_the_runs_own_not_the_size_of_the_process_that_started_it() -> None:
    """ru_maxrss survives execve: a run started by a large process must still report its own peak."""
    parent = (
        "import subprocess, sys\n"
        "ballast = bytearray(300 << 20)\n"
        "ballast[:: 4096] = b'x' * len(ballast[:: 4096])\n"
        "code = 'from orchestrator.steps.finish import peak_rss_mib; print(peak_rss_mib())'\n"
        "print(subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout)\n"
    )
    done = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, check=True, timeout=120)
    assert float(done.stdout.strip()) < 200, done.stdout


def test_the_datadir_warm_up_reads_the_listed_files_only_when_they_fit_in_memory(tmp_path: Path) -> None:
    """The files the final pass will read are read before the window (into the page cache), unless they would take
    more than the allowed share of the host's available memory; names with spaces are read whole."""
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "hot table.ibd").write_bytes(b"x" * 70_000)
    (tmp_path / "ib_logfile0").write_bytes(b"y" * 30_000)
    listing = "db/hot table.ibd\0ib_logfile0\0gone.ibd\0"
    done = subprocess.run(["sh", "-c", warm_command(str(tmp_path))], input=listing, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split() == ["warmed=100000"], done
    assert warm_outcome(done.stdout, 0.25) == "warmed 100000 bytes in 0.2 s"
    huge = subprocess.run(
        ["sh", "-c", warm_command(str(tmp_path), share=10**15)], input=listing, capture_output=True, text=True
    )
    assert huge.stdout.startswith("skipped=100000 available="), huge
    assert warm_outcome(huge.stdout, 0.0).startswith("skipped: 100000 bytes, more than 1/4 of ")
