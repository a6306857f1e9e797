"""What runs of this plan left on the hosts (tunnels, the rsync route's password file and daemon; see
orchestrator/services/owned.py), as the steps end it: preflight ends what earlier runs left before this one starts
anything, and its undo (the last compensation of a rollback) ends this run's and theirs.

Not a step: steps import this module, never each other.
"""

from __future__ import annotations

from orchestrator.contracts import runtime
from orchestrator.engine.step import StepContext
from orchestrator.services import owned
from orchestrator.transports.ssh import TransportError

SWEEP_TIMEOUT = 60.0


def end_left_by_runs(ctx: StepContext, *, keep_this_run: bool) -> list[owned.Leftover]:
    """End every tunnel, rsync password file and rsync daemon of this plan on both hosts that belongs to another run
    (and this run's too unless `keep_this_run`), each through what it recorded there; logs one line each. A host out
    of reach is skipped (preflight reports it; a rollback says it in the log)."""
    rt = runtime(ctx)
    key = owned.plan_key(rt.plan.name, rt.plan_path)
    keep = (owned.run_tag(ctx.run_id),) if keep_this_run else ()
    ended: list[owned.Leftover] = []
    for which in ("source", "target"):
        try:
            # This run's commit record stays whatever else goes: a rollback that meets it has refused to undo a commit.
            base = getattr(rt.plan, which).private_dir
            sweep = owned.sweep_command(key, keep, end=True, base=base, keep_records=(owned.run_tag(ctx.run_id),))
            result = rt.host(which).run(sweep, timeout=SWEEP_TIMEOUT, check=False)
        except TransportError as exc:
            ctx.log.warning("leftovers_not_checked", host=which, error=str(exc))
            continue
        for found in owned.parse_sweep(result.stdout):
            what = "leftover_ended" if found.state == "ended" else "leftover_found"
            ctx.log.warning(what, host=which, kind=found.kind, run_tag=found.tag, path=found.path, state=found.state)
            ended.append(found)
    return ended


def waiting_guards(found: list[owned.Leftover]) -> list[str]:
    """Why this run must not start: another run's guard waits on the source to restore it (its run died in its
    window, and nobody resumed it); starting now, this run's window could meet that restore."""
    return [
        f"a guard left by run …{leftover.tag} waits on the source to restore it ({leftover.path}/trace says when): "
        "let it act, then run again"
        for leftover in found
        if leftover.kind == "guard" and leftover.state == "waiting"
    ]
