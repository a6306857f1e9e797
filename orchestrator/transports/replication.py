"""MariaDB replication for the replicate cut-over: the seed, the tunnel, the replica, the switch and the comparison.

Thin and typed, like the other transports. What runs on a host over SSH is a pair: a function that builds the
command line and one that parses what it printed. What runs in SQL takes an open pymysql connection (autocommit,
from transports/mysql.py) and returns typed values; call those from an ordinary thread, never the SSH event loop's.

The pieces, in the order a run uses them:
- the seed: `mariadb-backup --backup --stream=mbstream` on the source, piped through the source→target SSH hop into
  `mbstream -x` in a staging directory beside the target's datadir, `--prepare`d there, then swapped in as the
  datadir (the old one is kept aside for an undo); its GTID position read from the backup's binlog info file;
- the tunnel: an `ssh -N` run on the source over the same host-key-verified hop rsync uses. `-R` makes the target
  listen on its loopback and carries the replica's connection to the source's MariaDB; `-L` (reverse replication)
  makes the source listen and reach the target's. Nothing of the replication protocol crosses the network outside
  SSH. The ssh is its own control master (a per-tunnel socket): `-O check` names its pid, `-O exit` ends it, and
  starting it again after it died is the same idempotent command;
- the replica: CHANGE MASTER TO … MASTER_USE_GTID=slave_pos after SET GLOBAL gtid_slave_pos, START/STOP SLAVE,
  SHOW SLAVE STATUS parsed, MASTER_GTID_WAIT in slices that notice a broken replica;
- the switch: read_only on the source, its final GTID position, the wait, the promotion (STOP SLAVE, RESET SLAVE
  ALL, read_only=0) and the proof that the target executed exactly the source's position;
- the comparison (after Vitess VDiff): a consistent snapshot on the source at a known GTID position, the replica
  stopped at that same position, and checksums of both sides over the same primary-key ranges.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import pymysql

from orchestrator.database.protocol import Session
from orchestrator.secrets import redact, register
from orchestrator.transports.mysql import db_error, read_timeout

NICE = ("nice", "-n19", "ionice", "-c3")
# The backup files that record where the copy stands in the source's binlog (the newer name first).
BINLOG_INFO_FILES = ("mariadb_backup_binlog_info", "xtrabackup_binlog_info")
SEED_SUFFIX = ".seed"
BEFORE_SEED_SUFFIX = ".before-seed"
# How long one MASTER_GTID_WAIT call may block before the replica's health is looked at again.
WAIT_SLICE = 0.5


class ReplicationError(Exception):
    """A replication operation failed; the message is one line, with the server's own words and no secret."""


class PositionMismatch(ReplicationError):
    """The replica did not execute exactly the source's final position: it was not promoted."""


# --- GTID positions ---------------------------------------------------------------------------------------------

_GTID = re.compile(r"^(\d+)-(\d+)-(\d+)$")


@dataclass(frozen=True, order=True)
class Gtid:
    domain: int
    server_id: int
    seq: int

    def __str__(self) -> str:
        return f"{self.domain}-{self.server_id}-{self.seq}"


