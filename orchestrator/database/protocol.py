"""The database seam: what a migration uses of a database engine (`Database`), the session it hands out, and the one
error type every engine's driver errors become (`DatabaseError`).

Steps, the runtime and the services see only these names; `orchestrator/database/engines.py` opens the engine a
plan names (`database.engine`). This module imports no driver: a second engine (PostgreSQL) is a sibling module of
`mariadb.py`, not a branch in the steps.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from orchestrator.redaction import redact

# Row counts and checksums by "schema.table" (the after-commit audit's figures).
Figures = tuple[dict[str, int], dict[str, int | None]]
# Called before each table's query with "schema.table": may raise to stop there, and returns how many seconds that
# query may take (None: the session's own read timeout).
TableLimit = Callable[[str], float | None]


class DatabaseError(Exception):
    """A database failure: one line without secrets, whether retrying may help (`transient`), the server's or the
    client's error number when there is one (`code`).

    Every engine raises it (or a subclass) for every failure of its driver, so callers catch one type whatever the
    engine. An engine may keep its driver's own class as a second base, so its own code still tells its driver's
    errors apart; nothing outside the engine relies on that."""

    def __init__(
        self, message: str, transient: bool = False, code: int | None = None, *, server_answered: bool = False
    ) -> None:
        # Not super(): a subclass may have a second base (its driver's error class) with an __init__ of its own.
        Exception.__init__(self, redact(message))
        self.transient = transient
        self.code = code
        self._server_answered = server_answered

    @property
    def server_answered(self) -> bool:
        """The server itself refused (e.g. access denied), as opposed to nothing answering at all. Engines say
        which of their driver's errors are the server's own answers."""
        return self._server_answered

    def prefixed(self, where: str) -> DatabaseError:
        """The same failure (same class, same figures), `where` it happened said first."""
        error = copy.copy(self)
        error.args = (f"{where} {self}",)
        return error

    @property
    def connection_lost(self) -> bool:
        """The session is gone (the server or the way to it went away): a new session may do what this one could
        not. Engines set it for their driver's "lost the connection" errors."""
        return False

    def about(self, what: str) -> str:
        """One line: `what` failed, in the server's words (with its error number when it gave one)."""
        return f"{what}: {self}"

    @property
    def statement_refused(self) -> bool:
        """The server refused this statement (a table it does not have, a syntax it does not know); the session
        goes on."""
        return False


class Cursor(Protocol):
    """A DB-API 2.0 cursor (PEP 249), as a session's `cursor()` hands it out."""

    def execute(self, query: str, args: Any = None) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> Any: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...


class Session(Protocol):
    """An open autocommit session on one server, as `StepRuntime.db()` hands it out: the engine's driver connection,
    its failures `DatabaseError`s. Callers hand it back to the engine's methods (or to `release`); the engine's own
    modules may run SQL on it through `cursor()`."""

    def cursor(self) -> Any: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Blocker:
    """A session that held up the fence (the cut-over's lock)."""

    id: int
    user: str
    command: str
    seconds: int
    state: str
    query: str

    def summary(self) -> str:
        query = f": {self.query}" if self.query else ""
        return f"#{self.id} {self.user} {self.command} for {self.seconds}s{query}"


