"""What a step is, to the engine.

A step is one unit of the migration with four faces kept side by side in one file:
- `describe`: what it would do (dry-run prints this; nothing may change anywhere);
- `check`: is its effect already in place? (on resume, a step whose effect is there is not run again);
- `run`: do it; may return a small JSON-able dict kept in the journal (bytes moved, old DNS content, ...);
- `undo`: its compensation, run in reverse order on rollback. It must be safe to call after a partial `run`.

The engine knows nothing of MySQL, rsync or Cloudflare: the domain objects a step needs reach it as `ctx.rt`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from orchestrator.engine.view import JournalView, Records

P = TypeVar("P")


class StepError(Exception):
    """An expected failure of a step, with a message an operator can act on (one line, no secrets)."""


class UndoRefused(StepError):
    """A compensation that must not run now: undoing would take from clients what they were told (e.g. the run
    committed outside before it stopped). The rollback stops there and leaves the service as it is, serving."""


class WriteWindow(Protocol):
    """The downtime window as steps see it (the domain's implementation comes with the runtime, `rt.window`)."""

    def bind(self, history: Callable[[], JournalView]) -> WriteWindow: ...
    def begin(self, at: float | None = None) -> float: ...
    def remaining(self) -> float | None: ...
    def timeout(self, cap: float | None = None) -> float | None: ...
    def bounded(self, policy: P) -> P: ...
    def check(self, what: str) -> None: ...
    def lift(self, at: float | None = None) -> None: ...
    def intervals(self) -> list[list[float | None]]: ...
    def elapsed(self) -> float | None: ...
    @property
    def blocked_at(self) -> float | None: ...
    @property
    def blocked_now(self) -> bool: ...

    # The seconds kept back from the budget for the rollback's own work (the cut-over measures and sets it).
    reserve: float


@dataclass
class StepContext:
    """What a step sees of the run: its identity, the domain runtime, and its own journaled data."""

    run_id: str
    step: str
    dry_run: bool
    rt: Any
    log: Any
    _saved: dict[str, Any] = field(default_factory=dict)
    _outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    _save: Callable[[str, str, Any], None] | None = None
    # The same, written without its own fsync (`save(..., sync=False)`); None: every save is fsync'd.
    _save_unsynced: Callable[[str, str, Any], None] | None = None
    # The run's journal so far: a view, or records (a test's hand-written history), read through `JournalView.of`.
    _history: Callable[[], Records] | None = None
    _commit: Callable[[str, str], None] | None = None
    _start_next: Callable[[], None] | None = None
    started_at: float = field(default_factory=time.time)
    # The downtime window (remaining budget, bounded timeouts and retries); by default the runtime's, bound to
    # this run's journal so a resumed run counts from the journaled moment writes were blocked.
    window: WriteWindow = None  # type: ignore[assignment]  # set in __post_init__

    def __post_init__(self) -> None:
        if self.window is None:
            window = getattr(self.rt, "window", None)
            if window is not None:
                self.window = window.bind(self.history)

    def save(self, key: str, value: Any, *, sync: bool = True) -> None:
        """Journal (and fsync) a value before acting on it, e.g. a DNS record's old content before the edit.

        `sync=False`: a fact that no action of this process depends on before the next fsync'd record (whose fsync
        flushes it too); a kill -9 keeps it either way. Inside the window each fsync costs 2-5 ms."""
        self._saved[key] = value
        save = self._save if sync or self._save_unsynced is None else self._save_unsynced
        if save is not None:
            save(self.step, key, value)

    def saved(self, key: str, default: Any = None) -> Any:
        """A value this step saved earlier in this run, even before a crash."""
        return self._saved.get(key, default)

    def commit(self, reason: str) -> None:
        """Declare the run committed from here on, before this step completes (journaled at once).

        For a step whose effect may already be partly visible to clients (a DNS flip that moved some records):
        a later failure then leaves the run to be finished forward (`migrate apply`) instead of rolled back.
        """
        if self._commit is not None:
            self._commit(self.step, reason)

    def start_next_beside(self) -> None:
        """Let the next step begin now, beside the rest of this one, when it may run beside others (its
        `runs_beside`): once this step has made true what the next one needs (e.g. writes stopped). A no-op
        otherwise, in a dry-run and when called again; without this call the next step waits for this one."""
        if self._start_next is not None:
            self._start_next()

    def history(self) -> JournalView:
        """The run's journal so far, oldest first (empty in a dry-run): `ctx.history().last_run().saved(...)`."""
        return JournalView.of(self._history()) if self._history is not None else JournalView()

    def output(self, step: str) -> dict[str, Any]:
        """The result dict of an earlier completed step ({} if it has none)."""
        return self._outputs.get(step, {})


class Step(ABC):
    name: ClassVar[str]
    # A plain attribute, like commit_point: a step's constructor may word it for the plan it runs in.
    title: str
    # Completing this step commits the migration: failures after it are not rolled back automatically. A plain
    # attribute: a step may be the commit point in one plan and not in another (set by its constructor).
    commit_point: bool = False
    # The confirmation gate (and the before-cutover hook) sits right before this step.
    begins_downtime: ClassVar[bool] = False
    # May run beside the steps after it, in a thread of the engine, when the step before it lets it start early
    # (`ctx.start_next_beside()`); it is then done before any commit point and before the run ends. Such a step
    # must not be one whose output the steps running beside it read (they would see none), unless they name it in
    # their `waits_for`.
    runs_beside: ClassVar[bool] = False
    # Steps that must have ended before this one begins, even when they run beside others: this one reads what they
    # did (e.g. a check of what a copy beside the switch copied). The engine waits for them first.
    waits_for: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def describe(self, ctx: StepContext) -> list[str]:
        """Lines saying what `run` would do, concretely (hosts, paths, commands, records)."""

    def check(self, ctx: StepContext) -> bool:
        """True when the step's effect is already in place, so resume may skip it. Default: unknown → run."""
        return False

    @abstractmethod
    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        """Do the step. Raise StepError for an expected failure."""

    def undo(self, ctx: StepContext) -> None:  # noqa: B027 - a step without side effects needs no compensation
        """Compensate the step's effect. Must be idempotent and safe after a partial run."""

    # The engine's optional hooks: each a no-op unless a step has something to do at that moment. A failure in one is
    # logged (reattach, observe_at_end) or reported with the rollback's (settle_after_rollback), never raised on.

    def settle_commit(self, ctx: StepContext) -> bool:
        """For a commit point that sends its commit to be made elsewhere (a command that goes on without us): the
        run stopped inside this step, not journaled committed, and is about to be rolled back. Decide the commit for
        good first: True when it happened (the engine journals the run committed and finishes it forward), False
        when it did not and now never will (the rollback may run). Raise StepError when it cannot be told: nothing
        is undone then. Default: nothing sent elsewhere, False."""
        return False

    def reattach(self, ctx: StepContext) -> None:  # noqa: B027 - most steps leave nothing running
        """A process takes over a run (resume, `migrate rollback`) in which this step had started: take up again
        what the step began that is meant to live as long as the run (e.g. the heartbeat a guard listens to)."""

    def settle_after_rollback(self, ctx: StepContext) -> None:  # noqa: B027 - most steps have nothing in flight
        """Once every compensation ran (the service is back), wait for an outside effect of this step to settle
        (e.g. an API edit that may still be in flight) and set it right. Called for every step that began."""

    def observe_at_end(self, ctx: StepContext) -> None:  # noqa: B027 - most steps have nothing to look at
        """The run has ended (completed, rolled back or not, failed after the commit): take a last look at what
        the step changed outside and journal it. The run's outcome is decided already."""