@dataclass(frozen=True)
class GtidPosition:
    """A GTID position (one GTID per replication domain), as in @@gtid_binlog_pos: '0-1-42,1-3-7'."""

    gtids: tuple[Gtid, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> GtidPosition:
        items = [part.strip() for part in (text or "").split(",") if part.strip()]
        gtids: dict[int, Gtid] = {}
        for item in items:
            match = _GTID.match(item)
            if not match:
                raise ValueError(f"not a GTID: {item!r}")
            gtid = Gtid(*(int(g) for g in match.groups()))
            if gtid.domain in gtids:
                raise ValueError(f"two GTIDs for domain {gtid.domain} in {text!r}")
            gtids[gtid.domain] = gtid
        return cls(tuple(sorted(gtids.values())))

    def __str__(self) -> str:
        return ",".join(str(g) for g in self.gtids)

    def __bool__(self) -> bool:
        return bool(self.gtids)

    def seq_by_domain(self) -> dict[int, int]:
        return {g.domain: g.seq for g in self.gtids}

    def reached(self, wanted: GtidPosition) -> bool:
        """Every domain of `wanted` is at or past its sequence number here (what MASTER_GTID_WAIT waits for)."""
        mine = self.seq_by_domain()
        return all(mine.get(g.domain, -1) >= g.seq for g in wanted.gtids)


# --- the seed ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeedSpec:
    """How the seed copies the live source into the target's datadir.

    `ssh_to_target`: the ssh argv as run ON THE SOURCE to reach the target, login last (the hop rsync uses, host
    key verified). The source's database is reached on `source_socket` (or the client's default) as `source_user`;
    a password, when the user has one (`password_env`, the name it is known by), is the first line of the command's
    stdin (pass it as the command's input, never on a command line): the script keeps it in a shell variable and
    hands it to mariadb-backup alone, in that one process's environment (MYSQL_PWD), not to dd, ssh or anything else
    the script runs. `throttle` is mariadb-backup's --throttle: data-file read
    operations per second, a coarse knob that is NOT a rate (measured on 10.11 on the lab, 256 MiB: unthrottled
    ~70 MB/s, --throttle=20 7.6 MB/s, --throttle=2 1.4 MB/s; Percona's 10 MiB-per-operation figure does not hold).
    nice/ionice (`nice`) is what protects a live source in every case.
    """

    source_datadir: str
    target_datadir: str
    ssh_to_target: tuple[str, ...]
    source_socket: str | None = None
    source_user: str | None = None
    password_env: str | None = None
    owner: str | None = None
    throttle: int | None = None
    nice: bool = True
    no_defaults: bool = False
    # The target's plan says `become: sudo`: the hop logs in as a non-root user, the receiver runs through sudo.
    target_sudo: bool = False
    parallel: int = 1
    log_copy_interval_ms: int = 10

    @property
    def staging_dir(self) -> str:
        return self.target_datadir.rstrip("/") + SEED_SUFFIX

    @property
    def previous_dir(self) -> str:
        return self.target_datadir.rstrip("/") + BEFORE_SEED_SUFFIX


def _bash(script: str) -> str:
    return "bash -c " + shlex.quote(script)


def _ssh_remote(ssh_argv: Sequence[str], remote_command: str) -> str:
    """ssh … login 'command': the remote command as one argument, quoted for the remote shell."""
    return shlex.join([*ssh_argv, remote_command])


def seed_stream_command(spec: SeedSpec, *, log_path: str | None = None) -> str:
    """Run on the source: stream a hot backup into the target's staging directory (replaced if it exists).

    stdout carries `dd status=progress` lines ('123456 bytes (…) copied, 2 s, 61 MB/s', split on \\r) and, at the
    end, mariadb-backup's stage lines prefixed 'backup: ' (its locks and the binlog position it recorded), each with
    the moment it was written (`stamp_log`). On failure the tail of mariadb-backup's log goes to stderr. `log_path`:
    where mariadb-backup's log is kept while it runs (a throttle reads its stages there), removed at the end like the
    temporary one.
    """
    backup = [*NICE] if spec.nice else []
    backup += ["mariadb-backup"]
    if spec.no_defaults:
        backup.append("--no-defaults")
    backup += ["--backup", "--stream=mbstream", f"--datadir={spec.source_datadir}", f"--parallel={spec.parallel}"]
    backup.append(f"--log-copy-interval={spec.log_copy_interval_ms}")
    backup.append("--target-dir=/tmp")  # the copy goes to stdout; the option must still name a directory
    if spec.source_socket:
        backup.append(f"--socket={spec.source_socket}")
    if spec.source_user:
        backup.append(f"--user={spec.source_user}")
    if spec.throttle is not None:
        backup.append(f"--throttle={spec.throttle}")
    staging = shlex.quote(spec.staging_dir)
    receive = f"rm -rf {staging} && mkdir -p {staging} && mbstream -x -C {staging}"
    if spec.target_sudo:
        receive = shlex.join(["sudo", "-n", "--", "sh", "-c", receive])
    password = 'MYSQL_PWD="$password" ' if spec.password_env else ""
    # The password: the first line of stdin, in a variable the script never exports; stdin is then closed.
    read_password = "IFS= read -r password || true; exec </dev/null\n" if spec.password_env else ""
    script = f"""set -o pipefail
{read_password}log={shlex.quote(log_path) if log_path else "$(mktemp)"}; trap 'rm -f "$log"' EXIT
exec 4>&1
{stamp_log(spec.nice)}
{password}{shlex.join(backup)} 2>&5 5>&- | dd bs=1M status=progress 2>&4 5>&- | \
  {_ssh_remote(spec.ssh_to_target, receive)} 5>&-
rc=$?
{stamp_log_end()}
grep -E 'BACKUP STAGE|All tables unlocked|binlog position|completed OK' "$log" | sed 's/^/backup: /'
if [ $rc -ne 0 ]; then {stamped_tail(15)} >&2; fi
exit $rc"""
    return _bash(script)


# The first of mariadb-backup's stages that take locks on the live server: from here on (FLUSH, BLOCK_DDL, then
# BLOCK_COMMIT, which holds every commit until the end) a paused backup would hold them over the pause.
LOCKING_STAGE = "Starting BACKUP STAGE FLUSH"
# What a stamped log ends with once every line of mariadb-backup's is in it.
STAMPED_END = "stamped: end"
# How long the script waits for that end after the backup exited (its last lines are being written): a bound that
# only the lock figures depend on, never the copy.
STAMPED_END_WAIT_S = 5


def stamp_log(niced: bool) -> str:
    """Opens fd 5 for mariadb-backup's log: a reader (a process substitution) writes each line to "$log" after the
    moment it was written, seconds since the epoch to the microsecond (bash's $EPOCHREALTIME, `date` where bash is
    older than 5), so the report says how long the backup blocked the live site's commits to the millisecond where
    mariadb-backup's own log says it to the second.

    Beside a niced backup, the same reader gives it the ordinary CPU and I/O priority back on its first locking
    stage's line: nice -n19 and the idle I/O class suit its long InnoDB copy, which blocks nobody; but a starved
    process holding BLOCK_COMMIT holds every commit of the live site for as long as the machine keeps it waiting (a
    priority inversion: seconds on a busy host instead of milliseconds). Lowering a niceness needs root or
    CAP_SYS_NICE; without them the backup stays niced, and the reader says nothing. The reader acts on the line as
    it arrives: nothing polls the log."""
    unnice = ""
    if niced:
        # In the background: the lines that follow (the locking stages' own) are stamped as they arrive, not after it.
        unnice = (
            f'if [ -z "$unniced" ] && [[ $line == *{shlex.quote(LOCKING_STAGE)}* ]]; then unniced=1; '
            "{ for pid in $(pgrep -P $$ -x mariadb-backup); do renice -n 0 -p $pid; ionice -c2 -n4 -p $pid; done; } "
            "</dev/null >/dev/null 2>&1 4>&- 6>&- & fi; "
        )
    # The log on an fd of its own (6), not the loop's redirected stdout: bash would keep a copy of the session's
    # stdout for the loop, which the job above would inherit and hold open. `|| [ -n "$line" ]`: a last line
    # without its newline (a crash's message) is kept too.
    return (
        'exec 5> >(exec 6>"$log"; unniced=; while IFS= read -r line || [ -n "$line" ]; do '
        'printf "%s %s\\n" "${EPOCHREALTIME:-$(date +%s.%N)}" "$line" >&6; '
        f"{unnice}done; echo {shlex.quote(STAMPED_END)} >&6)"
    )


def stamped_tail(lines: int) -> str:
    """The last lines of mariadb-backup's own log as it wrote them (the stamps and the reader's end left out): the
    failure's own words end the command's stderr, which is what an error message shows."""
    return f"grep -vxF {shlex.quote(STAMPED_END)} \"$log\" | tail -n {lines} | sed -E 's/^[0-9]+[.,][0-9]+ //'"


def stamp_log_end() -> str:
    """After the backup: fd 5 closed, then a wait for the reader's last lines, bounded in time (bash's $SECONDS)."""
    return (
        f'exec 5>&-; waited=$SECONDS; until grep -qxF {shlex.quote(STAMPED_END)} "$log" 2>/dev/null || '
        f"[ $((SECONDS - waited)) -ge {STAMPED_END_WAIT_S} ]; do sleep 0.01; done"
    )


def seed_locking_command(log_path: str) -> str:
    """A shell condition, run on the source: true once the backup logging to `log_path` began its locking stages."""
    return f"grep -qF {shlex.quote(LOCKING_STAGE)} {shlex.quote(log_path)} 2>/dev/null"


def redo_lsn(conn: Session) -> int:
    """The source's current redo log sequence number (bytes of redo written since the server was made)."""
    rows = _rows(conn, "SHOW GLOBAL STATUS LIKE 'Innodb_lsn_current'")
    if not rows:
        raise ReplicationError("the server does not report Innodb_lsn_current")
    return int(str(rows[0][1]))


def redo_capacity(conn: Session) -> int:
    """Bytes of redo the server keeps before writing over the oldest (its circular redo log's size)."""
    return int(str(_scalar(conn, "SELECT @@innodb_log_file_size")))


_DD_PROGRESS = re.compile(r"^(\d+) bytes")


def parse_seed_progress(line: str) -> int | None:
    """Bytes streamed so far, from one of dd's progress or summary lines."""
    match = _DD_PROGRESS.match(line.strip())
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class BackupStage:
    """When mariadb-backup entered and left each BACKUP STAGE (seconds resolution, from its own log)."""

    stage: str
    started: str
    finished: str


_STAGE_LINE = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (Starting|Started|Acquired locks for|Finish\w*|Executing) BACKUP STAGE (\w+)"
)


