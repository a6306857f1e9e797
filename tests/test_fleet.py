"""The fleet file and the fleet's scheduling, without a lab: validation lines, waves, limits, stop conditions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.fleet.loader import load_fleet
from orchestrator.fleet.schedule import FleetSpec, PlanEnd, PlanSpec, drive, startable, stop_reason
from orchestrator.plan.loader import PlanError
from tests.conftest import migrate
from tests.engine.world import Result

EXAMPLE_PLAN = Path(__file__).resolve().parents[1] / "plans" / "example.yaml"


def example_plan() -> Path:
    candidates = sorted((Path(__file__).resolve().parents[1] / "plans").glob("*.yaml"))
    assert candidates, "the repository ships example plans"
    return EXAMPLE_PLAN if EXAMPLE_PLAN.exists() else candidates[0]


def write(tmp_path: Path, text: str) -> Path:
    plan = tmp_path / "a.yaml"
    plan.write_text(example_plan().read_text())
    (tmp_path / "b").mkdir(exist_ok=True)
    (tmp_path / "b" / "a.yaml").write_text(example_plan().read_text())
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(PlanError) as caught:
        load_fleet(path)
    return caught.value.lines


def test_a_valid_fleet_loads_with_its_waves(tmp_path: Path) -> None:
    path = write(tmp_path, "name: f\nplans:\n  - plan: a.yaml\n    storage: nfs\n  - {name: b, plan: b/a.yaml}\n"
                           "order: [a, b]\nmax_parallel: 2\nlimits: {per_storage: {nfs: 1}}\n")  # fmt: skip
    loaded = load_fleet(path)
    assert loaded.fleet.wave_list() == [["a"], ["b"]]  # the canary alone first
    assert [m.name for m in loaded.members] == ["a", "b"]


def test_each_problem_is_one_line_with_its_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "name: f\nplans:\n  - plan: a.yaml\n    storrage: nfs\n  - plan: missing.yaml\n"
                           "waves: [[a, c]]\nmax_parallel: 0\n")  # fmt: skip
    lines = problems(path)
    assert lines[0] == f"{path}:4:5: plans[0].storrage: unknown key 'storrage' (did you mean 'storage'?)"
    assert f"{path}:7:1: max_parallel: must be at least 1, got 0" in lines
    path.write_text("name: f\nplans:\n  - plan: a.yaml\n  - plan: missing.yaml\nwaves: [[a, c]]\n")
    lines = problems(path)
    assert any(line.startswith(f"{path}:4:5: plans[1].plan: the plan does not load: ") for line in lines), lines
    assert f"{path}:5:13: waves[0][1]: no plan named 'c' in `plans`" in lines, lines


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            "name: f\nplans: [{plan: a.yaml}]\nmax_parallel: true\n",
            "3:1: max_parallel: expected a whole number, got true",
        ),
        (
            "name: f\nplans: [{plan: a.yaml}]\nmax_parallel: '2'\n",
            "3:1: max_parallel: expected a whole number, got '2'",
        ),
        ("name: f\nplans:\n  - plan: ~nosuchuser-x/a.yaml\n", "3:5: plans[0].plan: cannot expand '~nosuchuser-x'"),
        ('name: f\nplans:\n  - plan: "a\\0.yaml"\n', "3:5: plans[0].plan: must not contain control characters"),
        ("", "1:1: the fleet file is empty"),
    ],
)
def test_a_bad_fleet_file_is_one_line_naming_the_fleet_file_never_an_internal_error(
    tmp_path: Path, text: str, line: str, migrate_here: Callable[..., Result]
) -> None:
    path = write(tmp_path, text)
    result = migrate_here("fleet", "validate", str(path))
    assert result.returncode == 2, result
    (said,) = result.stderr.strip().splitlines()
    assert said.startswith(f"{path}:{line}"), said
    assert "the plan" not in said


def test_the_same_run_twice_and_an_unknown_storage_limit_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "name: f\nplans:\n  - plan: a.yaml\n  - {name: again, plan: a.yaml}\n"
                           "limits: {per_storage: {nfs: 1}}\n")  # fmt: skip
    lines = problems(path)
    assert any(":4:5: plans[1]: the same run as 'a'" in line for line in lines), lines
    assert any(":5:24: limits.per_storage.nfs: no plan reads from storage 'nfs'" in line for line in lines), lines


def test_the_cli_validates_and_prints_the_schema(tmp_path: Path, migrate_here: Callable[..., Result]) -> None:
    path = write(tmp_path, "name: f\nplans: [{plan: a.yaml}]\nmax_paralel: 2\n")
    result = migrate_here("fleet", "validate", str(path))
    assert result.returncode == 2, result
    assert result.stderr.strip() == f"{path}:3:1: max_paralel: unknown key 'max_paralel' (did you mean 'max_parallel'?)"
    assert "Traceback" not in result.stderr
    schema = json.loads(migrate_here("fleet", "schema").stdout)
    assert schema["title"] == "migrate fleet" and "max_parallel" in schema["properties"]


def spec(**overrides: object) -> FleetSpec:
    plans = [
        PlanSpec("a", "a.yaml", "10.0.0.1", "nfs"),
        PlanSpec("b", "b.yaml", "10.0.0.1", "nfs"),
        PlanSpec("c", "c.yaml", "10.0.0.2", "nfs"),
        PlanSpec("d", "d.yaml", "10.0.0.3", "zfs"),
    ]
    base = FleetSpec(name="f", plans=plans, waves=[["a"], ["b", "c", "d"]], max_parallel=3,
                     per_storage={"nfs": 1})  # fmt: skip
    for key, value in overrides.items():
        setattr(base, key, value)
    return base


def test_the_canary_goes_alone_then_limits_pick_what_may_run_together() -> None:
    fleet = spec()
    assert startable(fleet, {}, set()) == ["a"]
    ended = {"a": PlanEnd("a", 0)}
    # b and c share the NFS storage (limit 1); d reads another storage: b and d together.
    assert startable(fleet, ended, set()) == ["b", "d"]
    assert startable(fleet, ended, {"b"}) == ["d"]
    # Two from one source host never run together.
    fleet = spec(per_storage={}, max_parallel=4)
    assert startable(fleet, ended, {"b"}) == ["c", "d"]
    assert startable(fleet, {**ended, "b": PlanEnd("b", 0)}, set()) == ["c", "d"]


def test_stop_conditions() -> None:
    assert stop_reason(spec(), {"a": PlanEnd("a", 1)}) == "plan 'a' rolled back (stop.on_rollback)"
    assert stop_reason(spec(stop_on_rollback=False), {"a": PlanEnd("a", 1)}) is None
    assert "needs attention" in (stop_reason(spec(), {"a": PlanEnd("a", 4)}) or "")
    fleet = spec(stop_on_rollback=False, stop_after_failures=2)
    assert stop_reason(fleet, {"a": PlanEnd("a", 1)}) is None
    assert "2 plans failed" in (stop_reason(fleet, {"a": PlanEnd("a", 1), "b": PlanEnd("b", 2)}) or "")


def test_the_driver_stops_starting_at_the_first_rollback_and_lets_the_running_end() -> None:
    fleet = spec(waves=[["a", "c", "d"], ["b"]], per_storage={}, max_parallel=2)
    started: list[str] = []

    async def start(plan: PlanSpec) -> PlanEnd:
        started.append(plan.name)
        await asyncio.sleep(0.01 if plan.name == "a" else 0.05)
        return PlanEnd(plan.name, 1 if plan.name == "a" else 0)

    result = asyncio.run(drive(fleet, start, {}))
    assert started == ["a", "c"]  # d and the next wave never started
    assert result.stopped == "plan 'a' rolled back (stop.on_rollback)"
    assert result.ended["c"].ok and result.not_started == ["d", "b"]


def test_a_resumed_fleet_never_runs_an_ended_plan_again() -> None:
    fleet = spec(per_storage={})
    started: list[str] = []

    async def start(plan: PlanSpec) -> PlanEnd:
        started.append(plan.name)
        return PlanEnd(plan.name, 0)

    result = asyncio.run(drive(fleet, start, {"a": PlanEnd("a", 0), "c": PlanEnd("c", 0)}))
    assert sorted(started) == ["b", "d"] and result.ok


def test_without_a_terminal_the_windows_need_yes_and_nothing_starts(
    tmp_path: Path, migrate_here: Callable[..., Result]
) -> None:
    path = write(tmp_path, "name: f\nplans: [{plan: a.yaml}]\n")
    result = migrate_here("fleet", "apply", str(path))
    assert result.returncode == 3, result
    assert result.stderr.strip() == "the fleet's windows need a confirmation: --yes when not at a terminal"
    assert not (tmp_path / ".migrate-fleet").exists() and not (tmp_path / ".migrate").exists()


def test_an_unreachable_temporal_server_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "name: f\nplans: [{plan: a.yaml}]\n")
    result = migrate("fleet", "apply", str(path), "--yes", "--temporal", "127.0.0.1:1")
    assert result.returncode == 1, result
    assert result.stderr.startswith("cannot reach Temporal at 127.0.0.1:1: ") and result.stderr.count("\n") == 1
    assert not (tmp_path / ".migrate").exists()


def test_a_plan_fixed_by_hand_after_the_fleet_stopped_counts_as_completed(tmp_path: Path) -> None:
    from orchestrator.fleet.embedded import FleetRecord

    loaded = load_fleet(write(tmp_path, "name: f\nplans: [{plan: a.yaml}]\n"))
    member = loaded.members[0]
    record = FleetRecord(loaded.state_dir)
    record.append("plan_ended", plan="a", exit_code=1, run_id="r1", status="rolled_back")

    def journal(run_id: str, last: str) -> None:
        member.journal_path.parent.mkdir(parents=True, exist_ok=True)
        events = [{"seq": 1, "event": "run_started", "run_id": run_id, "plan_sha256": "x", "plan_path": "a.yaml",
                   "ts": 1.0}, {"seq": 2, "event": last, "ts": 2.0}]  # fmt: skip
        member.journal_path.write_text("".join(json.dumps(ev) + "\n" for ev in events))

    journal("r1", "rollback_completed")
    assert record.ended(loaded)["a"].exit_code == 1  # the fleet's rollback: it stays ended, and stops the fleet
    journal("r2", "run_completed")  # `migrate apply a.yaml` by hand, since
    assert record.ended(loaded)["a"].ok
