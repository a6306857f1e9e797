"""The fleet on Temporal: `migrate worker --temporal HOST:PORT` (the plan activity and the workflow) and the
client side of `migrate fleet apply|confirm --temporal HOST:PORT`.

The journal reaches the worker that resumes a plan through shared storage: every worker reads the plan file and
its state directory at the same absolute path (one machine, or a shared filesystem mounted alike on each). The
heartbeat's details carry the plan's progress (run, step, status) for Temporal's UI, not the journal: a journal is
the run's single truth, and two copies of it (one in Temporal's history, one on disk) could disagree after a crash.
See docs/fleet.md.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from datetime import timedelta

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError
from temporalio.worker import Worker

from orchestrator.fleet.schedule import FleetEnd, FleetSpec, PlanEnd, PlanSpec
from orchestrator.fleet.workflow import PLAN_ACTIVITY, TASK_QUEUE, FleetWorkflow, workflow_id

# A worker asked to stop (SIGTERM, Ctrl-C) lets its plans end rather than cut one off inside its window.
GRACEFUL_SHUTDOWN = timedelta(days=2)


class TemporalError(Exception):
    """The Temporal server could not be reached or refused the request."""


@activity.defn(name=PLAN_ACTIVITY)
async def run_plan_activity(plan: PlanSpec) -> PlanEnd:
    """Run or resume one plan as `migrate apply` would, heartbeating where its journal stands."""
    from orchestrator.fleet.planrun import run_plan

    info = activity.info()
    # On the worker's output: which worker took which plan, and which attempt resumes one a dead worker left.
    print(f"plan {plan.name}: attempt {info.attempt} (workflow {info.workflow_id})", flush=True)
    end = await run_plan(plan, progress=lambda details: activity.heartbeat(details))
    print(f"plan {plan.name}: exit {end.exit_code} ({end.status})", flush=True)
    return end


async def connect(address: str) -> Client:
    try:
        return await Client.connect(address)
    except (RPCError, RuntimeError, OSError) as exc:
        detail = " ".join(str(exc).split())[:240]  # the SDK's message may span lines
        raise TemporalError(f"cannot reach Temporal at {address}: {detail}") from None


async def serve(address: str, say: Callable[[str], None] = print) -> None:
    client = await connect(address)
    worker = Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[FleetWorkflow],
        activities=[run_plan_activity],
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    say(f"worker on {address}, task queue {TASK_QUEUE}: waiting for fleets")
    async with worker:
        await stop.wait()
        say("stopping: the plans running here go to their end first")


async def run_fleet(
    address: str,
    spec: FleetSpec,
    ended: dict[str, PlanEnd],
    *,
    confirmed_all: bool,
    say: Callable[[str], None] = print,
) -> FleetEnd:
    """Start the fleet's workflow (or attach to the one running) and wait for its end."""
    client = await connect(address)
    wid = workflow_id(spec.name)
    handle = client.get_workflow_handle(wid, result_type=FleetEnd)
    try:
        status = (await handle.describe()).status
    except RPCError:
        status = None
    if status == WorkflowExecutionStatus.COMPLETED:
        # The fleet ran here before: what it ended badly stays ended (the embedded runner's rule), unless the
        # plan's journal shows a run completed since (the caller's `ended` says so).
        before = await handle.result()
        for name, end in before.ended.items():
            if not end.ok:
                ended.setdefault(name, end)
    running = status == WorkflowExecutionStatus.RUNNING
    if running:
        say(f"fleet '{spec.name}': its workflow {wid} is running: following it")
    else:
        handle = await client.start_workflow(
            FleetWorkflow.run, args=[spec, ended, confirmed_all], id=wid, task_queue=TASK_QUEUE
        )
        say(f"fleet '{spec.name}': workflow {wid} started (run {handle.result_run_id})")
    try:
        return await handle.result()
    except WorkflowFailureError as exc:
        raise TemporalError(f"the fleet's workflow failed: {exc.cause or exc}") from None


async def confirm_plan(address: str, fleet_name: str, plan: str) -> None:
    client = await connect(address)
    await client.get_workflow_handle(workflow_id(fleet_name)).signal(FleetWorkflow.confirm, plan)
