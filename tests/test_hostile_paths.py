"""Hostile names on the lab: a path reaches rsync and ssh exactly as written, or is refused at validation.

Each tree is copied by the real transport (rsync on the source, over ssh, into the target) and then compared; the
content must land at the path written, byte for byte, and nothing beside it may change (the neighbouring
directories are hashed before and after). Names that cannot be a path (NUL) or that could be read as something else
(newline, ESC, DEL, C1) are refused by `migrate validate` with one line and exit 2.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from ruamel.yaml import YAML

from migrate_lab.state import LabState
from orchestrator.plan.model import Plan
from orchestrator.runtime import Runtime
from orchestrator.transports import rsync
from orchestrator.transports.ssh import SshHost
from tests.engine.world import Result

MIGRATE = Path(sys.executable).parent / "migrate"

# Names a user could write that must reach the target exactly as written.
HOSTILE_NAMES = [
    "red]",
    "]",
    ":100:",
    'it\'s "quoted"',
    "$(touch PWNED)",
    "`touch PWNED`",
    "a;touch PWNED",
    "with space",
    " leading space",
    "-e sh",
    "--delete",
    "ünïcødé 🚀",
    "back\\slash",
    "100%d",
    "{a,b}",
    "~",
]
# Names rsync would read as a pattern on the host (with or without -s): '[red]' is synced into an existing 'r'.
WILDCARD_NAMES = ["[red]", "[/]", "*", "a?b"]
# What each would be confused with if a shell or rsync reinterpreted it: they must survive untouched.
NEIGHBOURS = ["r", "e", "d", "red", "[red", "ab", "a", "b", "PWNED", "with", "space", "-e", "sh", "100", "e sh", "x"]


def tree_digest(root: Path, skip: set[Path] | None = None) -> str:
    """Every name, type, mode and content under `root` (except the `skip` subtrees), as one hash."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if here / d not in (skip or set()))
        for name in sorted(dirnames + filenames):
            path = here / name
            info = path.lstat()
            digest.update(f"{path.relative_to(root)!r} {info.st_mode:o} {info.st_size}\n".encode())
            if path.is_file() and not path.is_symlink():
                digest.update(path.read_bytes())
    return digest.hexdigest()


