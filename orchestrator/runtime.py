"""The domain objects steps use (`ctx.rt`, see `orchestrator.contracts.StepRuntime`), built from the plan and
opened lazily.

Nothing is connected until a step asks for it, so a dry-run that only describes never touches a host.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from orchestrator import secrets
from orchestrator.database import engines
from orchestrator.database.protocol import Database, DatabaseError, Session
from orchestrator.engine.interrupt import Interrupted
from orchestrator.engine.step import StepError
from orchestrator.plan.model import DatabaseEndpoint, Plan, SecretRef
from orchestrator.retry import call_with_retry
from orchestrator.services import audit
from orchestrator.transports import dns_providers, rsync, rsync_daemon
from orchestrator.transports.meter import RoundTrips
from orchestrator.transports.ssh import SshHost, TransportError
from orchestrator.window import DowntimeWindow

if TYPE_CHECKING:
    from orchestrator.transports.dns import DnsProvider
    from orchestrator.transports.haproxy import FrontDoor

Which = Literal["source", "target"]


class DatabaseUnreachable(DatabaseError, TransportError):
    """The SSH tunnel to a database could not be opened: a DatabaseError for the steps (db() raises no other kind),
    still the TransportError it was for callers that tell the two apart."""

    def __init__(self, exc: TransportError) -> None:
        DatabaseError.__init__(self, str(exc), exc.transient)


class Runtime:
    def __init__(self, plan: Plan, plan_path: Path, *, dry_run: bool = False) -> None:
        self.plan = plan
        self.plan_path = Path(plan_path)
        self.base_dir = self.plan_path.resolve().parent
        self.dry_run = dry_run
        # The downtime window's budget, begun by the cut-over (steps see it as ctx.window).
        self.window = DowntimeWindow(plan.cutover.max_write_block)
        self._hosts: dict[str, SshHost] = {}
        self._tunnels: dict[str, tuple[object, tuple[str, int]]] = {}
        self._connections: list[Session] = []
        # Connections opened before the downtime window for db() to hand out inside it (keep_spare).
        self._spares: dict[str, list[Session]] = {}
        self._spares_lock = threading.Lock()
        self._dns: DnsProvider | None = None
        self._database: Database | None = None
        self._lock = threading.Lock()
        # The run's heartbeat for the guard on the source (orchestrator/services/guard.py), while this process drives
        # it.
        self.heartbeat: Any = None
        # The window's rsync route (transports/rsync_daemon.py), opened before the window when it can be.
        self.window_route: rsync_daemon.DaemonRoute | None = None
        # What this run holds for its after-commit audit (orchestrator/services/audit.py): the target's snapshot session
        # and how the source's server runs. In this process only: a resumed run has none, and its audit says so.
        self.audit_hold = audit.Held()
        # The front doors this run has reached (orchestrator/services/frontdoor.py), by side: one admin-socket route
        # each.
        self.front_doors: dict[str, FrontDoor] = {}
        # Round trips to the hosts, their databases and front doors, and the DNS API, by step (the report's window
        # parts carry them).
        self.round_trips = RoundTrips(inside=lambda: self.window.blocked_now)

    # --- hosts ---

    def host(self, which: Which) -> SshHost:
        with self._lock:
            if which not in self._hosts:
                spec = self.plan.source if which == "source" else self.plan.target
                # rsync on the source reaches the target with our agent when it has no key of its own.
                forward = which == "source" and self.plan.transfer.source_to_target_key is None
                self._hosts[which] = SshHost(
                    spec,
                    name=which,
                    base_dir=self.base_dir,
                    retry=self.plan.retry,
                    forward_agent=forward,
                    meter=self.round_trips,
                )
            return self._hosts[which]

    @property
    def source(self) -> SshHost:
        return self.host("source")

    @property
    def target(self) -> SshHost:
        return self.host("target")

    # --- databases ---

    @property
    def database(self) -> Database:
        """The plan's database engine (`database.engine`), its sessions counted on the run's round trips."""
        if self._database is None:
            self._database = engines.open_database(self.plan, meter=self.round_trips)
        return self._database

    def endpoint(self, which: Which) -> DatabaseEndpoint:
        return self.plan.database.source if which == "source" else self.plan.database.target

    def _tunnel(self, which: Which) -> tuple[str, int]:
        host = self.host(which)
        connection = host.connection()
        cached = self._tunnels.get(which)
        # A tunnel lives on its SSH connection: after a reconnect, open a new one.
        if cached is None or cached[0] is not connection:
            endpoint = self.endpoint(which)
            if endpoint.socket:
                address = host.forward_to_path(endpoint.socket)
            else:
                address = host.forward_to_port(endpoint.host, endpoint.port)
            cached = self._tunnels[which] = (connection, address)
        return cached[1]

    def db_password(self) -> str | None:
        ref = self.plan.database.password
        return None if ref is None else self.secret(ref)

    def db(
        self, which: Which, *, retry: bool = True, read_timeout: float | None = None, ping_spare: bool = True
    ) -> Session:
        """A new autocommit connection to that host's database through an SSH tunnel (closed by close()), or a spare
        one (keep_spare). `ping_spare=False`: a spare is handed out without its ping (one round trip less); the
        caller's first statement is the check, and on a connection error it asks for a connection again."""
        spare = self._take_spare(which, read_timeout or self.plan.database.read_timeout, ping=ping_spare)
        if spare is not None:
            return spare
        return self._new_db(which, retry=retry, read_timeout=read_timeout)

    def _new_db(self, which: Which, *, retry: bool, read_timeout: float | None) -> Session:
        database = self.plan.database
        engine = self.database
        password = self.db_password()
        try:
            local_host, local_port = self._tunnel(which)
        except TransportError as exc:
            raise DatabaseUnreachable(exc) from None

        def _connect() -> Session:
            return engine.connect(
                local_host,
                local_port,
                user=database.user,
                password=password,
                connect_timeout=database.connect_timeout,
                read_timeout=read_timeout or database.read_timeout,
                write_timeout=read_timeout or database.read_timeout,
            )

        try:
            conn = call_with_retry(_connect, self.plan.retry, what=f"database {which}") if retry else _connect()
        except DatabaseError as exc:
            raise exc.prefixed(which) from None
        self._connections.append(conn)
        return conn

    def keep_spare(self, which: Which, count: int) -> None:
        """Open `count` connections to that database now (before the window), for the next db() calls to take:
        inside the window a connection costs a round trip (a ping), not a TCP and SSH channel set-up and a login.
        Best effort: one that cannot be opened now is opened when asked for, as without a spare."""
        for _ in range(count):
            try:
                # A new one each time: db() would hand back the spare just kept, and `count` would keep one.
                conn = self._new_db(which, retry=False, read_timeout=None)
            except Exception:
                return
            with self._spares_lock:
                self._spares.setdefault(which, []).append(conn)

    def _take_spare(self, which: Which, read_timeout: float, *, ping: bool = True) -> Session | None:
        """A spare connection, alive (one ping, unless `ping` is False) and bounded like a new one; None when there
        is none left."""
        while True:
            with self._spares_lock:
                spares = self._spares.get(which) or []
                if not spares:
                    return None
                conn = spares.pop()
            try:
                if ping:
                    self.database.revive(conn, read_timeout)
                else:
                    self.database.set_timeouts(conn, read_timeout)
            except Interrupted:  # a signal (SIGTERM, SIGINT) is the run's to act on, not a dead spare
                self.release(conn)
                raise
            except Exception:  # gone since it was opened: the next one, or a new connection
                self.release(conn)
                continue
            return conn

    def db_source(self) -> Session:
        return self.db("source")

    def db_target(self) -> Session:
        return self.db("target")

    def db_answers(self, which: Which) -> bool:
        """Is that database server up? One try: it answers SELECT 1, or at least refuses us itself."""
        try:
            conn = self.db(which, retry=False, read_timeout=10.0)
        except TransportError:
            raise  # the way to the host (the tunnel): not an answer from its database
        except DatabaseError as exc:
            return exc.server_answered
        try:
            return self.database.answers(conn)
        finally:
            self.release(conn)

    def release(self, conn: Session) -> None:
        """Close a connection from db() before close() would."""
        if conn in self._connections:
            self._connections.remove(conn)
        with contextlib.suppress(Exception):  # already closed by the server going away
            conn.close()

    # --- DNS and secrets ---

    @property
    def dns(self) -> DnsProvider:
        """The plan's DNS provider (`dns.provider`), opened on first use."""
        if self._dns is None:
            self._dns = dns_providers.open_provider(
                self.plan.dns, self.secret(self.plan.dns.api_token), meter=self.round_trips
            )
        return self._dns

    def secret(self, ref: SecretRef) -> str:
        try:
            return secrets.resolve(ref, self.base_dir)
        except secrets.SecretError as exc:
            raise StepError(f"secret: {exc}") from None

    # --- lifecycle ---

    def close(self) -> None:
        heartbeat, self.heartbeat = self.heartbeat, None
        if heartbeat is not None:
            heartbeat.stop()
        source = self._hosts.get("source")
        route, self.window_route = self.window_route, None
        if route is not None and source is not None:
            rsync_daemon.close_route(self.plan, source, route)
        if source is not None and not self.dry_run:
            # The source's shared SSH connection to the target (rsync's) must not outlive the run.
            with contextlib.suppress(Exception):
                source.run(rsync.close_master_command(self.plan), timeout=15, check=False)
        self._spares.clear()
        for conn in self._connections:
            with contextlib.suppress(Exception):  # the server may have gone away first
                conn.close()
        self._connections.clear()
        self._tunnels.clear()
        for host in self._hosts.values():
            host.close()
        self._hosts.clear()
        dns, self._dns = self._dns, None
        if dns is not None:
            dns.close()
        self.front_doors.clear()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
