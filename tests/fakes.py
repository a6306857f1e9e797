"""The offline tests' stand-ins for what steps depend on, each implementing its protocol (`make lint` type-checks this
file, so `_implements` below fails the lint when a fake drifts from its protocol):

- `RecordingHost` (a `contracts.Host`): records every command, answers from fixtures;
- `LocalHost` (a `contracts.Host`): runs the command on this machine, as SshHost runs it on a host;
- `FakeDns` (a `transports.dns.DnsProvider`): zones and records in memory, every call recorded, failures injected;
- `FakeDatabase` (a `database.protocol.Database`): the MariaDB engine's SQL over offline sessions (`FakeSession`:
  every statement recorded, answered like a small source database), so a test reads exactly what a step sent;
- `FakeReplication` (a `database.protocol.Replication`): both servers' replication as the replicate steps see it
  (read-only flags, replica states, positions as text), every call recorded as (what, side, detail), the wait and
  the promotion scripted; `FakeDatabase.replica_control` hands it out;
- `OfflineRuntime` (a `contracts.StepRuntime`): the plan, the window, recording hosts, a `FakeDns`, a `FakeDatabase`
  and database sessions whose answers the test sets (`FakeSession`);
- `context(rt, step, ...)`: a StepContext over such a runtime, its saves kept in a dict the test reads.

What these stand for on real hosts and the real API is proven on the lab (test_cutover, test_steps_live, test_e2e,
test_cloudflare).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from orchestrator.database.mariadb import MariaDb
from orchestrator.database.protocol import ChunkedAudit, Comparison, PositionMismatch, ReplicaSource, ServerAccess
from orchestrator.engine.step import StepContext
from orchestrator.plan.loader import load_plan
from orchestrator.plan.model import DatabaseEndpoint, Plan, SecretRef
from orchestrator.services import audit
from orchestrator.transports.dns import DnsError, DnsProvider, DnsRecord
from orchestrator.transports.meter import RoundTrips
from orchestrator.transports.ssh import CommandFailed, CommandResult, TransportError
from orchestrator.window import DowntimeWindow

if TYPE_CHECKING:
    from orchestrator.contracts import Host, StepRuntime, Which
    from orchestrator.database.protocol import Database, Replication
    from orchestrator.transports.haproxy import FrontDoor

PLAN_FILE = Path(__file__).parents[1] / "plans" / "course-review.yaml"


def example_plan() -> Plan:
    """The example plan (plans/course-review.yaml)."""
    return load_plan(PLAN_FILE).plan


plan = example_plan


# --- hosts ------------------------------------------------------------------------------------------------------


class RecordingHost:
    """Records every command; answers with the first fixture whose pattern the command matches (else empty, 0)."""

    def __init__(self, answers: list[tuple[str, str | list[str]]] | None = None, *, fail: str | None = None) -> None:
        self.answers = answers or []
        self.fail = fail
        self.calls: list[dict[str, Any]] = []
        # Called with each command after it ran (what the command does to the world, in a test).
        self.effect: Callable[[str], None] | None = None

    def _answer(self, command: str) -> CommandResult:
        if self.fail is not None and re.search(self.fail, command):
            raise TransportError(f"`{command}` failed", False)
        for pattern, output in self.answers:
            if re.search(pattern, command):
                # A list answers in turn, its last answer repeating.
                text = (output.pop(0) if len(output) > 1 else output[0]) if isinstance(output, list) else output
                return CommandResult(0, text, "")
        return CommandResult(0, "", "")

    def run(self, command: str, *, timeout: float | None = None, input: str | None = None, **_: Any) -> CommandResult:
        self.calls.append({"command": command, "timeout": timeout, "input": input})
        result = self._answer(command)
        if self.effect is not None:
            self.effect(command)
        return result

    def stream(
        self, command: str, on_line: Callable[[str], None], *, timeout: float | None = None, **_: Any
    ) -> CommandResult:
        self.calls.append({"command": command, "timeout": timeout, "input": None})
        result = self._answer(command)
        for line in result.stdout.splitlines():
            on_line(line)
        return result

    @property
    def commands(self) -> list[str]:
        return [call["command"] for call in self.calls]

    @property
    def timeouts(self) -> list[float | None]:
        return [call["timeout"] for call in self.calls]


class LocalHost:
    """Runs each command with `sh -c` on this machine, as SshHost runs it on a host: a non-zero exit raises
    CommandFailed when `check` (SshHost's rule), else comes back in the result."""

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        check: bool = True,
        env: dict[str, str] | None = None,
        input: str | None = None,
    ) -> CommandResult:
        done = subprocess.run(
            ["sh", "-c", command], capture_output=True, text=True, timeout=timeout, input=input, env=env
        )
        if check and done.returncode != 0:
            raise CommandFailed(command, done.returncode, done.stderr)
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def stream(
        self,
        command: str,
        on_line: Callable[[str], None],
        *,
        timeout: float | None = None,
        check: bool = True,
        env: dict[str, str] | None = None,
        keep: Callable[[str], bool] | None = None,
        input: str | None = None,
    ) -> CommandResult:
        result = self.run(command, timeout=timeout, check=check, env=env, input=input)
        for line in result.stdout.splitlines():
            on_line(line)
        kept = "\n".join(line for line in result.stdout.splitlines() if keep is None or keep(line))
        return CommandResult(result.exit_status, kept, result.stderr)


