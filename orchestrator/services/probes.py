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


# --- the database server's last start, from its error log ----------------------------------------------------

# MariaDB's and MySQL's error log: the line a start begins with, and the line it ends with (the server answers).
# MariaDB pads a one-digit hour with a space ("2026-11-25  0:57:42"); MySQL writes ISO times.
_WHEN = r"^(\d{4}-\d{2}-\d{2}[ T]+\d{1,2}:\d{2}:\d{2}(?:\.\d+)?)"
_STARTING = re.compile(_WHEN + r".*(?:Starting MariaDB|starting as process)")
_READY = re.compile(_WHEN + r".*ready for connections")
# How much of the log's end is read: the last start is near the end of a log the server appends to.
ERROR_LOG_TAIL_BYTES = 262144


def _log_time(text: str) -> float | None:
    from datetime import datetime

    day, _, clock = text.replace("T", " ").partition(" ")
    clock = clock.strip()
    if clock[1:2] == ":":  # a one-digit hour
        clock = "0" + clock
    try:
        return datetime.fromisoformat(f"{day}T{clock}").timestamp()
    except ValueError:
        return None


def parse_last_start(output: str) -> float | None:
    """Seconds the last start recorded in the error log took (its `Starting` line to its `ready for connections`
    line), None when the log holds no complete start. The log's times may be whole seconds: +1 s, never less."""
    started: float | None = None
    found: float | None = None
    whole = False
    for line in output.splitlines():
        begin, ready = _STARTING.match(line), _READY.match(line)
        if begin:
            started = _log_time(begin.group(1))
            whole = "." not in begin.group(1)
        elif ready and started is not None:
            at = _log_time(ready.group(1))
            if at is not None:
                found = max(at - started, 0.0) + (1.0 if whole else 0.0)
            started = None
    return found


def last_start_seconds(log_path: str) -> Probe[float | None]:
    """How long the database server took to start the last time (from the end of its error log)."""
    path = shlex.quote(log_path)
    return Probe(
        f"tail -c {ERROR_LOG_TAIL_BYTES} {path} 2>/dev/null | grep -E 'Starting MariaDB|starting as process|ready for"
        " connections' || true",
        parse_last_start,
        check=False,
    )


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


@dataclass(frozen=True)
class ResolvedPath:
    """A path as the host resolves it: `real` with every symbolic link followed (readlink -m: what does not exist
    is kept as written); `link`: the path itself is a symbolic link; `exists`: what it names exists (a link whose
    target is missing does not)."""

    path: str
    real: str
    link: bool
    exists: bool

    @property
    def dangling(self) -> bool:
        return self.link and not self.exists


def parse_resolved(paths: list[str], out: str) -> list[ResolvedPath]:
    """'<link y|n> <exists y|n> <real path>' per path, in order (a path holds no newline: the plan refuses it)."""
    lines = out.splitlines()
    if len(lines) != len(paths):
        raise TransportError(f"unexpected answer resolving {len(paths)} path(s): {len(lines)} line(s)", False)
    found = []
    for path, line in zip(paths, lines, strict=True):
        link, exists, real = [*line.split(" ", 2), "", ""][:3]
        if link not in ("y", "n") or exists not in ("y", "n") or not real.startswith("/"):
            raise TransportError(f"unexpected answer resolving {path}: {line[:200]!r}", False)
        found.append(ResolvedPath(path, real, link == "y", exists == "y"))
    return found


def resolve(paths: list[str]) -> Probe[list[ResolvedPath]]:
    """Each path as the host resolves it (ResolvedPath), in order: what rsync, mv and the database server meet
    there, where the plan's text may name a link to another directory (/var/run → /run, /var/lib/mysql → a disk)."""
    script = (
        'for p in "$@"; do r=$(readlink -m -- "$p") || exit 1; l=n; [ -L "$p" ] && l=y; e=n; [ -e "$p" ] && e=y; '
        'printf "%s %s %s\\n" "$l" "$e" "$r"; done'
    )
    command = f"sh -c {shlex.quote(script)} sh " + " ".join(shlex.quote(path) for path in paths)
    return Probe(command, lambda out: parse_resolved(paths, out))


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


def innodb_holders_command(datadir: str, pids: Iterable[int] = (), files: Iterable[str] = INNODB_FILES) -> str:
    """A command: '/proc/<pid>/fd <file>' for every open descriptor on the datadir's InnoDB files, and
    '/proc/<pid>/fd (running)' for each of `pids` (the server's, seen before its stop) still running.

    /proc/<pid>/fd/* links name the real path, so `datadir` must be resolved (`real_path`) first. Processes that
    vanish during the scan, and those the ssh user may not look into, are silently skipped: see
    `innodb_files_visible` for the latter. A zombie (exited, not yet reaped) is not running. `files`: the patterns
    of the server's files (the engine's `server_files`; InnoDB's by default).
    """
    base = glob_escape(datadir.rstrip("/") or "/")
    tests = " -o ".join(f"-lname {shlex.quote(base + '/' + name)}" for name in files)
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


