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
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from orchestrator.redaction import redact

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
    # The write fence in words ("FLUSH TABLES WITH READ LOCK"), as the cut-over's lines and errors name it.
    fence_name: str
    # Whether the write fence lives in the data (PostgreSQL's NOLOGIN roles: a copy of the datadir carries it, and the
    # target's is lifted when it starts) rather than in a session or the server's memory (MariaDB's lock, read_only).
    fence_in_data: bool
    # Whether the shutdown mode's audit starts the stopped source isolated and read-only with
    # orchestrator/services/audit.py (MariaDB's server options) or asks the engine (`isolated_figures`: PostgreSQL).
    audits_stopped_source: bool
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

    def isolated_figures(
        self,
        host: Any,
        binary: str,
        user: str | None,
        datadir: str,
        tables: list[str],
        *,
        counts: bool,
        checksums: bool,
    ) -> tuple[dict[str, int], dict[str, int | None]]:
        """The stopped source's row counts and checksums ("schema.table" → figure), its server (`binary`, run as
        `user`) started isolated and read-only on `host`, then stopped again; a table that cannot be read is left
        out. Only for an engine whose `audits_stopped_source` is False."""

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


__all__ = ["Blocker", "Cursor", "Database", "DatabaseError", "Session", "TableLimit"]
