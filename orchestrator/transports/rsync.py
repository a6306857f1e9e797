"""rsync command lines run ON THE SOURCE over SSH, pushing to the target, and parsers for what rsync prints.

Every piece of a command line is shell-quoted: paths, patterns and the inner ssh command reach a remote shell.
rsync itself runs with `-s` (--secluded-args, formerly --protect-args): the paths and options it hands to the rsync
on the target travel inside its protocol, never through the target's shell, so no character in a path can change
what it names there. File paths inside the ssh command are quoted the way ssh's own option parser reads them.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import structlog

from orchestrator.output.progress import PROGRESS_KEY, TRANSFER_EVENT, EtaEstimator, TransferProgress
from orchestrator.plan.model import Plan, Retry
from orchestrator.retry import call_with_retry
from orchestrator.transports.ssh import CommandFailed, TransportError
from orchestrator.transports.throttle import Thresholds, Throttle, group_marker, live_command
from orchestrator.transports.throttle import parse_load_check as parse_load_check  # where callers found it

if TYPE_CHECKING:
    from orchestrator.contracts import Host

NICE = ["nice", "-n19", "ionice", "-c3"]
# Runtime files of a database server that must never travel with its datadir (sockets, pid files: MariaDB's and
# PostgreSQL's postmaster.pid alike). Here, not in steps/common.py: the estimate (services/) excludes them too.
DATADIR_EXCLUDES = ("*.sock", "*.sock.lock", "*.pid", "mysql.sock*")
# Exit codes: 24 = files vanished during the transfer (normal on a live tree); these are worth another try.
VANISHED = 24
# Exit 23 (partial transfer) is also what rsync sometimes gives when files vanish on a churning tree: on a LIVE
# tree it counts as vanished when every error line says so; inside the window it stays an error.
PARTIAL = 23
_VANISHED_LINES = re.compile(
    r"^(file has vanished: |rsync warning: some files vanished|rsync error: some files/attrs were not transferred)"
)
TRANSIENT_EXITS = {10, 12, 30, 35, 255}

ExitKind = Literal["ok", "vanished", "transient", "permanent"]


class RsyncError(TransportError):
    """rsync failed; `transient` for network-ish exits (10, 12, 30, 255)."""

    def __init__(self, what: str, exit_status: int | None, stderr: str) -> None:
        last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
        message = f"rsync {what} failed with exit {exit_status}" + (f": {last}" if last else "")
        super().__init__(message, exit_kind(exit_status) == "transient")
        self.exit_status = exit_status


@dataclass(frozen=True)
class Progress:
    bytes: int
    pct: int
    rate: str
    eta: str
    files_done: int | None = None  # xfr#N: files transferred so far
    files_total: int | None = None  # to-chk=N/M: M files in the transfer's list


@dataclass(frozen=True)
class Stats:
    files_transferred: int = 0
    total_size: int = 0
    transferred_bytes: int = 0
    literal_bytes: int = 0
    files_total: int = 0  # entries in the transfer (files, directories, links)
    deleted: int = 0  # entries deleted on the target (--delete, --delete-missing-args)
    # With --itemize-changes: the regular files this transfer received on the target ('>f' items).
    received: tuple[str, ...] = ()


def only_vanished(stderr: str) -> bool:
    """Every line of rsync's stderr is about files that vanished during the transfer (and there is one)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return (
        bool(lines)
        and any(line.startswith("file has vanished") for line in lines)
        and all(_VANISHED_LINES.match(line) for line in lines)
    )


def exit_kind(code: int | None) -> ExitKind:
    if code == 0:
        return "ok"
    if code == VANISHED:
        return "vanished"
    if code is None or code in TRANSIENT_EXITS:
        return "transient"
    return "permanent"


def _slash(path: str) -> str:
    return path.rstrip("/") + "/"


def target_spec(plan: Plan, path: str) -> str:
    address = plan.target.address
    if ":" in address:  # IPv6
        address = f"[{address}]"
    return f"{plan.target.user}@{address}:{_slash(path)}"


# rsync on the source reaches the target many times (pre-syncs, final passes, comparisons). One shared SSH
# connection saves a handshake (~0.2 s) on every hop, three or more of them inside the downtime window.
# The master lives on the source, exits by itself after CONTROL_PERSIST idle seconds, and the runtime closes it.
# The source → target hop's control socket, in the source's private directory (plan `run_dir`): a master another
# account started can never be found there, so every connection of the hop is the run's own, its host key checked.
CONTROL_NAME = "ssh-%C"
CONTROL_PERSIST = 120


