"""One lock per plan, so two `migrate` processes never drive the same migration.

The lock is an flock on a file that also records who holds it. The kernel releases an flock when its process dies,
however it dies, so a lock file left behind by a dead process is recognised as stale and taken over.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path


class LockHeld(Exception):
    """Another live process holds the plan's lock."""


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    since: float
    command: str

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on {self.host} ({self.command}) since {when}"


class PlanLock:
    def __init__(self, path: Path, command: str) -> None:
        self.path = path
        self.command = command
        self._fd: int | None = None
        self.stale_holder: Holder | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(self.path)
            os.close(fd)
            who = holder.describe() if holder else "another process"
            raise LockHeld(f"plan is locked by {who}; wait for it, or stop it first") from None
        # We hold it. Whatever the file still names was left by a process that died holding it.
        previous = read_holder(self.path)
        if previous is not None and previous.pid != os.getpid():
            self.stale_holder = previous
        holder = Holder(os.getpid(), socket.gethostname(), time.time(), self.command)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder.__dict__).encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> PlanLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_holder(path: Path) -> Holder | None:
    try:
        raw = json.loads(path.read_text() or "null")
        return Holder(**raw) if raw else None
    except (OSError, ValueError, TypeError):
        return None


def is_locked(path: Path) -> Holder | None:
    """The live holder of the lock, or None (free or stale). Does not take the lock."""
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_holder(path) or Holder(0, "?", 0.0, "?")
    finally:
        os.close(fd)
    return None