def parse_backup_stages(stdout: str) -> list[BackupStage]:
    started: dict[str, str] = {}
    stages: list[BackupStage] = []
    for line in stdout.splitlines():
        match = _STAGE_LINE.search(line)
        if not match:
            continue
        stamp, verb, stage = match.groups()
        if verb.startswith("Start"):
            started.setdefault(stage, stamp)
        elif verb.startswith("Finish") or verb == "Executing":
            stages.append(BackupStage(stage, started.get(stage, stamp), stamp))
    return stages


@dataclass(frozen=True)
class BackupLocks:
    """How long the backup blocked the live source, from its stamped log (seconds, to the millisecond): its commits
    from the BLOCK_COMMIT stage's start (a pending BLOCK_COMMIT already holds new commits back) until every lock was
    released, and DDL from BLOCK_DDL's start until then. None where the log does not show both ends."""

    commits_blocked: float | None
    ddl_blocked: float | None
    commits_blocked_from: float | None = None  # when, on the source's clock (seconds since the epoch)


_STAMP = re.compile(r"^(?:backup: )?(\d+[.,]\d+) ")


def parse_backup_locks(stdout: str) -> BackupLocks:
    begun: dict[str, float] = {}
    unlocked: float | None = None
    for line in stdout.splitlines():
        match = _STAMP.match(line)
        if not match:
            continue
        stamp = float(match.group(1).replace(",", "."))  # $EPOCHREALTIME follows the locale's decimal point
        if line.rstrip().endswith("Starting BACKUP STAGE BLOCK_COMMIT"):
            begun.setdefault("commit", stamp)
        elif line.rstrip().endswith("Started BACKUP STAGE BLOCK_DDL"):
            begun.setdefault("ddl", stamp)
        elif line.rstrip().endswith("All tables unlocked"):
            unlocked = stamp

    def span(what: str) -> float | None:
        return round(unlocked - begun[what], 3) if unlocked is not None and what in begun else None

    commits = span("commit")
    return BackupLocks(commits, span("ddl"), begun["commit"] if commits is not None else None)


def seed_size_command(spec: SeedSpec) -> str:
    """Run on the source: about how many bytes the backup streams (the datadir without what it never copies:
    binlogs, relay logs, the redo log, of which only the part written during the copy travels, and ibtmp1)."""
    datadir = shlex.quote(spec.source_datadir.rstrip("/"))
    excluded = ("*.[0-9][0-9][0-9][0-9][0-9][0-9]", "*.index", "ib_logfile*", "ibtmp*")
    options = " ".join(f"--exclude={shlex.quote(pattern)}" for pattern in excluded)
    return _bash(f"du -sb {options} {datadir} | cut -f1")


def parse_size(stdout: str) -> int:
    return int(stdout.strip().split()[0])


def prepare_command(spec: SeedSpec) -> str:
    """Run on the target: make the streamed copy consistent (InnoDB's crash recovery, applied to the copy)."""
    argv = ["mariadb-backup"]
    if spec.no_defaults:
        argv.append("--no-defaults")
    argv += ["--prepare", f"--target-dir={spec.staging_dir}"]
    script = f"""set -o pipefail
log=$(mktemp); trap 'rm -f "$log"' EXIT
{shlex.join(argv)} >"$log" 2>&1 || {{ tail -n 15 "$log" >&2; exit 1; }}"""
    return _bash(script)


def _chown(spec: SeedSpec, datadir: str, previous: str) -> str:
    """The copy is written by the SSH user (root): it takes the owner given, else that of the datadir it replaces
    (the database server's account), so the server can open it."""
    if spec.owner:
        return f"chown -R {shlex.quote(spec.owner)} {datadir}"
    return f"if [ -e {previous} ]; then chown -R --reference={previous} {datadir}; fi"


def _not_a_link(quoted_datadir: str) -> str:
    """Refuse to rename a symbolic link: the datadir must be given resolved (the directory a /var/lib/mysql link
    points at), or the link itself would move aside and the copy land on the link's filesystem, the real directory
    left stale."""
    return (f"if [ -L {quoted_datadir} ]; then echo {quoted_datadir}': a symbolic link: the seed acts on the "
            "directory it points at (resolve it first)' >&2; exit 1; fi")  # fmt: skip


def install_command(spec: SeedSpec) -> str:
    """Run on the target, its database stopped: the prepared copy becomes the datadir.

    The previous datadir is kept beside it (`restore_previous_command` undoes the swap); both renames stay on one
    filesystem, so neither copies a byte. A staging dir that is not a complete, prepared copy (its
    xtrabackup_checkpoints says 'backup_type = log-applied' only after --prepare succeeded) is refused.
    """
    staging, datadir, previous = (
        shlex.quote(p) for p in (spec.staging_dir, spec.target_datadir.rstrip("/"), spec.previous_dir)
    )
    chown = _chown(spec, datadir, previous)
    script = f"""set -euo pipefail
{_not_a_link(datadir)}
if ! grep -qx 'backup_type = log-applied' {staging}/xtrabackup_checkpoints 2>/dev/null; then
  echo "no prepared seed in {spec.staging_dir}" >&2; exit 1
fi
rm -rf {previous}
if [ -e {datadir} ]; then mv {datadir} {previous}; fi
mv {staging} {datadir}
{chown}"""
    return _bash(script)