# --- DNS --------------------------------------------------------------------------------------------------------


class FakeDns:
    """A DNS provider in memory: `zones` (name → id) and `records` (id → DnsRecord). Every call is recorded in `calls`
    as (operation, argument); `failures[operation]` (a list of DnsErrors) makes the next calls of that operation
    fail in turn before it answers again."""

    def __init__(self, zones: dict[str, str] | None = None, records: list[DnsRecord] | None = None) -> None:
        self.zones = dict(zones or {})
        self.records = {record.id: record for record in records or []}
        self.calls: list[tuple[str, str]] = []
        self.failures: dict[str, list[DnsError]] = {}
        self.token_active = True
        self.closed = False

    def _call(self, operation: str, argument: str) -> None:
        self.calls.append((operation, argument))
        pending = self.failures.get(operation)
        if pending:
            raise pending.pop(0)

    def verify_token(self, zone_name: str) -> None:
        self._call("verify_token", "")
        if not self.token_active:
            raise DnsError("fake DNS: the API token is not active", transient=False)

    def check_can_edit(self, zone_id: str, record: DnsRecord) -> None:
        self._call("check_can_edit", record.name)

    def zone_id(self, zone_name: str, *, timeout: float | None = None) -> str:
        self._call("zone_id", zone_name)
        wanted = zone_name.lower().rstrip(".")
        if wanted not in self.zones:
            raise DnsError(f"fake DNS: zone {wanted} not found", transient=False)
        return self.zones[wanted]

    def find_records(self, zone_id: str, name: str, type: str, *, timeout: float | None = None) -> list[DnsRecord]:
        self._call("find_records", name)
        wanted = name.lower().rstrip(".")
        return [r for r in self.records.values() if r.name == wanted and r.type == type]

    def get_record(self, zone_id: str, record_id: str, *, timeout: float | None = None) -> DnsRecord:
        self._call("get_record", record_id)
        if record_id not in self.records:
            raise DnsError(f"fake DNS: no record {record_id}", transient=False)
        return self.records[record_id]

    def set_content(self, zone_id: str, record: DnsRecord, content: str, *, timeout: float | None = None) -> DnsRecord:
        self._call("set_content", f"{record.name} {content}")
        self.records[record.id] = replace(self.records[record.id], content=content)
        return self.records[record.id]

    def set_ttl(self, zone_id: str, record: DnsRecord, ttl: int) -> DnsRecord:
        self._call("set_ttl", f"{record.name} {ttl}")
        self.records[record.id] = replace(self.records[record.id], ttl=ttl)
        return self.records[record.id]

    def close(self) -> None:
        self.closed = True

    def edits(self) -> list[tuple[str, str]]:
        """The calls that changed a record, in order."""
        return [call for call in self.calls if call[0] in ("set_content", "set_ttl")]


# --- databases --------------------------------------------------------------------------------------------------


class FakeCursor:
    def __init__(self, session: FakeSession) -> None:
        self.session = session
        self.rows: list[tuple[Any, ...]] = []

    def __enter__(self) -> FakeCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, sql: str, args: object = None) -> None:
        self.session.statements.append(sql)
        self.rows = self.session.answer(sql)

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows


