"""The migration's steps, in the order the engine runs them.

Each step lives in its own module `orchestrator.steps.<name>` and is the one `Step` subclass there whose `name` is
the module's name; `build_steps` finds it by that name so a module may keep helper classes beside its step.
"""

from __future__ import annotations

import importlib
import inspect

from orchestrator.engine.step import Step
from orchestrator.plan.model import Plan

STEP_ORDER: tuple[str, ...] = (
    "preflight",
    "prepare_target",
    "files_presync",
    "db_presync",
    "cutover",
    "files_final",
    "start_target",
    "verify_target",
    "dns_flip",
    "finish",
)


def step_class(name: str) -> type[Step]:
    """The Step subclass named `name` in `orchestrator.steps.<name>`."""
    module = importlib.import_module(f"{__name__}.{name}")
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if issubclass(obj, Step) and not inspect.isabstract(obj) and getattr(obj, "name", None) == name:
            return obj
    raise LookupError(f"module {module.__name__} defines no step named {name!r}")


def build_steps(plan: Plan) -> list[Step]:
    """One instance of every step, in run order. Steps read the plan from the runtime, not from here."""
    del plan  # every step applies to every plan today; kept so a plan can later select steps
    return [step_class(name)() for name in STEP_ORDER]