def finish_install_command(spec: SeedSpec) -> str:
    """Run on the target, its database stopped: complete an install a crash cut short, never undoing one.

    After a crash the swap stands at one of three places: not begun (the prepared staging dir and the datadir both
    there: a plain install), half done (the datadir already moved aside, the staging dir not yet in its place: move
    it), or done (no staging dir: nothing to do). A plain re-run of `install_command` in the half-done case would
    delete the previous datadir.
    """
    staging, datadir, previous = (
        shlex.quote(p) for p in (spec.staging_dir, spec.target_datadir.rstrip("/"), spec.previous_dir)
    )
    chown = _chown(spec, datadir, previous)
    script = f"""set -euo pipefail
if [ -d {staging} ]; then
  if [ -e {datadir} ]; then {install_command(spec)}; exit $?; fi
  grep -qx 'backup_type = log-applied' {staging}/xtrabackup_checkpoints
  mv {staging} {datadir}
fi
{chown}"""
    return _bash(script)


def restore_previous_command(spec: SeedSpec) -> str:
    """Run on the target, its database stopped: undo `install_command` (the seeded datadir is deleted)."""
    datadir, previous = (shlex.quote(p) for p in (spec.target_datadir.rstrip("/"), spec.previous_dir))
    return _bash(f"set -euo pipefail; {_not_a_link(datadir)}\n"
                 f"if [ -e {previous} ]; then rm -rf {datadir}; mv {previous} {datadir}; fi")  # fmt: skip


def discard_staging_command(spec: SeedSpec) -> str:
    """Run on the target: remove a staging dir a failed or abandoned seed left (nothing else was touched)."""
    return _bash(f"rm -rf {shlex.quote(spec.staging_dir)}")


@dataclass(frozen=True)
class BackupPosition:
    """Where the copy stands in the source's binlog."""

    file: str
    position: int
    gtid: GtidPosition


def backup_position_command(backup_dir: str) -> str:
    """Run on the target: print the backup's binlog info file (whichever name this version writes)."""
    files = " ".join(shlex.quote(f"{backup_dir.rstrip('/')}/{name}") for name in BINLOG_INFO_FILES)
    return _bash(f'for f in {files}; do if [ -f "$f" ]; then cat "$f"; exit 0; fi; done; exit 1')


def parse_backup_position(text: str) -> BackupPosition:
    """'binlog.000002<TAB>3877<TAB>0-1-38' (the GTID column may list several domains, or be absent)."""
    fields = text.strip().split("\t") if "\t" in text else text.split()
    if len(fields) < 2 or not fields[1].isdigit():
        raise ReplicationError(f"unreadable binlog info in the backup: {text.strip()[:120]!r}")
    gtid = GtidPosition.parse(fields[2] if len(fields) > 2 else "")
    if not gtid:
        raise ReplicationError("the backup recorded no GTID position: is the source's binlog enabled?")
    return BackupPosition(fields[0], int(fields[1]), gtid)


# --- the tunnel -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TunnelSpec:
    """An SSH tunnel run on the source over its hop to the target.

    `remote`: the target listens on its 127.0.0.1:`listen_port` and the connection goes on, from the source, to
    `connect_host`:`connect_port` (the source's MariaDB): the forward replica's path. `local`: the source listens on
    its 127.0.0.1:`listen_port` and reaches `connect_host`:`connect_port` as seen from the target: the reverse path.
    """

    name: str
    direction: Literal["remote", "local"]
    ssh_to_target: tuple[str, ...]
    listen_port: int
    connect_host: str
    connect_port: int
    control_dir: str = "/tmp"
    alive_interval: int = 5
    alive_count: int = 3

    @property
    def control_path(self) -> str:
        return f"{self.control_dir.rstrip('/')}/migrate-tunnel-{self.name}.ctl"

    @property
    def log_path(self) -> str:
        return f"{self.control_dir.rstrip('/')}/migrate-tunnel-{self.name}.log"

    @property
    def forward(self) -> list[str]:
        flag = "-R" if self.direction == "remote" else "-L"
        return [flag, f"127.0.0.1:{self.listen_port}:{self.connect_host}:{self.connect_port}"]


def _with_options(ssh_argv: Sequence[str], options: Iterable[str]) -> list[str]:
    # ssh keeps the FIRST value of an option: ours go right after the program name, before the plan's.
    return [ssh_argv[0], *options, *ssh_argv[1:]]


def _control(spec: TunnelSpec, operation: str) -> str:
    argv = _with_options(spec.ssh_to_target, ["-o", f"ControlPath={spec.control_path}", "-O", operation])
    return shlex.join(argv)


def tunnel_up_command(spec: TunnelSpec) -> str:
    """Run on the source: start the tunnel unless it runs; returns once the forward is listening.

    `-f` with ExitOnForwardFailure makes ssh wait for the forward to be set up before it goes to the background,
    and fail when the port is taken. Keepalives end a tunnel whose peer vanished; this same command brings it back
    (a socket left by a killed master is removed first). Prints 'pid N'.
    """
    options = [
        "-f", "-N",
        "-o", "ControlMaster=yes", "-o", f"ControlPath={spec.control_path}", "-o", "ControlPersist=no",
        "-o", "ExitOnForwardFailure=yes",
        "-o", f"ServerAliveInterval={spec.alive_interval}", "-o", f"ServerAliveCountMax={spec.alive_count}",
        *spec.forward,
    ]  # fmt: skip
    start = shlex.join(_with_options(spec.ssh_to_target, options))
    control = shlex.quote(spec.control_path)
    log = shlex.quote(spec.log_path)
    script = f"""set -u
mkdir -p {shlex.quote(spec.control_dir)}
if ! {_control(spec, "check")} 2>/dev/null; then
  rm -f {control}
  if ! {start} </dev/null >{log} 2>&1; then
    echo "tunnel {spec.name}: ssh failed: $(tail -n 3 {log} | tr '\\n' ' ')" >&2
    exit 1
  fi
fi
{_control(spec, "check")} 2>&1 | sed -n 's/.*pid=\\([0-9]*\\).*/pid \\1/p'"""
    return _bash(script)


