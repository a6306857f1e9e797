"""MariaDB's after-commit audit: the shutdown mode's stopped source read in isolation, the held snapshot's figures,
and the replicate mode's chunked comparison of the read-only source against the target's snapshot.

Shutdown mode. The source is started so that it cannot take a write by mistake, whatever its configuration says: its
own command line (read from the running server before the window, services/audit.read_launch) plus
`--skip-networking` (no TCP at all), a socket in a private directory (0700) of its own, `--read-only`,
`--innodb-read-only` (InnoDB writes nothing: its files stay byte for byte as the clean shutdown left them), no binary
log, no replica threads, no event scheduler. Only Aria's log control file notes the start. The audit stops it again
(SIGTERM, waited for) before it reports.

Replicate mode. repl_catchup compared the replica before the window; a change made on the replica after that
comparison (a write with the binary log off, by an account that may write through read_only, or by hand) reaches no
GTID, so the switch's proof (the replica executed exactly the source's final position) cannot see it. This audit can:
after the commit, nothing on the source changes (read_only, fenced, no replication into it until finish), and the
target's side is read in the consistent snapshot verify_target opened on the promoted, still fenced target (held on
the run's runtime, orchestrator/services/audit.py), so the target's writes since the commit are outside it.

Why that snapshot holds the target exactly as migrated: it is opened after the promotion (verify_target runs after
the switch has returned) and before the commit (the commit point, switch_traffic with a front door on the source or
else the DNS flip, lifts the target's fence after verify_target has returned): no write of the application can be
in it. A write made by another hand meanwhile is in it, and differs from the source: that is what the audit is for.
The session's isolation level is checked first (a snapshot under READ COMMITTED would see the writes since the
commit): a session not in REPEATABLE READ is reported, not compared. The source's side is proven frozen too: its own
snapshot's binary-log position must be the final GTID position the switch journaled.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.database.mysql import compare, gtid
from orchestrator.database.mysql import session as mysql
from orchestrator.database.protocol import (
    AuditCutShort,
    AuditUnreadable,
    ChunkedAudit,
    DatabaseError,
    PositionNotReached,
    Session,
)

if TYPE_CHECKING:
    from orchestrator.contracts import Host
    from orchestrator.services.audit import ServerLaunch

Figures = tuple[dict[str, int], dict[str, int | None]]
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
START_TIMEOUT = 180.0
STOP_TIMEOUT = 300.0
POLL = 0.5
# A table missing on one side (ER_NO_SUCH_TABLE).
NO_SUCH_TABLE = 1146
# The connection is gone: nothing more can be read on it (CR_SERVER_GONE_ERROR, CR_SERVER_LOST).
CONNECTION_GONE = (2006, 2013)
SNAPSHOT_STATEMENT = "START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT"
# The snapshot and the target's position in one round trip: a transaction begun inside a compound statement keeps
# its snapshot after it (MariaDB 10.11). The position is read after the read view is made: it cannot be behind it.
SNAPSHOT_AND_POSITION = f"BEGIN NOT ATOMIC {SNAPSHOT_STATEMENT}; SELECT @@GLOBAL.gtid_current_pos; END"
# The same once the server has applied a position (read beside the promotion that waits for it too): the snapshot is
# opened only once the wait reached it (NULL comes back otherwise, nothing opened).
SNAPSHOT_AND_POSITION_AFTER = (
    "BEGIN NOT ATOMIC IF MASTER_GTID_WAIT(%s, %s) = 0 THEN "
    f"{SNAPSHOT_STATEMENT}; SELECT @@GLOBAL.gtid_current_pos; ELSE SELECT NULL; END IF; END"
)


def open_target_snapshot(conn: Session) -> None:
    """One statement, one round trip: the read view is made when it returns."""
    with conn.cursor() as cur:
        cur.execute(SNAPSHOT_STATEMENT)


def open_target_snapshot_at_position(
    conn: Session, after: tuple[gtid.GtidPosition, float] | None = None
) -> gtid.GtidPosition:
    """Open the snapshot and read the target's GTID position (gtid_current_pos) in one statement, one round trip;
    the position read just after the read view was made. `after` (a position, a wait in seconds): only once the
    server has applied it; PositionNotReached when it was not in that time."""
    with conn.cursor() as cur:
        if after is None:
            cur.execute(SNAPSHOT_AND_POSITION)
        else:
            cur.execute(SNAPSHOT_AND_POSITION_AFTER, (str(after[0]), after[1]))
        row = cur.fetchone()
    if row is None:
        raise DatabaseError("no GTID position came back with the snapshot")
    if after is not None and row[0] is None:
        raise PositionNotReached(f"the target did not apply {after[0]} within {after[1]:g} s")
    return gtid.GtidPosition.parse(str(row[0] or ""))


def snapshot_isolation(conn: Session) -> str:
    """The held session's isolation level ('REPEATABLE-READ' for a true consistent snapshot)."""
    with conn.cursor() as cur:
        cur.execute("SELECT @@SESSION.tx_isolation")
        row = cur.fetchone()
    return str(row[0]) if row else ""


