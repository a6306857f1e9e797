"""Load a fleet file: validated like a plan (orchestrator/plan/loader.py), then every plan it names is loaded too.

Every problem is one line `<file>:<line>:<col>: <field>: <message>`; a plan that does not load adds its own
lines (its file's positions) after the fleet line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.fleet.model import Fleet, FleetPlan, fleet_problems, plan_name
from orchestrator.plan.loader import LoadedPlan, PlanError, dotted, load_model, load_plan, position_of
from orchestrator.plan.model import Plan
from orchestrator.run.policy import state_dir_of

FLEET_KEYS = "name, plans, waves, max_parallel, ..."


@dataclass(frozen=True)
class FleetMember:
    """One plan of the fleet, resolved: its file, its loaded plan, where its run lives, what limits it counts in."""

    name: str
    entry: FleetPlan
    plan_path: Path
    loaded: LoadedPlan
    env_file: Path | None

    @property
    def plan(self) -> Plan:
        return self.loaded.plan

    @property
    def state_dir(self) -> Path:
        return state_dir_of(self.plan_path, self.plan, None)

    @property
    def journal_path(self) -> Path:
        return self.state_dir / "journal.jsonl"

    @property
    def source_host(self) -> str:
        return self.plan.source.address


@dataclass(frozen=True)
class LoadedFleet:
    fleet: Fleet
    path: Path
    text: str
    members: list[FleetMember]

    def member(self, name: str) -> FleetMember:
        return next(m for m in self.members if m.name == name)

    @property
    def state_dir(self) -> Path:
        """Where the fleet's own record lives: <fleet dir>/.migrate-fleet/<name>."""
        return self.path.resolve().parent / ".migrate-fleet" / self.fleet.name


def load_fleet(path: Path) -> LoadedFleet:
    """Read and check a fleet file and every plan it names; raises PlanError (str(): the first line)."""
    path = Path(path)
    fleet, text, positions = load_model(path, Fleet, FLEET_KEYS, "fleet file")
    found: list[tuple[tuple[int, int], list[str]]] = []  # sorted by where they are written

    def blame(field_path: tuple[str | int, ...], message: str, *more: str) -> None:
        line, col = position_of(positions, field_path)
        found.append(((line, col), [f"{path}:{line}:{col}: {dotted(field_path)}: {message}", *more]))

    for where, message in fleet_problems(fleet):
        blame(where, message)
    members: list[FleetMember] = []
    runs: dict[Path, str] = {}
    for index, entry in enumerate(fleet.plans):
        plan_path = _beside(path, entry.plan)
        if plan_path is None:
            blame(("plans", index, "plan"), f"cannot expand {entry.plan.split('/')[0]!r}: no such user's home")
            continue
        try:
            loaded = load_plan(plan_path)
        except PlanError as exc:
            blame(("plans", index, "plan"), f"the plan does not load: {exc.lines[0]}", *exc.lines[1:])
            continue
        env_file = _beside(path, entry.env_file) if entry.env_file else None
        if entry.env_file and env_file is None:
            blame(("plans", index, "env_file"), f"cannot expand {entry.env_file.split('/')[0]!r}: no such user's home")
        elif env_file is not None and not env_file.is_file():
            blame(("plans", index, "env_file"), f"no such file: {env_file}")
        member = FleetMember(plan_name(entry), entry, plan_path, loaded, env_file)
        other = runs.get(member.state_dir)
        if other is not None:
            blame(("plans", index), f"the same run as '{other}' ({member.state_dir}): one plan, once")
        runs[member.state_dir] = member.name
        members.append(member)
    if found:
        raise PlanError([line for _, lines in sorted(found, key=lambda item: item[0]) for line in lines])
    return LoadedFleet(fleet, path, text, members)


def _beside(fleet_path: Path, name: str) -> Path | None:
    """The file `name` names, relative to the fleet file; None when its `~user` has no home here."""
    try:
        given = Path(name).expanduser()
    except RuntimeError:
        return None
    return given if given.is_absolute() else (fleet_path.resolve().parent / given)


def fleet_json_schema() -> dict[str, object]:
    """The JSON Schema of a fleet file, for editors."""
    from orchestrator.plan.loader import SCHEMA_DIALECT

    schema = Fleet.model_json_schema(mode="validation")
    return {"$schema": SCHEMA_DIALECT, "title": "migrate fleet", **{k: v for k, v in schema.items() if k != "title"}}