def ssh_option_path(path: str) -> str:
    """A file path as the value of an ssh `-o Option=value`: ssh splits unquoted values on spaces (a known_hosts path
    with a space becomes two files) and expands '%' tokens, so the value is double-quoted, with '\\', '"' escaped
    and '%' doubled. A leading '~' stays unquoted-equivalent: ssh expands it after removing the quotes."""
    escaped = path.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


def target_ssh_command(plan: Plan, *, control: str = "auto") -> str:
    """The `-e` value: how rsync on the source reaches the target (host key verified, never a prompt)."""
    transfer = plan.transfer
    control_path = f"{plan.source.private_dir}/{CONTROL_NAME}"
    parts = ["ssh", "-o", f"ControlMaster={control}", "-o", f"ControlPath={control_path}"]
    if control == "auto":
        parts += ["-o", f"ControlPersist={CONTROL_PERSIST}"]
    if transfer.source_to_target_key is not None:
        # -o IdentityFile, not -i: ssh checks an -i path before expanding '%', so an escaped '%' would never match.
        parts += ["-o", f"IdentityFile={ssh_option_path(transfer.source_to_target_key)}"]
    parts += [
        "-o", f"UserKnownHostsFile={ssh_option_path(transfer.source_to_target_known_hosts)}",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes",
        "-p", str(plan.target.ssh_port),
        *transfer.source_to_target_options,
    ]  # fmt: skip
    return shlex.join(parts)


def open_master_command(plan: Plan) -> str:
    """Run on the source: opens (or keeps alive) the shared SSH connection to the target that rsync's `-e` reuses,
    so a transfer inside the window does not pay the handshake."""
    login = f"{plan.target.user}@{plan.target.address}"
    return f"{target_ssh_command(plan)} {shlex.quote(login)} true"


def remote_rsync(plan: Plan, *, nice: bool = False) -> list[str]:
    """How rsync's remote end is started on the target over the hop: as root through sudo when the target's plan says
    `become: sudo` (the hop logs in as its non-root user), niced when `nice`. [] when plain `rsync` will do."""
    argv = [*NICE] if nice else []
    argv += ["sudo", "-n", "--"] if plan.target.become == "sudo" else []  # inner: sudo allows rsync, not nice
    return ["--rsync-path=" + shlex.join([*argv, "rsync"])] if argv else []


def close_master_command(plan: Plan) -> str:
    """Run on the source: ends the shared SSH connection to the target, if there is one."""
    login = f"{plan.target.user}@{plan.target.address}"
    return f"{target_ssh_command(plan, control='no')} -O exit {shlex.quote(login)} 2>/dev/null || true"


def _common(plan: Plan, exclude: Iterable[str], chown: str | None) -> list[str]:
    args = ["-a", "-s", "--delete", "--numeric-ids"]
    if chown:
        args.append(f"--chown={chown}")
    if plan.transfer.rsync_timeout > 0:
        args.append(f"--timeout={plan.transfer.rsync_timeout}")
    for pattern in exclude:
        args.append(f"--exclude={pattern}")
    return args


def push_command(
    plan: Plan,
    source_dir: str,
    target_dir: str,
    *,
    exclude: Iterable[str] = (),
    live: bool = True,
    inplace: bool = False,
    chown: str | None = None,
    extra: Iterable[str] = (),
) -> str:
    """rsync SRC/ → user@target:DST/, to run on the source. `extra`: more rsync options, as given.

    `live`: the source is serving, so apply the plan's bwlimit and nice/ionice (on both ends). In the downtime
    window (live=False) neither applies: every second counts.
    """
    transfer = plan.transfer
    nice = live and transfer.nice
    argv = [*NICE] if nice else []
    argv += ["rsync", *_common(plan, exclude, chown)]
    if transfer.whole_file:
        argv.append("--whole-file")
    if inplace:
        argv.append("--inplace")
    argv += list(extra)
    if live and transfer.bwlimit:
        argv.append(f"--bwlimit={transfer.bwlimit}")
    argv += remote_rsync(plan, nice=nice)
    # Incremental recursion (rsync's default) keeps rsync's memory flat on a tree of millions of files; the whole
    # list up front (--no-inc-recursive) would only make progress2's percentage exact.
    argv += ["--info=progress2", "--stats"]
    argv += ["-e", target_ssh_command(plan), _slash(source_dir), target_spec(plan, target_dir)]
    return shlex.join(argv)