@runtime_checkable
class Database(Protocol):
    """The operations a migration needs of a database engine. Every failure is a `DatabaseError`; `session` is
    always one this engine's `connect` opened."""

    name: str
    # Patterns (relative to the data directory) of the files the server's processes hold open while it runs: once
    # none is held, the server is gone and its data directory quiet (the shutdown mode's proof).
    server_files: tuple[str, ...]
    # The names of the server's program (its binary's), to tell it among the processes holding `server_files`.
    server_programs: tuple[str, ...]
    # The write fence in words ("FLUSH TABLES WITH READ LOCK"), as the cut-over's lines and errors name it.
    fence_name: str
    # Whether the write fence lives in the data (PostgreSQL's NOLOGIN roles: a copy of the datadir carries it, and the
    # target's is lifted when it starts) rather than in a session or the server's memory (MariaDB's lock, read_only).
    fence_in_data: bool
    # A whole table's checksum in words ("CHECKSUM TABLE"), as the audit and the report name it.
    checksum_name: str
    # The settings among `datadir_settings`' that name a file (its directory counts), not a directory.
    file_settings: tuple[str, ...]
    # What preflight asks of the plan's account (`missing_privileges`), as the engine spells it, and how to give it.
    needed_privileges: tuple[str, ...]
    grant_hint: str

    def configure(self, settings: Any) -> None:
        """The plan's `database` section, given once when the run opens the engine."""

    # --- sessions ---

    def connect(
        self,
        host: str,
        port: int,
        *,
        user: str,
        password: str | None,
        connect_timeout: float,
        read_timeout: float,
        write_timeout: float,
    ) -> Session:
        """An autocommit session on the server at host:port (the near end of the runtime's SSH tunnel), every
        statement it sends counted as a round trip."""

    def bounded(self, session: Session, seconds: float | None) -> contextlib.AbstractContextManager[None]:
        """Bound the reads of the statements run inside to `seconds` (None: unchanged); the session's bound after."""

    def set_timeouts(self, session: Session, seconds: float) -> None:
        """Give a session opened earlier (a spare) the read and write bounds of a new one."""

    def ping(self, session: Session) -> None:
        """The driver's own liveness round trip; raises DatabaseError when the session is gone."""

    def revive(self, session: Session, seconds: float) -> None:
        """A session opened earlier (a spare), taken inside the window: proven alive (its answer bounded by
        `seconds`) and given a new one's bounds, in one round trip where the engine can. DatabaseError when gone."""

    def alive(self, session: Session) -> bool:
        """Does this session's server still answer? (A session dies with its server.)"""

    def answers(self, session: Session) -> bool:
        """Does the server answer a trivial query on this session?"""

    def round_trip(self, session: Session) -> None:
        """One trivial query (what a round trip to this server costs)."""

    def close_quietly(self, session: Session) -> None:
        """Close a session (releasing its locks); a server already gone released them too."""

    # --- what the server is and holds ---

    def server_version(self, session: Session) -> str: ...

    def major_version(self, version: str) -> str:
        """The version a server's version string names, as far as the engine's compatibility goes ('10.11')."""

    def data_bytes(self, session: Session) -> int | None:
        """The size of the user's data on this server (the estimate's database size; None: unknown)."""

    def missing_privileges(self, session: Session, needed: Iterable[str]) -> set[str]:
        """Global privileges among `needed` this session's account lacks."""

    def error_log_path(self, session: Session) -> str:
        """The server's error log (absolute, relative to the data directory, or empty)."""

    def list_tables(self, session: Session, schemas: list[str] | None = None) -> list[tuple[str, str]]:
        """(schema, table) of the base tables of `schemas`, or of every non-system schema, sorted."""

    def row_counts(
        self, session: Session, tables: Iterable[tuple[str, str]], *, limit: TableLimit | None = None
    ) -> dict[str, int]: ...

    def checksums(
        self, session: Session, tables: Iterable[tuple[str, str]], *, limit: TableLimit | None = None
    ) -> dict[str, int | None]: ...

    def open_snapshot(self, session: Session, schemas: list[str] | None) -> dict[str, str]:
        """A read-only consistent snapshot on `session` (the caller keeps it open): each table ("schema.table") and
        its storage engine, lower case."""

    # --- the fence: writes refused at the server ---

    def set_lock_wait_timeout(self, session: Session, seconds: float) -> None:
        """Bound this session's wait for a lock."""

    def lock_writes(self, session: Session) -> bool:
        """Block every write on the server for as long as this session lives: True once held, False when the wait
        for it timed out (set_lock_wait_timeout)."""

    def find_blockers(self, session: Session) -> list[Blocker]:
        """Other sessions running something, longest first."""

    def find_lock_holders(self, session: Session, waited: float = 0.0) -> list[Blocker]:
        """Sessions holding the locks others (and our lock, `waited` seconds) wait for."""

    def tables_in_use(self, session: Session, limit: int = 10) -> list[str]: ...

    def summarize_blockers(
        self, blockers: list[Blocker], in_use: list[str] | None = None, *, holders: list[Blocker] | None = None
    ) -> str:
        """One line: who holds the lock, who waits behind it, the tables in use."""

    def is_read_only(self, session: Session) -> bool:
        """Does the server refuse writes from ordinary accounts?"""

    def set_read_only(self, session: Session, on: bool, *, lock_wait_timeout: float) -> None: ...

    def lift_fence(self, session: Session) -> list[str]:
        """Let in again what a fence left in the data itself (PostgreSQL: NOLOGIN roles, copied to the target with
        the data directory); the accounts let in (none for an engine whose fence is a session's lock)."""

    # --- the after-commit audit ---

    def snapshot_figures(
        self, session: Session, tables: list[str], *, counts: bool, checksums: bool, timeout: float
    ) -> Figures:
        """Row counts and checksums ("schema.table" → figure) read in the snapshot held on `session`, each read
        bounded by `timeout`; a table that cannot be read (missing on the target) is left out."""

    def isolated_figures(
        self,
        host: Any,
        launch: Any,
        datadir: str,
        tables: list[str],
        *,
        counts: bool,
        checksums: bool,
        timeout: float,
        started: Callable[[str | None], None],
    ) -> Figures:
        """The stopped source's row counts and checksums, its server (`launch`: services/audit.ServerLaunch, read
        before the window) started isolated and read-only on `host`, then stopped again whatever happened; a table
        that cannot be read is left out. `started(directory)`: called with the private directory the server runs
        in before it starts, for an engine that can end it from there (`stop_isolated`) after a crash, and None once
        it is stopped again."""

    def stop_isolated(self, host: Any, directory: str) -> None:
        """Stop an isolated source a dead run left in `directory` (what `started` was given)."""

    # --- positions ---

    def final_position(self, session: Session) -> dict[str, Any] | None:
        """Where the server's change log ends (journaled as is; None when it keeps none)."""

    # --- preflight ---

    def datadir_settings(self, session: Session) -> tuple[str, dict[str, str]]:
        """The server's data directory, and its settings naming where else it keeps files (as it spells them)."""

    def durability_settings(self, session: Session) -> dict[str, str]:
        """The server's settings whose durability depends on fsync."""

    def installed_version(self) -> Any:
        """A probe (orchestrator.services.probes.Probe[str]) of a host's installed server version ('' when none)."""

    def preflight_notes(self, session: Session) -> tuple[list[str], dict[str, Any]]:
        """The engine's own preflight problems on the source (one line each) and facts to report."""

    # --- the replicate mode ---

    def replication(self) -> Replication | None:
        """The engine's replica control for the replicate mode (None: the engine runs the shutdown mode only)."""


