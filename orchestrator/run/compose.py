"""The composition: which steps, runtime, hooks and estimator a plan gets. Tests of the engine replace the
factories."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator import secrets
from orchestrator.engine.hooks import HookRunner
from orchestrator.engine.step import Step
from orchestrator.output import logging as mlog
from orchestrator.plan.model import Plan, static_mode

Say = Callable[[str], None]


def default_steps(plan: Plan) -> list[Step]:
    from orchestrator.steps import build_steps

    return build_steps(plan)


def default_runtime(plan: Plan, plan_path: Path, dry_run: bool) -> Any:
    from orchestrator.runtime import Runtime

    return Runtime(plan, plan_path, dry_run=dry_run)


def default_estimator(plan: Plan, plan_path: Path) -> Any:
    from orchestrator.run.rehearse import dry_run_estimate

    return dry_run_estimate(plan, plan_path)


steps_factory: Callable[[Plan], Sequence[Step]] = default_steps
runtime_factory: Callable[[Plan, Path, bool], Any] = default_runtime
# What `apply --dry-run` measures on the hosts (read-only); None: steps without hosts, nothing to measure.
estimator: Callable[[Plan, Path], Any] | None = default_estimator


def resolve_mode(plan: Plan, plan_path: Path, journal_path: Path, *, probe: bool) -> Plan:
    """The plan with `cutover.mode: auto` resolved to the mode its run uses (other modes: the plan as is).

    A run that began already journaled its step list (run_started): its mode is read back from it, so a resumed
    run, a rollback and `status` agree with the run whatever the servers look like now (a source made read-only or
    stopped by the window). A new run asks the servers (reads only; `probe`): replicate when they allow it, else
    shutdown; preflight then says which and why. Without `probe` (status, a dry-run's fallback) an unresolved
    `auto` shows the replicate steps.
    """
    if plan.reverse_of is not None and plan.cutover.mode == "replicate":
        return _with_mode(plan, journaled_mode(journal_path) or _reverse_mode(plan, plan_path, probe=probe))
    if plan.cutover.mode != "auto":
        return plan
    mode = journaled_mode(journal_path)
    if mode is None and static_mode(plan) != "auto":
        mode = static_mode(plan)  # no replication section: nothing to ask the servers
    if mode is None and probe:
        mode = _probe_mode(plan, plan_path)
    if mode is None:
        return plan
    return _with_mode(plan, mode)


def _with_mode(plan: Plan, mode: str) -> Plan:
    if mode == plan.cutover.mode:
        return plan
    return plan.model_copy(update={"cutover": plan.cutover.model_copy(update={"mode": mode})})


def journaled_mode(journal_path: Path) -> str | None:
    """The mode an unfinished or completed run began with (its journaled step list), None without one."""
    from orchestrator.engine.journal import RunStatus
    from orchestrator.engine.view import JournalView
    from orchestrator.steps.repl_common import SWITCH_STEP

    journal = JournalView.read(journal_path)
    state = journal.state()
    if state is None or state.status == RunStatus.ROLLED_BACK:
        return None
    steps = journal.run_steps()
    if not steps:
        return None
    return "replicate" if SWITCH_STEP in steps else "shutdown"


def forward_kept_until(plan_path: Path, forward_name: str) -> float | None:
    """Until when the forward run of `forward_name` keeps its reverse path (None: not kept, or no such run)."""
    from orchestrator.engine.view import JournalView
    from orchestrator.steps.repl_common import FINISH_STEP, reverse_kept_until

    path = plan_path.resolve().parent / ".migrate" / forward_name / "journal.jsonl"
    state = JournalView.read(path).state()
    if state is None or FINISH_STEP not in state.steps:
        return None
    if state.status.value != "completed":
        return None
    return reverse_kept_until(state.steps[FINISH_STEP].saved)


def _reverse_mode(plan: Plan, plan_path: Path, *, probe: bool) -> str:
    """A new reverse run goes back over the reverse replica while the forward run keeps it and (`probe`: read live
    on the old source) it replicates; otherwise in the shutdown mode, which copies the target's datadir back."""
    assert plan.reverse_of is not None
    if forward_kept_until(plan_path, plan.reverse_of) is None:
        return "shutdown"
    if not probe:
        return "replicate"
    from orchestrator.steps.repl_common import reverse_problem

    rt = runtime_factory(plan, plan_path, True)
    try:
        problem = reverse_problem(rt, "target")  # the reversed plan's target is the old source
    except Exception as exc:
        problem = f"the old source could not be asked: {exc}"
    finally:
        close_runtime(rt)
    if problem is not None:
        mlog.get_logger().warning("the reverse run goes back in the shutdown mode", why=problem)
        return "shutdown"
    return "replicate"


def _probe_mode(plan: Plan, plan_path: Path) -> str:
    from orchestrator.steps.repl_common import probe_replication

    rt = runtime_factory(plan, plan_path, True)
    try:
        problems = probe_replication(rt)
    except Exception as exc:  # the servers cannot be asked now: preflight will say why, in the shutdown mode
        mlog.get_logger().warning("cutover.mode auto: the servers could not be asked", error=str(exc))
        return "shutdown"
    finally:
        close_runtime(rt)
    return "shutdown" if problems else "replicate"


def hooks_for(plan: Plan, plan_path: Path) -> HookRunner:
    directory = Path(os.path.expanduser(plan.hooks.dir))
    if not directory.is_absolute():
        directory = plan_path.resolve().parent / directory
    return HookRunner(
        directory,
        timeout=plan.hooks.timeout,
        base_env=secrets.hook_environment(plan.hooks.pass_env),
        passed=plan.hooks.pass_env,
        log=mlog.get_logger(),
    )


def close_runtime(rt: Any) -> None:
    close = getattr(rt, "close", None)
    if close is not None:
        close()
