"""Fixtures shared by the whole suite: one lab for the session.

`lab` brings a lab up under a temporary directory (random free ports, so suites on one machine do not collide)
and tears it down at the end, even when tests fail. With LAB_DIR set, it reuses (and repairs) that lab instead and
leaves it running.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.lab import hosts
from orchestrator.lab.state import LabState

LAB_DIR_ENV = "LAB_DIR"


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    existing = os.environ.get(LAB_DIR_ENV)
    if existing:
        yield hosts.up(Path(existing))
        return
    lab_dir = tmp_path_factory.mktemp("lab")
    try:
        yield hosts.up(lab_dir, default_ports=False)
    finally:
        hosts.down(lab_dir)
