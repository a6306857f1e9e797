"""A cut-over mode as an object: its step sequence and what the shared steps do in it.

The shared steps (preflight, start_target, verify_target, audit, finish) are built with the run's mode
(`steps.build_steps` hands it to each) and call it where the modes differ, never asking which one it is. What each
step offers its mode to combine (its checks, its reads, its replication work) stays in the step's own file: a
mode picks and orders, it holds no SQL of its own beyond naming which snapshot verify opens.

Not a step: steps import this package, never each other; it imports no step module (only what steps share:
steps/common.py, steps/repl_common.py). It lives under steps/ so that the package's __init__ (build_steps) is always
loaded before it, whichever module is imported first.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol

from orchestrator.contracts import StepRuntime, Which
from orchestrator.engine.step import StepContext
from orchestrator.plan.model import Plan
from orchestrator.results import AuditResult
from orchestrator.services import audit, estimates
from orchestrator.services.health import HealthCheck

# Every mode begins with these: the checks, the TTLs lowered, the target prepared, the file trees pre-synced live.
BEFORE_CUTOVER: tuple[str, ...] = ("preflight", "lower_ttl", "prepare_target", "files_presync")
# The shared end, in the order a mode keeps it: the uploads' delta, the target started (the shutdown mode only: in
# the replicate mode it runs before the window), verified, the DNS flip (the commit point), the after-commit audit
# (row counts and checksums, or chunks, kept out of the window), finish.
SHARED_END: tuple[str, ...] = ("files_final", "start_target", "verify_target", "dns_flip", "audit", "finish")
# With a front door on the source the commit is made there (`switch_traffic`: the target's fence lifted, the source's
# door forwarding to the target's), and the DNS flip follows after the window, with all the patience a slow API
# needs: every client reaches the target through the source's door whatever its DNS cache says.
COMMIT_AT_DOOR = "switch_traffic"


def with_door(end: tuple[str, ...], door_commits: bool) -> tuple[str, ...]:
    """`end` with the commit at the door before the DNS flip when the plan's front door commits."""
    if not door_commits:
        return end
    at = end.index("dns_flip")
    return (*end[:at], COMMIT_AT_DOOR, *end[at:])


Checked = tuple[dict[str, Any], list[str]]


class VerifyKit(Protocol):
    """What verify_target offers its mode: each part bounded by the window, each giving figures and problems."""

    def health(self, ctx: StepContext) -> tuple[dict[str, int], list[str]]: ...
    def trees(self, ctx: StepContext) -> Checked: ...
    def snapshot(self, ctx: StepContext, conn: Any = None) -> Checked: ...
    def positions(self, ctx: StepContext) -> Checked: ...


class AuditKit(Protocol):
    """What the audit step offers its mode."""

    def stop_left_over(self, ctx: StepContext) -> None: ...
    def audit_figures(self, ctx: StepContext, held: audit.Held) -> AuditResult: ...
    def audit_chunks(self, ctx: StepContext, held: audit.Held) -> AuditResult: ...


class FinishKit(Protocol):
    """What finish offers its mode: the replicate mode's reverse path (set up, kept, torn down)."""

    def reverse_replication(self, ctx: StepContext) -> dict[str, Any] | None: ...
    def keep_reverse(self, ctx: StepContext, keep: float) -> dict[str, Any]: ...
    def tear_down(self, ctx: StepContext) -> None: ...


