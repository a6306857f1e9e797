"""The fleet as a Temporal workflow: the same driver as the embedded runner (schedule.drive), each plan an activity.

This module is re-imported inside Temporal's workflow sandbox: it imports only the standard library, temporalio and
the driver (itself standard library only). The activity is called by name; it lives in orchestrator/fleet/temporal.py
with the worker.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from orchestrator.fleet.schedule import FleetEnd, FleetSpec, PlanEnd, PlanSpec, drive

TASK_QUEUE = "migrate-fleet"
PLAN_ACTIVITY = "migrate-plan"
# A worker that stops heartbeating this long is taken for dead: the plan's activity is retried on another worker,
# which resumes the plan from its journal.
HEARTBEAT_TIMEOUT = timedelta(seconds=10)
PLAN_TIMEOUT = timedelta(days=2)  # a plan may wait long (a postponed cut-over, the DNS TTL wait-out)
# Retries are for a worker that died or lost the server, never for a plan's own failure (that is a result).
PLAN_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10),
                         maximum_attempts=20)  # fmt: skip


def workflow_id(fleet_name: str) -> str:
    return f"migrate-fleet-{fleet_name}"


@workflow.defn(name="migrate-fleet")
class FleetWorkflow:
    def __init__(self) -> None:
        self.confirmed: set[str] = set()
        self.ended: dict[str, PlanEnd] = {}
        self.started: list[str] = []

    @workflow.signal
    def confirm(self, plan: str) -> None:
        """`migrate fleet confirm`: a plan's window may begin (confirm: each)."""
        self.confirmed.add(plan)

    @workflow.query
    def progress(self) -> dict[str, Any]:
        return {
            "started": list(self.started),
            "ended": {name: end.exit_code for name, end in self.ended.items()},
            "waiting_for_confirmation": sorted(set(self.started) - self.confirmed - set(self.ended)),
        }

    @workflow.run
    async def run(self, spec: FleetSpec, ended: dict[str, PlanEnd], confirmed_all: bool) -> FleetEnd:
        self.ended = dict(ended)

        async def start(plan: PlanSpec) -> PlanEnd:
            self.started.append(plan.name)
            if spec.confirm == "each" and not confirmed_all:
                await workflow.wait_condition(lambda: plan.name in self.confirmed)
            return await workflow.execute_activity(
                PLAN_ACTIVITY,
                plan,
                result_type=PlanEnd,
                start_to_close_timeout=PLAN_TIMEOUT,
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                retry_policy=PLAN_RETRY,
                activity_id=f"plan-{plan.name}",
            )

        def on_end(end: PlanEnd) -> None:
            self.ended[end.name] = end

        async def wait(
            tasks: list[asyncio.Task[PlanEnd]], **options: Any
        ) -> tuple[set[asyncio.Task[PlanEnd]], set[asyncio.Task[PlanEnd]]]:
            # The workflow's deterministic wait (asyncio.wait would not be replay-safe).
            done, pending = await workflow.wait(tasks, **options)
            return set(done), set(pending)

        return await drive(spec, start, ended, on_end, wait=wait)