# --- the replicate mode's replica control --------------------------------------------------------------------------

# A position in the engine's change log (MariaDB: a GTID position; PostgreSQL: a WAL position). Steps keep it opaque:
# they journal its str() and read it back with `Replication.parse_position`; an empty one is falsy.
Position = Any


class ReplicationError(Exception):
    """A replication operation failed; the message is one line, with the server's own words and no secret."""


class PositionNotReached(ReplicationError):
    """The server did not apply the awaited position within the wait: nothing was opened or read."""


class PositionMismatch(ReplicationError):
    """The replica did not execute exactly the source's final position: it was not promoted."""


@dataclass(frozen=True)
class ServerAccess:
    """Where a server runs, for what an engine does on its host rather than over SQL (a clean stop, a standby's
    files): the host (a contracts.Host), its data directory and the plan's start and stop commands."""

    host: Any
    datadir: str
    start: str
    stop: str


@dataclass(frozen=True)
class LocalLogin:
    """How a client on the database's own host logs in: the plan's account and the endpoint as seen from there."""

    user: str
    password: str | None = field(repr=False)
    socket: str | None
    address: str
    port: int


class HostStop(Protocol):
    """stop_writes as one command on the source's host, made ready before the window (Replication.host_stop): the
    window's first command there runs it once the fence is up, so the database's side of the switch costs no round
    trip of its own (pyinfra's facts: a command, and the parse of what it printed)."""

    @property
    def local_cost(self) -> float:
        """The seconds the host spends on it beyond the round trip it saves (a client's start), measured when made
        ready."""

    def command(self, *, lock_wait_timeout: float) -> str:
        """Shell: stop writes (waiting at most `lock_wait_timeout` for running writes), then print the final
        position; its exit status is not 0 when writes were not stopped."""

    def parse(self, status: int | None, output: str) -> Any:
        """The final position from the command's status and output (stdout and stderr); ReplicationError when it
        did not stop writes or its answer is not whole (the switch then stops them over its session)."""