class CutoverMode(ABC):
    """One cut-over mode: the steps it runs between the shared pre-sync and the shared end, the shared end it
    keeps, and its part in the shared steps."""

    name: str
    own_steps: tuple[str, ...]
    shared_end: tuple[str, ...] = SHARED_END
    # The databases that replicated in the forward run and still run when its reverse run finishes (its finish
    # forgets replication on them).
    forward_replication_on: tuple[Which, ...] = ("target",)

    def steps(self, *, door_commits: bool = False) -> tuple[str, ...]:
        """Every step's name, in run order (`door_commits`: the plan commits at the source's front door)."""
        return BEFORE_CUTOVER + self.own_steps + with_door(self.shared_end, door_commits)

    def __repr__(self) -> str:
        return f"<cut-over mode {self.name}>"

    # -- preflight
    def preflight_lines(self, lines: list[str]) -> list[str]:
        """The dry-run's lines of preflight, in this mode."""
        return lines

    def check_storage(self, check: Callable[[], None]) -> None:
        """Preflight's free space and storage comparison (`check`), where the mode moves a datadir."""
        check()

    @abstractmethod
    def probes_replication(self, declared: str) -> bool:
        """Whether preflight asks the servers about replication (`declared`: the mode the plan's author wrote)."""

    @abstractmethod
    def requirement_problems(self, found: list[str], app_users: Callable[[], list[str]]) -> list[str]:
        """Preflight's problems with what this mode needs: `found`, the replication probe's findings; `app_users`,
        the application accounts' check (read only when the mode needs it)."""

    # -- start_target
    @abstractmethod
    def describe_start(self, ctx: StepContext, lines: Callable[[], list[str]]) -> list[str]:
        """The target's start in words (`lines`: the step's own start)."""

    @abstractmethod
    def start_target(self, ctx: StepContext, start: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The target started (`start`: the step's fence, database and services)."""

    @abstractmethod
    def undo_start(self, ctx: StepContext, stop: Callable[[], None]) -> None:
        """The target's start undone (`stop`: the step's services and database stopped)."""

    # -- verify_target
    @abstractmethod
    def inside_checks(self, plan: Plan) -> list[HealthCheck]:
        """The health checks that run inside the window."""

    @abstractmethod
    def describe_verify(self, ctx: StepContext, checks: list[str], trees: list[str]) -> list[str]:
        """The verification in words (`checks`: one line per health check inside the window; `trees`: one line per
        file tree compared)."""

    @abstractmethod
    def open_audit_snapshot(self, conn: Any, schemas: list[str] | None, database: Any) -> dict[str, str] | None:
        """The audit's consistent snapshot opened on `conn` (a session of `database`, the plan's engine): the tables'
        storage engines read in it (None: read later)."""

    @abstractmethod
    def verify(self, ctx: StepContext, kit: VerifyKit) -> dict[str, Any]:
        """The verification inside the window: the step's result, or a StepError naming every problem."""

    # -- audit
    audit_method: str

    @abstractmethod
    def describe_audit(self, plan: Plan) -> list[str]:
        """The after-commit audit in words (when the plan asks for one)."""

    @abstractmethod
    def audit(self, ctx: StepContext, kit: AuditKit, held: audit.Held) -> AuditResult:
        """The after-commit audit, from what verify_target held."""

    # -- finish
    def describe_finish(self, plan: Plan) -> list[str]:
        """Finish's lines of a forward run particular to this mode."""
        return []

    def reverse_path(self, ctx: StepContext, kit: FinishKit) -> dict[str, Any] | None:
        """A forward run's finish, before the drain: the way back set up (None: none)."""
        return None

    def end_reverse_path(self, ctx: StepContext, kit: FinishKit, reverse: dict[str, Any] | None) -> None:
        """A forward run's finish, after the drain: the way back kept or ended (`reverse`: what reverse_path set up,
        updated in place)."""
        return None

    def undo_finish(self, ctx: StepContext, kit: FinishKit) -> None:
        """A forward run's finish undone, before the source's services start again."""
        return None

    # -- the estimate (orchestrator/services/estimates.py: EstimatedMode; the arithmetic stays there)
    @abstractmethod
    def database_transfer(self, rt: StepRuntime) -> estimates.TransferEstimate:
        """How the database travels before the window, measured read-only."""

    @abstractmethod
    def window_shell(self, host: Any) -> bool:
        """Whether the window's short commands on `host` run in a shell kept open before it (kept open now if so)."""

    @abstractmethod
    def health_rounds(self, rt: StepRuntime) -> tuple[list[float], str]:
        """One round of the health checks, timed where this mode can ask them before the window, and where."""

    @abstractmethod
    def datadir_delta(self, rt: StepRuntime) -> tuple[int, float]:
        """The datadir's bytes the window copies and the rate the source checksums them at ((0, 0.0): none)."""

    @abstractmethod
    def window_parts(self, basis: estimates.WindowBasis) -> list[estimates.WindowPart]:
        """The window's parts in this mode."""

    @abstractmethod
    def measure_compare(self, rt: StepRuntime) -> tuple[float, int] | None:
        """What this mode's comparison before the window costs (None: it makes none)."""

    @abstractmethod
    def before_parts(self, units: estimates.UnitCosts, plan: Plan,
                     compare: tuple[float, int] | None) -> list[estimates.WindowPart]:  # fmt: skip
        """This mode's own steps before the window that move nothing of their own."""
