"""What steps depend on, as protocols: a host they run commands on, and the runtime that hands them hosts,
the database engine (`database.protocol.Database`) and its sessions, the DNS provider (`transports.dns.DnsProvider`)
and the downtime window.

`orchestrator.runtime.Runtime` is the real implementation; offline tests give steps the shared fakes of
`tests/fakes.py` (checked against these protocols by mypy). `runtime(ctx)` is the typed view of `ctx.rt`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from orchestrator.database.protocol import Database, Session
    from orchestrator.engine.step import StepContext
    from orchestrator.plan.model import DatabaseEndpoint, Plan, SecretRef
    from orchestrator.transports.dns import DnsProvider
    from orchestrator.transports.haproxy import FrontDoor
    from orchestrator.transports.meter import RoundTrips
    from orchestrator.transports.ssh import CommandResult
    from orchestrator.window import DowntimeWindow

Which = Literal["source", "target"]


class Host(Protocol):
    """A machine steps run shell commands on (SshHost; a recording host in offline tests)."""

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        check: bool = True,
        env: dict[str, str] | None = None,
        input: str | None = None,
    ) -> CommandResult: ...

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
    ) -> CommandResult: ...


class StepRuntime(Protocol):
    """The domain objects a step may use (`ctx.rt`)."""

    plan: Plan
    plan_path: Path
    window: DowntimeWindow
    # What the run holds for its after-commit audit: an orchestrator.services.audit.Held (typed there, through
    # audit.held(rt): the audit module builds on these contracts, not the other way round).
    audit_hold: Any
    # The front doors the run has reached, by side (orchestrator/services/frontdoor.py opens and keeps them here).
    front_doors: dict[str, FrontDoor]
    round_trips: RoundTrips

    def host(self, which: Which) -> Host: ...

    @property
    def source(self) -> Host: ...

    @property
    def target(self) -> Host: ...

    def endpoint(self, which: Which) -> DatabaseEndpoint: ...

    @property
    def database(self) -> Database:
        """The plan's database engine (`database.engine`): what steps do with a session from db()."""

    def db(
        self, which: Which, *, retry: bool = True, read_timeout: float | None = None, ping_spare: bool = True
    ) -> Session: ...

    def keep_spare(self, which: Which, count: int) -> None: ...

    def db_answers(self, which: Which) -> bool: ...

    def release(self, conn: Session) -> None: ...

    def db_password(self) -> str | None: ...

    def secret(self, ref: SecretRef) -> str: ...

    @property
    def dns(self) -> DnsProvider: ...


def runtime(ctx: StepContext) -> StepRuntime:
    """`ctx.rt`, typed: what a step may use of the runtime."""
    rt: StepRuntime = ctx.rt
    return rt
