"""The fleet file (`fleet.yaml`): which plans, in which waves, how many at once, what stops the fleet.

Validated like a plan (orchestrator/plan/loader.py: file:line:col lines, the same size limits); the cross-field
checks (plan names, wave membership, limits naming known storages) are `fleet_problems`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from orchestrator.plan.checks import path_problem

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=64)]
MAX_PLANS = 500


def _file_path(value: str) -> str:
    problem = path_problem(value, absolute=False)
    if problem is not None:
        raise PydanticCustomError("unsafe_path", problem)
    return value


FilePath = Annotated[str, AfterValidator(_file_path)]


class Strict(BaseModel):
    # As strict as a plan (orchestrator/plan/model.py): a number is a number (no `true`, no '2'), no value in errors.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False, hide_input_in_errors=True)


class FleetPlan(Strict):
    name: Name | None = Field(
        default=None, description="the plan's name in the fleet (waves, limits, status); default: the plan's own name"
    )
    plan: FilePath = Field(min_length=1, max_length=4096, description="the plan file, relative to the fleet file")
    storage: Name | None = Field(
        default=None,
        description="the named storage the plan's source reads from (an NFS server, a ZFS pool): "
        "limits.per_storage bounds how many of its plans run at once",
    )
    env_file: FilePath | None = Field(default=None, max_length=4096, description="KEY=VALUE secrets for this plan")


class Limits(Strict):
    per_source_host: int | None = Field(
        default=1, ge=1, le=1000, description="plans at once from one source host (its address); null: no limit"
    )
    per_storage: dict[Name, Annotated[int, Field(ge=1, le=1000)]] = Field(
        default_factory=dict, description="plans at once per named storage"
    )


class Stop(Strict):
    on_rollback: bool = Field(default=True, description="start no further plan once one rolled back (exit 1)")
    on_needs_attention: bool = Field(
        default=True, description="start no further plan once one needs attention (exit 4)"
    )
    after_failures: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PLANS,
        description="start no further plan once this many failed (any end but 0)",
    )


class Fleet(Strict):
    name: Name = Field(description="the fleet's name (its state directory, the Temporal workflow id)")
    plans: list[FleetPlan] = Field(min_length=1, max_length=MAX_PLANS)
    waves: list[list[Name]] | None = Field(
        default=None,
        description="plan names, wave by wave: a wave starts once every plan of the one before it ended well",
    )
    order: list[Name] | None = Field(
        default=None, description="instead of waves: one order, the first `canary` plans alone in a first wave"
    )
    canary: int = Field(default=1, ge=0, le=MAX_PLANS, description="with `order`: plans in the first wave")
    max_parallel: int = Field(default=1, ge=1, le=1000, description="plans running at once")
    limits: Limits = Field(default_factory=Limits)
    stop: Stop = Field(default_factory=Stop)
    confirm: Literal["once", "each"] = Field(
        default="once",
        description="once: one confirmation for every plan's window (`fleet apply` asks, or --yes); each: every "
        "plan is confirmed on its own (asked as it starts; on Temporal, a `migrate fleet confirm`)",
    )

    def plan_names(self) -> list[str]:
        return [plan_name(p) for p in self.plans]

    def wave_list(self) -> list[list[str]]:
        """The waves, whichever way the file wrote them (no waves and no order: every plan, file order, one wave
        after the canary)."""
        if self.waves is not None:
            return [list(w) for w in self.waves]
        order = list(self.order) if self.order is not None else self.plan_names()
        first, rest = order[: self.canary], order[self.canary :]
        return [w for w in (first, rest) if w]


def plan_name(entry: FleetPlan) -> str:
    # Without a name, the file's stem: known without reading the plan (the plan's own name is checked to agree).
    if entry.name:
        return entry.name
    stem = entry.plan.rsplit("/", 1)[-1]
    return stem.rsplit(".", 1)[0] if "." in stem else stem


FieldPath = tuple[str | int, ...]


def fleet_problems(fleet: Fleet) -> list[tuple[FieldPath, str]]:
    """What the types cannot say: each problem with the field path to blame."""
    problems: list[tuple[FieldPath, str]] = []
    names = fleet.plan_names()
    seen: set[str] = set()
    for index, name in enumerate(names):
        if name in seen:
            problems.append((("plans", index), f"two plans named '{name}': give one a `name`"))
        seen.add(name)
    if fleet.waves is not None and fleet.order is not None:
        problems.append((("order",), "give `waves` or `order`, not both"))
    listed = "waves" if fleet.waves is not None else "order" if fleet.order is not None else None
    if listed is not None:
        flat: list[tuple[FieldPath, str]] = []
        if fleet.waves is not None:
            flat = [(("waves", w, i), n) for w, wave in enumerate(fleet.waves) for i, n in enumerate(wave)]
        else:
            flat = [(("order", i), n) for i, n in enumerate(fleet.order or [])]
        placed: set[str] = set()
        for where, name in flat:
            if name not in seen:
                problems.append((where, f"no plan named '{name}' in `plans`"))
            elif name in placed:
                problems.append((where, f"'{name}' is listed twice"))
            placed.add(name)
        for index, name in enumerate(names):
            if name not in placed:
                problems.append((("plans", index), f"'{name}' is in no wave: add it to `{listed}`"))
    if fleet.waves is not None:
        for index, wave in enumerate(fleet.waves):
            if not wave:
                problems.append((("waves", index), "an empty wave"))
    storages = {p.storage for p in fleet.plans if p.storage}
    for storage in fleet.limits.per_storage:
        if storage not in storages:
            problems.append((("limits", "per_storage", storage), f"no plan reads from storage '{storage}'"))
    return problems