def tunnel_check_command(spec: TunnelSpec) -> str:
    """Run on the source: prints 'pid N' while the tunnel's ssh runs (exit 0), nothing otherwise (exit 1)."""
    return _bash(
        f"set -o pipefail; {_control(spec, 'check')} 2>&1 | sed -n 's/.*pid=\\([0-9]*\\).*/pid \\1/p' | grep ."
    )


def parse_tunnel_pid(stdout: str) -> int | None:
    match = re.search(r"pid (\d+)", stdout)
    return int(match.group(1)) if match else None


def tunnel_down_command(spec: TunnelSpec) -> str:
    """Run on the source: end the tunnel (its connections close with it) and remove its socket and log; nothing to
    do when it is not running."""
    files = f"{shlex.quote(spec.control_path)} {shlex.quote(spec.log_path)}"
    return _bash(f"{_control(spec, 'exit')} 2>/dev/null; rm -f {files}; true")


def free_port_command(low: int = 20000, high: int = 60000) -> str:
    """Run on a host: print a TCP port nothing listens on at 127.0.0.1 now (a tunnel's listening end).

    Only a hint: the tunnel's ssh fails on a port taken meanwhile (ExitOnForwardFailure) and is tried again.
    """
    return _bash(
        f"for i in $(seq 50); do p=$(( {low} + (RANDOM * 32768 + RANDOM) % ({high} - {low}) )); "
        "if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo $p; exit 0; fi; done; exit 1"
    )


def parse_port(stdout: str) -> int:
    return int(stdout.strip().split()[0])


def tunnel_probe_command(port: int, user: str, password_env: str) -> str:
    """Run where the tunnel listens: a MariaDB handshake and login through it ('mysqld is alive' on success).

    The password comes from the environment variable `password_env` (pass it with the command's env).
    """
    argv = ["mariadb-admin", "--no-defaults", "--protocol=tcp", "-h", "127.0.0.1", "-P", str(port)]
    argv += ["-u", user, "--connect-timeout=5", "ping"]
    return _bash(f'MYSQL_PWD="${{{password_env}}}" {shlex.join(argv)} 2>&1')


def parse_probe(stdout: str) -> bool:
    return "is alive" in stdout


# --- SQL helpers ------------------------------------------------------------------------------------------------


def _rows(conn: Session, sql: str, args: object = None) -> list[tuple[object, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def _scalar(conn: Session, sql: str, args: object = None) -> object:
    rows = _rows(conn, sql, args)
    return rows[0][0] if rows else None


def _run(conn: Session, what: str, *statements: str) -> None:
    try:
        with conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)
    except pymysql.MySQLError as exc:
        raise ReplicationError(str(db_error(what, exc))) from None


def gtid_binlog_pos(conn: Session) -> GtidPosition:
    """What this server has written to its binlog: what a replica of it receives."""
    return GtidPosition.parse(str(_scalar(conn, "SELECT @@GLOBAL.gtid_binlog_pos") or ""))


def gtid_current_pos(conn: Session) -> GtidPosition:
    return GtidPosition.parse(str(_scalar(conn, "SELECT @@GLOBAL.gtid_current_pos") or ""))


def gtid_slave_pos(conn: Session) -> GtidPosition:
    """What this server has applied as a replica."""
    return GtidPosition.parse(str(_scalar(conn, "SELECT @@GLOBAL.gtid_slave_pos") or ""))


# --- the replica ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaSource:
    """Where a replica reads from (through a tunnel: 127.0.0.1 and the tunnel's port)."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    connect_retry: int = 1
    heartbeat_period: float = 1.0


def start_binlog_at(conn: Session, position: GtidPosition) -> None:
    """On a freshly seeded server: its binlog starts at the copy's position (RESET MASTER, gtid_binlog_state).

    The copy carries no binlog. With this, the target's first binlog lists the source's last GTID, so after the
    promotion an old source asking to replicate from exactly that position (nothing written between the seed and
    the switch) finds it there, and the target's own @@gtid_binlog_pos starts where its data does. (On the lab,
    MariaDB 10.11 also accepted that request without it; the GTID docs make no such promise under
    gtid_strict_mode.)
    """
    _run(conn, "setting the seeded binlog state", "RESET MASTER", f"SET GLOBAL gtid_binlog_state = '{position}'")


def point_replica(conn: Session, source: ReplicaSource, start_at: GtidPosition) -> None:
    """Make this server a GTID replica of `source` from `start_at` (not started: see start_replica).

    The password goes into CHANGE MASTER as a bound parameter and is registered for redaction; an error message
    never carries it. The server keeps it in its master.info (in the datadir), as every MariaDB replica does.
    """
    register(source.password)
    try:
        with conn.cursor() as cur:
            cur.execute("STOP SLAVE")
            cur.execute("RESET SLAVE ALL")
            cur.execute("SET GLOBAL gtid_slave_pos = %s", (str(start_at),))
            cur.execute(
                "CHANGE MASTER TO MASTER_HOST = %s, MASTER_PORT = %s, MASTER_USER = %s, MASTER_PASSWORD = %s, "
                "MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = %s, MASTER_HEARTBEAT_PERIOD = %s",
                (source.host, source.port, source.user, source.password, source.connect_retry, source.heartbeat_period),
            )
    except pymysql.MySQLError as exc:
        message = str(db_error("pointing the replica at its source", exc)).replace(source.password, "***")
        raise ReplicationError(redact(message)) from None


def forget_replication(conn: Session) -> None:
    """STOP SLAVE and RESET SLAVE ALL: no more replication, and master.info (which holds the replication password
    in clear) deleted. A no-op on a server that is not a replica."""
    if replica_status(conn) is None:
        return
    _run(conn, "forgetting replication", "STOP SLAVE", "RESET SLAVE ALL")


def start_replica(conn: Session) -> None:
    _run(conn, "START SLAVE", "START SLAVE")


def stop_replica(conn: Session) -> None:
    _run(conn, "STOP SLAVE", "STOP SLAVE")


@dataclass(frozen=True)
class ReplicaStatus:
    """SHOW SLAVE STATUS, the parts a run decides on."""

    io_running: str  # Yes, No, Connecting
    sql_running: bool
    seconds_behind: int | None
    gtid_io_pos: GtidPosition
    last_io_errno: int
    last_io_error: str
    last_sql_errno: int
    last_sql_error: str
    master_host: str
    master_port: int
    using_gtid: str
    until_condition: str

    @property
    def replicating(self) -> bool:
        return self.io_running == "Yes" and self.sql_running

    @property
    def error(self) -> str | None:
        """The replica's own words for what stopped it, or None."""
        if self.last_sql_errno:
            return f"replica SQL thread error {self.last_sql_errno}: {self.last_sql_error}"
        if self.last_io_errno:
            return f"replica IO thread error {self.last_io_errno}: {self.last_io_error}"
        return None