def fill(directory: Path, tag: str) -> dict[str, bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    files = {"file.txt": f"content of {tag}\n".encode(), "sub/nested [x].bin": os.urandom(64)}
    for relative, data in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


@pytest.fixture
def lab_env(lab: LabState, monkeypatch: pytest.MonkeyPatch) -> LabState:
    for key, value in lab.secrets().items():
        monkeypatch.setenv(key, value)
    return lab


@pytest.fixture
def lab_plan(lab_env: LabState) -> Plan:
    return Plan.model_validate(YAML(typ="safe").load(lab_env.plan_file.read_text()))


@pytest.fixture
def arena(lab: LabState) -> Iterator[tuple[Path, Path]]:
    """A fresh directory on each host for this test, removed afterwards."""
    name = f"hostile-{uuid.uuid4().hex[:8]}"
    source, target = lab.source.path / name, lab.target.path / name
    try:
        yield source, target
    finally:
        shutil.rmtree(source, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)


def plan_with_tree(plan: Plan, source_dir: str, target_dir: str, **changes: Any) -> Plan:
    data = plan.model_dump(mode="python")
    data["files"] = [{"name": "hostile", "source": source_dir, "target": target_dir}]
    for section, values in changes.items():
        data[section] = {**data[section], **values}
    return Plan.model_validate(data)


@pytest.mark.lab
def test_hostile_names_land_exactly_where_written_and_nothing_else_changes(
    lab_env: LabState, lab_plan: Plan, arena: tuple[Path, Path]
) -> None:
    source_root, target_root = arena
    expected: dict[Path, dict[str, bytes]] = {}
    pairs: list[tuple[Path, Path]] = []
    for name in HOSTILE_NAMES:
        source_dir, target_dir = source_root / name, target_root / name
        expected[target_dir] = fill(source_dir, name)
        pairs.append((source_dir, target_dir))
    for name in NEIGHBOURS:  # what a misread name would hit, on both hosts
        fill(source_root / name, f"neighbour {name} (source)")
        fill(target_root / name, f"neighbour {name} (target)")
    for name in WILDCARD_NAMES:
        with pytest.raises(ValidationError, match="rsync would expand"):
            plan_with_tree(lab_plan, str(source_root / "x"), str(target_root / name))
    targets = {target for _, target in pairs}
    before_target = tree_digest(target_root, targets)
    before_source = tree_digest(source_root)
    # The lab hosts' own trees beside the arena (their databases and logs change by themselves).
    beside = [host.uploads for host in (lab_env.source, lab_env.target)] + [lab_env.target.bin_dir]
    before_beside = [tree_digest(path) for path in beside]

    runtime = Runtime(lab_plan, lab_env.plan_file)
    try:
        for source_dir, target_dir in pairs:
            # Validated as a user's plan would be: every one of these names is acceptable.
            plan = plan_with_tree(lab_plan, str(source_dir), str(target_dir))
            tree = plan.files[0]
            push = rsync.push_command(plan, tree.source, tree.target, live=False)
            rsync.push(runtime.source, push, what=f"tree {tree.source!r}", retry=plan.retry)
            compare = rsync.compare_command(plan, tree.source, tree.target)
            assert rsync.changed_items(runtime.source, compare, what="compare") == [], target_dir
    finally:
        runtime.close()

    for target_dir, files in expected.items():
        # Checked here, on the path as written, independently of what rsync was told.
        assert target_dir.is_dir(), target_dir
        landed = {str(p.relative_to(target_dir)): p.read_bytes() for p in target_dir.rglob("*") if p.is_file()}
        assert landed == files, target_dir
    assert tree_digest(target_root, targets) == before_target, "a neighbouring directory on the target changed"
    assert tree_digest(source_root) == before_source, "the source changed"
    assert [tree_digest(path) for path in beside] == before_beside, "something beside the trees changed"
    # A name run as a command would touch PWNED where the remote command runs: the ssh user's home, or the lab.
    pwned = [p for root in (lab_env.source.path, lab_env.target.path) for p in root.rglob("PWNED") if p.is_file()]
    pwned += [p for p in (Path.home() / "PWNED", Path.cwd() / "PWNED") if p.exists()]
    assert not pwned, f"a name was run as a command: {pwned}"


@pytest.mark.lab
def test_a_newline_in_a_name_reaches_the_target_as_written_not_its_neighbour(
    lab_env: LabState, lab_plan: Plan, arena: tuple[Path, Path]
) -> None:
    # The plan refuses such a name (next test); the transport must not misread it either: rsync once turned
    # "a<newline>b" into a line continuation and synced, with --delete, into the existing "ab".
    source_root, target_root = arena
    files = fill(source_root / "a\nb", "newline")
    fill(target_root / "ab", "the neighbour")
    before = tree_digest(target_root / "ab")
    runtime = Runtime(lab_plan, lab_env.plan_file)
    try:
        command = rsync.push_command(lab_plan, str(source_root / "a\nb"), str(target_root / "a\nb"), live=False)
        rsync.push(runtime.source, command, what="newline", retry=lab_plan.retry)
    finally:
        runtime.close()
    landed = target_root / "a\nb"
    assert {str(p.relative_to(landed)): p.read_bytes() for p in landed.rglob("*") if p.is_file()} == files
    assert tree_digest(target_root / "ab") == before


@pytest.mark.parametrize(
    ("written", "shown"),
    [("a\\nb", "U+000A"), ("a\\0b", "U+0000"), ("a\\tb", "U+0009"), ("a\\eb", "U+001B"), ("a\\x7fb", "U+007F"),
     ("a\\x85b", "U+0085"), ("a\\u202eb", "U+202E")],
)  # fmt: skip
def test_control_characters_in_a_tree_are_refused_by_validate(
    tmp_path: Path, written: str, shown: str, migrate_here: Callable[..., Result]
) -> None:
    plan = (Path(__file__).parent.parent / "plans" / "course-review.yaml").read_text()
    text = plan.replace("    target: /var/www/course-review/uploads", f'    target: "/var/www/course-review/{written}"')
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    # ESC through the installed command, as a terminal would receive it; the others through the same `main` in the
    # test's process (no process start-up each).
    if shown == "U+001B":
        result: subprocess.CompletedProcess[str] | Result = subprocess.run(
            [str(MIGRATE), "validate", str(path)], capture_output=True, text=True, timeout=60
        )
    else:
        result = migrate_here("validate", str(path))
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    line = text.splitlines().index(f'    target: "/var/www/course-review/{written}"') + 1
    assert lines[0].startswith(f"{path}:{line}:5: files[0].target: must not contain control characters: {shown}")
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.lab
def test_known_hosts_and_key_paths_with_spaces_work_for_both_ssh_hops(
    lab_env: LabState, lab_plan: Plan, arena: tuple[Path, Path], tmp_path: Path
) -> None:
    odd = tmp_path / "known hosts dir %d"
    odd.mkdir()
    known_hosts = odd / "known hosts"
    shutil.copy(lab_env.known_hosts, known_hosts)
    key = odd / "id 'ed25519' %h"
    shutil.copy(lab_env.ssh_key, key)
    key.chmod(0o600)
    hosts = {"known_hosts": str(known_hosts), "key": str(key)}
    transfer = {"source_to_target_known_hosts": str(known_hosts), "source_to_target_key": str(key)}
    plan = plan_with_tree(lab_plan, "/srv/unused/a", "/srv/unused/b", source=hosts, target=hosts, transfer=transfer)
    # The orchestrator's own connection (asyncssh) to each host.
    for which in ("source", "target"):
        host = SshHost(getattr(plan, which), name=which, base_dir=tmp_path, retry=plan.retry)
        try:
            assert host.run("echo ok").stdout == "ok\n"
        finally:
            host.close()
    # The source's hop to the target, exactly as preflight runs it: OpenSSH reads the known_hosts as one file.
    runtime = Runtime(plan, lab_env.plan_file)
    try:
        login = rsync.target_spec(plan, "").rsplit(":", 1)[0]
        hop = f"{rsync.target_ssh_command(plan, control='no')} {shlex.quote(login)} echo reached"
        result = runtime.source.run(hop, check=False, timeout=60)
        assert (result.exit_status, result.stdout) == (0, "reached\n"), result.stderr
        assert "host key is known" not in result.stderr
        # And rsync through the same ssh command.
        source_dir, target_dir = arena
        files = fill(source_dir, "spaces")
        command = rsync.push_command(plan, str(source_dir), str(target_dir), live=False)
        rsync.push(runtime.source, command, what="spaces", retry=plan.retry)
        landed = {str(p.relative_to(target_dir)): p.read_bytes() for p in target_dir.rglob("*") if p.is_file()}
        assert landed == files
    finally:
        runtime.close()


def test_ssh_reads_a_quoted_option_path_as_exactly_one_file() -> None:
    # ssh -G prints the configuration it would use, without connecting.
    path = '/tmp/dir with space/known "hosts" %d\\x'
    value = rsync.ssh_option_path(path)
    result = subprocess.run(
        ["ssh", "-G", "-F", "/dev/null", "-o", f"UserKnownHostsFile={value}", "example.invalid"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    shown = [line for line in result.stdout.splitlines() if line.startswith("userknownhostsfile ")]
    assert shown == [f"userknownhostsfile {path}"]
