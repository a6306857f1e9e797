"""Paths as the host resolves them: the probe's command run here for real (links, a link to nothing, /var/run), the
protected-directory policy applied to what a path resolves to, and the seed's install acting on the directory a
symbolic datadir points at (the commands run here on temporary directories, as they run on a target)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator.database.mysql import seed
from orchestrator.plan.checks import protected_problem
from orchestrator.services import probes
from orchestrator.transports.ssh import TransportError


def run_probe(probe: probes.Probe[list[probes.ResolvedPath]]) -> list[probes.ResolvedPath]:
    done = subprocess.run(probe.command, shell=True, capture_output=True, text=True, timeout=30, check=True)
    return probe.parse(done.stdout)


def test_resolve_follows_links_keeps_missing_parts_and_tells_a_link_to_nothing(tmp_path: Path) -> None:
    disk = tmp_path / "disk 2" / "mysql"
    disk.mkdir(parents=True)
    link = tmp_path / "mysql"
    link.symlink_to(disk)
    dangling = tmp_path / "unmounted"
    dangling.symlink_to(tmp_path / "nowhere" / "mysql")
    paths = [str(link), str(disk), str(tmp_path / "new" / "dir"), str(dangling), str(link / "sub" / "x"), "-n"]
    found = run_probe(probes.resolve(paths))
    assert [f.real for f in found[:5]] == [
        str(disk), str(disk), str(tmp_path / "new" / "dir"), str(tmp_path / "nowhere" / "mysql"), str(disk / "sub/x")
    ]  # fmt: skip
    assert [(f.link, f.exists, f.dangling) for f in found[:4]] == [
        (True, True, False), (False, True, False), (False, False, False), (True, False, True)
    ]  # fmt: skip
    assert found[5].path == "-n" and found[5].real.endswith("/-n")  # an odd name is a name, not an option


@pytest.mark.skipif(not os.path.islink("/var/run"), reason="this host's /var/run is not a link")
def test_var_run_resolves_into_run_which_is_protected() -> None:
    (app, lock) = run_probe(probes.resolve(["/var/run/app", "/var/lock/app"]))
    assert app.real == "/run/app" and lock.real == "/run/lock/app"
    # The plan's text is refused as it stands (validate needs no host for it), and so is what it resolves to.
    assert "inside /var/run, a protected system tree" in str(
        protected_problem("/var/run/app", datadir=False, allowed=False)
    )
    problem = protected_problem(app.real, datadir=False, allowed=False)
    assert problem is not None and problem.startswith("refusing to sync into /run/app: inside /run")


def test_resolve_refuses_an_answer_it_cannot_read() -> None:
    probe = probes.resolve(["/a", "/b"])
    with pytest.raises(TransportError, match=r"resolving 2 path\(s\): 1 line"):
        probe.parse("n y /a\n")
    with pytest.raises(TransportError, match="unexpected answer resolving /a"):
        probe.parse("maybe y /a\nn y /b\n")


def _prepared_seed(spec: seed.SeedSpec) -> None:
    staging = Path(spec.staging_dir)
    staging.mkdir()
    (staging / "xtrabackup_checkpoints").write_text("backup_type = log-applied\n")
    (staging / "ibdata1").write_text("new")


def test_the_seed_installs_into_the_directory_a_symbolic_datadir_points_at(tmp_path: Path) -> None:
    real = tmp_path / "disk2" / "mysql"
    real.mkdir(parents=True)
    (real / "ibdata1").write_text("old")
    link = tmp_path / "lib" / "mysql"
    link.parent.mkdir()
    link.symlink_to(real)
    # Given the link as it is written in a plan, the install refuses to rename it (it would move the link aside
    # and leave the real directory stale), and changes nothing.
    unresolved = seed.SeedSpec("/unused", str(link), ("ssh", "unused"))
    _prepared_seed(unresolved)
    refused = subprocess.run(seed.install_command(unresolved), shell=True, capture_output=True, text=True)
    assert refused.returncode == 1 and "a symbolic link" in refused.stderr
    assert link.is_symlink() and (real / "ibdata1").read_text() == "old"
    refused = subprocess.run(seed.restore_previous_command(unresolved), shell=True, capture_output=True, text=True)
    assert refused.returncode == 1 and link.is_symlink()
    subprocess.run(seed.discard_staging_command(unresolved), shell=True, check=True)
    # Resolved (as preflight journals it): staged, swapped in and kept beside the real directory; the link stays.
    spec = seed.SeedSpec("/unused", str(real), ("ssh", "unused"))
    _prepared_seed(spec)
    subprocess.run(seed.install_command(spec), shell=True, check=True)
    assert link.is_symlink() and link.resolve() == real
    assert (link / "ibdata1").read_text() == "new"
    assert Path(spec.previous_dir) == tmp_path / "disk2" / "mysql.before-seed"
    assert (Path(spec.previous_dir) / "ibdata1").read_text() == "old"
    assert not Path(f"{link}.before-seed").exists() and not Path(f"{link}.seed").exists()
    # The undo puts the old directory back in the real place, the link untouched.
    subprocess.run(seed.restore_previous_command(spec), shell=True, check=True)
    assert link.is_symlink() and (link / "ibdata1").read_text() == "old"
