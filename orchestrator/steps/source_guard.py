"""The guard on the source as the steps that block its writes use it: the cut-over (shutdown mode) and the switch
(replicate mode). orchestrator/services/guard.py is the guard itself; this module is what a step does with it.

- `start` before the window: the guard's deadline (the budget and a margin from the first block, on the source's
  clock: the backoffs between lock tries do not count, writes are let in between them), journaled under `guard`
  before the guard exists, then its pid; the run's heartbeat begins.
- `refuse_if_restored` on a re-entered step: a guard that restored the source means the source took writes since,
  so the run must not block it again (it rolls back).
- `reattach` in a new process taking over the run: the heartbeat again, so a live run is never raced.
- `release` at the end of the step's undo: the guard is told the run restored the source itself (it leaves, and
  takes its directory with it); what it did, if it had acted, is logged.
- `commit` at the commit point (the front door's switch, or the DNS flip without a door): the guard learns of it
  first, then the journal, whichever step started the guard (both journal it as `guard`).
"""

from __future__ import annotations

import time

from orchestrator.contracts import runtime
from orchestrator.engine.step import StepContext, StepError
from orchestrator.services import guard, owned
from orchestrator.transports.ssh import TransportError

GUARD = "guard"
START_TIMEOUT = 30.0
COMMIT_TIMEOUT = 120.0


def directory(ctx: StepContext) -> str | None:
    """The guard's directory on the source, as this step journaled it (None: no guard was started)."""
    saved = ctx.saved(GUARD)
    return str(saved["dir"]) if isinstance(saved, dict) and saved.get("dir") else None


def started(ctx: StepContext) -> bool:
    """This step's guard runs (its pid journaled)."""
    saved = ctx.saved(GUARD)
    return isinstance(saved, dict) and bool(saved.get("pid"))


def start(ctx: StepContext, *, clock_offset: float | None, marks: tuple[str, ...] = ()) -> None:
    """Start the guard unless this step already did (then only the heartbeat again). `marks` are left for it in the
    same round trip, before it starts (e.g. READ_ONLY: this run's window sets read_only on the source)."""
    rt = runtime(ctx)
    if started(ctx):
        guard.keep_alive(rt, str(directory(ctx)))
        return
    c = rt.plan.cutover
    endpoint = rt.plan.database.source
    plan = guard.GuardPlan(
        directory=guard.guard_dir(owned.owner(rt.plan.name, rt.plan_path, ctx.run_id), rt.plan.source.private_dir),
        # From the moment writes were first blocked (now, when the guard starts just before): a run that dies
        # leaves the source blocked for at most the budget and the margin, whatever its lock tries would have
        # waited between them.
        deadline=guard.deadline(ctx.window.blocked_at or time.time(), c.max_write_block, clock_offset),
        db_start=endpoint.start,
        db_stop=endpoint.stop,
        fence_off=rt.plan.services.fence.disable,
    )
    ctx.save(GUARD, {"dir": plan.directory, "deadline": plan.deadline})
    try:
        pid = guard.start(rt.source, plan, timeout=START_TIMEOUT, marks=marks)
    except TransportError as exc:
        raise StepError(f"the guard on the source did not start: {exc}") from None
    ctx.save(GUARD, guard.journal_value(pid, plan))
    guard.keep_alive(rt, plan.directory)
    ctx.log.info("guard_started", pid=pid, dir=plan.directory, deadline=plan.deadline, marks=list(marks))


def reattach(ctx: StepContext) -> None:
    """A resumed run (or `migrate rollback`) in a new process: the guard hears this run's heartbeat again."""
    found = directory(ctx)
    if found is None:
        return
    before = getattr(runtime(ctx), "heartbeat", None)
    if guard.keep_alive(runtime(ctx), found) is not before:
        ctx.log.info("guard_heartbeat_resumed", dir=found)


def refuse_if_restored(ctx: StepContext) -> None:
    """A re-run after the guard restored the source must not block it again: the source took writes since."""
    found = directory(ctx)
    if found is None:
        return
    trace = guard.read_trace(runtime(ctx).source, found)
    if guard.restored(trace):
        ctx.log.warning("guard_had_restored_the_source", trace=trace)
        raise StepError(
            "the guard on the source restored it after this run stopped past its budget (its trace: "
            f"{found}/{guard.TRACE}); the source has taken writes since: the run rolls back"
        )


def release(ctx: StepContext, failures: list[str]) -> None:
    """Tell the guard the run released the source itself (it leaves), and say what it did if it acted. Not told
    while the undo failed: the source may still be blocked, and the guard is then what restores it."""
    found = directory(ctx)
    if found is None:
        return
    source = runtime(ctx).source
    trace = guard.read_trace(source, found)
    if guard.restored(trace):
        ctx.log.warning("guard_had_restored_the_source", trace=trace)
    if not failures:
        try:
            guard.mark(source, found, guard.RELEASED, timeout=START_TIMEOUT)
        except TransportError as exc:
            ctx.log.warning("guard_not_told", error=str(exc))


def journaled_directory(ctx: StepContext) -> str | None:
    """The guard's directory on the source as whichever step started it journaled it in this run (None: none)."""
    guards = [v for v in ctx.history().last_run().saved_values(None, GUARD) if isinstance(v, dict)]
    found = guards[-1].get("dir") if guards else None
    return str(found) if found else None


def commit(ctx: StepContext, reason: str, *, timeout: float | None = None, told: bool = False) -> None:
    """The guard on the source learns of the commit first (it must then leave the source alone), then the
    journal. A guard that cannot be told means no commit: the step fails before the target takes writes. `told`:
    the caller left the marker itself (the commit driven from the source, frontdoor.commit_from_source)."""
    found = journaled_directory(ctx)
    if found is not None and not told:
        try:
            guard.mark(runtime(ctx).source, found, guard.COMMITTED, timeout=timeout or COMMIT_TIMEOUT)
        except TransportError as exc:
            raise StepError(f"cannot tell the guard on the source that the run commits: {exc}") from None
    ctx.commit(reason)
