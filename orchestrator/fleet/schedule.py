"""Which plan starts when: waves, max_parallel, per-host and per-storage limits, stop conditions.

One async driver for both runners: the embedded one (orchestrator/fleet/embedded.py, plans as `migrate apply`
processes) and the Temporal workflow (orchestrator/fleet/temporal.py, plans as activities). It only decides; the
runner's `start` runs a plan to its end. Standard library only: the Temporal workflow sandbox re-imports it, and a
workflow must be deterministic (no clock, no I/O here).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

# `migrate apply`'s exit codes (orchestrator/exit_codes.py), repeated: this module imports nothing of the project.
OK, FAILED, NEEDS_ATTENTION = 0, 1, 4


@dataclass
class PlanSpec:
    name: str
    plan_path: str
    source_host: str
    storage: str | None = None
    env_file: str | None = None


@dataclass
class FleetSpec:
    """What the workflow needs of a fleet file (plain data: a Temporal payload)."""

    name: str
    plans: list[PlanSpec]
    waves: list[list[str]]
    max_parallel: int = 1
    per_source_host: int | None = 1
    per_storage: dict[str, int] = field(default_factory=dict)
    stop_on_rollback: bool = True
    stop_on_needs_attention: bool = True
    stop_after_failures: int | None = None
    confirm: str = "once"

    def plan(self, name: str) -> PlanSpec:
        return next(p for p in self.plans if p.name == name)


@dataclass
class PlanEnd:
    name: str
    exit_code: int
    run_id: str | None = None
    status: str | None = None  # the plan journal's run status at the end
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == OK


@dataclass
class FleetEnd:
    ended: dict[str, PlanEnd]
    stopped: str | None  # why no further plan was started, or None
    not_started: list[str]

    @property
    def ok(self) -> bool:
        return self.stopped is None and not self.not_started and all(e.ok for e in self.ended.values())


def stop_reason(spec: FleetSpec, ended: dict[str, PlanEnd]) -> str | None:
    """Why the fleet must start no further plan, from the plans' ends so far (file order)."""
    failures = [e for e in ended.values() if not e.ok]
    for end in failures:
        if spec.stop_on_rollback and end.exit_code == FAILED:
            return f"plan '{end.name}' rolled back (stop.on_rollback)"
        if spec.stop_on_needs_attention and end.exit_code == NEEDS_ATTENTION:
            return f"plan '{end.name}' needs attention (stop.on_needs_attention)"
    if spec.stop_after_failures is not None and len(failures) >= spec.stop_after_failures:
        names = ", ".join(e.name for e in failures)
        return f"{len(failures)} plans failed ({names}; stop.after_failures: {spec.stop_after_failures})"
    return None


def startable(spec: FleetSpec, ended: dict[str, PlanEnd], running: set[str]) -> list[str]:
    """The plans that may start now, in order: the current wave's, within max_parallel and every limit."""
    wave = next((w for w in spec.waves if any(n not in ended for n in w)), None)
    if wave is None:
        return []
    chosen: list[str] = []
    busy = set(running)
    for name in wave:
        if name in ended or name in busy:
            continue
        if len(busy) >= spec.max_parallel:
            break
        if not _within_limits(spec, spec.plan(name), busy):
            continue  # a later plan of the wave, on another host or storage, may go first
        chosen.append(name)
        busy.add(name)
    return chosen


def _within_limits(spec: FleetSpec, plan: PlanSpec, busy: set[str]) -> bool:
    others = [spec.plan(n) for n in busy]
    same_host = sum(1 for o in others if o.source_host == plan.source_host)
    if spec.per_source_host is not None and same_host >= spec.per_source_host:
        return False
    limit = spec.per_storage.get(plan.storage) if plan.storage else None
    return limit is None or sum(1 for o in others if o.storage == plan.storage) < limit


async def drive(
    spec: FleetSpec,
    start: Callable[[PlanSpec], Awaitable[PlanEnd]],
    ended: dict[str, PlanEnd],
    on_end: Callable[[PlanEnd], None] = lambda end: None,
    wait: Callable[..., Awaitable[tuple[set[asyncio.Task[PlanEnd]], set[asyncio.Task[PlanEnd]]]]] = asyncio.wait,
    halted: Callable[[], str | None] = lambda: None,
) -> FleetEnd:
    """Run the fleet to its end: start what may start, wait for any plan to end, until every plan ended or a stop
    condition holds (then the plans running go to their own end; nothing new starts). `ended`: the ends already
    known (a resumed fleet), never run again. `wait`: asyncio.wait, or the workflow's deterministic twin.
    `halted`: a reason to start nothing more, from outside (an interrupted runner)."""
    ended = dict(ended)
    running: dict[str, asyncio.Task[PlanEnd]] = {}
    stopped = stop_reason(spec, ended) or halted()
    while True:
        if stopped is None:
            for name in startable(spec, ended, set(running)):
                running[name] = asyncio.ensure_future(start(spec.plan(name)))
        if not running:
            break
        done, _ = await wait(list(running.values()), return_when=asyncio.FIRST_COMPLETED)
        for name, task in list(running.items()):
            if task in done:
                del running[name]
                end = task.result()
                ended[name] = end
                on_end(end)
        stopped = stopped or stop_reason(spec, ended) or halted()
    order = [n for w in spec.waves for n in w]
    return FleetEnd(ended, stopped, [n for n in order if n not in ended])