@dataclass(frozen=True)
class ReplicaSource:
    """Where a replica reads from (through a tunnel: 127.0.0.1 and the tunnel's port)."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    connect_retry: int = 1
    heartbeat_period: float = 1.0


class ReplicaStatus(Protocol):
    """A replica's state, the parts a run decides on (None instead of one: the server is no replica)."""

    @property
    def io_running(self) -> str:
        """Whether it receives from its source, in the engine's words (Yes, No, Connecting, streaming...)."""

    @property
    def sql_running(self) -> bool:
        """Whether it applies what it received."""

    @property
    def seconds_behind(self) -> int | None: ...

    @property
    def gtid_io_pos(self) -> Position:
        """Up to where it received."""

    @property
    def master_port(self) -> int:
        """The port it reads its source through (the tunnel's)."""

    @property
    def replicating(self) -> bool:
        """Receiving and applying."""

    @property
    def error(self) -> str | None:
        """The replica's own words for what stopped it, or None."""


class WaitResult(Protocol):
    """A bounded wait for a replica to reach a position: `outcome` is reached, timed_out or replica_failed."""

    @property
    def outcome(self) -> str: ...

    @property
    def waited(self) -> float: ...

    @property
    def position(self) -> Position: ...

    @property
    def error(self) -> str | None: ...


class Promotion(Protocol):
    """A wait for a position and, once reached, the promotion with its proof (`promoted`), in one call."""

    @property
    def reached(self) -> bool: ...

    @property
    def promoted(self) -> bool: ...

    @property
    def executed(self) -> Position: ...

    @property
    def waited(self) -> float: ...


class ChunkDifference(Protocol):
    def describe(self) -> str:
        """One line naming the table and the chunk that differ."""


# A preflight fact (Database.preflight_notes): the tables outside the engine's snapshots, one line each. The
# comparison before the window reads them at a quiet moment, else leaves them to the after-commit audit.
NON_TRANSACTIONAL = "non_transactional_tables"


@dataclass
class Comparison:
    """The comparison before the window: the position both sides were compared at, the chunks that differ, or why
    the replica could not be held at that position (`error`: nothing was compared)."""

    position: Position
    differences: list[Any] = field(default_factory=list)
    error: str | None = None
    # Tables left to the after-commit audit, one line each: read live (outside the snapshot), every read raced a
    # write to them.
    not_compared: list[str] = field(default_factory=list)


class AuditCutShort(ReplicationError):
    """The after-commit chunked audit compared nothing (the snapshot not consistent, the source moved on)."""


class AuditUnreadable(ReplicationError):
    """One side could not be read at all during the audit (its connection is gone): nothing was proven."""


@dataclass
class ChunkedAudit:
    """What the after-commit chunked comparison found and what it cost. `differences` hold each a `table` and a
    describe() line; `engines`: each table's storage engine, lower case (a non-transactional one is read live)."""

    differences: list[Any] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # tables the source has and the target's snapshot does not
    unread: dict[str, str] = field(default_factory=dict)  # table -> why it could not be compared
    engines: dict[str, str] = field(default_factory=dict)
    tables: int = 0
    chunks: int = 0
    rows: int = 0  # the source's rows compared
    seconds: float = 0.0


class SeedKit(Protocol):
    """The seed of a replica, as host commands and the parsers of their output, on the engine's own spec
    (`Replication.seed_spec`). Each command is one idempotent shell line run on the host its name says."""

    # Which password the stream command reads on its stdin: the plan's database account's ("database") or the
    # replication account's ("replication").
    secret: str

    def seed_size_command(self, spec: Any) -> str:
        """On the source: the bytes the seed will stream."""

    def parse_size(self, stdout: str) -> int: ...

    def seed_stream_command(self, spec: Any, *, log_path: str | None = None) -> str:
        """On the source: the live copy streamed into a staging directory beside the target's datadir, its progress
        on stdout; the database password (when the spec says so) on stdin."""

    def parse_seed_progress(self, line: str) -> int | None: ...

    def seed_locking_command(self, log_path: str) -> str:
        """On the source: exit 0 once the copy holds locks on the live server (a throttle must not pause it)."""

    def prepare_command(self, spec: Any) -> str:
        """On the target: make the staged copy consistent."""

    def install_command(self, spec: Any) -> str:
        """On the target: the staged copy takes the datadir's place, the previous one kept beside it."""

    def finish_install_command(self, spec: Any) -> str:
        """On the target: finish an install a crash cut short."""

    def restore_previous_command(self, spec: Any) -> str: ...

    def discard_staging_command(self, spec: Any) -> str: ...

    def backup_position_command(self, backup_dir: str) -> str:
        """On the target: what the installed copy recorded of its position."""

    def parse_backup_position(self, text: str) -> Any:
        """That position (its `gtid`: the replica starts there; `file`, `position`: the change log's file)."""

    def parse_backup_stages(self, stdout: str) -> list[Any]: ...

    def parse_backup_locks(self, stdout: str) -> Any: ...

    def redo_lsn(self, conn: Session) -> int:
        """The source's redo (or WAL) write position in bytes (the throttle's pause bound)."""

    def redo_capacity(self, conn: Session) -> int:
        """How many bytes of redo the source keeps before writing over them."""