def replica_status(conn: Session) -> ReplicaStatus | None:
    """None when the server is not a replica."""
    with cast(pymysql.Connection, conn).cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute("SHOW SLAVE STATUS")
        row = cur.fetchone()
    if not row:
        return None
    behind = row.get("Seconds_Behind_Master")
    return ReplicaStatus(
        io_running=str(row.get("Slave_IO_Running") or "No"),
        sql_running=row.get("Slave_SQL_Running") == "Yes",
        seconds_behind=None if behind is None else int(behind),
        gtid_io_pos=GtidPosition.parse(str(row.get("Gtid_IO_Pos") or "")),
        last_io_errno=int(row.get("Last_IO_Errno") or 0),
        last_io_error=redact(str(row.get("Last_IO_Error") or "")),
        last_sql_errno=int(row.get("Last_SQL_Errno") or 0),
        last_sql_error=redact(str(row.get("Last_SQL_Error") or "")),
        master_host=str(row.get("Master_Host") or ""),
        master_port=int(row.get("Master_Port") or 0),
        using_gtid=str(row.get("Using_Gtid") or ""),
        until_condition=str(row.get("Until_Condition") or ""),
    )


WaitOutcome = Literal["reached", "timed_out", "replica_failed"]


@dataclass(frozen=True)
class WaitResult:
    outcome: WaitOutcome
    waited: float
    position: GtidPosition  # gtid_slave_pos when the wait ended
    error: str | None = None  # the replica's own error when it failed


def wait_for_position(
    conn: Session, wanted: GtidPosition, timeout: float, *, require_running: bool = True
) -> WaitResult:
    """MASTER_GTID_WAIT(wanted), at most `timeout` seconds, in slices: a replica that stops with an error ends the
    wait at once with its error (MASTER_GTID_WAIT alone would sit out the whole timeout)."""
    started = time.monotonic()
    while True:
        left = timeout - (time.monotonic() - started)
        chunk = max(0.0, min(WAIT_SLICE, left))
        with read_timeout(conn, chunk + 10):
            got = _scalar(conn, "SELECT MASTER_GTID_WAIT(%s, %s)", (str(wanted), chunk))
        if got is not None and int(str(got)) == 0:
            return WaitResult("reached", time.monotonic() - started, gtid_slave_pos(conn))
        status = replica_status(conn)
        if require_running and (status is None or not status.sql_running):
            error = status.error if status else "the server is not a replica"
            return WaitResult("replica_failed", time.monotonic() - started, gtid_slave_pos(conn), error or "stopped")
        if left <= 0:
            return WaitResult("timed_out", time.monotonic() - started, gtid_slave_pos(conn))


# --- the switch -------------------------------------------------------------------------------------------------


def set_read_only(conn: Session, on: bool, *, lock_wait_timeout: float) -> None:
    """SET GLOBAL read_only. Global: it outlives this session (unlike FLUSH TABLES WITH READ LOCK), so a run that
    dies leaves it set and its undo must clear it. Turning it on waits for running commits and table locks, at most
    `lock_wait_timeout`. Accounts with READ ONLY ADMIN (or SUPER before MariaDB 11.0.1) still write, as do the
    replication threads: the application's account must have neither."""
    seconds = max(1, int(lock_wait_timeout + 0.999))
    _run(
        conn,
        f"SET GLOBAL read_only = {int(on)}",
        f"SET SESSION lock_wait_timeout = {seconds}",
        f"SET GLOBAL read_only = {1 if on else 0}",
    )


def read_only_and_position(conn: Session, *, lock_wait_timeout: float) -> GtidPosition:
    """set_read_only(on) and then the position this server has written to its binlog (its final one: nothing
    without READ ONLY ADMIN commits after read_only), in one round trip: one compound statement (MariaDB's `BEGIN
    NOT ATOMIC`), whose statements run in order and stop at the first error (read_only not set: the lock wait's
    error, and no position)."""
    seconds = max(1, int(lock_wait_timeout + 0.999))
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"BEGIN NOT ATOMIC SET SESSION lock_wait_timeout = {seconds}; SET GLOBAL read_only = 1; "
                "SELECT @@GLOBAL.gtid_binlog_pos; END"
            )
            row = cur.fetchone()
    except pymysql.MySQLError as exc:
        raise ReplicationError(str(db_error("SET GLOBAL read_only = 1", exc))) from None
    if row is None:
        raise ReplicationError("SET GLOBAL read_only = 1: no binlog position came back")
    return GtidPosition.parse(str(row[0] or ""))


def is_read_only(conn: Session) -> bool:
    return int(str(_scalar(conn, "SELECT @@GLOBAL.read_only"))) == 1


def promote(conn: Session, expected: GtidPosition | None = None) -> GtidPosition:
    """The replica becomes a primary: replication stopped, the proof checked, replication forgotten, writes allowed.

    Returns the position it executed (gtid_slave_pos read after the stop). With `expected` (the source's final
    position), a replica that did not execute exactly that position is NOT promoted: it is left stopped and
    read-only, its replication settings intact, and PositionMismatch says where it stands (the source may be
    resumed, or the replica started again).
    """
    stop_replica(conn)
    executed = gtid_slave_pos(conn)
    if expected is not None and not same_position(expected, executed):
        raise PositionMismatch(
            f"the replica executed {executed or 'nothing'}, the source's final position is {expected}"
        )
    _run(conn, "promoting the replica", "RESET SLAVE ALL", "SET GLOBAL read_only = 0")
    return executed


@dataclass(frozen=True)
class Promotion:
    """What wait_and_promote did: the replica reached the position (within the wait) or not; when it did, it was
    stopped, and promoted only if it executed exactly that position."""

    reached: bool
    promoted: bool
    executed: GtidPosition  # gtid_slave_pos read after STOP SLAVE (empty when not reached)
    waited: float  # seconds the replica took to reach the position, on the server's clock