def innodb_holders_probe(
    datadir: str, pids: Iterable[int] = (), files: Iterable[str] = INNODB_FILES
) -> Probe[dict[int, set[str]]]:
    return Probe(innodb_holders_command(datadir, pids, files), parse_holders, check=False)


def describe_holders(holders: dict[int, set[str]]) -> str:
    items = []
    for pid, files in sorted(holders.items()):
        held = sorted(files - {RUNNING})
        items.append(f"pid {pid} holds {', '.join(held[:2])} open" if held else f"pid {pid} still runs")
    more = f" and {len(items) - MAX_HOLDERS_LISTED} more" if len(items) > MAX_HOLDERS_LISTED else ""
    return "; ".join(items[:MAX_HOLDERS_LISTED]) + more


def innodb_holders(
    host: Host,
    datadir: str,
    timeout: float | None = 60.0,
    pids: Iterable[int] = (),
    files: Iterable[str] = INNODB_FILES,
) -> dict[int, set[str]]:
    """Processes on `host` that hold the InnoDB files of the (resolved) `datadir` open, and those of `pids` alive."""
    return ask(host, innodb_holders_probe(datadir, pids, files), timeout=timeout)


def real_datadir(host: Host, datadir: str) -> str:
    """The datadir with every symbolic link resolved, as the kernel names its files in /proc/<pid>/fd."""
    return ask(host, real_path(datadir))


def innodb_files_visible(host: Host, datadir: str, files: Iterable[str] = INNODB_FILES) -> tuple[set[int], str | None]:
    """While the database runs: the pids holding its InnoDB files, or why none can be seen.

    Proving that the database has really stopped relies on seeing them: an ssh user who may not look into the
    server's /proc/<pid>/fd sees nothing, and nothing would look like stopped.
    """
    holders = innodb_holders(host, datadir, files=files)
    if holders:
        return set(holders), None
    return set(), (
        f"no process is seen holding the InnoDB files of {datadir} open while the database runs: the cut-over "
        "could not prove the source database has stopped; connect as root (or as the database's user) and check "
        "that database.source.datadir is the server's datadir"
    )


# --- storage ---------------------------------------------------------------------------------------------------

# The nearest existing ancestor of a path (a target's datadir may not exist yet): its filesystem is where the data
# will land.
_EXISTING = 'p={path}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; '


@dataclass(frozen=True)
class MountFacts:
    """The filesystem under a path: findmnt's view, stat -f's counts, and what lies beneath a loop or ZFS mount."""

    path: str
    mount_point: str = ""
    device: str = ""
    fstype: str = ""
    options: tuple[str, ...] = ()
    free_bytes: int = 0
    free_inodes: int = 0
    total_inodes: int = 0
    loop_backing_file: str = ""
    zfs_sync: str = ""


def parse_mount(output: str, path: str = "") -> MountFacts:
    """mount_facts' output: a findmnt -P line, key=value lines from stat -f, losetup and zfs."""
    fields: dict[str, str] = {}
    for line in output.splitlines():
        if line.startswith("TARGET="):
            for pair in shlex.split(line):
                key, _, value = pair.partition("=")
                fields[key] = value
        elif "=" in line:
            key, _, value = line.partition("=")
            fields[key.strip()] = value.strip()
    if "FSTYPE" not in fields:
        raise TransportError(f"unexpected findmnt output for {path}", False)

    def _int(key: str) -> int:
        value = fields.get(key, "")
        return int(value) if value.isdigit() else 0

    return MountFacts(
        path=fields.get("path", path),
        mount_point=fields.get("TARGET", ""),
        device=fields.get("SOURCE", ""),
        fstype=fields["FSTYPE"],
        options=tuple(option for option in fields.get("OPTIONS", "").split(",") if option),
        free_bytes=_int("bavail") * _int("blocksize"),
        free_inodes=_int("ffree"),
        total_inodes=_int("files"),
        loop_backing_file=fields.get("backing", ""),
        zfs_sync=fields.get("zfs_sync", ""),
    )


def mount_facts(path: str) -> Probe[MountFacts]:
    """The filesystem holding `path` (or its nearest existing ancestor), its free bytes and inodes."""
    script = (
        _EXISTING.format(path=shlex.quote(path)) + 'echo "path=$p"; '
        'findmnt -n -P -T "$p" -o TARGET,SOURCE,FSTYPE,OPTIONS | head -n 1; '
        "stat -f -c 'blocksize=%S' \"$p\"; stat -f -c 'bavail=%a' \"$p\"; "
        "stat -f -c 'files=%c' \"$p\"; stat -f -c 'ffree=%d' \"$p\"; "
        'src=$(findmnt -n -o SOURCE -T "$p" | head -n 1); fs=$(findmnt -n -o FSTYPE -T "$p" | head -n 1); '
        'case "$src" in /dev/loop*) echo "backing=$(losetup -n -O BACK-FILE "$src" 2>/dev/null)";; esac; '
        'if [ "$fs" = zfs ]; then echo "zfs_sync=$(' + SBIN_PATH + 'zfs get -H -o value sync "$src" 2>/dev/null)"; fi'
    )
    return Probe(script, lambda out: parse_mount(out, path))


