"""The composition: which steps, runtime and hooks a plan gets. Tests of the engine replace the two factories."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator import logging as mlog
from orchestrator import secrets
from orchestrator.engine.hooks import HookRunner
from orchestrator.engine.step import Step
from orchestrator.plan.model import Plan

Say = Callable[[str], None]


def default_steps(plan: Plan) -> list[Step]:
    from orchestrator.steps import build_steps

    return build_steps(plan)


def default_runtime(plan: Plan, plan_path: Path, dry_run: bool) -> Any:
    from orchestrator.runtime import Runtime

    return Runtime(plan, plan_path, dry_run=dry_run)


steps_factory: Callable[[Plan], Sequence[Step]] = default_steps
runtime_factory: Callable[[Plan, Path, bool], Any] = default_runtime


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
