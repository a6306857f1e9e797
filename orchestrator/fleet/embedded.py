"""The embedded fleet runner: the fleet on this machine, in this process, each plan a `migrate apply` process.

The fleet's own record (`<fleet dir>/.migrate-fleet/<name>/fleet.jsonl`, append-only, fsync'd) says which plans
this fleet started and how each ended; where a plan stands inside its run is its own journal's business. Run again
after a crash, the runner skips the plans that ended, and runs `migrate apply` for every other one, which resumes it
where its journal stands.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from orchestrator import exit_codes
from orchestrator.engine.journal import RunStatus
from orchestrator.engine.lock import LockHeld, PlanLock
from orchestrator.fleet.loader import LoadedFleet
from orchestrator.fleet.planrun import journal_state, run_plan
from orchestrator.fleet.schedule import FleetEnd, FleetSpec, PlanEnd, PlanSpec, drive

RECORD_FILE = "fleet.jsonl"
Say = Callable[[str], None]
Confirm = Callable[[str], Awaitable[bool]]


class FleetRefused(Exception):
    """The fleet cannot run now (its lock is held); nothing was started."""


def spec_of(loaded: LoadedFleet) -> FleetSpec:
    fleet = loaded.fleet
    return FleetSpec(
        name=fleet.name,
        plans=[
            PlanSpec(
                name=m.name,
                plan_path=str(m.plan_path),
                source_host=m.source_host,
                storage=m.entry.storage,
                env_file=str(m.env_file) if m.env_file else None,
            )
            for m in loaded.members
        ],
        waves=fleet.wave_list(),
        max_parallel=fleet.max_parallel,
        per_source_host=fleet.limits.per_source_host,
        per_storage=dict(fleet.limits.per_storage),
        stop_on_rollback=fleet.stop.on_rollback,
        stop_on_needs_attention=fleet.stop.on_needs_attention,
        stop_after_failures=fleet.stop.after_failures,
        confirm=fleet.confirm,
    )


class FleetRecord:
    def __init__(self, directory: Path) -> None:
        self.path = directory / RECORD_FILE

    def events(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        events = []
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # a torn last line: the event was not recorded
        return events

    def append(self, event: str, **fields: Any) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(json.dumps({"event": event, "ts": time.time(), **fields}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def ended(self, loaded: LoadedFleet) -> dict[str, PlanEnd]:
        """The plans that ended, by this record and their journals. A failed plan whose journal now shows a later
        run completed (the operator fixed it with `migrate apply`) counts as completed."""
        ends: dict[str, PlanEnd] = {}
        for ev in self.events():
            if ev.get("event") == "plan_ended" and ev.get("plan") in {m.name for m in loaded.members}:
                ends[ev["plan"]] = PlanEnd(ev["plan"], int(ev["exit_code"]), ev.get("run_id"), ev.get("status"))
        for member in loaded.members:
            state = journal_state(member.journal_path)
            if state is None or state.status != RunStatus.COMPLETED:
                continue
            before = ends.get(member.name)
            if before is None or (not before.ok and before.run_id != state.run_id):
                ends[member.name] = PlanEnd(member.name, exit_codes.OK, state.run_id, state.status.value)
        return ends


def apply(loaded: LoadedFleet, *, say: Say, confirm: Confirm | None = None) -> FleetEnd:
    """Run the fleet to its end (or its stop); `confirm` asks for each plan when the fleet's policy is `each`."""
    record = FleetRecord(loaded.state_dir)
    lock = PlanLock(loaded.state_dir / "lock", "migrate fleet apply")
    try:
        lock.acquire()
    except LockHeld as exc:
        raise FleetRefused(f"fleet '{loaded.fleet.name}': {exc}") from None
    try:
        return asyncio.run(_run(loaded, record, say, confirm))
    finally:
        lock.release()


async def _run(loaded: LoadedFleet, record: FleetRecord, say: Say, confirm: Confirm | None) -> FleetEnd:
    spec = spec_of(loaded)
    ended = record.ended(loaded)
    record.append("fleet_started", pid=os.getpid(), already_ended=sorted(ended))
    if ended:
        say(f"fleet '{spec.name}': {len(ended)} of {len(spec.plans)} plans already ended; going on with the rest")
    asking = asyncio.Lock()  # one question on the terminal at a time
    interrupted: list[str] = []
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        # The plans running go to their own end (a terminal's Ctrl-C reaches them too, and each acts on it at its
        # safe points); the fleet starts nothing more.
        loop.add_signal_handler(signum, interrupted.append, f"interrupted ({signal.Signals(signum).name})")

    async def start(plan: PlanSpec) -> PlanEnd:
        if confirm is not None:
            async with asking:
                if not await confirm(plan.name):
                    return PlanEnd(plan.name, exit_codes.REFUSED, message="not confirmed")
        record.append("plan_started", plan=plan.name)
        say(f"plan '{plan.name}': started ({plan.plan_path})")
        return await run_plan(plan)

    def on_end(end: PlanEnd) -> None:
        record.append("plan_ended", plan=end.name, exit_code=end.exit_code, run_id=end.run_id, status=end.status)
        outcome = "completed" if end.ok else f"exit {end.exit_code} ({end.status or 'no run'})"
        say(f"plan '{end.name}': {outcome}" + (f" — {end.message}" if end.message and not end.ok else ""))

    try:
        result = await drive(spec, start, ended, on_end, halted=lambda: interrupted[0] if interrupted else None)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    record.append("fleet_ended", stopped=result.stopped, not_started=result.not_started)
    return result


def exit_code(result: FleetEnd) -> int:
    """0: every plan completed; 4: one needs attention; 1: a plan failed or the fleet stopped before the end."""
    codes = [e.exit_code for e in result.ended.values()]
    if exit_codes.NEEDS_ATTENTION in codes:
        return exit_codes.NEEDS_ATTENTION
    if result.ok:
        return exit_codes.OK
    return exit_codes.FAILED
