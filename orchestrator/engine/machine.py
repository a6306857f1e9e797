"""The state machine: runs steps forward, rolls back with compensations in reverse, resumes from the journal.

Forward, for each step not yet done: fire `before-step` (and `before-cutover` ahead of the step that begins the
downtime, after the operator's confirmation), journal `step_started`, run, journal `step_completed`. A step found
`running` in the journal was in flight when the process died: if its `check` says its effect is in place it is
marked done, else it is re-entered from its start (steps are written to be safe to re-run).

A failure before the commit point journals `step_failed`, then rolls back: the compensations (`undo`) of every step
that started, newest first, each journaled, so an interrupted rollback resumes too. A failure after the commit point
leaves the run `failed_after_commit`: the target serves, and `migrate apply` resumes forward. Whether the run is
committed is always read back from the journal on disk, never from memory alone.

A commit point may send its commit to be made elsewhere (a command that goes on on a host without us): before any
rollback of a run not journaled committed, it settles that commit for good (`Step.settle_commit`). Made: the run is
journaled committed and finished forward, nothing undone. Cannot tell: nothing is undone, `migrate apply` asks
again. A compensation that refuses (`UndoRefused`) stops the rollback where it stands, the service left serving.

Signals are acted on only at safe points (engine/interrupt.py): before the commit point an interruption fails the
current step (and the run rolls back); once the journal says committed, the run finishes forward. A rollback is never
stopped by a signal.

Beside: a step marked `runs_beside` may start before the step ahead of it ends, when that step says its
preconditions hold (`ctx.start_next_beside()`, e.g. once writes are stopped); it then runs in a thread while the
engine goes on with the steps after it, and is joined (its completion or failure journaled) before any commit point,
before a step that names it in its `waits_for` (one that reads what it did), before the run ends, and before a
rollback begins: nothing of it is still running when a compensation starts or the
run commits. A failure it raises fails the run like any step's. Its `step_started` is journaled before it starts, so
a resumed run re-enters it like any step found in flight.

`describe` is the dry-run: the same step contexts as a run, built from an in-memory journal.
"""

from __future__ import annotations

import contextvars
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import structlog

from orchestrator.engine.events import (
    Committed,
    Event,
    GateConfirmed,
    GateDeclined,
    RollbackCompleted,
    RollbackStarted,
    RunCompleted,
    RunResumed,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepSaved,
    StepStarted,
    UndoCompleted,
    UndoFailed,
    UndoStarted,
)
from orchestrator.engine.hooks import EVENTS, HookFailed, HookRunner
from orchestrator.engine.interrupt import Interrupted, Interruptions
from orchestrator.engine.journal import Journal, RunState, RunStatus, StepState
from orchestrator.engine.step import Step, StepContext, StepError, UndoRefused
from orchestrator.engine.view import JournalView
from orchestrator.redaction import printable, redact

__all__ = ["Engine", "EngineConfig", "Interrupted", "Outcome", "StepPlan"]


class Outcome(IntEnum):
    COMPLETED = 0
    ROLLED_BACK = 1
    DECLINED = 3  # the operator did not confirm the downtime; nothing past the gate was done
    NEEDS_ATTENTION = 4  # failed after the commit point, or a compensation failed


@dataclass(frozen=True)
class StepPlan:
    """What one step would do (the dry-run's unit)."""

    index: int
    name: str
    title: str
    begins_downtime: bool
    commit_point: bool
    lines: list[str] = field(default_factory=list)
    state: StepState = StepState.PENDING


@dataclass
class _Beside:
    """A step running beside the steps after it (see the module's docstring)."""

    step: Step
    index: int
    future: Future[tuple[dict[str, Any], float]]


@dataclass
class EngineConfig:
    plan_path: str
    plan_name: str
    plan_sha256: str
    plan_text: str
    dry_run: bool = False