def compare_command(
    plan: Plan,
    source_dir: str,
    target_dir: str,
    *,
    exclude: Iterable[str] = (),
    chown: str | None = None,
    live: bool = False,
) -> str:
    """A --dry-run --checksum --itemize-changes run: it lists every item that WOULD change (none = equal).

    `live`: the full comparison made before the window reads every byte on both hosts while the source serves, so
    it runs with the plan's nice/ionice on both ends, like the pre-sync, and reports its progress.
    """
    nice = live and plan.transfer.nice
    argv = [*NICE] if nice else []
    argv += ["rsync", *_common(plan, exclude, chown), "--dry-run", "--checksum", "--itemize-changes"]
    if live:
        argv.append("--info=progress2")
    argv += remote_rsync(plan, nice=nice)
    argv += ["-e", target_ssh_command(plan), _slash(source_dir), target_spec(plan, target_dir)]
    return shlex.join(argv)


def item_path(line: str) -> str | None:
    """The path of one --itemize-changes line ('>f.st...... dir/file', '*deleting   gone'), None for other lines.

    rsync pads the item flags (and '*deleting') to 11 characters, then one space."""
    if len(line) < 13 or line[11] != " " or line[0] not in "<>ch.*":
        return None
    if _DIR_TIMES_ONLY.match(line[:11]):
        return None
    return line[12:].rstrip("/") or None


_PROGRESS = re.compile(r"^\s*([\d,]+)\s+(\d+)%\s+(\S+)\s+(\d+:\d\d:\d\d)")
_XFR = re.compile(r"xfr#(\d+)")
_TO_CHECK = re.compile(r"to-chk=(\d+)/(\d+)")
_BWLIMIT = re.compile(r"--bwlimit=(\S+)")
PROGRESS_EVENT_EVERY = 0.5  # seconds between the transfer's progress records (bars redraw from them)


def parse_progress(line: str) -> Progress | None:
    """One --info=progress2 update, e.g. '  1,234,567  45%   12.34MB/s    0:00:05 (xfr#3, to-chk=0/10)'."""
    match = _PROGRESS.match(line)
    if not match:
        return None
    xfr = _XFR.search(line)
    to_check = _TO_CHECK.search(line)
    return Progress(
        int(match.group(1).replace(",", "")),
        int(match.group(2)),
        match.group(3),
        match.group(4),
        int(xfr.group(1)) if xfr else None,
        int(to_check.group(2)) if to_check else None,
    )


