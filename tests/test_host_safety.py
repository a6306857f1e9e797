"""Host safety: nothing of a run under a name another account on the host can take first or replace.

What a run leaves on a host (the guard and its script, the commit's record, control sockets, pid and lock files,
the rsync route's files) lives in the run's private directory there (the plan's `run_dir`: /var/lib/migrate for
root), made mode 0700 and proven the account's own before anything is written in it. Here, for real with `sh` as
root on this machine: the directory check refuses what another account planted (a link, a directory of theirs, a
FIFO), the guard never runs a script it did not write, the plan refuses a `run_dir` others can write in, and no
host-side command of the package names a fixed path in a world-writable directory.
"""

from __future__ import annotations

import ast
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator import exit_codes
from orchestrator.plan.model import SHARED_DIRECTORIES
from orchestrator.services import guard, owned
from tests.conftest import ROOT
from tests.fakes import LocalHost

NOBODY = 65534
PACKAGE = ROOT / "orchestrator"


def check(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", owned.private_dir_command(str(directory))], capture_output=True, text=True)


@pytest.fixture
def as_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("these checks plant another account's files: they run as root (as the suite does here)")


def test_a_fresh_private_directory_is_made_0700_and_ours(tmp_path: Path, as_root: None) -> None:
    private = tmp_path / "base" / "migrate"
    done = check(private)
    assert done.returncode == 0, done
    info = private.lstat()
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
    private.chmod(0o755)  # one of ours made too open: closed again
    assert check(private).returncode == 0 and stat.S_IMODE(private.lstat().st_mode) == 0o700


@pytest.mark.parametrize("planted", ["symlink", "their_directory", "fifo"])
def test_a_private_directory_another_account_planted_is_refused_and_left_alone(
    tmp_path: Path, planted: str, as_root: None
) -> None:
    private = tmp_path / "migrate"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if planted == "symlink":
        private.symlink_to(elsewhere)
    elif planted == "their_directory":
        private.mkdir()
        private.chmod(0o777)
        os.chown(private, NOBODY, NOBODY)
    else:
        os.mkfifo(private)
    done = check(private)
    assert done.returncode == 3 and owned.UNSAFE_DIR in done.stdout, done
    assert list(elsewhere.iterdir()) == []
    if planted == "their_directory":
        assert private.lstat().st_uid == NOBODY and stat.S_IMODE(private.lstat().st_mode) == 0o777


def _guard_plan(directory: Path) -> guard.GuardPlan:
    return guard.GuardPlan(
        directory=str(directory), deadline=time.time() + 3600, db_start="true", db_stop="true", fence_off="true"
    )


def test_the_guard_never_starts_in_a_directory_it_cannot_prove_its_own(tmp_path: Path, as_root: None) -> None:
    """Another account made the base first (a directory of theirs, with their guard.sh waiting in it): the start
    is refused, nothing of theirs is run or written through."""
    base = tmp_path / "migrate"
    base.mkdir(mode=0o777)
    os.chown(base, NOBODY, NOBODY)
    theirs = base / f"{owned.GUARD_PREFIX}x-aaa111"
    theirs.mkdir(mode=0o777)
    marker = tmp_path / "ran"
    (theirs / "guard.sh").write_text(f"touch {marker}\n")
    with pytest.raises(Exception, match="status 3"):
        guard.start(LocalHost(), _guard_plan(theirs), timeout=10)  # type: ignore[arg-type]
    time.sleep(0.2)
    assert not marker.exists() and (theirs / "guard.sh").read_text() == f"touch {marker}\n"


def test_the_guard_runs_the_script_it_wrote_whatever_had_its_name(tmp_path: Path, as_root: None) -> None:
    """A FIFO (or anything) left at guard.sh's name in the run's own directory: replaced, and the guard that runs
    is the run's (its pid file written by its own first line)."""
    directory = tmp_path / "migrate" / f"{owned.GUARD_PREFIX}x-aaa111"
    directory.mkdir(parents=True, mode=0o700)
    directory.parent.chmod(0o700)
    os.mkfifo(directory / "guard.sh")
    pid = guard.start(LocalHost(), _guard_plan(directory), timeout=10)  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + 10
        while not (directory / guard.PID).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (directory / guard.PID).read_text().strip() == str(pid)
        assert stat.S_ISREG((directory / "guard.sh").lstat().st_mode)
    finally:
        os.kill(pid, 9)


@pytest.mark.parametrize("where", ["/tmp/migrate", "/var/tmp", "/dev/shm/x", "relative/dir"])
def test_the_plan_refuses_a_run_dir_others_can_write_in(tmp_path: Path, where: str, migrate_here: object) -> None:
    plan = tmp_path / "plan.yaml"
    text = (ROOT / "plans" / "course-review.yaml").read_text()
    plan.write_text(text.replace("  user: root\n", f"  user: root\n  run_dir: {where}\n", 1))
    res = migrate_here("validate", str(plan))  # type: ignore[operator]
    assert res.returncode == exit_codes.BAD_INPUT, res
    (line,) = res.stderr.strip().splitlines()
    assert "run_dir" in line and f"{plan}:" in line, line


def _constants(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are no docstring."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def fixed_shared_names(root: Path = PACKAGE) -> list[str]:
    """Every host-side string that names a file under a world-writable directory by a name of its own (a name
    `mktemp` makes is not fixed)."""
    shared = [*(f"{d}/" for d in SHARED_DIRECTORIES), "${TMPDIR"]
    found = []
    for path in sorted(root.rglob("*.py")):
        for line, value in _constants(path):
            if any(prefix in value for prefix in shared) and "mktemp" not in value:
                found.append(f"{path.relative_to(root.parent)}:{line}: {value[:80]}")
    return found


def test_no_host_command_names_a_fixed_path_in_a_world_writable_directory() -> None:
    assert fixed_shared_names() == []


def test_the_scan_finds_a_planted_fixed_name(tmp_path: Path) -> None:
    package = tmp_path / "orchestrator"
    package.mkdir()
    (package / "planted.py").write_text('"""Doc: /tmp/doc is fine."""\nCONTROL = "/tmp/migrate-ssh-%C"\n')
    assert fixed_shared_names(package) == ["orchestrator/planted.py:2: /tmp/migrate-ssh-%C"]


@pytest.mark.parametrize(("user", "refused"), [("root", []), ("nobody", ["rsync", "sh"])])
def test_preflight_reads_what_sudo_lets_the_hops_user_run(user: str, refused: list[str], as_root: None) -> None:
    """Run for real through this machine's sudo: root's rules allow everything; nobody's allow nothing, and each
    refused program is named (preflight makes one line of each)."""
    from orchestrator.steps.preflight import HOP_SUDO_PROGRAMS, sudo_check_command, sudo_refused

    done = subprocess.run(
        ["sh", "-c", sudo_check_command(user, HOP_SUDO_PROGRAMS)], capture_output=True, text=True, check=True
    )
    assert sudo_refused(done.stdout, HOP_SUDO_PROGRAMS) == refused