class Engine:
    def __init__(
        self,
        steps: Sequence[Step],
        journal: Journal,
        *,
        config: EngineConfig,
        rt: Any,
        hooks: HookRunner,
        confirm: Callable[[Step], bool],
        log: Any = None,
        interruptions: Interruptions | None = None,
    ) -> None:
        names = [s.name for s in steps]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate step names: {names}")
        self.steps = list(steps)
        self.journal = journal
        self.config = config
        self.rt = rt
        self.hooks = hooks
        self.confirm = confirm
        self.log = log or structlog.get_logger("migrate")
        self.interruptions = interruptions or Interruptions()
        self._beside: _Beside | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._thread = threading.get_ident()  # the thread signals are acted on in (the one running forward)

    def _append(self, event: Event, *, sync: bool | None = None) -> None:
        """Journal a transition; no signal lands between the durable record and the in-memory state. A step's
        completion protects no action of its own: the next record's fsync makes it durable (one fsync less per
        step, inside the window too), unless it is the commit point's. `sync` False: a step's save that says so."""
        if sync is None:
            sync = not (isinstance(event, StepCompleted) and not event.commit_point)
        if threading.get_ident() != self._thread:
            # A step running beside: signals are acted on in the engine's own thread only, so nothing can split
            # this record from its state here (the journal serialises the two threads' writers).
            self.journal.append(event, sync=sync)
            if isinstance(event, Committed):
                self.interruptions.finish_forward = True
            return
        with self.interruptions.recording():
            self.journal.append(event, sync=sync)
            if isinstance(event, Committed) or (isinstance(event, StepCompleted) and event.commit_point):
                self.interruptions.finish_forward = True

    def _fire(self, event: str, *, interruptible: bool = True, **env: str) -> None:
        if interruptible:
            with self.interruptions.interruptible():
                self.hooks.fire(event, **env)
        else:
            self.hooks.fire(event, **env)

    def _safe_point(self, *, act: bool = True) -> None:
        """Between journaled actions: log the signals noted meanwhile, and act on a pending one (if `act`)."""
        for name in self.interruptions.unreported():
            if self.interruptions.finish_forward:
                self.log.warning("interrupted after the commit point: the run finishes forward", signal=name)
            elif not act:
                self.log.warning("interrupted: noted, the current work goes on to its end", signal=name)
        if act:
            self.interruptions.raise_if_pending()

    def durable_state(self) -> RunState | None:
        """The run as the journal on disk says it is (decisions that matter are taken from this)."""
        return self.journal.durable_state()

    # ----------------------------------------------------------------- state
    def state(self) -> RunState | None:
        return self.journal.state()

    def _require_state(self) -> RunState:
        state = self.state()
        assert state is not None, "no run in the journal"
        return state

    def start_run(self) -> RunState:
        run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
        self._append(
            RunStarted(
                run_id=run_id,
                plan_path=self.config.plan_path,
                plan_name=self.config.plan_name,
                plan_sha256=self.config.plan_sha256,
                plan_text=self.config.plan_text,
                steps=tuple(s.name for s in self.steps),
                dry_run=self.config.dry_run,
            )
        )
        state = self._require_state()
        structlog.contextvars.bind_contextvars(run_id=state.run_id)
        self._fire("on-start", interruptible=False, **self._hook_env(state, None))
        return state

    def resume_run(self) -> RunState:
        state = self._require_state()
        structlog.contextvars.bind_contextvars(run_id=state.run_id)
        self._append(RunResumed(status=state.status.value))
        state = self._require_state()
        self._reattach(state)
        self.interruptions.finish_forward = state.committed
        self._fire("on-resume", interruptible=False, **self._hook_env(state, None))
        return state

    # --------------------------------------------------------------- forward
    def forward(self) -> Outcome:
        try:
            return self._forward()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def _forward(self) -> Outcome:
        self._thread = threading.get_ident()
        state = self._require_state()
        self.interruptions.finish_forward = state.committed
        for index, step in enumerate(self.steps):
            # A step running beside is joined before a commit point; one that already failed, as soon as seen.
            waited = self._beside is not None and self._beside.step.name in step.waits_for
            failed = self._join_beside(wait=step.commit_point or waited)
            if failed is not None:
                return self._on_failure(*failed)
            state = self._require_state()
            if self._beside is not None and self._beside.step is step:
                continue  # it runs beside the steps after it
            rec = state.step(step.name)
            if rec.state == StepState.DONE:
                continue
            ctx = self._context(step, state)
            structlog.contextvars.bind_contextvars(step=step.name)
            try:
                self._safe_point()
                if rec.state in (StepState.RUNNING, StepState.FAILED) and self._effect_in_place(step, ctx):
                    self._append(
                        StepCompleted(
                            step=step.name,
                            result={"already_in_place": True},
                            duration=0.0,
                            commit_point=step.commit_point,
                        )
                    )
                    state = self._require_state()
                    continue
                if rec.state == StepState.RUNNING:
                    self.log.warning("step was in flight when the run stopped; re-entering it from its start")
                # The gate stands before the downtime; a downtime step re-entered on resume is already past it.
                if step.begins_downtime and rec.state == StepState.PENDING and not self.config.dry_run:
                    with self.interruptions.interruptible():
                        confirmed = self.confirm(step)
                    if not confirmed:
                        self._append(GateDeclined(step=step.name))
                        self.log.warning("not confirmed: stopping before the downtime; nothing past this was done")
                        return Outcome.DECLINED
                    self._append(GateConfirmed(step=step.name))
                    self._fire("before-cutover", **self._hook_env(state, step, index))  # type: ignore[arg-type]  # MIGRATE_* keys only: none fills `interruptible`
                self._fire("before-step", **self._hook_env(state, step, index))  # type: ignore[arg-type]  # as above
                self._safe_point()
                self._append(StepStarted(step=step.name, title=step.title))
                self.log.info("step started", title=step.title, index=f"{index + 1}/{len(self.steps)}")
                began = time.monotonic()
                with self.interruptions.interruptible():
                    result = step.run(ctx) or {}
                duration = time.monotonic() - began
                self._append(
                    StepCompleted(step=step.name, result=result, duration=duration, commit_point=step.commit_point)
                )
                following = self.steps[index + 1].title if index + 1 < len(self.steps) else "the end of the run"
                self.log.info("step done", duration=f"{duration:.2f}s", next=following)
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    exc = Interrupted("interrupted by the operator")
                if not isinstance(exc, Exception):
                    raise
                self._end_beside_before_failure()
                return self._on_failure(step, exc)
            finally:
                structlog.contextvars.unbind_contextvars("step")
            state = self._require_state()
            self._fire("after-step", interruptible=False, **self._hook_env(state, step, index))
        failed = self._join_beside(wait=True)
        if failed is not None:
            return self._on_failure(*failed)
        self._append(RunCompleted())
        state = self._require_state()
        self._observe_at_end(state)
        self._safe_point(act=False)
        self.log.info("migration completed", run_id=state.run_id)
        self._fire("on-success", interruptible=False, **self._hook_env(state, None))
        return Outcome.COMPLETED

    # ----------------------------------------------------------------- beside
    def _start_beside(self, index: int) -> None:
        """The step at `index` says the next one may begin now: started in a thread if it `runs_beside` (else a
        no-op: it runs after this one, as usual)."""
        if self.config.dry_run or self._beside is not None or index + 1 >= len(self.steps):
            return
        if threading.get_ident() != self._thread:
            return
        step = self.steps[index + 1]
        state = self._require_state()
        if not step.runs_beside or state.step(step.name).state == StepState.DONE:
            return
        # Journaled, started and tracked as one: a signal landing in between would leave it running untracked.
        with self.interruptions.recording():
            self._append(StepStarted(step=step.name, title=step.title, beside=self.steps[index].name))
            ctx = self._context(step, self._require_state())
            env = self._hook_env(state, step, index + 1)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="beside")
            future = self._pool.submit(contextvars.copy_context().run, self._run_beside, step, ctx, env)
            self._beside = _Beside(step, index + 1, future)
        self.log.info("step started beside the previous one", step=step.name, index=f"{index + 2}/{len(self.steps)}")

    def _run_beside(self, step: Step, ctx: StepContext, env: dict[str, str]) -> tuple[dict[str, Any], float]:
        """The step, in its thread; its completion journaled here, at once (a crash after it does not re-run it,
        and the report shows when it really ended). A failure is journaled by the engine's thread, which acts on
        it."""
        structlog.contextvars.bind_contextvars(step=step.name)
        self.hooks.fire("before-step", **env)
        began = time.monotonic()
        result = step.run(ctx) or {}
        duration = time.monotonic() - began
        self._append(StepCompleted(step=step.name, result=result, duration=duration, commit_point=step.commit_point))
        self.log.info("step done", duration=f"{duration:.2f}s", beside=True)
        return result, duration

    def _join_beside(self, *, wait: bool) -> tuple[Step, Exception] | None:
        """The step running beside, once ended (waited for when `wait`): None when it completed, or the step and
        its failure (not journaled yet), for the caller to fail the run with."""
        beside = self._beside
        if beside is None or not (wait or beside.future.done()):
            return None
        self._beside = None
        try:
            beside.future.result()  # its completion is journaled already
        except Exception as exc:
            return beside.step, exc
        self._fire("after-step", interruptible=False, **self._hook_env(self._require_state(), beside.step))
        return None

    def _end_beside_before_failure(self) -> None:
        """Another step failed: the one running beside is waited for (its work is bounded like any step's) and its
        outcome journaled, so no compensation starts while it still works."""
        failed = self._join_beside(wait=True)
        if failed is not None:
            step, exc = failed
            error = _one_line(exc)
            self._append(StepFailed(step=step.name, error=error, error_type=type(exc).__name__))
            self.log.error("step failed", step=step.name, error=error)

    def _effect_in_place(self, step: Step, ctx: StepContext) -> bool:
        try:
            with self.interruptions.interruptible():
                return bool(step.check(ctx))
        except Interrupted:
            raise
        except Exception as exc:  # a check that cannot tell means: run the step again
            self.log.warning("check could not tell whether the step's effect is in place", error=_one_line(exc))
            return False

    def _on_failure(self, step: Step, exc: Exception) -> Outcome:
        error = _one_line(exc)
        self._append(StepFailed(step=step.name, error=error, error_type=type(exc).__name__))
        # Decided from the journal on disk: a `committed` record written just before an interruption counts.
        state = self.durable_state() or self._require_state()
        self.log.error("step failed", error=error)
        if not isinstance(exc, StepError | HookFailed | Interrupted):
            self.log.debug("failure detail", exc_info=exc)
        if not state.committed:
            # A commit sent elsewhere may have happened: decided for good before anything is undone.
            found = self._commit_settled(state)
            if found is None:
                self._observe_at_end(state)
                self._fire("on-failure", interruptible=False, **self._hook_env(state, step), MIGRATE_ERROR=error)
                return Outcome.NEEDS_ATTENTION
            if found:
                self.log.warning("the commit had happened before the failure: the run finishes forward")
                return self._forward()
        if state.committed:
            self.log.error(
                "failed after the commit point: the target is serving; fix the cause and run `migrate apply` "
                "again to finish"
            )
            self._observe_at_end(state)
            self._fire("on-failure", interruptible=False, **self._hook_env(state, step), MIGRATE_ERROR=error)
            return Outcome.NEEDS_ATTENTION
        # Service first: the rollback runs before the operator's on-failure hooks (a notification can wait;
        # blocked writes cannot).
        outcome = self.rollback(reason=f"{step.name} failed: {error}", commit_settled=True)
        self._fire(
            "on-failure", interruptible=False, **self._hook_env(self._require_state(), step), MIGRATE_ERROR=error
        )
        return outcome

    # -------------------------------------------------------------- rollback
    def rollback(self, *, reason: str, commit_settled: bool = False) -> Outcome:
        """Compensate every started step, newest first. Signals are only noted meanwhile: the rollback is what
        restores the service, stopping it half-way would leave writes blocked. A commit sent elsewhere is settled
        first (unless the caller just did: `commit_settled`); one that happened leaves everything as it is."""
        with self.interruptions.shielded():
            state = self.state()
            if state is not None:
                self._reattach(state)
                if not state.committed and not commit_settled:
                    found = self._commit_settled(state)
                    if found is None:
                        return Outcome.NEEDS_ATTENTION
                    if found:
                        self.log.error(
                            "not rolled back: the run committed before it stopped (the target serves); "
                            "`migrate apply` finishes it"
                        )
                        return Outcome.NEEDS_ATTENTION
            return self._rollback(reason=reason)

    def _commit_settled(self, state: RunState) -> bool | None:
        """Before a run that is not journaled committed is rolled back: each commit point that started decides a
        commit it may have sent elsewhere (Step.settle_commit). True: it happened, and the run is journaled
        committed now; False: none happened, none will; None: it cannot be told now, and nothing may be undone."""
        for step in self.steps:
            if not step.commit_point or state.step(step.name).state not in (StepState.RUNNING, StepState.FAILED):
                continue
            structlog.contextvars.bind_contextvars(step=step.name)
            try:
                happened = step.settle_commit(self._context(step, state))
            except Exception as exc:
                self.log.error(
                    "stopped at the commit, and whether it happened cannot be told now: nothing is undone (that "
                    "could take writes from a target that serves); fix the cause, then `migrate apply` reads it "
                    "again and finishes forward, or rolls back when it did not happen",
                    error=_one_line(exc),
                )
                return None
            finally:
                structlog.contextvars.unbind_contextvars("step")
            if happened:
                if not (self.durable_state() or state).committed:
                    self._append(Committed(step=step.name, reason="its commit was found made before the run stopped"))
                return True
        return False

    def _reattach(self, state: RunState) -> None:
        """A process taking over a run: steps that began something meant to live as long as the run (`reattach`:
        e.g. the heartbeat a guard on a host listens to) take it up again. A no-op for what this process runs
        already; a failure is logged, never fatal."""
        for step in self.steps:
            if state.step(step.name).state in (StepState.PENDING, StepState.UNDONE):
                continue
            try:
                step.reattach(self._context(step, state))
            except Exception as exc:
                self.log.warning("could not take up what the step left running", step=step.name, error=_one_line(exc))

    def _rollback(self, *, reason: str) -> Outcome:
        state = self._require_state()
        if state.status != RunStatus.ROLLING_BACK:
            self._append(RollbackStarted(reason=reason))
            self.log.warning("rolling back", reason=reason)
        else:
            self.log.warning("resuming the rollback", reason=state.rollback_reason)
        state = self._require_state()
        # Every compensation is tried even when one fails: each may be what makes a host serve again (a DNS restore
        # that fails must not keep the source's database stopped). The failures are reported together.
        failed: list[tuple[str, str]] = []
        for step in reversed(self.steps):
            rec = state.step(step.name)
            if rec.state in (StepState.PENDING, StepState.UNDONE):
                continue
            ctx = self._context(step, state)
            structlog.contextvars.bind_contextvars(step=step.name)
            try:
                self._append(UndoStarted(step=step.name))
                began = time.monotonic()
                step.undo(ctx)
                self._append(UndoCompleted(step=step.name, duration=time.monotonic() - began))
                self._safe_point(act=False)
            except UndoRefused as exc:
                # Undoing the others now would half-undo a service that serves: the rollback stops here.
                error = _one_line(exc)
                self._append(UndoFailed(step=step.name, error=error))
                self.log.error("compensation refused: the rollback stops here, nothing else is undone", error=error)
                state = self._require_state()
                self._observe_at_end(state)
                self._fire("on-failure", interruptible=False, **self._hook_env(state, step), MIGRATE_ERROR=error)
                return Outcome.NEEDS_ATTENTION
            except Exception as exc:
                error = _one_line(exc)
                self._append(UndoFailed(step=step.name, error=error))
                self.log.error("compensation failed; the rollback goes on with the others", error=error)
                failed.append((step.name, error))
            finally:
                structlog.contextvars.unbind_contextvars("step")
            state = self._require_state()
        failed += self._settle_after_rollback(state)
        self._observe_at_end(state)
        if failed:
            summary = "; ".join(f"{name}: {error}" for name, error in failed)
            self.log.error(
                "rollback incomplete: fix the cause and run `migrate rollback` to finish it",
                could_not=summary,
            )
            last = next(s for s in self.steps if s.name == failed[-1][0])
            self._fire("on-failure", interruptible=False, **self._hook_env(state, last), MIGRATE_ERROR=summary)
            return Outcome.NEEDS_ATTENTION
        self._append(RollbackCompleted())
        state = self._require_state()
        self.log.warning("rolled back: the source serves as before", reason=state.rollback_reason)
        self._fire(
            "on-rollback", interruptible=False, **self._hook_env(state, None), MIGRATE_ERROR=state.rollback_reason or ""
        )
        return Outcome.ROLLED_BACK

    def _settle_after_rollback(self, state: RunState) -> list[tuple[str, str]]:
        """Once every compensation ran (the source serves again), steps that must wait for an outside effect to
        settle (an API edit that may still be in flight) wait for it here, never before the service is back."""
        failed: list[tuple[str, str]] = []
        for step in reversed(self.steps):
            if state.step(step.name).state == StepState.PENDING:
                continue
            structlog.contextvars.bind_contextvars(step=step.name)
            try:
                step.settle_after_rollback(self._context(step, state))
            except Exception as exc:
                error = _one_line(exc)
                self._append(UndoFailed(step=step.name, error=error))
                self.log.error("could not settle after the rollback", error=error)
                failed.append((step.name, error))
            finally:
                structlog.contextvars.unbind_contextvars("step")
        return failed

    def _observe_at_end(self, state: RunState) -> None:
        """The run's last look at what it changed outside (a step's `observe_at_end`: e.g. where every DNS record
        points), journaled by the step. Never fails the run: its outcome is decided already."""
        for step in self.steps:
            structlog.contextvars.bind_contextvars(step=step.name)
            try:
                step.observe_at_end(self._context(step, state))
            except Exception as exc:
                self.log.warning("could not look at the run's outcome", error=_one_line(exc))
            finally:
                structlog.contextvars.unbind_contextvars("step")

    # -------------------------------------------------------------- dry-run
    def describe(self) -> list[StepPlan]:
        """What every step would do, through the same contexts a run gives its steps. Changes nothing; the journal
        is only read (a dry-run engine is given an in-memory journal)."""
        state = self.state()
        plans = []
        for index, step in enumerate(self.steps, 1):
            ctx = self._context(step, state)
            lines = [redact(line) for line in step.describe(ctx)]
            rec_state = state.step(step.name).state if state is not None else StepState.PENDING
            plans.append(
                StepPlan(index, step.name, step.title, step.begins_downtime, step.commit_point, lines, rec_state)
            )
        return plans

    def hooks_by_event(self) -> dict[str, list[str]]:
        """The hooks each event would fire (events without hooks left out)."""
        fired = {event: [p.name for p in self.hooks.hooks_for(event)] for event in EVENTS}
        return {event: names for event, names in fired.items() if names}

    # --------------------------------------------------------------- helpers
    def _context(self, step: Step, state: RunState | None) -> StepContext:
        if state is None:
            return StepContext(
                run_id="dry-run", step=step.name, dry_run=True, rt=self.rt, log=self.log.bind(step=step.name)
            )
        rec = state.step(step.name)
        return StepContext(
            run_id=state.run_id,
            step=step.name,
            dry_run=self.config.dry_run,
            rt=self.rt,
            log=self.log.bind(step=step.name),
            _saved=dict(rec.saved),
            _outputs=state.outputs,
            _save=self._save,
            _save_unsynced=self._save_unsynced,
            _history=lambda: JournalView.of(self.journal),
            _commit=lambda step, reason: self._append(Committed(step=step, reason=reason)),
            _start_next=lambda: self._start_beside(self.steps.index(step)),
        )

    def _save(self, step: str, key: str, value: Any) -> None:
        self._append(StepSaved(step=step, key=key, value=value))

    def _save_unsynced(self, step: str, key: str, value: Any) -> None:
        self._append(StepSaved(step=step, key=key, value=value), sync=False)

    def _hook_env(self, state: RunState, step: Step | None, index: int | None = None) -> dict[str, str]:
        if step is not None and index is None:
            index = self.steps.index(step)
        return {
            "MIGRATE_PLAN": self.config.plan_path,
            "MIGRATE_PLAN_NAME": self.config.plan_name,
            "MIGRATE_RUN_ID": state.run_id,
            "MIGRATE_STEP": step.name if step else "",
            "MIGRATE_STEP_INDEX": str(index + 1) if index is not None else "",
            "MIGRATE_STEP_COUNT": str(len(self.steps)),
            "MIGRATE_DRY_RUN": "1" if self.config.dry_run else "0",
            "MIGRATE_ELAPSED_SECONDS": f"{time.time() - state.started_at:.1f}",
            "MIGRATE_STATE": state.status.value,
            "MIGRATE_JOURNAL": str(self.journal.path or ""),
        }


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    text = " ".join(text.split())
    return printable(redact(text))[:1000]
