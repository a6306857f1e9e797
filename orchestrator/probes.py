"""Host probes: what a step or the preflight asks a host, each as a command and the parse of its output.

The command and the parse are kept apart (as facts are in pyinfra) so every parse is tested offline from
fixtures, and a step's sequencing can be tested with a host that records commands and returns fixture output.
`ask(host, probe)` runs one on a host.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from orchestrator.contracts import Host
from orchestrator.transports.ssh import TransportError

T = TypeVar("T")

# sshd's PATH for a non-login command often lacks sbin, where mariadbd lives.
SBIN_PATH = 'PATH="$PATH:/usr/sbin:/usr/local/sbin:/sbin"; '
# The datadir's InnoDB files (ibdata*, ib_logfile*, ibtmp1, redo and temporary directories of MySQL 8, undo
# tablespaces): the server holds them open until its shutdown has flushed everything.
INNODB_FILES = ("ib*", "#innodb_redo/*", "#innodb_temp/*", "undo*")
RUNNING = "(running)"
MAX_HOLDERS_LISTED = 5


@dataclass(frozen=True)
class Probe(Generic[T]):
    """A command to run on a host and the parse of its output (stdout)."""

    command: str
    parse: Callable[[str], T]
    # False: a non-zero exit is an answer too (parsed from what was printed).
    check: bool = True


def ask(host: Host, probe: Probe[T], *, timeout: float | None = 60.0) -> T:
    return probe.parse(host.run(probe.command, timeout=timeout, check=probe.check).stdout)


# --- clocks ----------------------------------------------------------------------------------------------------


def clock() -> Probe[float]:
    """The host's clock (seconds since the epoch, with nanoseconds)."""
    return Probe("date +%s.%N", lambda out: float(out.strip()))


def clock_offset(host: Host) -> float:
    """The host's clock minus ours, within about the round trip of one SSH command."""
    asked = time.time()
    answer = ask(host, clock(), timeout=30)
    answered = time.time()
    return answer - (asked + answered) / 2


# --- paths -----------------------------------------------------------------------------------------------------


def parse_first_line(output: str) -> str:
    return next((line.strip() for line in output.splitlines() if line.strip()), "")


def real_path(path: str) -> Probe[str]:
    """`path` with every symbolic link resolved (readlink -f), as the kernel names files in /proc/<pid>/fd."""
    return Probe(f"readlink -f -- {shlex.quote(path)}", lambda out: out.strip() or path)


def resolved_paths(paths: list[str]) -> Probe[list[str]]:
    """Each path resolved, links included (readlink -m: the path need not exist), in order."""

    def _parse(out: str) -> list[str]:
        lines = out.splitlines()
        if len(lines) != len(paths):
            raise TransportError(f"unexpected readlink output for {len(paths)} paths", False)
        return lines

    return Probe("readlink -m -- " + " ".join(shlex.quote(path) for path in paths), _parse)


def links_in(directory: str, limit: int) -> Probe[list[str]]:
    """Symbolic links and .isl files (tablespaces kept elsewhere) under `directory`, at most limit + 1."""
    return Probe(
        f"find -H {shlex.quote(directory)} \\( -type l -o -name '*.isl' \\) -print 2>/dev/null | head -n {limit + 1}",
        lambda out: out.splitlines(),
        check=False,
    )


def directory_exists(path: str) -> Probe[bool]:
    return Probe(f"test -d {shlex.quote(path)} && echo yes || echo no", lambda out: out.strip() == "yes")


def files_changed_since(directory: str, since: float | None) -> Probe[list[str]]:
    """Files under `directory` (relative, ./name) modified after `since` (host clock), every file when None."""
    newer = "" if since is None else f" -newermt @{since:.3f}"
    return Probe(
        f"cd {shlex.quote(directory)} && find . -type f{newer} -print0",
        lambda out: [name for name in out.split("\0") if name],
    )


# --- space -----------------------------------------------------------------------------------------------------


def parse_du(output: str) -> dict[str, int]:
    """`du -sb` lines → {path: bytes}."""
    sizes: dict[str, int] = {}
    for line in output.splitlines():
        size, _, path = line.partition("\t")
        if size.isdigit():
            sizes[path] = int(size)
    return sizes


def sizes(paths: list[str]) -> Probe[dict[str, int]]:
    """Apparent size in bytes of each existing path."""
    return Probe(f"du -sb {' '.join(shlex.quote(p) for p in paths)} 2>/dev/null", parse_du, check=False)


def parse_df(output: str, path: str = "") -> tuple[str, int]:
    """The last line of `df -P -B1` → (mount point, free bytes)."""
    fields = output.split()
    if len(fields) < 6:
        raise TransportError(f"unexpected df output for {path}", False)
    return fields[5], int(fields[3])