def wait_and_promote(conn: Session, expected: GtidPosition, wait: float) -> Promotion:
    """MASTER_GTID_WAIT(expected, wait) and, once reached, promote() with its proof, in one round trip: one compound
    statement (MariaDB's `BEGIN NOT ATOMIC`) that stops replication, reads what the replica executed, and only when
    that is exactly `expected` in each of its domains (same_position, checked on the server: gtid_slave_pos holds
    one GTID per domain, so `expected`'s GTID of a domain is in that list exactly when the replica stands there)
    forgets replication and allows writes. Checked again here from what it read. Not reached within `wait`:
    nothing changed (the caller waits in slices, then promotes, as before). Reached but not that position: left
    stopped and read-only, its replication settings intact, as promote() leaves it (PositionMismatch)."""
    proof = (
        " AND ".join(
            f"FIND_IN_SET('{int(g.domain)}-{int(g.server_id)}-{int(g.seq)}', REPLACE(executed, ' ', '')) > 0"
            for g in expected.gtids
        )
        or "TRUE"
    )
    block = (
        "BEGIN NOT ATOMIC "
        "DECLARE began DATETIME(6) DEFAULT SYSDATE(6); DECLARE reached INT DEFAULT NULL; "
        "DECLARE waited BIGINT DEFAULT 0; DECLARE executed TEXT DEFAULT ''; DECLARE promoted INT DEFAULT 0; "
        "SET reached = MASTER_GTID_WAIT(%s, %s); "
        "SET waited = TIMESTAMPDIFF(MICROSECOND, began, SYSDATE(6)); "
        "IF reached = 0 THEN "
        "STOP SLAVE; SET executed = @@GLOBAL.gtid_slave_pos; "
        f"IF {proof} THEN RESET SLAVE ALL; SET GLOBAL read_only = 0; SET promoted = 1; END IF; "
        "END IF; "
        "SELECT reached, promoted, executed, waited; "
        "END"
    )
    try:
        with read_timeout(conn, wait + 10), conn.cursor() as cur:
            cur.execute(block, (str(expected), max(0.0, wait)))
            row = cur.fetchone()
    except pymysql.MySQLError as exc:
        raise ReplicationError(str(db_error("promoting the replica", exc))) from None
    if row is None:
        raise ReplicationError("promoting the replica: nothing came back")
    reached, promoted = row[0] is not None and int(str(row[0])) == 0, int(str(row[1] or 0)) == 1
    executed = GtidPosition.parse(str(row[2] or "")) if reached else GtidPosition()
    outcome = Promotion(reached, promoted, executed, int(str(row[3] or 0)) / 1e6)
    if reached and not same_position(expected, executed):
        raise PositionMismatch(
            f"the replica executed {executed or 'nothing'}, the source's final position is {expected}"
            + (" (and the server promoted it: a defect of the proof)" if promoted else "")
        )
    return outcome


def same_position(source_final: GtidPosition, executed: GtidPosition) -> bool:
    """The target executed exactly the source's final position: in every domain of the source, the same GTID."""
    mine = {g.domain: g for g in executed.gtids}
    return all(mine.get(g.domain) == g for g in source_final.gtids)


# --- the comparison (VDiff) -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """A consistent snapshot open on a source connection and where it stands in the binlog."""

    binlog_file: str
    binlog_position: int
    gtid: GtidPosition


def open_consistent_snapshot(conn: Session) -> Snapshot:
    """START TRANSACTION WITH CONSISTENT SNAPSHOT on this connection (it stays open: read the source's side of the
    comparison on it, then `close_snapshot`) and the binlog position it sees, as a GTID position.

    It blocks no writer; it holds InnoDB's purge back while open, so keep the comparison bounded.
    """
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
            status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
            file, position = status["binlog_snapshot_file"], int(status["binlog_snapshot_position"])
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (file, position))
            row = cur.fetchone()
    except pymysql.MySQLError as exc:
        raise ReplicationError(str(db_error("opening a consistent snapshot", exc))) from None
    gtid = GtidPosition.parse(str(row[0]) if row and row[0] is not None else "")
    return Snapshot(file, position, gtid)


def close_snapshot(conn: Session) -> None:
    _run(conn, "closing the snapshot", "COMMIT")


def stop_replica_at(conn: Session, position: GtidPosition, timeout: float) -> WaitResult:
    """Run the replica up to exactly `position` and leave it stopped there.

    Stop the replica BEFORE opening the source's snapshot: the replica must not be past the snapshot already.
    """
    _run(conn, "START SLAVE UNTIL", "STOP SLAVE", f"START SLAVE UNTIL master_gtid_pos = '{position}'")
    result = wait_for_position(conn, position, timeout, require_running=False)
    if result.outcome != "reached":
        return result
    # The SQL thread stops by itself right after the UNTIL position; wait for that before reading the data.
    deadline = time.monotonic() + max(1.0, timeout - result.waited)
    while True:
        status = replica_status(conn)
        if status is None or not status.sql_running:
            break
        if time.monotonic() > deadline:
            return WaitResult("timed_out", result.waited, gtid_slave_pos(conn))
        time.sleep(0.02)
    _run(conn, "STOP SLAVE", "STOP SLAVE")
    executed = gtid_slave_pos(conn)
    if not same_position(position, executed):
        return WaitResult("replica_failed", result.waited, executed, f"stopped at {executed}, not at {position}")
    return WaitResult("reached", result.waited, executed)


@dataclass(frozen=True)
class TableShape:
    schema: str
    table: str
    key: tuple[str, ...]  # primary key (or first unique NOT NULL key) columns; empty: compared as one chunk
    columns: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def quoted(self) -> str:
        return f"{_ident(self.schema)}.{_ident(self.table)}"


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def table_shape(conn: Session, schema: str, table: str) -> TableShape:
    columns = _rows(
        conn,
        "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
        "ORDER BY ORDINAL_POSITION",
        (schema, table),
    )
    indexes = _rows(
        conn,
        "SELECT s.INDEX_NAME, s.COLUMN_NAME, c.IS_NULLABLE FROM information_schema.STATISTICS s "
        "JOIN information_schema.COLUMNS c ON c.TABLE_SCHEMA = s.TABLE_SCHEMA AND c.TABLE_NAME = s.TABLE_NAME "
        "AND c.COLUMN_NAME = s.COLUMN_NAME "
        "WHERE s.TABLE_SCHEMA = %s AND s.TABLE_NAME = %s AND s.NON_UNIQUE = 0 "
        "ORDER BY s.INDEX_NAME <> 'PRIMARY', s.INDEX_NAME, s.SEQ_IN_INDEX",
        (schema, table),
    )
    unique: dict[str, list[tuple[str, bool]]] = {}
    for index, column, nullable in indexes:
        unique.setdefault(str(index), []).append((str(column), nullable == "YES"))
    # The primary key, else the first unique key without a nullable column (NULLs may repeat in a unique key).
    key = next(([c for c, _ in cols] for cols in unique.values() if not any(n for _, n in cols)), [])
    return TableShape(schema, table, tuple(key), tuple(str(c[0]) for c in columns))