def table_engines(conn: Session) -> dict[str, str]:
    """Each base table's engine, lower case, by 'schema.table'."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_SCHEMA, TABLE_NAME, ENGINE FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE'"
        )
        return {f"{schema}.{table}": str(engine or "").lower() for schema, table, engine in cur.fetchall()}


def _gone(exc: DatabaseError) -> bool:
    return bool(exc.args) and exc.args[0] in CONNECTION_GONE


def compare_snapshots(
    source: Session,
    target: Session,
    tables: Iterable[tuple[str, str]],
    *,
    chunk_rows: int,
    pause_ratio: float = 0.0,
    on_chunk: Callable[[str, int, int], None] | None = None,
) -> ChunkedAudit:
    """Both sides' checksums over the source's primary-key chunks (compare.chunk_bounds / compare.chunk_checksum, as
    repl_catchup compares). A table one side cannot read is listed with why and the others go on; a connection
    that is gone ends it (AuditUnreadable). `pause_ratio`: after each chunk, that many times its duration (the
    live target's share)."""
    found = ChunkedAudit()
    started = time.monotonic()
    for schema, table in tables:
        found.tables += 1
        name = f"{schema}.{table}"
        side = "source"
        try:
            shape = compare.table_shape(source, schema, table)
            chunks = compare.chunk_bounds(source, shape, chunk_rows)
            for chunk in chunks:
                began = time.monotonic()
                side = "source"
                ours = compare.chunk_checksum(source, shape, chunk)
                side = "target"
                theirs = compare.chunk_checksum(target, shape, chunk)
                found.chunks += 1
                found.rows += ours.rows
                if ours != theirs:
                    found.differences.append(compare.ChunkDiff(shape.name, chunk, shape.key, ours, theirs))
                if on_chunk is not None:
                    on_chunk(name, chunk.index + 1, len(chunks))
                if pause_ratio > 0:
                    time.sleep((time.monotonic() - began) * pause_ratio)
        except DatabaseError as exc:
            if _gone(exc):
                raise AuditUnreadable(f"the {side}'s connection is gone at {name}: {exc}") from None
            if side == "target" and exc.args and exc.args[0] == NO_SUCH_TABLE:
                found.missing.append(name)
            else:
                found.unread[name] = f"on the {side}: {exc}"
    found.seconds = round(time.monotonic() - started, 3)
    return found


def audit_chunks(snapshot: Session, source: Session, final: gtid.GtidPosition, schemas: list[str] | None, *,
                 chunk_rows: int, pause_ratio: float, timeout: float, on_start: Callable[[int], None],
                 on_chunk: Callable[[str, int, int], None]) -> ChunkedAudit:  # fmt: skip
    """The held target snapshot against the read-only source, chunk by chunk: the snapshot's isolation checked, the
    source's own consistent snapshot proven at `final`, every table compared (`on_start(tables)` before), the
    source's snapshot closed. AuditCutShort when nothing could be compared."""
    with mysql.read_timeout(snapshot, timeout):
        isolation = snapshot_isolation(snapshot)
        if isolation.upper().replace(" ", "-") != "REPEATABLE-READ":
            raise AuditCutShort(f"the target's session ran in {isolation}, not REPEATABLE READ: its snapshot was not "
                                "consistent, nothing was compared")  # fmt: skip
        try:
            held = compare.open_consistent_snapshot(source)
            if not gtid.same_position(final, held.gtid):
                raise AuditCutShort(f"the source stands at {held.gtid or 'nothing'}, not at the final position "
                                    f"{final}: it changed since the switch, nothing was compared")  # fmt: skip
            tables = mysql.list_tables(source, schemas)
            engines = table_engines(source)
            on_start(len(tables))
            found = compare_snapshots(source, snapshot, tables, chunk_rows=chunk_rows, pause_ratio=pause_ratio,
                                      on_chunk=on_chunk)  # fmt: skip
            found.engines = engines
            return found
        finally:
            with contextlib.suppress(Exception):
                compare.close_snapshot(source)


# --- the shutdown mode: the stopped source, isolated ---------------------------------------------------------


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


def source_figures(server: IsolatedServer, tables: list[str], *, counts: bool, checksums: bool,
                   timeout: float) -> Figures:  # fmt: skip
    sql = figures_sql(tables, counts=counts, checksums=checksums)
    return parse_figures(server.query(sql, timeout=timeout, force=True), tables)


def isolated_figures(host: Host, launch: ServerLaunch, tables: list[str], *, counts: bool, checksums: bool,
                     timeout: float, started: Callable[[str | None], None]) -> Figures:  # fmt: skip
    """The stopped source started read-only and isolated, read, and stopped again whatever happened.
    `started(directory)` is called with its private directory before it starts (the step journals it:
    `stop_isolated` ends what a dead run left), `started(None)` once it stopped."""
    server = private_dir(host, launch)
    started(server.directory)
    try:
        start_isolated(server, launch)
        return source_figures(server, tables, counts=counts, checksums=checksums, timeout=timeout)
    finally:
        stop_isolated(server)  # raises when it would not stop: the directory stays journaled
        started(None)


def snapshot_figures(conn: Session, tables: list[str], *, counts: bool, checksums: bool, timeout: float) -> Figures:
    """Row counts and checksums read in the held snapshot; a table that cannot be read is left out."""
    got_counts: dict[str, int] = {}
    got_sums: dict[str, int | None] = {}
    with conn.cursor() as cur, mysql.read_timeout(conn, timeout):
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