class FakeSession:
    """A database session that records statements and answers like a small source database."""

    def __init__(self, which: str = "source") -> None:
        self.which = which  # the side whose database this session reaches
        self.statements: list[str] = []
        self._read_timeout: float | None = 30.0
        self.server_running = True
        self.closed = False

    def answer(self, sql: str) -> list[tuple[Any, ...]]:
        if "information_schema.TABLES" in sql and "ENGINE" in sql:
            return [("app", "reviews", "InnoDB"), ("app", "users", "InnoDB")]
        if "information_schema.TABLES" in sql:
            return [("app", "reviews"), ("app", "users")]
        if sql.startswith("SHOW BINLOG STATUS"):
            return [("binlog.000003", 1234)]
        if "gtid_binlog_pos" in sql:
            return [("0-1-42",)]
        if "@@GLOBAL.read_only" in sql:
            return [(0,)]
        if sql.startswith("SELECT COUNT(*)"):
            return [(7,)] if "reviews" in sql else [(2,)]
        return []

    def cursor(self) -> FakeCursor:
        return FakeCursor(self)

    def ping(self, reconnect: bool = False) -> None:
        if not self.server_running:
            raise OSError("the server went away")

    def close(self) -> None:
        self.closed = True


class FakeDatabase(MariaDb):
    """The MariaDB engine whose sessions are FakeSessions: its SQL is the real engine's, nothing is connected;
    `replica_control` (a FakeReplication), when set, is its replicate mode's."""

    def __init__(self) -> None:
        super().__init__("mariadb")
        self.opened: list[FakeSession] = []
        self.replica_control: Replication | None = None

    def replication(self) -> Replication | None:
        return self.replica_control if self.replica_control is not None else super().replication()

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
    ) -> FakeSession:
        self.opened.append(FakeSession())
        return self.opened[-1]


# --- replication ------------------------------------------------------------------------------------------------


@dataclass
class FakeStatus:
    """A replica's state (database.protocol.ReplicaStatus)."""

    io_running: str = "Yes"
    sql_running: bool = True
    seconds_behind: int | None = 0
    gtid_io_pos: Any = ""
    master_port: int = 3307
    error: str | None = None

    @property
    def replicating(self) -> bool:
        return self.io_running == "Yes" and self.sql_running


@dataclass
class FakeWait:
    """A bounded wait's outcome (WaitResult) and, for `wait_and_promote`, a promotion's (Promotion)."""

    outcome: str = "reached"
    waited: float = 0.1
    position: Any = ""
    error: str | None = None
    promoted: bool = False
    executed: Any = ""

    @property
    def reached(self) -> bool:
        return self.outcome == "reached"