@dataclass(frozen=True)
class ChunkSum:
    rows: int
    digest: int


@dataclass(frozen=True)
class Chunk:
    index: int
    lower: tuple[object, ...] | None  # first key of the chunk (None: from the table's start)
    upper: tuple[object, ...] | None  # first key of the next chunk (None: to the table's end)


@dataclass(frozen=True)
class ChunkDiff:
    table: str
    chunk: Chunk
    key: tuple[str, ...]
    source: ChunkSum
    replica: ChunkSum

    def describe(self) -> str:
        lower = "the start" if self.chunk.lower is None else _key_text(self.chunk.lower)
        upper = "the end" if self.chunk.upper is None else f"before {_key_text(self.chunk.upper)}"
        keys = ", ".join(self.key) or "whole table"
        if self.source.rows != self.replica.rows:
            what = f"{self.source.rows} rows on the source, {self.replica.rows} on the replica"
        else:
            what = f"{self.source.rows} rows on both, contents differ"
        return f"{self.table} chunk {self.chunk.index} ({keys} from {lower} to {upper}): {what}"


def _key_text(values: tuple[object, ...]) -> str:
    return ", ".join(repr(v) for v in values) if len(values) > 1 else repr(values[0])


def _key_compare(key: tuple[str, ...], op: str) -> str:
    columns = ", ".join(_ident(c) for c in key)
    marks = ", ".join(["%s"] * len(key))
    return f"({columns}) {op} ({marks})" if len(key) > 1 else f"{columns} {op} %s"


def chunk_bounds(conn: Session, shape: TableShape, chunk_rows: int) -> list[Chunk]:
    """Primary-key ranges of about `chunk_rows` rows each, read on `conn` (the source's snapshot)."""
    if not shape.key:
        return [Chunk(0, None, None)]
    columns = ", ".join(_ident(c) for c in shape.key)
    starts: list[tuple[object, ...]] = []
    last: tuple[object, ...] | None = None
    while True:
        where = f"WHERE {_key_compare(shape.key, '>=')}" if last is not None else ""
        sql = f"SELECT {columns} FROM {shape.quoted} {where} ORDER BY {columns} LIMIT 1 OFFSET {chunk_rows}"
        rows = _rows(conn, sql, last)
        if not rows:
            break
        last = tuple(rows[0])
        starts.append(last)
    bounds: list[tuple[object, ...] | None] = [None, *starts, None]
    return [Chunk(i, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def _row_digest(shape: TableShape) -> str:
    # One 64-bit digest per row (MD5's first half), XORed over the chunk with the count beside it (as
    # pt-table-checksum does). The NULL flags keep NULL apart from an empty string, which CONCAT_WS skips.
    values = ", ".join(_ident(c) for c in shape.columns)
    nulls = ", ".join(f"ISNULL({_ident(c)})" for c in shape.columns)
    return f"CAST(CONV(LEFT(MD5(CONCAT_WS('#', {values}, CONCAT({nulls}))), 16), 16, 10) AS UNSIGNED)"


def chunk_checksum(conn: Session, shape: TableShape, chunk: Chunk) -> ChunkSum:
    conditions: list[str] = []
    args: list[object] = []
    if chunk.lower is not None:
        conditions.append(_key_compare(shape.key, ">="))
        args += list(chunk.lower)
    if chunk.upper is not None:
        conditions.append(_key_compare(shape.key, "<"))
        args += list(chunk.upper)
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    sql = f"SELECT COUNT(*), COALESCE(BIT_XOR({_row_digest(shape)}), 0) FROM {shape.quoted} {where}"
    rows = _rows(conn, sql, args)
    count, digest = rows[0]
    return ChunkSum(int(str(count)), int(str(digest)))


def sample_checksum_seconds(conn: Session, shape: TableShape, rows: int) -> tuple[float, int]:
    """A chunk's checksum over the table's first `rows` rows in key order, as compare_tables computes it, timed:
    (seconds, rows read). Read-only; what one chunk of the comparison costs on this server now."""
    order = f"ORDER BY {', '.join(_ident(c) for c in shape.key)}" if shape.key else ""
    sql = (
        f"SELECT COUNT(*), COALESCE(BIT_XOR({_row_digest(shape)}), 0) FROM "
        f"(SELECT * FROM {shape.quoted} {order} LIMIT {int(rows)}) AS sample"
    )
    started = time.monotonic()
    found = _rows(conn, sql)
    return time.monotonic() - started, int(str(found[0][0])) if found else 0


def compare_tables(
    source: Session,
    replica: Session,
    tables: Iterable[tuple[str, str]],
    *,
    chunk_rows: int = 2000,
    pause_ratio: float = 0.0,
    on_chunk: Callable[[str, int, int], None] | None = None,
) -> list[ChunkDiff]:
    """Checksums of both sides over the same key ranges; every chunk that differs, named by table and chunk.

    `source` must be inside `open_consistent_snapshot`, `replica` stopped at its position (`stop_replica_at`).
    `pause_ratio`: after each chunk, sleep that many times the chunk's duration (the live source's share).
    `on_chunk(table, done, total)` reports progress.
    """
    diffs: list[ChunkDiff] = []
    for schema, table in tables:
        shape = table_shape(source, schema, table)
        chunks = chunk_bounds(source, shape, chunk_rows)
        for chunk in chunks:
            started = time.monotonic()
            ours, theirs = chunk_checksum(source, shape, chunk), chunk_checksum(replica, shape, chunk)
            if ours != theirs:
                diffs.append(ChunkDiff(shape.name, chunk, shape.key, ours, theirs))
            if on_chunk is not None:
                on_chunk(shape.name, chunk.index + 1, len(chunks))
            if pause_ratio > 0:
                time.sleep((time.monotonic() - started) * pause_ratio)
    return diffs