def free_space(path: str) -> Probe[tuple[str, int]]:
    """(mount point, free bytes) of the filesystem holding `path` or its nearest existing ancestor."""
    script = f'p={shlex.quote(path)}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -P -B1 "$p" | tail -n 1'
    return Probe(script, lambda out: parse_df(out, path))


# --- programs --------------------------------------------------------------------------------------------------


def has_program(name: str) -> Probe[bool]:
    return Probe(
        SBIN_PATH + f"command -v {shlex.quote(name)} >/dev/null && echo yes || echo no",
        lambda out: out.strip() == "yes",
    )


def database_server_version() -> Probe[str]:
    """The installed server's version line ('' when neither mariadbd nor mysqld is there)."""
    return Probe(SBIN_PATH + "(mariadbd --version || mysqld --version) 2>/dev/null", parse_first_line, check=False)


# --- InnoDB files held open ------------------------------------------------------------------------------------


def glob_escape(path: str) -> str:
    """`path` as a literal for find's -lname (fnmatch): its *, ?, [ and backslashes escaped."""
    return re.sub(r"([*?\[\\])", r"\\\1", path)


def innodb_holders_command(datadir: str, pids: Iterable[int] = ()) -> str:
    """A command: '/proc/<pid>/fd <file>' for every open descriptor on the datadir's InnoDB files, and
    '/proc/<pid>/fd (running)' for each of `pids` (the server's, seen before its stop) still running.

    /proc/<pid>/fd/* links name the real path, so `datadir` must be resolved (`real_path`) first. Processes that
    vanish during the scan, and those the ssh user may not look into, are silently skipped: see
    `innodb_files_visible` for the latter. A zombie (exited, not yet reaped) is not running.
    """
    base = glob_escape(datadir.rstrip("/") or "/")
    tests = " -o ".join(f"-lname {shlex.quote(base + '/' + name)}" for name in INNODB_FILES)
    command = f"find /proc/[0-9]*/fd -mindepth 1 -maxdepth 1 \\( {tests} \\) -printf '%h %l\\n' 2>/dev/null"
    for pid in sorted(set(pids)):
        stat = f"/proc/{int(pid)}/stat"
        command += (
            f"; s=$(sed 's/.*) //' {stat} 2>/dev/null | cut -d' ' -f1)"
            f'; [ -n "$s" ] && [ "$s" != Z ] && echo \'/proc/{int(pid)}/fd {RUNNING}\''
        )
    return command + "; true"


def parse_holders(output: str) -> dict[int, set[str]]:
    """innodb_holders_command's output → {pid: {open InnoDB files}}."""
    holders: dict[int, set[str]] = {}
    for line in output.splitlines():
        fd_dir, _, target = line.partition(" ")
        parts = fd_dir.split("/")  # /proc/<pid>/fd
        if len(parts) == 4 and parts[2].isdigit():
            holders.setdefault(int(parts[2]), set()).add(target)
    return holders


def innodb_holders_probe(datadir: str, pids: Iterable[int] = ()) -> Probe[dict[int, set[str]]]:
    return Probe(innodb_holders_command(datadir, pids), parse_holders, check=False)


def describe_holders(holders: dict[int, set[str]]) -> str:
    items = []
    for pid, files in sorted(holders.items()):
        held = sorted(files - {RUNNING})
        items.append(f"pid {pid} holds {', '.join(held[:2])} open" if held else f"pid {pid} still runs")
    more = f" and {len(items) - MAX_HOLDERS_LISTED} more" if len(items) > MAX_HOLDERS_LISTED else ""
    return "; ".join(items[:MAX_HOLDERS_LISTED]) + more


def innodb_holders(
    host: Host, datadir: str, timeout: float | None = 60.0, pids: Iterable[int] = ()
) -> dict[int, set[str]]:
    """Processes on `host` that hold the InnoDB files of the (resolved) `datadir` open, and those of `pids` alive."""
    return ask(host, innodb_holders_probe(datadir, pids), timeout=timeout)


def real_datadir(host: Host, datadir: str) -> str:
    """The datadir with every symbolic link resolved, as the kernel names its files in /proc/<pid>/fd."""
    return ask(host, real_path(datadir))


def innodb_files_visible(host: Host, datadir: str) -> tuple[set[int], str | None]:
    """While the database runs: the pids holding its InnoDB files, or why none can be seen.

    Proving that the database has really stopped relies on seeing them: an ssh user who may not look into the
    server's /proc/<pid>/fd sees nothing, and nothing would look like stopped.
    """
    holders = innodb_holders(host, datadir)
    if holders:
        return set(holders), None
    return set(), (
        f"no process is seen holding the InnoDB files of {datadir} open while the database runs: the cut-over "
        "could not prove the source database has stopped; connect as root (or as the database's user) and check "
        "that database.source.datadir is the server's datadir"
    )