class ProgressReporter:
    """Turns rsync's updates into `transfer_progress` records (orchestrator.output.progress) with an honest ETA."""

    def __init__(self, what: str, command: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        bwlimit = _BWLIMIT.search(command)
        self.what = what
        self.throttle = bwlimit.group(1).strip("'\"") if bwlimit else None
        self.clock = clock
        self.started = clock()
        self.estimator = EtaEstimator()
        self.last_sent = -PROGRESS_EVENT_EVERY
        self.log = structlog.get_logger("migrate")

    def update(self, p: Progress, *, done: bool = False) -> TransferProgress:
        now = self.clock()
        rate, eta, total, state = self.estimator.update(now, p.bytes, p.pct)
        update = TransferProgress(
            id=self.what, bytes=p.bytes, total=total, pct=100 if done else p.pct, files_done=p.files_done,
            files_total=p.files_total, rate=rate, eta=0.0 if done else eta, state="done" if done else state,
            elapsed=round(now - self.started, 3), throttle=self.throttle,
        )  # fmt: skip
        if done or now - self.last_sent >= PROGRESS_EVENT_EVERY:
            self.last_sent = now
            self.log.info(TRANSFER_EVENT, **{PROGRESS_KEY: update.payload()})
        return update


def _stat(text: str, label: str) -> int:
    match = re.search(rf"^{re.escape(label)}:\s*([\d,]+)", text, re.MULTILINE)
    return int(match.group(1).replace(",", "")) if match else 0


def _not_progress(line: str) -> bool:
    return _PROGRESS.match(line) is None


def parse_stats(text: str) -> Stats:
    """The --stats block."""
    return Stats(
        files_transferred=_stat(text, "Number of regular files transferred"),
        total_size=_stat(text, "Total file size"),
        transferred_bytes=_stat(text, "Total transferred file size"),
        literal_bytes=_stat(text, "Literal data"),
        files_total=_stat(text, "Number of files"),
        deleted=_stat(text, "Number of deleted files"),
        received=tuple(path for line in text.splitlines() if line.startswith(">f") and (path := item_path(line))),
    )


def push(
    host: Host,
    command: str,
    *,
    what: str,
    retry: Retry,
    on_progress: Callable[[Progress], None] | None = None,
    progress_interval: float = 2.0,
    timeout: float | None = None,
    live: bool = False,
    short: bool = False,
) -> Stats:
    """Run a push_command on `host` (the source), retrying transient failures; returns the --stats figures.

    `short`: a pass over a list of changed paths (O(changes)): it may run in the host's kept shell (SshHost.stream).

    `live`: the source tree is being written to, so files vanishing under rsync are normal (exit 24, or 23 when
    every error is a vanished file).

    `on_progress` is called at most every `progress_interval` seconds (and with the last update).
    """
    log = structlog.get_logger()

    def _once() -> Stats:
        last_sent = 0.0
        latest: list[Progress] = []
        reporter = ProgressReporter(what, command)

        def _line(line: str) -> None:
            nonlocal last_sent
            progress = parse_progress(line)
            if progress is None:
                return
            latest[:] = [progress]
            reporter.update(progress)
            now = time.monotonic()
            if on_progress is not None and now - last_sent >= progress_interval:
                last_sent = now
                on_progress(progress)

        extra: dict[str, Any] = {"short": True} if short else {}
        result = host.stream(command, _line, timeout=timeout, check=False, keep=_not_progress, **extra)
        kind = exit_kind(result.exit_status)
        if live and result.exit_status == PARTIAL and only_vanished(result.stderr):
            kind = "vanished"
        if kind == "vanished":
            log.warning("rsync_files_vanished", what=what, detail="normal on a live tree")
        elif kind != "ok":
            raise RsyncError(what, result.exit_status, result.stderr)
        if on_progress is not None and latest:
            on_progress(latest[0])
        stats = parse_stats(result.stdout)
        last = latest[0] if latest else Progress(0, 100, "", "0:00:00")
        reporter.update(Progress(stats.transferred_bytes or last.bytes, 100, "", "", last.files_done,
                                 last.files_total), done=True)  # fmt: skip
        return stats

    return call_with_retry(_once, retry, what=f"rsync {what}")


_DIR_TIMES_ONLY = re.compile(r"^\.d\.\.t[.\s]*$")


def changed_items(host: Host, command: str, *, what: str, timeout: float | None = None) -> list[str]:
    """Run a compare_command; the items that differ ('>fcs...... path', '*deleting path', ...)."""
    try:
        result = host.run(command, timeout=timeout, check=True)
    except CommandFailed as exc:
        raise RsyncError(what, exc.exit_status, exc.stderr) from None
    return itemized(result.stdout)


def itemized(stdout: str) -> list[str]:
    """The items a compare_command printed that differ (a directory whose only difference is its mtime holds no
    different data)."""
    items = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        flags, _, _name = line.partition(" ")
        if _DIR_TIMES_ONLY.match(flags):
            continue
        items.append(line)
    return items


# --- a pre-sync the live site does not feel (transports/throttle.py) -------------------------------------------


def push_live(
    host: Host,
    plan: Plan,
    command: str,
    *,
    what: str,
    retry: Retry,
    on_progress: Callable[[Progress], None] | None = None,
    timeout: float | None = None,
) -> tuple[Stats, float]:
    """`push` for a pre-sync while the source serves: under `nocache` and, with `transfer.max_load` or
    `transfer.max_latency_ms`, paused while the source is loaded or the live app slow. Returns the figures and the
    seconds spent paused."""
    transfer = plan.transfer
    thresholds = Thresholds.of(plan)
    if thresholds is None:
        wrapped = live_command(command, nocache=transfer.nocache, group_marker=None)
        return push(host, wrapped, what=what, retry=retry, on_progress=on_progress, timeout=timeout, live=True), 0.0
    marker = group_marker(plan.source.private_dir)
    wrapped = live_command(command, nocache=transfer.nocache, group_marker=marker, max_load=transfer.max_load)
    with Throttle(host, marker, thresholds, what=what) as throttle:
        stats = push(host, wrapped, what=what, retry=retry, on_progress=on_progress, timeout=timeout, live=True)
    structlog.get_logger().info(
        "presync_throttle", what=what, max_load=transfer.max_load, max_latency_ms=thresholds.max_latency_ms,
        **throttle.figures(),
    )  # fmt: skip
    return stats, round(throttle.throttled_seconds, 3)
