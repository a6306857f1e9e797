"""The shutdown mode's after-commit audit: what it holds between steps, and the stopped source read in isolation.

Row counts and CHECKSUM TABLE read every row: O(data). They stay out of the downtime window. Inside it,
verify_target only opens a consistent snapshot on the (still fenced) target, which costs one round trip, and keeps
that session open here; after the commit, the `audit` step reads the snapshot (the data exactly as migrated, whatever
the target took since) and the stopped source, started again read-only and isolated, and compares.

The source is started so that it cannot take a write by mistake, whatever its configuration says: its own command
line (read from the running server before the window) plus `--skip-networking` (no TCP at all), a socket in a
private directory (0700) of its own, `--read-only`, `--innodb-read-only` (InnoDB writes nothing: its files stay
byte for byte as the clean shutdown left them), no binary log, no replica threads, no event scheduler. Only Aria's
log control file notes the start. The audit stops it again (SIGTERM, waited for) before it reports.

What is held lives in this process only, on the run's runtime (`Runtime.audit_hold`): a run resumed by another
process has no snapshot, and says so. The replicate mode's audit (orchestrator/services/replica_audit.py) holds its
target snapshot the same way.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.contracts import Host
from orchestrator.database.mysql import session as mysql
from orchestrator.database.protocol import DatabaseError, Session

# Options appended to the source server's own command line (later options win over earlier ones and its files).
ISOLATION_OPTIONS = (
    "--skip-networking",
    "--read-only",
    "--innodb-read-only",
    "--skip-log-bin",
    "--skip-slave-start",
    "--event-scheduler=OFF",
    # Reached only through the private socket below: no credentials needed, none exposed.
    "--skip-grant-tables",
)
SERVER_NAMES = ("mariadbd", "mysqld")
START_TIMEOUT = 180.0
STOP_TIMEOUT = 300.0
POLL = 0.5
# One whole-table read per table on a stopped, otherwise idle server: generous, it is after the commit.
READ_TIMEOUT = 4 * 3600.0
TRANSACTIONAL = ("innodb", "heap")  # PostgreSQL's tables are all "heap" (MVCC, in the snapshot)


@dataclass
class ServerLaunch:
    """How the source's database server was started: its binary, arguments and user (read before the window)."""

    binary: str
    args: list[str]
    user: str | None = None


@dataclass
class Held:
    """What one run keeps between verify_target and the audit (on its runtime: `Runtime.audit_hold`)."""

    source: ServerLaunch | None = None
    snapshot: Session | None = None
    snapshot_at: float | None = None
    engines: dict[str, str] = field(default_factory=dict)


class HoldsAudit(Protocol):
    audit_hold: Held


def held(rt: HoldsAudit) -> Held:
    """What this run holds for its audit (kept by the run's runtime: it lives and dies with this process)."""
    return rt.audit_hold


def forget(rt: HoldsAudit) -> Held:
    """What was held, handed over once (the runtime keeps a fresh, empty hold)."""
    hold, rt.audit_hold = rt.audit_hold, Held()
    return hold


# --- the source server's command line ---------------------------------------------------------------------------


def parse_launch(output: str) -> ServerLaunch | None:
    """`launch_command`'s output: the user, the binary (/proc/PID/exe), then the NUL-separated command line."""
    user, _, rest = output.partition("\n")
    exe, _, cmdline = rest.partition("\n")
    args = [a for a in cmdline.split("\0") if a]
    if not args:
        return None
    binary = exe.strip()
    if not binary or binary.endswith(" (deleted)"):  # an upgraded binary: the name it was started by
        binary = args[0]
    return ServerLaunch(binary=binary, args=args[1:], user=user.strip() or None)


def launch_command(pid: int) -> str:
    return f"stat -c %U /proc/{pid} && readlink /proc/{pid}/exe; echo; cat /proc/{pid}/cmdline"


def server_pid(host: Host, pids: Iterable[int]) -> int | None:
    """Of the processes holding the datadir's InnoDB files, the database server (by its binary's name)."""
    candidates = sorted(pids)
    for pid in candidates:
        out = host.run(f"readlink /proc/{pid}/exe", timeout=10.0, check=False).stdout.strip()
        if out.rsplit("/", 1)[-1].split(" ")[0] in SERVER_NAMES:
            return pid
    return candidates[0] if candidates else None


def read_launch(host: Host, pids: Iterable[int]) -> ServerLaunch | None:
    pid = server_pid(host, pids)
    if pid is None:
        return None
    return parse_launch(host.run(launch_command(pid), timeout=10.0).stdout)


