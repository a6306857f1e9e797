"""The window's rsync route (transports/rsync_daemon.py) on the lab's real sshd and rsync: what goes through it lands
exactly as the ssh way would land it, the check through it finds a difference, and the daemon never outlives the
SSH session that started it (our stop, or a kill -9 of the process that opened it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from migrate_lab.state import LabState
from orchestrator.plan.model import Plan
from orchestrator.runtime import Runtime
from orchestrator.services.tracking import final_pass_command, verify_listed_command
from orchestrator.transports import rsync, rsync_daemon
from tests.test_hostile_paths import NEIGHBOURS, fill, tree_digest

# Names the daemon's configuration can hold (the others are refused below, and the window then uses ssh).
NAMES = ["plain", "red]", ":100:", 'it\'s "quoted"', "$(touch PWNED)", "with space", " leading space", "ünïcødé 🚀"]


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
    name = f"route-{uuid.uuid4().hex[:8]}"
    source, target = lab.source.path / name, lab.target.path / name
    try:
        yield source, target
    finally:
        subprocess.run(["rm", "-rf", str(source), str(target)], check=False)


def plan_with_trees(plan: Plan, pairs: list[tuple[Path, Path]]) -> Plan:
    data = plan.model_dump(mode="python")
    data["files"] = [{"name": f"t{i}", "source": str(s), "target": str(t)} for i, (s, t) in enumerate(pairs)]
    return Plan.model_validate(data)


def write_list(path: Path, names: list[str]) -> None:
    path.write_bytes(b"".join(name.encode() + b"\0" for name in names))


def daemon_gone(pid: int, directory: str) -> bool:
    return not Path(f"/proc/{pid}").exists() and not Path(directory).exists()


def wait_until(condition: object, what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


# --- without a host ---


def test_paths_the_configuration_cannot_hold_are_refused_by_name(lab_plan_offline: Plan) -> None:
    for bad in ("/srv/100%d", "/srv/a#b", "/srv/trailing ", "/srv/back\\slash", "/srv/semi;colon", "/srv/new\nline"):
        data = lab_plan_offline.model_dump(mode="python")
        data["files"] = [{"name": "ok", "source": "/srv/a", "target": "/srv/b"}]
        plan = Plan.model_validate(data)
        tree = plan.files[0].model_copy(update={"target": bad})
        with pytest.raises(rsync_daemon.RouteUnavailable, match="tree ok: its target path"):
            rsync_daemon.config_text([tree])


def test_the_configuration_names_one_module_per_tree_and_no_secret(lab_plan_offline: Plan) -> None:
    data = lab_plan_offline.model_dump(mode="python")
    data["files"] = [{"name": f"n{i}", "source": f"/srv/s{i}", "target": f"/srv/t {i}"} for i in range(3)]
    plan = Plan.model_validate(data)
    globals_, modules = rsync_daemon.config_text(list(plan.files))
    assert modules.splitlines() == [
        "[tree0]",
        "path = /srv/t 0",
        "[tree1]",
        "path = /srv/t 1",
        "[tree2]",
        "path = /srv/t 2",
    ]
    assert "munge symlinks = no" in globals_ and "hosts allow = 127.0.0.1" in globals_ and "secret" not in globals_
    assert rsync_daemon.ready_fields("port=40001 pid=12 dir=/tmp/x") == {"port": "40001", "pid": "12", "dir": "/tmp/x"}


@pytest.fixture
def lab_plan_offline() -> Plan:
    text = (Path(__file__).parent.parent / "plans" / "course-review.yaml").read_text()
    return Plan.model_validate(YAML(typ="safe").load(text))


# --- on the lab ---


@pytest.mark.lab
def test_through_the_route_paths_land_as_written_and_the_check_finds_a_difference(
    lab_env: LabState, lab_plan: Plan, arena: tuple[Path, Path], tmp_path: Path
) -> None:
    source_root, target_root = arena
    pairs = [(source_root / name, target_root / name) for name in NAMES]
    expected = {target: fill(source, source.name) for source, target in pairs}
    for source, target in pairs:
        target.mkdir(parents=True)
        (target / "gone.txt").write_text("deleted on the source since the pre-sync\n")
        (source / "link").symlink_to("file.txt")
    for name in NEIGHBOURS:
        fill(target_root / name, f"neighbour {name}")
    neighbours = tree_digest(target_root, {target for _, target in pairs})
    plan = plan_with_trees(lab_plan, pairs)
    listed = tmp_path / "changed.list"
    write_list(listed, ["file.txt", "sub", "sub/nested [x].bin", "link", "gone.txt"])

    runtime = Runtime(plan, lab_env.plan_file)
    try:
        route = rsync_daemon.open_route(plan, runtime.source, runtime.target)
        said = rsync_daemon.ready_fields(route.daemon.ready_line)  # type: ignore[union-attr]
        try:
            for tree in plan.files:
                push = final_pass_command(tree.source, route.url(tree), str(listed), extra=route.options())
                rsync.push(runtime.source, push, what=tree.name, retry=plan.retry)
                check = verify_listed_command(tree.source, route.url(tree), str(listed), extra=route.options())
                assert rsync.changed_items(runtime.source, check, what="check") == [], tree.target
            # The check through the route can fail: a changed byte on the target is found.
            changed = pairs[0][1] / "file.txt"
            changed.write_bytes(changed.read_bytes().replace(b"content", b"CONTENT"))
            tree = plan.files[0]
            check = verify_listed_command(tree.source, route.url(tree), str(listed), extra=route.options())
            assert [item.split(" ", 1)[1] for item in rsync.changed_items(runtime.source, check, what="check")] == [
                "file.txt"
            ]
            changed.write_bytes(expected[pairs[0][1]]["file.txt"])
        finally:
            rsync_daemon.close_route(plan, runtime.source, route)
        wait_until(lambda: daemon_gone(int(said["pid"]), said["dir"]), "the daemon and its directory are gone")
        assert not list(Path(route.client_dir).parent.glob(Path(route.client_dir).name)), "the password file is gone"
    finally:
        runtime.close()
    for _source, target in pairs:
        landed = {str(p.relative_to(target)): p.read_bytes() for p in target.rglob("*") if p.is_file()}
        assert landed == {**expected[target], "link": expected[target]["file.txt"]}, target
        assert os.readlink(target / "link") == "file.txt", "a symlink lands as it is (not munged by the daemon)"
        assert not (target / "gone.txt").exists(), "a listed path gone from the source is deleted on the target"
    assert tree_digest(target_root, {target for _, target in pairs}) == neighbours, "a neighbour changed"
    # A name run as a command would have made a file PWNED (a neighbour directory has that name).
    assert not [p for root in (lab_env.source.path, lab_env.target.path) for p in root.rglob("PWNED") if p.is_file()]


OPENER = """
import sys, time
from ruamel.yaml import YAML
from orchestrator.plan.model import Plan
from orchestrator.runtime import Runtime
from orchestrator.transports import rsync_daemon
plan = Plan.model_validate(YAML(typ="safe").load(open(sys.argv[1]).read()))
runtime = Runtime(plan, sys.argv[1])
route = rsync_daemon.open_route(plan, runtime.source, runtime.target)
print(route.daemon.ready_line, flush=True)
time.sleep(600)
"""


@pytest.mark.lab
def test_the_daemon_ends_with_the_process_that_started_it_killed(lab_env: LabState) -> None:
    opener = subprocess.Popen(
        [sys.executable, "-c", OPENER, str(lab_env.plan_file)], stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).parent.parent,
    )  # fmt: skip
    try:
        said = rsync_daemon.ready_fields(opener.stdout.readline())  # type: ignore[union-attr]
        pid, directory = int(said["pid"]), said["dir"]
        assert Path(f"/proc/{pid}").exists() and Path(directory).is_dir(), "the daemon runs before the kill"
        opener.kill()
        opener.wait(timeout=30)
        wait_until(lambda: daemon_gone(pid, directory), "the daemon and its directory are gone after a kill -9")
    finally:
        if opener.poll() is None:
            opener.kill()
            opener.wait(timeout=30)
