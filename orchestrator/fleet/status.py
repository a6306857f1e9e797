"""`migrate fleet status`: every plan's state and next action, read from each plan's journal and lock (the same
reading as `migrate status`, without live DNS reads), beside what the fleet's record says of it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from orchestrator import run
from orchestrator.fleet.embedded import FleetRecord, spec_of
from orchestrator.fleet.loader import LoadedFleet
from orchestrator.fleet.planrun import progress_of
from orchestrator.fleet.schedule import stop_reason


@dataclass
class PlanLine:
    name: str
    wave: int
    source_host: str
    storage: str | None
    state: str  # not started, running, completed, rolled_back, ...
    step: str | None
    run_id: str | None
    running_by: str | None  # who holds the plan's lock
    fleet_end: int | None  # the exit code the fleet recorded
    next_action: str


@dataclass
class FleetStatus:
    name: str
    plans: list[PlanLine]
    stopped: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"fleet": self.name, "stopped": self.stopped, "plans": [asdict(p) for p in self.plans]}


def fleet_status(loaded: LoadedFleet) -> FleetStatus:
    ended = FleetRecord(loaded.state_dir).ended(loaded)
    wave_of = {name: index + 1 for index, wave in enumerate(loaded.fleet.wave_list()) for name in wave}
    lines = []
    for member in loaded.members:
        report = run.status(member.plan_path, live_dns=False, env_file=member.env_file)
        progress = progress_of(report.state)
        end = ended.get(member.name)
        if report.holder is not None:
            next_action = f"wait: it runs (`migrate status --watch {member.plan_path}` follows it)"
        elif report.state is None:
            next_action = "`migrate fleet apply` starts it in its wave"
        elif end is not None and not end.ok and report.state.status.value == "rolled_back":
            next_action = (
                f"fix the cause, then `migrate apply {member.plan_path}`: the fleet counts it once it completes"
            )
        elif end is None or end.ok:
            next_action = report.next_action.replace("`migrate apply`", "`migrate fleet apply`")
        else:
            next_action = report.next_action
        lines.append(
            PlanLine(
                name=member.name,
                wave=wave_of.get(member.name, 0),
                source_host=member.source_host,
                storage=member.entry.storage,
                state=str(progress["status"]),
                step=progress.get("step"),
                run_id=progress.get("run_id"),
                running_by=report.holder.describe() if report.holder else None,
                fleet_end=end.exit_code if end else None,
                next_action=next_action,
            )
        )
    return FleetStatus(loaded.fleet.name, lines, stop_reason(spec_of(loaded), ended))
