"""The replica's seed and the tunnel its replication runs through, as command lines for a host and their parsers.

What runs on a host over SSH is a pair: a function that builds the command line and one that parses what it printed.
- the seed: `mariadb-backup --backup --stream=mbstream` on the source, piped through the source→target SSH hop into
  `mbstream -x` in a staging directory beside the target's datadir, `--prepare`d there, then swapped in as the
  datadir (the old one is kept aside for an undo); its GTID position read from the backup's binlog info file;
- the tunnel (orchestrator/transports/tunnel.py, shared by every engine): an `ssh -N` run on the source over the
  same host-key-verified hop rsync uses; here only its MariaDB probe.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.database.mysql.gtid import GtidPosition, ReplicationError, _rows, _scalar
from orchestrator.database.protocol import Session
from orchestrator.transports.tunnel import (
    TunnelSpec,
    free_port_command,
    parse_port,
    parse_tunnel_pid,
    tunnel_check_command,
    tunnel_down_command,
    tunnel_up_command,
)

__all__ = [
    "TunnelSpec",
    "free_port_command",
    "parse_port",
    "parse_tunnel_pid",
    "tunnel_check_command",
    "tunnel_down_command",
    "tunnel_up_command",
]

NICE = ("nice", "-n19", "ionice", "-c3")


# The backup files that record where the copy stands in the source's binlog (the newer name first).
BINLOG_INFO_FILES = ("mariadb_backup_binlog_info", "xtrabackup_binlog_info")


SEED_SUFFIX = ".seed"


BEFORE_SEED_SUFFIX = ".before-seed"


# --- the seed ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeedSpec:
    """How the seed copies the live source into the target's datadir.

    `ssh_to_target`: the ssh argv as run ON THE SOURCE to reach the target, login last (the hop rsync uses, host
    key verified). The source's database is reached on `source_socket` (or the client's default) as `source_user`;
    a password, when the user has one (`password_env`, the name it is known by), is the first line of the command's
    stdin (pass it as the command's input, never on a command line): the script keeps it in a shell variable, writes
    it into an option file of a private directory (mktemp -d, 0700) that mariadb-backup alone reads
    (--defaults-extra-file, or --defaults-file with `no_defaults`), and removes both at its end: it is in no
    process's environment or command line. `throttle` is mariadb-backup's --throttle: data-file read
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


LOGIN_WORD = '"$login"'


def _backup_words(argv: list[str]) -> str:
    """mariadb-backup's command line: every word quoted, but the option file's, which the shell expands."""
    return " ".join(word if word.endswith(LOGIN_WORD) else shlex.quote(word) for word in argv)


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
    if spec.password_env:
        # An option file must be the first option; --defaults-file reads it alone (what --no-defaults asks).
        backup.append(f"--defaults-file={LOGIN_WORD}" if spec.no_defaults else f"--defaults-extra-file={LOGIN_WORD}")
    elif spec.no_defaults:
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
    # The password: the first line of stdin, in a variable the script never exports; stdin is then closed. Written
    # into the option file escaped as option files read a quoted value (a backslash and a double quote escaped).
    read_password = (
        'IFS= read -r password || true; exec </dev/null; private=$(mktemp -d) || exit 3; login="$private/login.cnf"\n'
        "esc=$(printf '%s' \"$password\" | sed 's/[\\\\\"]/\\\\&/g'); unset password\n"
        # mariadb-backup reads its connection's options from the client groups ([client] among them).
        '( umask 077; printf \'[client]\\npassword="%s"\\n\' "$esc" >"$login" ); '
        "unset esc\n"
        if spec.password_env
        else ""
    )
    cleanup = 'rm -f "$log"; rm -rf "$private"' if spec.password_env else 'rm -f "$log"'
    script = f"""set -o pipefail
{read_password}log={shlex.quote(log_path) if log_path else "$(mktemp)"}; trap '{cleanup}' EXIT
exec 4>&1
{stamp_log(spec.nice)}
{_backup_words(backup)} 2>&5 5>&- | dd bs=1M status=progress 2>&4 5>&- | \
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


# --- the tunnel (transports/tunnel.py; named here too, as this package's callers knew it) ------------------------


def tunnel_probe_command(port: int, user: str, password_env: str) -> str:
    """Run where the tunnel listens: a MariaDB handshake and login through it ('mysqld is alive' on success).

    The password comes from the environment variable `password_env` (pass it with the command's env).
    """
    argv = ["mariadb-admin", "--no-defaults", "--protocol=tcp", "-h", "127.0.0.1", "-P", str(port)]
    argv += ["-u", user, "--connect-timeout=5", "ping"]
    return _bash(f'MYSQL_PWD="${{{password_env}}}" {shlex.join(argv)} 2>&1')


def parse_probe(stdout: str) -> bool:
    return "is alive" in stdout