@runtime_checkable
class Replication(Protocol):
    """The replicate mode's replica control: seed a replica, start, stop and observe it, stop writes on the source
    and read its final position, wait for a replica to reach a position, promote it with proof, make the old
    primary follow the new one, compare the tables in chunks. Every failure is a `ReplicationError` (or a
    `DatabaseError` from the session); positions are opaque (`Position`)."""

    # How long one bounded wait may block before the replica's health is looked at again.
    wait_slice: float
    # The seed's commands and parsers.
    seed: SeedKit
    # What the mode relies on, in words (preflight's line when the replicate mode is chosen).
    requirements: str
    # The switch stops the source's server (PostgreSQL: a clean shutdown, whose checkpoint is the final position a
    # standby can follow on from) rather than leaving it running read-only (MariaDB): nothing reads the source
    # inside the window after that, its undo starts it again, the front door holds reads too.
    source_stops: bool

    def describe(self, part: str, plan: Any) -> list[str]:
        """The dry-run's lines for one part of the mode as this engine does it: "seed" (repl_seed), "replica"
        (repl_replica, before its services), "compare" (repl_catchup's comparison), "switch" (repl_switch, between
        the app's fence and the health checks), "positions" (verify_target's proof), "finish" (two: the reverse
        path, and the words for how it is torn down)."""

    # --- can this pair replicate? ---

    def programs(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The programs each side ("source", "target") needs installed."""

    def writer_problems(self, conn: Session, app_users: list[str]) -> list[str]:
        """Preflight, on the source: why `stop_writes` would not stop every one of the application's accounts
        (replication.app_users), one line each; empty when it would."""

    def server_facts(self, conn: Session) -> dict[str, str]:
        """The server settings replication depends on (read only)."""

    def problems(self, plan: Any, source: dict[str, str] | None, target: dict[str, str] | None,
                 programs: dict[str, bool]) -> list[str]:  # fmt: skip
        """Why these servers cannot replicate (None: that side did not answer); empty when they can."""

    def pair_problems(self, source: dict[str, str], target: dict[str, str]) -> list[str]:
        """What only the running target shows (checked once the replica starts)."""

    def seed_spec(self, plan: Any, *, source_datadir: str, target_datadir: str, ssh_to_target: tuple[str, ...],
                  password_env: str | None) -> Any:  # fmt: skip
        """The seed's spec (the engine's own), for `seed`'s commands."""

    # --- positions ---

    def parse_position(self, text: str | None) -> Position: ...

    def same_position(self, final: Position, executed: Position) -> bool:
        """Does `executed` stand exactly at `final`?"""

    def write_position(self, conn: Session) -> Position:
        """Where this server's change log ends (what a replica of it must reach)."""

    def current_position(self, conn: Session) -> Position:
        """The position this server's data stands at (what it wrote or applied)."""

    def current_position_after(self, conn: Session, wanted: Position, wait: float) -> Position | None:
        """The position once this server has applied `wanted`, waiting for it on the server at most `wait` seconds,
        in one round trip; None when it did not get there in that time."""

    def executed_position(self, conn: Session) -> Position:
        """What this server applied as a replica."""

    # --- the replica ---

    def replica_status(self, conn: Session) -> ReplicaStatus | None: ...

    def follow(
        self,
        conn: Session | None,
        source: ReplicaSource,
        start_at: Position,
        *,
        seeded: bool,
        server: ServerAccess | None = None,
        primary: Session | None = None,
    ) -> None:
        """Make this server a replica of `source` from `start_at` (not started); `seeded`: a freshly seeded copy,
        whose change log starts at `start_at` first. `conn` None: the server is stopped (an old primary the switch
        stopped), and `server` says where it runs; `primary`: a session on the server it will follow."""

    def start_replica(self, conn: Session) -> None: ...

    def stop_replica(self, conn: Session) -> None: ...

    def forget_replication(self, conn: Session) -> None:
        """No more replication, and whatever holds the replication password on the server deleted; a no-op on a
        server that is not a replica."""

    def wait_for_position(self, conn: Session, wanted: Position, timeout: float) -> WaitResult:
        """At most `timeout` seconds; a replica that stops with an error ends the wait at once."""

    # --- the switch ---

    def is_read_only(self, conn: Session) -> bool: ...

    def set_read_only(self, conn: Session, on: bool, *, lock_wait_timeout: float) -> None: ...

    def before_window(self, conn: Session) -> None:
        """On the source, just before the window: what keeps the window's own work short (PostgreSQL: a
        CHECKPOINT, so the clean shutdown inside the window has little to flush)."""

    def stop_writes(self, conn: Session | None, *, lock_wait_timeout: float, server: ServerAccess) -> Position:
        """The source refuses writes from now on, and its final position (read once it does), in one round trip
        where the engine can. ReplicationError when the wait for running writes timed out (nothing changed).
        `server`: the source's host, for an engine whose `source_stops` (`conn` None: stopped already, by this
        switch before a crash; its final position is read from its files)."""

    def host_stop(self, server: ServerAccess, login: LocalLogin) -> HostStop | None:
        """Before the window: stop_writes made ready to run on the source's host (a local client's login put
        where only that command reads it, its cost measured). None when the engine or the host cannot: the switch
        then calls stop_writes."""

    def wait_and_promote(
        self, conn: Session, expected: Position, wait: float, *, within: float | None = None
    ) -> Promotion:
        """Wait at most `wait` for `expected`, then promote with proof (PositionMismatch: not promoted). `within`:
        how long the promotion itself may take (what is left of the budget; None: the engine's own bound)."""

    def promote(self, conn: Session, expected: Position, *, within: float | None = None) -> Position:
        """The replica (which reached `expected`) becomes a primary, with proof; what it executed. `within`: as
        for wait_and_promote."""

    # --- the after-commit audit (none for an engine whose `source_stops`: the mode does not run it) ---

    def open_audit_snapshot(self, conn: Session) -> None:
        """Open a read-only consistent snapshot on the promoted target (the caller keeps the session)."""

    def audit_snapshot_and_position(self, conn: Session, after: tuple[Position, float] | None = None) -> Position:
        """Open that snapshot and read the target's position in one round trip (a DatabaseError that is not a lost
        connection: the server refused the combined statement, and the caller does both apart). `after` (a
        position, a wait in seconds): only once the server has applied it, waited for on the server in the same
        round trip; PositionNotReached when it was not in that time."""

    def audit_chunks(
        self,
        snapshot: Session,
        source: Session,
        final: Position,
        schemas: list[str] | None,
        *,
        chunk_rows: int,
        pause_ratio: float,
        timeout: float,
        on_start: Callable[[int], None],
        on_chunk: Callable[[str, int, int], None],
    ) -> ChunkedAudit:
        """The target's held snapshot against the read-only source at `final`, in the comparison's chunks.
        AuditCutShort: nothing was compared (why in its message); AuditUnreadable: a side's connection went."""

    # --- the comparison before the window ---

    def compare_cost(self, conn: Session, tables: list[tuple[str, str]], chunk_rows: int) -> tuple[float, int]:
        """The estimate's figures for `compare`, read only on the source: one chunk's checksum in seconds (timed on
        the largest table, scaled to `chunk_rows`) and how many chunks the tables make (the server's row
        estimates)."""

    def compare(
        self,
        snapshot_conn: Session,
        target: Session,
        tables: list[tuple[str, str]],
        *,
        chunk_rows: int,
        pause_ratio: float,
        timeout: float,
        on_chunk: Callable[[str, int, int], None],
    ) -> Comparison:
        """The replica stopped, a consistent snapshot opened on `snapshot_conn` (the source) at a known position,
        the replica run to exactly it, every table checksummed over the same chunks on both sides; the snapshot
        closed. The replica stays stopped: the caller starts it again when nothing differs."""


__all__ = [
    "NON_TRANSACTIONAL",
    "AuditCutShort",
    "AuditUnreadable",
    "Blocker",
    "ChunkDifference",
    "ChunkedAudit",
    "Comparison",
    "Cursor",
    "Database",
    "DatabaseError",
    "Figures",
    "Position",
    "PositionMismatch",
    "Promotion",
    "ReplicaSource",
    "ReplicaStatus",
    "Replication",
    "ReplicationError",
    "SeedKit",
    "ServerAccess",
    "Session",
    "TableLimit",
    "WaitResult",
]