@dataclass
class FakeReplication:
    """Both servers' replication as the replicate steps read and change it, through the `Replication` protocol.

    Positions are their text ("0-1-42"); `executed[side]` is what that side applied. `first_slice` is what the
    switch's first bounded wait-and-promote returns, `waits` what each later `wait_for_position` does (in order),
    `mismatch` makes a promotion fail its proof. Every call lands in `calls` as (what, side, detail)."""

    read_only: dict[str, bool] = field(default_factory=lambda: {"source": False, "target": True})
    replica: dict[str, FakeStatus | None] = field(default_factory=lambda: {"source": None, "target": FakeStatus()})
    executed: dict[str, str] = field(default_factory=lambda: {"source": "", "target": "0-1-42"})
    final: str = "0-1-42"
    first_slice: FakeWait = field(default_factory=FakeWait)
    waits: list[FakeWait] = field(default_factory=list)
    mismatch: str | None = None
    source_stops: bool = False
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    wait_slice: float = 0.5
    requirements: str = "what the fake engine relies on"
    seed: Any = None

    def _record(self, what: str, conn: Any, detail: Any = None) -> str:
        side = str(getattr(conn, "which", "?")) if conn is not None else "stopped"
        self.calls.append((what, side, detail))
        return side

    def changes(self) -> list[tuple[str, str, Any]]:
        """The calls that change a server."""
        kept = ("set_read_only", "start_replica", "stop_replica", "follow", "promote", "wait_and_promote",
                "stop_writes", "forget_replication")  # fmt: skip
        return [call for call in self.calls if call[0] in kept]

    def describe(self, part: str, plan: Any) -> list[str]:
        return [f"the fake engine's {part}"] if part != "finish" else ["the reverse path", "torn down"]

    def programs(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        return ()

    def server_facts(self, conn: Any) -> dict[str, str]:
        self._record("server_facts", conn)
        return {}

    def problems(self, plan: Any, source: dict[str, str] | None, target: dict[str, str] | None,
                 programs: dict[str, bool]) -> list[str]:  # fmt: skip
        return []

    def pair_problems(self, source: dict[str, str], target: dict[str, str]) -> list[str]:
        return []

    def writer_problems(self, conn: Any, app_users: list[str]) -> list[str]:
        return []

    def seed_spec(self, plan: Any, *, source_datadir: str, target_datadir: str, ssh_to_target: tuple[str, ...],
                  password_env: str | None) -> Any:  # fmt: skip
        raise AssertionError("the fake engine has no seed")

    def parse_position(self, text: str | None) -> Any:
        return text or ""

    def same_position(self, final: Any, executed: Any) -> bool:
        return bool(final) and str(final) == str(executed)

    def write_position(self, conn: Any) -> Any:
        self._record("write_position", conn)
        return self.final

    def current_position(self, conn: Any) -> Any:
        return self.executed[self._record("current_position", conn)]

    def current_position_after(self, conn: Any, wanted: Any, wait: float) -> Any:
        # Reached when what the server executed is at `wanted` (the fake's positions compare as equal or not).
        found = self.executed[self._record("current_position_after", conn)]
        return found if str(found) == str(wanted) else None

    def executed_position(self, conn: Any) -> Any:
        return self.executed[self._record("executed_position", conn)]

    def replica_status(self, conn: Any) -> FakeStatus | None:
        return self.replica[self._record("replica_status", conn)]

    def follow(self, conn: Any, source: ReplicaSource, start_at: Any, *, seeded: bool,
               server: ServerAccess | None = None, primary: Any = None) -> None:  # fmt: skip
        side = self._record("follow", conn, (source.port, str(start_at), seeded))
        self.replica[side] = FakeStatus(io_running="No", sql_running=False, master_port=source.port)

    def start_replica(self, conn: Any) -> None:
        side = self._record("start_replica", conn)
        status = self.replica[side]
        if status is not None:
            self.replica[side] = replace(status, io_running="Yes", sql_running=True)

    def stop_replica(self, conn: Any) -> None:
        side = self._record("stop_replica", conn)
        status = self.replica[side]
        if status is not None:
            self.replica[side] = replace(status, io_running="No", sql_running=False)

    def forget_replication(self, conn: Any) -> None:
        self.replica[self._record("forget_replication", conn)] = None

    def wait_for_position(self, conn: Any, wanted: Any, timeout: float) -> FakeWait:
        self._record("wait_for_position", conn, str(wanted))
        return self.waits.pop(0) if self.waits else FakeWait(position=wanted)

    def is_read_only(self, conn: Any) -> bool:
        return self.read_only[self._record("is_read_only", conn)]

    def set_read_only(self, conn: Any, on: bool, *, lock_wait_timeout: float) -> None:
        self.read_only[self._record("set_read_only", conn, on)] = on

    def before_window(self, conn: Any) -> None:
        self._record("before_window", conn)

    def host_stop(self, server: ServerAccess, login: Any) -> None:
        return None  # the stop over the session (the first command's own is proven in test_host_stop and the lab)

    def stop_writes(self, conn: Any, *, lock_wait_timeout: float, server: ServerAccess) -> Any:
        side = self._record("stop_writes", conn)
        self.read_only[side if side != "stopped" else "source"] = True
        return self.final

    def _promote(self, side: str, expected: Any) -> Any:
        if self.mismatch is not None:
            raise PositionMismatch(self.mismatch)
        self.replica[side], self.read_only[side] = None, False
        return self.executed[side]

    def wait_and_promote(self, conn: Any, expected: Any, wait: float, *, within: float | None = None) -> FakeWait:
        side = self._record("wait_and_promote", conn, str(expected))
        if not self.first_slice.reached:
            return self.first_slice
        return replace(self.first_slice, promoted=True, executed=self._promote(side, expected))

    def promote(self, conn: Any, expected: Any, *, within: float | None = None) -> Any:
        return self._promote(self._record("promote", conn, str(expected)), expected)

    def open_audit_snapshot(self, conn: Any) -> None:
        self._record("open_audit_snapshot", conn)

    def audit_snapshot_and_position(self, conn: Any, after: tuple[Any, float] | None = None) -> Any:
        self._record("audit_snapshot_and_position", conn)
        return self.executed["target"]

    def audit_chunks(self, snapshot: Any, source: Any, final: Any, schemas: list[str] | None, *, chunk_rows: int,
                     pause_ratio: float, timeout: float, on_start: Callable[[int], None],
                     on_chunk: Callable[[str, int, int], None]) -> ChunkedAudit:  # fmt: skip
        self._record("audit_chunks", source, str(final))
        return ChunkedAudit()

    def compare_cost(self, conn: Any, tables: list[tuple[str, str]], chunk_rows: int) -> tuple[float, int]:
        return 0.01, len(tables)

    def compare(self, snapshot_conn: Any, target: Any, tables: list[tuple[str, str]], *, chunk_rows: int,
                pause_ratio: float, timeout: float,
                on_chunk: Callable[[str, int, int], None]) -> Comparison:  # fmt: skip
        self._record("compare", target, len(tables))
        return Comparison(position=self.final)


# --- the runtime ------------------------------------------------------------------------------------------------


class OfflineRuntime:
    """What the steps use of the runtime, with recording hosts, a FakeDns and database sessions whose answers the
    test sets (`answers`: does that side's database answer; `db` hands out a new FakeSession, kept as `session`)."""

    def __init__(
        self,
        plan: Plan,
        *,
        source: RecordingHost | None = None,
        target: RecordingHost | None = None,
        dns: FakeDns | None = None,
    ) -> None:
        self.plan = plan
        self.plan_path = Path("plan.yaml")
        self.window = DowntimeWindow(plan.cutover.max_write_block)
        self.round_trips = RoundTrips()
        self.source = source or RecordingHost()
        self.target = target or RecordingHost()
        self.dns = dns or FakeDns()
        self.database = FakeDatabase()
        self.answers: dict[str, bool] = {"source": True, "target": False}
        self.audit_hold = audit.Held()
        self.front_doors: dict[str, FrontDoor] = {}
        self.released: list[object] = []
        self.closed = False

    def host(self, which: Which) -> RecordingHost:
        return self.source if which == "source" else self.target

    def endpoint(self, which: Which) -> DatabaseEndpoint:
        return self.plan.database.source if which == "source" else self.plan.database.target

    # A FakeSession: a session of the FakeDatabase.
    def db(
        self, which: Which, *, retry: bool = True, read_timeout: float | None = None, ping_spare: bool = True
    ) -> Any:
        self.session = FakeSession(which)
        return self.session

    def keep_spare(self, which: Which, count: int) -> None:
        pass

    def db_answers(self, which: Which) -> bool:
        return self.answers[which]

    def release(self, conn: Any) -> None:
        self.released.append(conn)

    def db_password(self) -> str | None:
        return None

    def secret(self, ref: SecretRef) -> str:
        return "offline-secret"

    def close(self) -> None:
        self.closed = True


def context(
    rt: Any,
    step: str,
    *,
    saved: dict[str, Any] | None = None,
    outputs: dict[str, dict[str, Any]] | None = None,
    history: list[dict[str, Any]] | None = None,
) -> StepContext:
    """A StepContext over `rt`; what the step saves lands in `saved` (when given) as the journal would keep it."""
    journal = saved if saved is not None else {}

    def _save(_step: str, key: str, value: Any) -> None:
        journal[key] = value

    return StepContext(
        run_id="offline",
        step=step,
        dry_run=False,
        rt=rt,
        log=structlog.get_logger("test"),
        _saved=dict(journal),
        _outputs=outputs or {},
        _save=_save,
        _history=(lambda: history) if history is not None else None,
    )


def _implements(example: Plan) -> None:
    """Never called: mypy checks each fake against the protocol it stands in for (`make lint`)."""
    recording: Host = RecordingHost()
    local: Host = LocalHost()
    dns: DnsProvider = FakeDns()
    database: Database = FakeDatabase()
    replication: Replication = FakeReplication()
    rt: StepRuntime = OfflineRuntime(example)
    del recording, local, dns, database, replication, rt
