"""Pid files and processes of the lab: read, check, stop, and pick free ports.

A pid file can outlive its process and the pid can be reused by an unrelated process, so "running" always means:
the pid is alive AND its command line contains a marker we expect (usually a path inside the lab).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def cmdline(pid: int) -> str:
    """The process's command line joined by spaces ('' when it is gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0) but is gone for every practical purpose.
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        return status.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def running_pid(pid_file: Path, marker: str | None = None) -> int | None:
    """The pid recorded in pid_file if that process is alive (and its command line contains marker)."""
    pid = read_pid(pid_file)
    if pid is None or not is_alive(pid):
        return None
    if marker is not None and marker not in cmdline(pid):
        return None
    return pid


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return True
        time.sleep(0.05)
    return not is_alive(pid)


def stop_pid(pid: int, *, timeout: float = 30.0, sig: int = signal.SIGTERM) -> bool:
    """Signal one process, wait until it is gone; SIGKILL it after `timeout`. True when it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    if wait_gone(pid, timeout):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return wait_gone(pid, 5.0)


def stop_pid_file(pid_file: Path, marker: str | None = None, *, timeout: float = 30.0) -> int | None:
    """Stop the process a pid file names (only if it is ours); returns the pid it stopped."""
    pid = running_pid(pid_file, marker)
    if pid is None:
        return None
    stop_pid(pid, timeout=timeout)
    return pid


def port_is_free(address: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR as the daemons set it: connections in TIME_WAIT do not stop them, only a listener does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def port_answers(address: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port(addresses: Sequence[str], *, prefer: int | None = None, avoid: Sequence[int] = ()) -> int:
    """A TCP port free on every address: `prefer` when it is, else a random one from a high range.

    Random rather than kernel-assigned (bind to 0): kernel ports are handed out sequentially from the ephemeral
    range and two labs made at the same moment would often race for the same one.
    """
    if prefer and prefer not in avoid and all(port_is_free(a, prefer) for a in addresses):
        return prefer
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.randint(20000, 32000)  # below the usual ephemeral range (32768+), where clients get ports
        if port not in avoid and all(port_is_free(a, port) for a in addresses):
            return port
    raise RuntimeError(f"no free TCP port on {', '.join(addresses)}")