def isolated_argv(launch: ServerLaunch, directory: str) -> list[str]:
    """The server's own command line, then what isolates it (a later option wins): its socket, pid file and error
    log in `directory`, no network, read-only everywhere."""
    argv = [launch.binary, *launch.args, *ISOLATION_OPTIONS]
    argv += [f"--socket={directory}/mysqld.sock", f"--pid-file={directory}/mysqld.pid",
             f"--log-error={directory}/mysqld.err"]  # fmt: skip
    if launch.user:
        argv.append(f"--user={launch.user}")  # as root, the server drops to its own user again
    return argv


# --- the isolated source ----------------------------------------------------------------------------------------


class AuditError(Exception):
    pass


@dataclass
class IsolatedServer:
    host: Host
    directory: str

    @property
    def socket(self) -> str:
        return f"{self.directory}/mysqld.sock"

    def client(self) -> str:
        client = 'c=$(command -v mariadb || command -v mysql) || { echo "no mariadb client" >&2; exit 127; }'
        return f'{client}; "$c" --no-defaults -S {shlex.quote(self.socket)} -u root -N -B'

    def query(self, sql: str, *, timeout: float, force: bool = False) -> str:
        flags = " --force" if force else ""
        result = self.host.run(f"{self.client()}{flags}", input=sql, timeout=timeout, check=False)
        if result.exit_status != 0 and not force:
            raise AuditError(f"the isolated source did not answer: {result.stderr.strip()[-300:]}")
        return result.stdout


def private_dir(host: Host, launch: ServerLaunch) -> IsolatedServer:
    """A private (0700) directory on the source for the isolated server's socket, pid file and error log."""
    user = shlex.quote(launch.user or "")
    made = host.run(
        'd=$(mktemp -d "${TMPDIR:-/tmp}/migrate-audit.XXXXXX") && chmod 700 "$d" && '
        f'{{ [ "$(id -u)" != 0 ] || [ -z {user} ] || chown {user} "$d"; }} && printf %s "$d"',
        timeout=30.0,
    ).stdout.strip()
    if not made.startswith("/"):
        raise AuditError("could not make a private directory for the isolated source on its host")
    return IsolatedServer(host, made)


def start_isolated(server: IsolatedServer, launch: ServerLaunch, timeout: float = START_TIMEOUT) -> None:
    """Start the stopped source's server read-only on its private socket; returns once it answers."""
    host, made = server.host, server.directory
    argv = shlex.join(isolated_argv(launch, made))
    # The launch's own pid, recorded at once: the server writes its pid file only once it has started its engines,
    # and a probe that found neither the socket nor that file would take a starting server for an exited one.
    launched = shlex.quote(f"{made}/{LAUNCHED_PID}")
    host.run(f"cd / && (setsid nohup {argv} >/dev/null 2>&1 </dev/null & echo $! > {launched})", timeout=30.0)
    deadline = time.monotonic() + timeout
    while True:
        probe = host.run(f"{server.client()} -e 'SELECT 1'", timeout=30.0, check=False)
        if probe.exit_status == 0:
            return
        alive = host.run(_alive(made), timeout=30.0, check=False).exit_status == 0
        if not alive or time.monotonic() > deadline:
            tail = host.run(f"tail -n 5 {shlex.quote(made)}/mysqld.err", timeout=30.0, check=False).stdout.strip()
            stop_isolated(server)
            why = "exited during start-up" if not alive else f"did not answer within {timeout:g} s"
            raise AuditError(f"the source's server, started read-only for the audit, {why}: {tail[-400:]}")
        time.sleep(POLL)


LAUNCHED_PID = "launched.pid"


def _pid(directory: str) -> str:
    """Shell: the isolated server's pid (its own pid file, else the one its launch recorded), in $p."""
    own, launched = (shlex.quote(f"{directory}/{name}") for name in ("mysqld.pid", LAUNCHED_PID))
    return f'p=$(cat {own} 2>/dev/null); [ -n "$p" ] || p=$(cat {launched} 2>/dev/null)'


def _alive(directory: str) -> str:
    return f'{_pid(directory)}; test -n "$p" && kill -0 "$p"'