@dataclass(frozen=True)
class FsyncSample:
    """Latency of small synchronous writes (a 4 KiB write, then fsync) in one directory's filesystem."""

    writes: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    # "fsync" (each write timed), or "dd" (no python3 on the host: only the mean of oflag=dsync writes is known).
    method: str = "fsync"


# Writes 4 KiB then fsyncs, up to COUNT times or SECONDS, in a file it creates beside the data and always removes:
# at most 64 KiB on disk (16 blocks rewritten in turn). Prints 'fsync <writes> <latencies in microseconds...>'.
_FSYNC_SCRIPT = """
import os, sys, tempfile, time
count, seconds = int(sys.argv[2]), float(sys.argv[3])
fd, name = tempfile.mkstemp(prefix=".migrate-fsync-", dir=sys.argv[1])
block, times = b"\\0" * 4096, []
try:
    stop = time.monotonic() + seconds
    for i in range(count):
        began = time.perf_counter()
        os.pwrite(fd, block, (i % 16) * 4096)
        os.fsync(fd)
        times.append(int((time.perf_counter() - began) * 1e6))
        if time.monotonic() > stop:
            break
finally:
    os.close(fd)
    os.unlink(name)
print("fsync", len(times), *times)
"""


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


_DD_COPIED = re.compile(r"copied, ([\d.,]+) s")


def parse_fsync(output: str, path: str = "") -> FsyncSample:
    """fsync_latency's output → the sample's percentiles (milliseconds)."""
    for line in output.splitlines():
        fields = line.split()
        if fields[:1] == ["fsync"] and len(fields) > 2:
            micros = [int(value) / 1000 for value in fields[2:]]
            return FsyncSample(
                len(micros), round(_percentile(micros, 0.5), 3), round(_percentile(micros, 0.99), 3),
                round(max(micros), 3),
            )  # fmt: skip
        if fields[:1] == ["dd"] and len(fields) >= 2 and fields[1].isdigit():
            copied = _DD_COPIED.search(line)
            if copied:
                writes = int(fields[1])
                mean = float(copied.group(1).replace(",", ".")) * 1000 / max(writes, 1)
                return FsyncSample(writes, round(mean, 3), round(mean, 3), round(mean, 3), method="dd")
    raise TransportError(f"no fsync measurement for {path}: {parse_first_line(output)[:200]}", False)


def fsync_latency(directory: str, *, count: int = 200, seconds: float = 2.0) -> Probe[FsyncSample]:
    """Time small synchronous writes in `directory`'s filesystem (bounded by `count` writes and `seconds`).

    The probe file is created and removed in the directory itself (its nearest existing ancestor): a datadir is
    often a mount point of its own. Without python3 on the host, dd with oflag=dsync gives the mean only.
    """
    quoted_count, quoted_seconds = int(count), float(seconds)
    script = (
        _EXISTING.format(path=shlex.quote(directory))
        + "if command -v python3 >/dev/null; then python3 -c "
        + shlex.quote(_FSYNC_SCRIPT)
        + f' "$p" {quoted_count} {quoted_seconds}; else f=$(mktemp "$p/.migrate-fsync-XXXXXX") &&'
        + f' {{ printf "dd {quoted_count} "; timeout {quoted_seconds * 2:.0f} dd if=/dev/zero of="$f" bs=4k'
        + f' count={quoted_count} oflag=dsync 2>&1 | tail -n 1; rm -f "$f"; }}; fi'
    )
    return Probe(script, lambda out: parse_fsync(out, directory))


def parse_option_file(output: str) -> dict[str, str]:
    """`my_print_defaults --mysqld` lines ('--sync-binlog=0') → {sync_binlog: '0'}; a bare flag is 'ON'."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith("--"):
            continue
        name, _, value = line[2:].partition("=")
        name = name.replace("-", "_").lower()
        for prefix in ("loose_", "enable_"):
            name = name.removeprefix(prefix)
        found[name] = value if value else "ON"
    return found


def server_option_files() -> Probe[dict[str, str]]:
    """The [mysqld]/[mariadbd]/[server] options the host's option files give a server started without arguments."""
    return Probe(SBIN_PATH + "my_print_defaults --mysqld 2>/dev/null", parse_option_file, check=False)


def parse_counts(output: str) -> dict[str, int]:
    """'<count>\\t<path>' lines → {path: entries}."""
    counts: dict[str, int] = {}
    for line in output.splitlines():
        count, _, path = line.partition("\t")
        if count.strip().isdigit():
            counts[path] = int(count.strip())
    return counts


def entry_counts(paths: list[str]) -> Probe[dict[str, int]]:
    """How many files and directories each existing path holds (each takes an inode where it lands)."""
    script = "; ".join(
        f"[ -e {quoted} ] && printf '%s\\t%s\\n' \"$(find {quoted} 2>/dev/null | wc -l)\" {quoted}"
        for quoted in (shlex.quote(path) for path in paths)
    )
    return Probe(script + "; true", parse_counts, check=False)
