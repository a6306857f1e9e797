"""Fixtures shared by the whole suite: one lab for the session, the engine's file-step world, the `migrate` binary.

`lab` brings a lab up under a temporary directory (random free ports, so suites on one machine do not collide)
and tears it down at the end, even when tests fail. With LAB_DIR set, it reuses (and repairs) that lab instead and
leaves it running. Every test that uses a lab (`lab`, or a fixture built on it) is marked `lab`, so
`pytest -m "not lab"` (`make test-fast`) runs the fast layer alone.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from migrate_lab import hosts
from migrate_lab.state import LabState
from tests.engine.world import Result, World, run_in_process

LAB_DIR_ENV = "LAB_DIR"
ROOT = Path(__file__).resolve().parents[1]
MIGRATE = Path(sys.executable).with_name("migrate")
SECRET_ENV = ("COURSE_REVIEW_DB_PASSWORD", "CLOUDFLARE_API_TOKEN")


# The lab modules that take longest, longest first (their share of a whole run, measured): under pytest-xdist
# (`make test`: whole files per worker, in collection order) they start first, so no long file starts last and
# leaves the other workers idle at the end.
LONGEST_FIRST = (
    "test_postgres_faults.py",
    "test_postgres_kills.py",
    "test_postgres_guard.py",
    "test_e2e.py",
    "test_fleet_lab.py",
    "test_replicate_e2e.py",
    "test_faults_kill.py",
    "test_wordpress_lab.py",
    "test_faults.py",
    "test_scale_e2e.py",
    "test_frontdoor_e2e.py",
    "test_postgres_replicate.py",
    "test_postgres_lab.py",
    "test_postgres_migrate.py",
    "test_symlinked_datadir.py",
    "test_estimates.py",
    "test_throttle.py",
    "test_progress.py",
    "test_report_html.py",
    "test_tracking_lab.py",
    "test_window.py",
    "test_steps_live.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "lab" in getattr(item, "fixturenames", ()) and item.get_closest_marker("lab") is None:
            item.add_marker(pytest.mark.lab)

    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each module keeps its own order


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    existing = os.environ.get(LAB_DIR_ENV)
    if existing:
        # Under pytest-xdist each worker keeps a lab of its own below LAB_DIR: two workers' tests never share one.
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        yield hosts.up(Path(existing) / worker, default_ports=False) if worker else hosts.up(Path(existing))
        return
    lab_dir = tmp_path_factory.mktemp("lab")
    try:
        yield hosts.up(lab_dir, default_ports=False)
    finally:
        hosts.down(lab_dir)


@pytest.fixture
def world(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[World]:
    """A plan with file-based steps and hooks that record their environment (tests/engine)."""
    w = World(tmp_path, capsys)
    yield w
    # Whatever a failed assertion left running: the paused `migrate` processes and a paused hook.
    for proc in w.procs:
        if proc.poll() is None:
            w.kill9(proc)
    _drop_log_handlers()


def _drop_log_handlers() -> None:
    # In-process runs open the run's log file and a console bound to the captured stderr: neither outlives a test.
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) or getattr(handler, "_migrate_console", False):
            root.removeHandler(handler)
            handler.close()
    from orchestrator.output import logging as mlog

    mlog._configured_file = None


@pytest.fixture
def migrate_here(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[..., Result]]:
    """`migrate` run in the test's process (fast): the same `main` the installed command runs, without the example
    plan's secrets unless given."""

    def run(*args: str, env: dict[str, str] | None = None) -> Result:
        base = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
        return run_in_process(capsys, list(args), {**base, **(env or {})})

    yield run
    _drop_log_handlers()


def migrate(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """The installed `migrate` as an operator runs it, without the example plan's secrets unless given."""
    base = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    return subprocess.run(
        [str(MIGRATE), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env={**base, **(env or {})},
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
