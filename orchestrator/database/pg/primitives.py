"""PostgreSQL primitives both cut-over modes need: psycopg connections, the fence, WAL positions, the seed of a
standby through the SSH tunnel, promotion with proof, the old primary turned into a standby, preflight facts.

Supported: PostgreSQL 13 and later on both sides, the same major version (physical replication needs it); proven on
the lab with Debian 12's PostgreSQL 15. A thin adapter like database/mysql/session.py and database/mysql/replica.py: SQL
functions take an open psycopg connection, host work is a command string (run it with `host.run`) and the parse of
its output, as probes.py does. It decides nothing about a migration.

The switchover it supports, in order (docs/postgresql.md):

1. `checkpoint(source)` before the window, so the shutdown checkpoint inside it has little to flush;
2. `fast_shutdown_command(cluster)` on the source's host: the server stopped cleanly (every session ended; its
   walsender streams everything up to and including the shutdown checkpoint to the standby before it exits);
   `controldata` reads that checkpoint's position: the final position lies just past it;
3. `promote(target, expected)` — one statement: the standby's replay of `expected` waited for, the promotion asked
   for and waited for, with proof: out of recovery, on the next timeline, everything up to `expected` replayed;
4. `follow_check(...)` then `follow_command(...)` — the old primary restarts as a standby of the new one; no
   pg_rewind is needed when its last checkpoint lies before the new timeline's switch point.

`fence(conn, roles)` (the app's roles NOLOGIN, their sessions ended; see `fence` for why that is airtight) and
`lift_fence` are the shutdown mode's, and what fences a promoted target again at a rollback.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import psycopg
from psycopg import sql

from orchestrator.services.probes import Probe

if TYPE_CHECKING:
    from orchestrator.database.protocol import Session

DEFAULT_BIN_DIR = "/usr/lib/postgresql/{major}/bin"
SUPPORTED_MAJORS = range(13, 18)
# How often positions are polled while waiting: replay of a few records takes microseconds, so the wait's
# granularity is what a caller sees; 10 ms keeps it small without loading the standby.
POLL_SECONDS = 0.01
# pg_terminate_backend's own wait (ms) for each ended session to be gone.
TERMINATE_WAIT_MS = 5000


class PostgresError(Exception):
    """A PostgreSQL primitive failed; the message names what and where, never a secret."""


class ProofFailed(PostgresError):
    """A promotion or a follow could not be proven: the server is not in the state the caller needs."""


# --- positions ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Lsn:
    """A WAL position ('16/B374D848' in PostgreSQL's notation), comparable."""

    value: int

    @classmethod
    def parse(cls, text: str) -> Lsn:
        match = re.fullmatch(r"\s*([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})\s*", text)
        if match is None:
            raise PostgresError(f"not a WAL position: {text!r}")
        return cls((int(match.group(1), 16) << 32) | int(match.group(2), 16))

    def __str__(self) -> str:
        return f"{self.value >> 32:X}/{self.value & 0xFFFFFFFF:X}"

    def minus(self, other: Lsn) -> int:
        """Bytes of WAL from `other` to this position."""
        return self.value - other.value


# --- connections -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """Where a server answers (through a tunnel's local end, or directly) and as whom."""

    host: str
    port: int
    user: str
    dbname: str = "postgres"
    connect_timeout: int = 5


def connect(endpoint: Endpoint, password: str, *, application_name: str = "migrate") -> psycopg.Connection:
    """An autocommit connection: every primitive below is one statement, or says where it needs a transaction."""
    try:
        return psycopg.connect(
            host=endpoint.host,
            port=endpoint.port,
            user=endpoint.user,
            password=password,
            dbname=endpoint.dbname,
            connect_timeout=endpoint.connect_timeout,
            application_name=application_name,
            autocommit=True,
        )
    except psycopg.Error as exc:
        # libpq's message names the host and port; the password is never part of it.
        where = f"{endpoint.host}:{endpoint.port} as {endpoint.user}"
        raise PostgresError(f"cannot connect to {where}: {_first(exc)}") from None


def _first(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _scalar(conn: psycopg.Connection, query: str | sql.Composable, args: Sequence[object] = ()) -> object:
    row = conn.execute(query, args).fetchone()  # type: ignore[arg-type]
    return None if row is None else row[0]


def connection_of(session: Session) -> psycopg.Connection[Any]:
    """The psycopg connection behind a `Session` the engine handed out (it is one)."""
    return cast("psycopg.Connection[Any]", session)


def session_scalar(session: Session, query: str | sql.Composable, args: Any = None) -> Any:
    """The first column of the first row (None without a row), through the session's cursor."""
    with session.cursor() as cur:
        cur.execute(query, args)
        row = cur.fetchone()
    return None if row is None else row[0]


def server_major(conn: psycopg.Connection) -> int:
    return int(str(_scalar(conn, "SHOW server_version_num"))) // 10000


def in_recovery(conn: psycopg.Connection) -> bool:
    return bool(_scalar(conn, "SELECT pg_is_in_recovery()"))


def current_wal_lsn(conn: psycopg.Connection) -> Lsn:
    """The primary's current write position: every transaction committed before this call ends at or below it."""
    return Lsn.parse(str(_scalar(conn, "SELECT pg_current_wal_lsn()::text")))


def flush_lsn(conn: psycopg.Connection) -> Lsn:
    """The primary's position flushed to disk (what a walsender may send)."""
    return Lsn.parse(str(_scalar(conn, "SELECT pg_current_wal_flush_lsn()::text")))


def replay_lsn(conn: psycopg.Connection) -> Lsn | None:
    """The standby's replayed position (None on a primary, or before a standby replayed anything)."""
    value = _scalar(conn, "SELECT pg_last_wal_replay_lsn()::text")
    return None if value is None else Lsn.parse(str(value))


def receive_lsn(conn: psycopg.Connection) -> Lsn | None:
    value = _scalar(conn, "SELECT pg_last_wal_receive_lsn()::text")
    return None if value is None else Lsn.parse(str(value))


def timeline(conn: psycopg.Connection) -> int:
    """The server's current timeline: a primary's from its current WAL file name (pg_control's checkpoint lags
    a promotion until the next checkpoint); a standby's from the WAL receiver, else from pg_control."""
    if in_recovery(conn):
        value = _scalar(conn, "SELECT received_tli FROM pg_stat_wal_receiver")
        if value is None:
            value = _scalar(conn, "SELECT timeline_id FROM pg_control_checkpoint()")
        return int(str(value))
    name = str(_scalar(conn, "SELECT pg_walfile_name(pg_current_wal_lsn())"))
    return int(name[:8], 16)


@dataclass(frozen=True)
class Wait:
    reached: bool
    position: Lsn | None
    seconds: float


def wait_for_replay(conn: psycopg.Connection, target: Lsn, timeout: float, poll: float = POLL_SECONDS) -> Wait:
    """Poll the standby until it replayed `target` (bounded by `timeout`)."""
    started = time.monotonic()
    while True:
        position = replay_lsn(conn)
        if position is not None and position >= target:
            return Wait(True, position, time.monotonic() - started)
        if time.monotonic() - started >= timeout:
            return Wait(False, position, time.monotonic() - started)
        time.sleep(poll)


# The wait for a replay position and the read of the position after it, in one round trip (no parameters: the
# simple query protocol runs the three statements in order). The wait loops on the server, 2 ms a look, and ends
# early once the server left recovery (a promoted server replays no more).
_POSITION_AFTER_SQL = """DO $$ DECLARE began timestamptz := clock_timestamp(); BEGIN
  WHILE pg_is_in_recovery() AND coalesce(pg_last_wal_replay_lsn() < '{wanted}'::pg_lsn, true)
        AND clock_timestamp() - began < make_interval(secs => {wait}) LOOP
    PERFORM pg_sleep(0.002);
  END LOOP;
END $$;
SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text,
       CASE WHEN pg_last_wal_replay_lsn() IS NULL AND NOT pg_is_in_recovery() THEN pg_current_wal_lsn()::text END"""


@dataclass(frozen=True)
class PositionAfter:
    """Where a server stood once it replayed a position or the wait ran out, read in the same round trip."""

    recovering: bool
    replayed: Lsn | None  # its replay position (None: a server never in recovery, or one that replayed nothing)
    written: Lsn | None  # a server never in recovery: its write position


def position_after(conn: psycopg.Connection, wanted: Lsn, wait: float) -> PositionAfter:
    """Wait (on the server, at most `wait` seconds) until a standby replayed `wanted`, then read where it stands:
    one round trip where in_recovery, wait_for_replay's polls and the position's read cost one each."""
    script = _POSITION_AFTER_SQL.format(wanted=wanted, wait=f"{max(0.0, wait):.3f}")
    cur = conn.execute(script)
    cur.nextset()  # past the DO block's (no rows)
    row = cur.fetchone()
    if row is None:
        raise PostgresError("the position's read returned no row")
    recovering, replayed, written = row
    return PositionAfter(
        bool(recovering),
        None if replayed is None else Lsn.parse(str(replayed)),
        None if written is None else Lsn.parse(str(written)),
    )


# --- the fence ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FenceState:
    """What the fence changed, to put back: each role and whether it could log in before."""

    could_login: dict[str, bool]
    sessions_ended: int = 0


def login_states(conn: psycopg.Connection, roles: Iterable[str]) -> dict[str, bool]:
    """Whether each role can log in now: what a caller journals before the fence, so a fence re-entered after a
    crash (the roles already NOLOGIN) still knows what to put back."""
    names = list(roles)
    rows = conn.execute("SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname = ANY(%s)", (names,)).fetchall()
    found = {str(name): bool(login) for name, login in rows}
    missing = [n for n in names if n not in found]
    if missing:
        raise PostgresError(f"no such role on the server: {', '.join(missing)}")
    return found


def app_sessions(conn: psycopg.Connection, roles: Iterable[str]) -> list[int]:
    """The pids of the sessions logged in as any of `roles` (our own session excepted)."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE usename = ANY(%s) AND pid <> pg_backend_pid()", (list(roles),)
    ).fetchall()
    return [int(r[0]) for r in rows]


def fence(
    conn: psycopg.Connection,
    roles: Sequence[str],
    *,
    before: dict[str, bool] | None = None,
    settle: float = 0.05,
    attempts: int = 20,
) -> FenceState:
    """Stop every write by the app's roles, for real. Returns what to put back (`lift_fence`); `before`: the
    roles' login states journaled before (`login_states`), when this is a fence re-entered after a crash.

    Why this and not something lighter:
    - `ALTER ROLE … SET default_transaction_read_only` (or the same with ALTER SYSTEM) is only a default: any
      session can `SET default_transaction_read_only = off` or `BEGIN READ WRITE` and write again;
    - revoking INSERT/UPDATE/DELETE does not bind a table's owner (apps usually own their tables), nor DDL;
    - `ALTER ROLE … NOLOGIN` refuses every new session of the role, whatever it asks for, superuser or not; the
      sessions already open are then ended with `pg_terminate_backend(pid, timeout)`, which waits until each is
      gone: a transaction that had not committed is rolled back, one that committed is in the WAL before the
      final position is read. With no session and no login, no statement of the app can run. A session whose
      authentication passed just before NOLOGIN committed may appear in pg_stat_activity a moment later: the
      sessions are listed again `settle` seconds after a listing found none.
    - prepared transactions (two-phase commit) outlive their sessions and anyone may commit them: the fence
      refuses to claim it holds while one exists.
    NOLOGIN is a catalog change: it replicates, so a promoted standby starts fenced too (`lift_fence` there).
    """
    before = login_states(conn, roles) if before is None else before
    for role in roles:
        conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(role)))
    ended = 0
    for _ in range(attempts):
        pids = app_sessions(conn, roles)
        if not pids:
            time.sleep(settle)  # a session that passed its login check as NOLOGIN committed shows up by now
            pids = app_sessions(conn, roles)
            if not pids:
                break
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s, %s)", (pid, TERMINATE_WAIT_MS))
        ended += len(pids)
    else:
        raise PostgresError(f"sessions of {', '.join(roles)} kept appearing after {attempts} rounds of ending them")
    prepared = _scalar(conn, "SELECT count(*) FROM pg_prepared_xacts")
    if prepared:
        raise PostgresError(f"{prepared} prepared transactions are pending: COMMIT or ROLLBACK PREPARED them first")
    return FenceState(could_login=before, sessions_ended=ended)


def lift_fence(conn: psycopg.Connection, saved: FenceState) -> None:
    """The roles log in again as they did before the fence (on the source at a rollback, on the new primary)."""
    for role, could in saved.could_login.items():
        if could:
            conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(role)))


def fenced_roles(conn: psycopg.Connection, roles: Iterable[str]) -> list[str]:
    """The roles among `roles` that cannot log in now."""
    return sorted(role for role, login in login_states(conn, roles).items() if not login)


# --- promotion -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Promotion:
    timeline_before: int
    timeline_after: int
    replayed: Lsn
    seconds: float
    waited: float = 0.0
    marked_roles: int = 0  # roles the NOLOGIN fence had marked when the WAL ended (to let in on the new primary)


class NotReplayed(ProofFailed):
    """The standby did not replay the wanted position in time: nothing was promoted."""


# Server-side: the standby's replay waited for, the promotion asked for and waited for, each at a 2 ms grain
# (pg_promote(wait => true) polls every 100 ms, and a client-side poll costs a round trip each time). One round
# trip with the timeline before and the proof after; the custom SQLSTATEs say which wait failed.
_NOT_STANDBY, _NOT_REPLAYED, _NOT_PROMOTED = "MGNSB", "MGNRP", "MGNPR"
_PROMOTE_SQL = """\
SELECT coalesce((SELECT received_tli FROM pg_stat_wal_receiver), (SELECT timeline_id FROM pg_control_checkpoint()));
DO $migrate$
DECLARE
  started timestamptz := clock_timestamp();
  deadline timestamptz := clock_timestamp() + make_interval(secs => {wait});
BEGIN
  IF NOT pg_is_in_recovery() THEN
    RAISE EXCEPTION USING ERRCODE = '{not_standby}',
      MESSAGE = 'the server to promote is not a standby (not in recovery)';
  END IF;
  WHILE coalesce(pg_last_wal_replay_lsn() < '{expected}'::pg_lsn, true) LOOP
    IF clock_timestamp() >= deadline THEN
      RAISE EXCEPTION USING ERRCODE = '{not_replayed}', MESSAGE = format(
        'the standby replayed %s in {wait} s, not {expected}: not promoted', pg_last_wal_replay_lsn());
    END IF;
    PERFORM pg_sleep({poll});
  END LOOP;
  RAISE NOTICE 'migrate.replayed_after %', extract(epoch FROM clock_timestamp() - started);
  PERFORM pg_promote(false);
  deadline := clock_timestamp() + make_interval(secs => {promote_wait});
  WHILE pg_is_in_recovery() LOOP
    IF clock_timestamp() >= deadline THEN
      RAISE EXCEPTION USING ERRCODE = '{not_promoted}',
        MESSAGE = 'the promotion did not finish within {promote_wait} s';
    END IF;
    PERFORM pg_sleep({poll});
  END LOOP;
END
$migrate$;
SELECT pg_is_in_recovery(), pg_walfile_name(pg_current_wal_lsn()), pg_current_wal_lsn()::text,
  pg_last_wal_replay_lsn()::text,
  (SELECT count(*) FROM pg_db_role_setting WHERE setdatabase = 0 AND '{mark}=on' = ANY(setconfig))"""


def promote(conn: psycopg.Connection, expected: Lsn, *, wait: float = 10.0, promote_wait: int = 60) -> Promotion:
    """Wait (bounded by `wait`) for the standby to replay `expected`, promote it and prove it, in one round trip:
    out of recovery, on the next timeline, everything up to `expected` replayed before the switch. NotReplayed when
    the wait ran out (nothing promoted); ProofFailed for any other failure."""
    script = _PROMOTE_SQL.format(
        wait=f"{max(0.0, wait):.3f}", expected=expected, poll="0.002", promote_wait=int(promote_wait),
        not_standby=_NOT_STANDBY, not_replayed=_NOT_REPLAYED, not_promoted=_NOT_PROMOTED, mark=FENCE_MARK,
    )  # fmt: skip
    notices: list[str] = []

    def heard(diag: psycopg.errors.Diagnostic) -> None:
        notices.append(diag.message_primary or "")

    started = time.monotonic()
    conn.add_notice_handler(heard)
    try:
        cur = conn.execute(script)
        before = cur.fetchone()
        cur.nextset()  # the DO block's (no rows)
        cur.nextset()
        proof = cur.fetchone()
    except psycopg.Error as exc:
        reason = _first(exc)
        if exc.sqlstate == _NOT_REPLAYED:
            raise NotReplayed(reason) from None
        raise ProofFailed(reason) from None
    finally:
        conn.remove_notice_handler(heard)
    seconds = time.monotonic() - started
    waited = next((float(n.split()[-1]) for n in notices if n.startswith("migrate.replayed_after")), 0.0)
    if before is None or proof is None:
        raise ProofFailed("the promotion's proof returned no row")
    recovering, walfile, position, replayed, marked = proof
    if recovering:
        raise ProofFailed("promoted, but the server is still in recovery")
    timeline_before, timeline_after = int(before[0]), int(str(walfile)[:8], 16)
    if timeline_after <= timeline_before:
        raise ProofFailed(f"promoted, but still on timeline {timeline_after} (was {timeline_before})")
    if Lsn.parse(str(position)) < expected:
        raise ProofFailed(f"promoted at {position}, below the source's final position {expected}")
    return Promotion(timeline_before, timeline_after, _lsn_or(replayed, expected), seconds - waited, waited,
                     int(marked))  # fmt: skip


def _lsn_or(value: object, default: Lsn) -> Lsn:
    return default if value is None else Lsn.parse(str(value))


def checkpoint(conn: psycopg.Connection) -> None:
    """Flush every dirty page now (a superuser's or pg_checkpoint's): made just before the window, it keeps the
    shutdown checkpoint inside the window short."""
    conn.execute("CHECKPOINT")


# --- host commands: the cluster, the seed, the follow -------------------------------------------------------------

# The shutdown mode's copy of a data directory leaves these out: they describe the running server, not the data
# (PostgreSQL's own base backup skips them), and a postmaster.pid copied to the target would name the source's pid.
DATADIR_EXCLUDES = ("/postmaster.pid", "/postmaster.opts")


@dataclass(frozen=True)
class Cluster:
    """A cluster on a host, as commands see it: its data directory, port, programs and owner.

    `os_user`: the account that owns the data directory and runs the server (PostgreSQL refuses root); commands
    are run as root and switch to it with runuser. '' when the SSH user is that account already.
    """

    data_dir: str
    port: int
    bin_dir: str = DEFAULT_BIN_DIR.format(major=15)
    os_user: str = "postgres"
    log_file: str = ""
    options: tuple[str, ...] = field(default_factory=tuple)  # extra `postgres` options for pg_ctl start (-o)

    def program(self, name: str) -> str:
        return f"{self.bin_dir.rstrip('/')}/{name}"

    def as_owner(self, argv: Sequence[str]) -> str:
        command = shlex.join(argv)
        return f"runuser -u {shlex.quote(self.os_user)} -- {command}" if self.os_user else command

    @property
    def passfile(self) -> str:
        """The replication account's password file, beside the data directory (never inside it: a base backup
        would copy it, and it would be lost with a re-seeded data directory)."""
        return self.data_dir.rstrip("/") + ".pgpass"


def pg_ctl_command(cluster: Cluster, action: str, *, mode: str = "fast", wait: int = 120) -> str:
    """`pg_ctl start|stop|restart|status` as the owner; `stop -m fast` is a clean shutdown (a shutdown checkpoint,
    every WAL record streamed to connected standbys before the server exits)."""
    argv = [cluster.program("pg_ctl"), "-D", cluster.data_dir, "-w", "-t", str(wait)]
    if action in ("stop", "restart"):
        argv += ["-m", mode]
    if action in ("start", "restart"):
        argv += ["-o", " ".join(["-p", str(cluster.port), *cluster.options])]
        if cluster.log_file:
            argv += ["-l", cluster.log_file]
    argv.append(action)
    return cluster.as_owner(argv)


def fast_shutdown_command(cluster: Cluster, bound: int) -> str:
    """A clean fast shutdown of the cluster's running server, waited for at a 5 ms grain (pg_ctl polls every
    100 ms): SIGINT to its postmaster, what `pg_ctl stop -m fast` sends, then the wait until the postmaster removed
    postmaster.pid, its last act (after the shutdown checkpoint, once its walsenders streamed every WAL record to
    the connected standbys). Nothing is signalled when no server runs there, or when the pid in a stale
    postmaster.pid belongs to another program. Exits 3 if the server still runs `bound` seconds later."""
    pidfile = shlex.quote(cluster.data_dir.rstrip("/") + "/postmaster.pid")
    return (
        f"F={pidfile}; P=$(head -n 1 $F 2>/dev/null); "
        'up() { [ -n "$P" ] && [ -e $F ] && [ "$(cat /proc/$P/comm 2>/dev/null)" = postgres ]; }; '
        'up && kill -INT "$P"; '
        f"end=$(($(date +%s) + {int(bound)})); "
        'while up; do [ "$(date +%s)" -lt $end ] || { echo "the server (pid $P) still shuts down after '
        f'{int(bound)} s" >&2; exit 3; }}; sleep 0.005; done'
    )


@dataclass(frozen=True)
class ControlData:
    state: str  # "in production", "shut down", "shut down in recovery", "in archive recovery", ...
    checkpoint: Lsn
    redo: Lsn
    timeline: int
    data_checksums: bool
    wal_log_hints: bool
    system_identifier: str

    @property
    def clean(self) -> bool:
        return self.state in ("shut down", "shut down in recovery")


def controldata_command(cluster: Cluster) -> str:
    return "LC_ALL=C " + cluster.as_owner([cluster.program("pg_controldata"), "-D", cluster.data_dir])


def parse_controldata(text: str) -> ControlData:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    try:
        return ControlData(
            state=fields["Database cluster state"],
            checkpoint=Lsn.parse(fields["Latest checkpoint location"]),
            redo=Lsn.parse(fields["Latest checkpoint's REDO location"]),
            timeline=int(fields["Latest checkpoint's TimeLineID"]),
            data_checksums=fields.get("Data page checksum version", "0") != "0",
            wal_log_hints=fields.get("wal_log_hints setting", "off") == "on",
            system_identifier=fields["Database system identifier"],
        )
    except KeyError as exc:
        raise PostgresError(f"pg_controldata printed no {exc.args[0]!r}") from None


def controldata(cluster: Cluster) -> Probe[ControlData]:
    return Probe(controldata_command(cluster), parse_controldata)


def passfile_command(cluster: Cluster) -> str:
    """Run on the standby's host: the replication account's password file (mode 0600, the owner's), its line on
    stdin (`passfile_line`). Through a passfile, the primary_conninfo pg_basebackup -R writes names the file
    instead of holding the password."""
    owner = shlex.quote(cluster.os_user or "root")
    quoted = shlex.quote(cluster.passfile)
    return f"umask 077; cat > {quoted}.tmp && chown {owner} {quoted}.tmp && mv {quoted}.tmp {quoted}"


def passfile_line(host: str, user: str, password: str) -> str:
    def esc(value: str) -> str:
        return value.replace("\\", "\\\\").replace(":", "\\:")

    # Any port and database: the tunnel's port may change when it is brought back.
    return f"{esc(host)}:*:*:{esc(user)}:{esc(password)}\n"


@dataclass(frozen=True)
class SeedSpec:
    """A standby seeded from the primary with pg_basebackup, run on the standby's host, reaching the primary at
    host:port (the tunnel's local end): WAL streamed beside the copy, a physical replication slot so the primary
    keeps what the standby still needs, -R for standby.signal and primary_conninfo (naming the passfile)."""

    cluster: Cluster
    primary_host: str
    primary_port: int
    repl_user: str
    slot: str
    application_name: str = "migrate_standby"
    checkpoint: str = "fast"  # the copy starts at once instead of after the next spread checkpoint
    max_rate: str = ""  # e.g. "32M": pg_basebackup's own throttle of the live source


def create_slot_sql() -> str:
    """On the primary: a physical slot reserving WAL from now (idempotent: an existing slot is kept)."""
    return (
        "SELECT pg_create_physical_replication_slot(%(slot)s, true) "
        "WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %(slot)s)"
    )


def create_slot(conn: psycopg.Connection, slot: str) -> None:
    conn.execute(create_slot_sql(), {"slot": slot})


def drop_slot(conn: psycopg.Connection, slot: str) -> None:
    conn.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s AND NOT active",
        (slot,),
    )


def seed_command(spec: SeedSpec) -> str:
    """Run on the standby's host (as root): an empty data directory for the owner, then pg_basebackup into it.

    A data directory that already holds a cluster is refused (the standby's must be stopped and moved aside by
    the caller: a seed never deletes one). Prints pg_basebackup's progress lines on stderr."""
    c = spec.cluster
    conninfo = primary_conninfo(spec.primary_host, spec.primary_port, spec.repl_user, c.passfile, spec.application_name)
    argv = [c.program("pg_basebackup"), "-d", conninfo, "-D", c.data_dir, "-X", "stream", "-S", spec.slot, "-R"]
    argv += ["-c", spec.checkpoint, "--no-password", "-P"]
    if spec.max_rate:
        argv += ["-r", spec.max_rate]
    data = shlex.quote(c.data_dir)
    owner = shlex.quote(c.os_user or "root")
    return (
        f"set -e; if [ -e {data}/PG_VERSION ]; then echo 'seed: {c.data_dir} holds a cluster already' >&2; exit 3; fi; "
        f"mkdir -p {data}; chown {owner} {data}; chmod 700 {data}; {c.as_owner(argv)}"
    )


def conninfo_value(value: object) -> str:
    """A libpq connection-string value, quoted (a path with a space would otherwise end the value)."""
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def primary_conninfo(host: str, port: int, user: str, passfile: str, application_name: str) -> str:
    pairs = {"host": host, "port": port, "user": user, "passfile": passfile, "application_name": application_name}
    return " ".join(f"{key}={conninfo_value(value)}" for key, value in pairs.items())


def follow_command(cluster: Cluster, conninfo: str, slot: str = "") -> str:
    """Run on the old primary's host, its server stopped cleanly: make it a standby of the new primary
    (standby.signal, primary_conninfo, the slot, the latest timeline) and start it."""
    settings = [
        f"primary_conninfo = '{_conf_quote(conninfo)}'",
        "recovery_target_timeline = 'latest'",
    ]
    if slot:
        settings.append(f"primary_slot_name = '{_conf_quote(slot)}'")
    # ALTER SYSTEM's file: later lines win, so appending overrides what an earlier seed or follow wrote.
    auto = shlex.quote(cluster.data_dir.rstrip("/") + "/postgresql.auto.conf")
    signal = shlex.quote(cluster.data_dir.rstrip("/") + "/standby.signal")
    lines = "".join(f"{s}\n" for s in settings)
    owner = cluster.os_user or "root"
    return (
        f"set -e; printf %s {shlex.quote(lines)} >> {auto}; touch {signal}; "
        f"chown {shlex.quote(owner)} {auto} {signal}; {pg_ctl_command(cluster, 'start')}"
    )


def _conf_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "''")


def history_command(cluster: Cluster, timeline_id: int) -> str:
    """Run on the new primary's host: its history file of `timeline_id` (the switch points of every timeline
    before it)."""
    return "cat " + shlex.quote(f"{cluster.data_dir.rstrip('/')}/pg_wal/{timeline_id:08X}.history")


def parse_history(text: str) -> dict[int, Lsn]:
    """A timeline history file: each parent timeline and the position where the next one branched off."""
    points: dict[int, Lsn] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit():
            points[int(parts[0])] = Lsn.parse(parts[1])
    return points


@dataclass(frozen=True)
class FollowCheck:
    ok: bool
    reason: str


def follow_check(old: ControlData, switch_points: dict[int, Lsn]) -> FollowCheck:
    """Can the old primary follow the new one without pg_rewind? Yes when it was shut down cleanly and its last
    checkpoint (its last WAL record after a clean shutdown) lies before the point where the new timeline branched
    off its timeline: then the new primary holds every record the old one wrote, and the standby replays on."""
    if not old.clean:
        return FollowCheck(False, f"the old primary was not shut down cleanly (state: {old.state}): pg_rewind it")
    point = switch_points.get(old.timeline)
    if point is None:
        return FollowCheck(False, f"the new primary's history has no branch from timeline {old.timeline}")
    if old.checkpoint >= point:
        return FollowCheck(
            False,
            f"the old primary's last checkpoint {old.checkpoint} is at or past the switch point {point}: it wrote"
            " WAL the new primary does not have (pg_rewind it, which needs data checksums or wal_log_hints)",
        )
    return FollowCheck(
        True, f"last checkpoint {old.checkpoint} before the switch point {point} on timeline {old.timeline}"
    )


# --- preflight facts ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerFacts:
    major: int
    wal_level: str
    max_wal_senders: int
    max_replication_slots: int
    data_checksums: bool
    wal_log_hints: bool
    hba_replication: bool  # pg_hba.conf has a replication line for the user from this host's loopback
    data_directory: str

    def problems(self, other_major: int | None = None) -> list[str]:
        """What stops this server from being a replication source (one line each)."""
        found: list[str] = []
        if self.major not in SUPPORTED_MAJORS:
            found.append(f"PostgreSQL {self.major} is not supported (13 to {SUPPORTED_MAJORS[-1]})")
        if self.wal_level not in ("replica", "logical"):
            found.append(f"wal_level is {self.wal_level}: set it to replica (a restart)")
        if self.max_wal_senders < 2:
            found.append(f"max_wal_senders is {self.max_wal_senders}: at least 2 (the seed streams WAL beside it)")
        if self.max_replication_slots < 1:
            found.append("max_replication_slots is 0: at least 1")
        if not self.hba_replication:
            found.append("pg_hba.conf lets no replication connection in from this host (the tunnel's end)")
        if other_major is not None and other_major != self.major:
            found.append(
                f"major versions differ ({self.major} here, {other_major} there): physical replication needs one"
            )
        return found

    @property
    def rewind_possible(self) -> bool:
        return self.data_checksums or self.wal_log_hints


FACTS_SQL = """
SELECT current_setting('server_version_num')::int / 10000,
       current_setting('wal_level'),
       current_setting('max_wal_senders')::int,
       current_setting('max_replication_slots')::int,
       current_setting('data_checksums') = 'on',
       current_setting('wal_log_hints') = 'on',
       current_setting('data_directory')
"""
HBA_SQL = """
SELECT count(*) FROM pg_hba_file_rules
WHERE error IS NULL AND 'replication' = ANY(database) AND (user_name && ARRAY[%s, 'all'])
  AND auth_method <> 'reject'
  AND (type = 'local' OR address IN ('samehost', 'all', '127.0.0.1') OR (netmask IS NOT NULL
       AND '127.0.0.1'::inet <<= (address || '/' || netmask)::inet))
"""


def server_facts(conn: psycopg.Connection, repl_user: str) -> ServerFacts:
    """Read as a superuser (pg_hba_file_rules and data_directory need it, or pg_read_all_settings + EXECUTE)."""
    row = conn.execute(FACTS_SQL).fetchone()
    if row is None:
        raise PostgresError("the server returned no settings")
    hba = _scalar(conn, HBA_SQL, (repl_user,))
    return ServerFacts(
        major=int(row[0]),
        wal_level=str(row[1]),
        max_wal_senders=int(row[2]),
        max_replication_slots=int(row[3]),
        data_checksums=bool(row[4]),
        wal_log_hints=bool(row[5]),
        hba_replication=bool(hba),
        data_directory=str(row[6]),
    )


def free_space_command(path: str) -> str:
    """The free bytes where `path` (or its nearest existing parent) lives: parse with probes.parse_df."""
    return f'p={shlex.quote(path)}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; df -P -B1 "$p" | tail -n 1'


def installed_majors_command() -> str:
    """Run on a host: the PostgreSQL majors whose server programs are installed (Debian's layout)."""
    return "ls -1 /usr/lib/postgresql 2>/dev/null | grep -E '^[0-9]+$' || true"


def parse_majors(text: str) -> list[int]:
    return sorted(int(line) for line in text.split() if line.isdigit())


def installed_majors() -> Probe[list[int]]:
    return Probe(installed_majors_command(), parse_majors, check=False)


# --- the fence as the database seam holds it (orchestrator/database/postgresql.py) ----------------------------------

# A custom setting stored on each role the fence made NOLOGIN (pg_db_role_setting, a shared catalog): it travels with
# the data directory and the WAL like NOLOGIN itself, so whoever lifts the fence (the source at a rollback, the
# target at its start, a resumed run) knows which roles to let in again, whatever process fenced them. A NOLOGIN
# role never opens a session, so the setting never applies to anything.
FENCE_MARK = "migrate.fenced"


def app_roles(conn: psycopg.Connection) -> list[str]:
    """The roles an application logs in as: those that can log in, neither superuser nor replication, nor us."""
    rows = conn.execute(
        "SELECT rolname FROM pg_roles WHERE rolcanlogin AND NOT rolsuper AND NOT rolreplication"
        " AND rolname <> current_user AND rolname !~ '^pg_' ORDER BY rolname"
    ).fetchall()
    return [str(r[0]) for r in rows]


def marked_roles(conn: psycopg.Connection) -> list[str]:
    """The roles this fence made NOLOGIN and has not let in again."""
    rows = conn.execute(
        "SELECT r.rolname FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole"
        " WHERE s.setdatabase = 0 AND %s = ANY(s.setconfig) ORDER BY r.rolname",
        (f"{FENCE_MARK}=on",),
    ).fetchall()
    return [str(r[0]) for r in rows]


def fence_marked(conn: psycopg.Connection) -> FenceState:
    """`fence` of every application role, each marked first (the mark is what `unfence_marked` puts back)."""
    roles = app_roles(conn)
    for role in roles:
        conn.execute(sql.SQL("ALTER ROLE {} SET " + FENCE_MARK + " = 'on'").format(sql.Identifier(role)))
    fenced = sorted(set(roles) | set(marked_roles(conn)))  # a fence re-entered: the roles it made NOLOGIN before
    return fence(conn, fenced, before=dict.fromkeys(fenced, True))


def unfence_marked(conn: psycopg.Connection) -> list[str]:
    """The marked roles log in again, their marks removed: the roles let in."""
    roles = marked_roles(conn)
    for role in roles:
        conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("ALTER ROLE {} RESET " + FENCE_MARK).format(sql.Identifier(role)))
    return roles
