"""A PostgreSQL lab for one test module (`lab up --engine postgresql`), made and taken down the same way everywhere.

The clusters run as `postgres`, so the lab lives where that account can reach it: under /var/tmp, in a directory of
mode 0755 (pytest's temporary directories are private to root).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from migrate_lab import hosts
from migrate_lab.state import LabState


@contextlib.contextmanager
def postgres_lab(prefix: str, *, db_size_mb: int) -> Iterator[LabState]:
    """The lab, up; down and purged afterwards, also when bringing it up failed half-way."""
    lab_dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    lab_dir.chmod(0o755)
    try:
        lab = hosts.up(
            lab_dir / "lab", engine="postgresql", db_size_mb=db_size_mb, uploads_size_mb=1, default_ports=False
        )
    except BaseException:
        with contextlib.suppress(Exception):
            hosts.down(lab_dir / "lab", purge=True)
        with contextlib.suppress(OSError):
            lab_dir.rmdir()
        raise
    try:
        yield lab
    finally:
        hosts.down(lab.path, purge=True)
        with contextlib.suppress(OSError):
            lab_dir.rmdir()