def stop_isolated(server: IsolatedServer, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM (a clean shutdown), waited for; then its private directory goes. Raises if it will not stop."""
    d = shlex.quote(server.directory)
    script = (
        f'{_pid(server.directory)}; if test -n "$p"; then kill -TERM "$p" 2>/dev/null; i=0; '
        f'while kill -0 "$p" 2>/dev/null; do i=$((i+1)); [ $i -gt {int(timeout * 10)} ] && exit 3; sleep 0.1; done; '
        f"fi; rm -rf {d}"
    )
    result = server.host.run(script, timeout=timeout + 30.0, check=False)
    if result.exit_status != 0:
        raise AuditError(
            f"the source's server started for the audit (socket {server.socket}) did not stop within {timeout:g} s:"
            " stop it by hand (it is read-only and reachable only through that socket)"
        )


# --- figures ----------------------------------------------------------------------------------------------------


def _quoted(name: str) -> str:
    schema, _, table = name.partition(".")
    return "`" + schema.replace("`", "``") + "`.`" + table.replace("`", "``") + "`"


def figures_sql(tables: list[str], *, counts: bool, checksums: bool) -> str:
    """Statements for the isolated source's client: one marker per table and figure, so a table that fails (missing)
    leaves its figure out instead of shifting the others."""
    lines = []
    for i, name in enumerate(tables):
        if counts:
            lines.append(f"SELECT 'count#{i}', COUNT(*) FROM {_quoted(name)};")
        if checksums:
            lines.append(f"SELECT 'checksum#{i}';")
            lines.append(f"CHECKSUM TABLE {_quoted(name)};")
    return "\n".join(lines) + "\n"


def parse_figures(output: str, tables: list[str]) -> tuple[dict[str, int], dict[str, int | None]]:
    counts: dict[str, int] = {}
    sums: dict[str, int | None] = {}
    pending: str | None = None
    for line in output.splitlines():
        head, _, value = line.partition("\t")
        if head.startswith("count#"):
            counts[tables[int(head[6:])]] = int(value)
            pending = None
        elif head.startswith("checksum#"):
            pending = tables[int(head[9:])]
        elif pending is not None and value:
            sums[pending] = None if value == "NULL" else int(value)
            pending = None
    return counts, sums


def source_figures(
    server: IsolatedServer, tables: list[str], *, counts: bool, checksums: bool
) -> tuple[dict[str, int], dict[str, int | None]]:
    sql = figures_sql(tables, counts=counts, checksums=checksums)
    return parse_figures(server.query(sql, timeout=READ_TIMEOUT, force=True), tables)


def open_snapshot(conn: Session, schemas: list[str] | None) -> dict[str, str]:
    """A read-only consistent snapshot on `conn` (kept open by the caller), and each table's engine, lower case."""
    return mysql.open_snapshot(conn, schemas)


def snapshot_figures(
    conn: Session, tables: list[str], *, counts: bool, checksums: bool
) -> tuple[dict[str, int], dict[str, int | None]]:
    """Row counts and checksums read in the held snapshot; a table that cannot be read is left out."""
    got_counts: dict[str, int] = {}
    got_sums: dict[str, int | None] = {}
    with conn.cursor() as cur, mysql.read_timeout(conn, READ_TIMEOUT):
        for name in tables:
            try:
                if counts:
                    cur.execute(f"SELECT COUNT(*) FROM {_quoted(name)}")
                    got_counts[name] = int(str(cur.fetchone()[0]))  # COUNT(*) has one row
                if checksums:
                    cur.execute(f"CHECKSUM TABLE {_quoted(name)}")
                    row = cur.fetchone()
                    got_sums[name] = None if not row or row[1] is None else int(str(row[1]))
            except DatabaseError as exc:
                if not exc.statement_refused:
                    raise
                continue  # the table is missing on the target
    return got_counts, got_sums


def engine_figures(
    database: Any, conn: Session, tables: list[str], *, counts: bool, checksums: bool
) -> tuple[dict[str, int], dict[str, int | None]]:
    """Row counts and checksums read in the held snapshot through the engine (`database`: a Database), one table at a
    time; a table that cannot be read (missing on the target) is left out."""
    got_counts: dict[str, int] = {}
    got_sums: dict[str, int | None] = {}
    with database.bounded(conn, READ_TIMEOUT):
        for name in tables:
            schema, _, table = name.partition(".")
            try:
                if counts:
                    got_counts.update(database.row_counts(conn, [(schema, table)]))
                if checksums:
                    got_sums.update(database.checksums(conn, [(schema, table)]))
            except DatabaseError as exc:
                if not exc.statement_refused:
                    raise
    return got_counts, got_sums


def differences(kind: str, source: dict[str, Any], target: dict[str, Any]) -> list[str]:
    """One line per table whose figure differs ('schema.table: row counts: source 10, target 9')."""
    lines = []
    for table, want in sorted(source.items()):
        if table not in target:
            lines.append(f"{table}: {kind}: missing on the target")
        elif target[table] != want:
            lines.append(f"{table}: {kind}: source {want}, target {target[table]}")
    return lines


def transactional(engine: str) -> bool:
    return engine in TRANSACTIONAL
