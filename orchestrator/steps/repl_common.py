"""What the replicate cut-over's steps (and the replicate mode object, steps/modes/replicate.py) share: whether the
servers allow replication, the seed's and the tunnels' specs, the replica's source, the facts the
steps journal and read back.

Not a step: steps import this module, never each other.
"""

from __future__ import annotations

import io
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from orchestrator.contracts import StepRuntime, Which, runtime
from orchestrator.database.names import replicate_refusal
from orchestrator.database.protocol import LocalLogin, ReplicaSource, ReplicaStatus, Replication, ServerAccess
from orchestrator.engine.step import StepContext, StepError
from orchestrator.plan.model import Plan, ReplicationEndpoint
from orchestrator.services import owned, probes
from orchestrator.transports import tunnel
from orchestrator.transports.rsync import target_ssh_command

# The step whose presence in a run's journaled step list says the run is in replicate mode.
SWITCH_STEP = "repl_switch"
REPLICA_STEP = "repl_replica"
SEED_STEP = "repl_seed"
# Journal keys (step_saved) read by more than one step.
SEED_POSITION = "seed_position"
FORWARD_TUNNEL = "forward_tunnel"
REVERSE_TUNNEL = "reverse_tunnel"
FINAL_GTID = "final_gtid"
# The forward run's finish: until when it keeps the reverse path (the old source a replica of the target), and
# that replication was torn down (by finish, `migrate finish` or the reverse run).
FINISH_STEP = "finish"
REVERSE_KEPT = "reverse_kept_until"
TORN_DOWN = "replication_torn_down"
# A reverse run over the reverse replica: the port the old source's replica reads the target through (journaled
# before the promotion: a rolled-back reverse switch makes it a replica again).
REPLICA_PORT = "replica_port"
# The password of the replication account travels to a host only in this environment variable's value.
REPL_PASSWORD_ENV = "MIGRATE_REPL_PASSWORD"
DB_PASSWORD_ENV = "MIGRATE_DB_PASSWORD"
COMMAND_TIMEOUT = 60.0


def replication(rt: StepRuntime) -> Replication:
    """The plan's engine's replica control (database/protocol.Replication): the replicate steps speak only that."""
    found = rt.database.replication()
    if found is None:
        raise StepError(f"database.engine {rt.plan.database.engine} has no replicate mode: use cutover.mode shutdown")
    return found


def server_access(rt: StepRuntime, which: Which) -> ServerAccess:
    """Where that side's database runs, for the engine's host commands (a clean stop, a standby's files)."""
    endpoint = rt.plan.database.source if which == "source" else rt.plan.database.target
    return ServerAccess(rt.host(which), endpoint.datadir, endpoint.start, endpoint.stop)


def local_login(rt: StepRuntime, which: Which) -> LocalLogin:
    """How a client on that side's host logs in to its database (the plan's account, the endpoint as seen there)."""
    endpoint = rt.endpoint(which)
    return LocalLogin(rt.plan.database.user, rt.db_password(), endpoint.socket, endpoint.host, endpoint.port)


def declared_mode(ctx: StepContext) -> str:
    """The cut-over mode the plan's author wrote (or left to its default, auto), before the run resolved it: the
    plan text journaled in run_started says; without it, the plan this run has."""
    text = ctx.history().plan_text()
    if text:
        try:
            data = YAML(typ="safe").load(io.StringIO(str(text)))
            cutover = data.get("cutover") if isinstance(data, dict) else None
            mode = cutover.get("mode", "auto") if isinstance(cutover, dict) else "auto"
            if mode in ("auto", "replicate", "shutdown"):
                return str(mode)
        except Exception:  # the text was validated when the run began: this is only a fallback
            pass
    return runtime(ctx).plan.cutover.mode


def reverse_over_replica(ctx: StepContext) -> bool:
    """For the replicate mode's own steps: this run moves the service back through the reverse replica, a reverse
    run (`Plan.reversed()`) whose target (the old source) already replicates from its source (the target the forward
    run moved to). The shared steps get this from their mode (modes/replicate.ReverseOverReplica)."""
    return runtime(ctx).plan.reverse_of is not None


def reverse_kept_until(finish_saved: dict[str, Any] | None) -> float | None:
    """Until when a completed forward run keeps its reverse path, from its finish step's journaled facts (None:
    not kept, or torn down since)."""
    saved = finish_saved or {}
    if saved.get(TORN_DOWN) or not saved.get(REVERSE_KEPT):
        return None
    return float(saved[REVERSE_KEPT])


def replica_problem(status: ReplicaStatus | None) -> str | None:
    """Why the old source cannot carry a reverse cut-over now (None: it replicates, caught up or catching up)."""
    if status is None:
        return "the old source is not a replica of the target any more"
    if status.error:
        return f"the old source's replica stopped: {status.error}"
    if not status.replicating:
        sql = "Yes" if status.sql_running else "No"
        return f"the old source's replica is not running (IO thread {status.io_running}, SQL thread {sql})"
    return None


def reverse_problem(rt: StepRuntime, old_source: Which) -> str | None:
    """Read live on the old source (`old_source`: its side in `rt`'s plan): why reverse replication is not usable."""
    conn = rt.db(old_source, retry=False, read_timeout=10.0)
    try:
        return replica_problem(replication(rt).replica_status(conn))
    finally:
        rt.release(conn)


def reverse_line(rt: StepRuntime, kept_until: float, plan_path: str) -> str:
    """One line on a kept reverse path (the forward plan's runtime), read live: the old source's lag behind the
    target, and how it ends."""
    until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(kept_until))
    due = "due since" if time.time() >= kept_until else "kept until"
    ends = f"{due} {until} (replication.keep_reverse); `migrate finish {plan_path}` ends it"
    rep = replication(rt)
    source = rt.db("source", retry=False, read_timeout=10.0)
    try:
        status = rep.replica_status(source)
        executed = rep.executed_position(source)
    finally:
        rt.release(source)
    problem = replica_problem(status)
    if problem is not None or status is None:
        return f"reverse replication: broken: {problem}; {ends}"
    target = rt.db("target", retry=False, read_timeout=10.0)
    try:
        at = rep.write_position(target)
    finally:
        rt.release(target)
    behind = "unknown" if status.seconds_behind is None else f"{status.seconds_behind} s"
    return (
        f"reverse replication: the old source {behind} behind the target (Seconds_Behind_Master), executed "
        f"{executed or 'nothing'}, the target at {at}; `migrate rollback {plan_path}` moves back losing nothing; {ends}"
    )


def forget_replication_on(rt: StepRuntime, sides: tuple[Which, ...], *, retry: bool = True) -> list[str]:
    """RESET SLAVE ALL on each side's database (it deletes master.info and the clear-text password it holds); every
    side is tried, and the failures come back one per side."""
    failures: list[str] = []
    for which in sides:
        try:
            conn = rt.db(which, retry=retry)
            try:
                replication(rt).forget_replication(conn)
            finally:
                rt.release(conn)
        except Exception as exc:
            failures.append(f"{which}: {exc}")
    return failures


def end_tunnels(host: Any, plan_name: str, plan_path: Path, private_dir: str) -> list[owned.Leftover]:
    """End every tunnel (and rsync leftover) of the plan `plan_name` on `host` (the source they were started on, its
    `private_dir`), whichever run started it, through what each recorded there (orchestrator/services/owned.py);
    idempotent."""
    key = owned.plan_key(plan_name, plan_path)
    result = host.run(owned.sweep_command(key, end=True, base=private_dir), timeout=COMMAND_TIMEOUT, check=False)
    return owned.parse_sweep(result.stdout)


# --- can this pair of servers replicate? ----------------------------------------------------------------------


def replication_problems(
    plan: Plan, source: dict[str, str] | None, target: dict[str, str] | None, programs: dict[str, bool]
) -> list[str]:
    """Why the replicate mode cannot run on these servers (empty: it can), as the plan's engine judges them.

    `source`/`target`: their replication facts (None: that database did not answer; the target's are then checked
    when the seed starts it)."""
    from orchestrator.database.engines import open_engine

    found = open_engine(plan.database.engine).replication()
    if found is None:
        return [replicate_refusal(plan.database.engine) or f"database.engine {plan.database.engine} cannot replicate"]
    return found.problems(plan, source, target, programs)


def probe_replication(rt: StepRuntime) -> list[str]:
    """Ask both hosts (reads only) whether the replicate mode can run: the problems, empty when it can."""
    plan = rt.plan
    refusal = replicate_refusal(plan.database.engine)
    if refusal is not None:
        return [refusal]  # nothing to ask the servers
    rep = replication(rt)
    programs: dict[str, bool] = {}
    for side, names in rep.programs():
        which: Which = "source" if side == "source" else "target"
        for name in names:
            programs[f"{name} on the {which}"] = probes.ask(rt.host(which), probes.has_program(name))
    variables: dict[str, dict[str, str] | None] = {}
    both: tuple[Which, Which] = ("source", "target")
    for which in both:
        try:
            conn = rt.db(which, retry=False, read_timeout=10.0)
        except Exception:
            variables[which] = None
            continue
        try:
            variables[which] = rep.server_facts(conn)
        finally:
            rt.release(conn)
    return rep.problems(plan, variables["source"], variables["target"], programs)


def engine_requirements(engine: str) -> str:
    """What the engine's replicate mode relies on, in words ('' for an engine without one)."""
    from orchestrator.database.engines import open_engine

    found = open_engine(engine).replication()
    return found.requirements if found is not None else ""


def mode_reason(mode: str, problems: list[str], declared: str, requirements: str | None = None) -> str:
    """The one line preflight says about the mode (`requirements`: what the engine's replication relies on,
    engine_requirements)."""
    if mode == "replicate":
        how = "chosen by 'auto'" if declared == "auto" else "as the plan says"
        needs = requirements or "binlog on, ROW format, GTID strict, log_slave_updates, distinct server ids"
        return f"replicate ({how}): {needs}; the window waits for the replica instead of copying files"
    if declared == "auto":
        return "shutdown (chosen by 'auto'): replication is not possible here: " + "; ".join(problems)
    return "shutdown (as the plan says): the source database is stopped cleanly inside the window"


# --- specs ------------------------------------------------------------------------------------------------------


def ssh_to_target(plan: Plan) -> tuple[str, ...]:
    """The ssh argv, run on the source, that reaches the target (the hop rsync uses, host key verified)."""
    login = f"{plan.target.user}@{plan.target.address}"
    return (*shlex.split(target_ssh_command(plan, control="no")), login)


def seed_spec(plan: Plan, rep: Replication, *, source_datadir: str | None = None,
              target_datadir: str | None = None) -> Any:  # fmt: skip
    """The seed's spec (the engine's own); a run passes each datadir as its host resolved it
    (steps.common.resolved_datadir): the staging copy, the install's renames and the kept `.before-seed` act on the
    real directory, beside it."""
    db = plan.database
    return rep.seed_spec(
        plan,
        source_datadir=source_datadir or db.source.datadir,
        target_datadir=target_datadir or db.target.datadir,
        ssh_to_target=ssh_to_target(plan),
        password_env=DB_PASSWORD_ENV if db.password is not None else None,
    )


def endpoint(plan: Plan, which: str) -> ReplicationEndpoint:
    settings = plan.replication
    assert settings is not None
    given = settings.source if which == "source" else settings.target
    if given is not None:
        return given
    db = plan.database.source if which == "source" else plan.database.target
    return ReplicationEndpoint(host=db.host, port=db.port)


@dataclass(frozen=True)
class TunnelFacts:
    """What the journal keeps of a tunnel: enough to find it again after a crash, and to end it."""

    name: str
    direction: str
    port: int

    def journal(self) -> dict[str, Any]:
        return {"name": self.name, "direction": self.direction, "port": self.port}

    @classmethod
    def of(cls, data: dict[str, Any] | None) -> TunnelFacts | None:
        if not data:
            return None
        return cls(str(data["name"]), str(data["direction"]), int(data["port"]))


def tunnel_spec(plan: Plan, facts: TunnelFacts) -> tunnel.TunnelSpec:
    """The forward tunnel (-R: the target reaches the source's database) or the reverse one (-L)."""
    # The control socket and the log in the source's private directory (plan `run_dir`), where they are started.
    control_dir = plan.source.private_dir
    if facts.direction == "remote":
        far = endpoint(plan, "source")
        return tunnel.TunnelSpec(facts.name, "remote", ssh_to_target(plan), facts.port, far.host, far.port, control_dir)
    far = endpoint(plan, "target")
    return tunnel.TunnelSpec(facts.name, "local", ssh_to_target(plan), facts.port, far.host, far.port, control_dir)


def tunnel_name(plan_name: str, plan_path: Path, direction: str, run_id: str) -> str:
    """The tunnel's name on the source (its control socket's): its owner, the plan and the run
    (orchestrator/services/owned.py), and the direction. A run asks only after its own: an earlier run's tunnel is never
    taken for this one's."""
    return f"{owned.owner(plan_name, plan_path, run_id)}-{'fwd' if direction == 'remote' else 'rev'}"


def replica_source(rt: StepRuntime, port: int) -> ReplicaSource:
    settings = rt.plan.replication
    assert settings is not None
    return ReplicaSource("127.0.0.1", port, settings.user, rt.secret(settings.password))


def open_tunnel(ctx: StepContext, direction: str, key: str, *, attempts: int = 5) -> TunnelFacts:
    """Bring up (or find again) the tunnel journaled under `key`; a new one gets a free port on its listening host.

    The facts are journaled BEFORE the ssh starts: whatever happens next, undo and finish know what to end.
    """
    rt = runtime(ctx)
    plan = rt.plan
    listening = rt.target if direction == "remote" else rt.source
    facts = TunnelFacts.of(ctx.saved(key))
    last = ""
    for _ in range(attempts):
        if facts is None:
            port = tunnel.parse_port(listening.run(tunnel.free_port_command(), timeout=COMMAND_TIMEOUT).stdout)
            facts = TunnelFacts(tunnel_name(plan.name, rt.plan_path, direction, ctx.run_id), direction, port)
            ctx.save(key, facts.journal())
        result = rt.source.run(tunnel.tunnel_up_command(tunnel_spec(plan, facts)), timeout=COMMAND_TIMEOUT, check=False)
        if result.exit_status == 0 and tunnel.parse_tunnel_pid(result.stdout) is not None:
            ctx.log.info("repl.tunnel_up", tunnel=facts.name, port=facts.port, direction=direction)
            return facts
        last = ((result.stderr or result.stdout).strip().splitlines()[-1:] or [f"exit {result.exit_status}"])[0]
        ctx.log.warning("repl.tunnel_failed", tunnel=facts.name, port=facts.port, error=last)
        facts = None  # the port may have been taken meanwhile: another one
    raise StepError(f"the replication tunnel over ssh from the source to the target did not come up: {last}")


def close_tunnel(ctx: StepContext, key: str, facts: TunnelFacts | None = None) -> None:
    """End the tunnel journaled under `key` by this step (or the one `facts` name); nothing if there is none."""
    rt = runtime(ctx)
    facts = facts or TunnelFacts.of(ctx.saved(key))
    if facts is None:
        return
    rt.source.run(tunnel.tunnel_down_command(tunnel_spec(rt.plan, facts)), timeout=COMMAND_TIMEOUT, check=False)
    ctx.log.info("repl.tunnel_down", tunnel=facts.name)


def saved_from(ctx: StepContext, step: str, key: str) -> Any:
    """A value another step of this run journaled (step_saved), the latest one."""
    return ctx.history().last_run().saved(step, key)


def repl_error(what: str, exc: Exception) -> StepError:
    return StepError(f"{what}: {exc}")


def replica_line(rt: StepRuntime) -> str:
    """One line on the replica, read live: its lag and position against the source's, or its own error."""
    rep = replication(rt)
    target = rt.db("target", retry=False, read_timeout=10.0)
    try:
        status = rep.replica_status(target)
    finally:
        rt.release(target)
    if status is None:
        return "replica: the target is not replicating"
    source = rt.db("source", retry=False, read_timeout=10.0)
    try:
        at = rep.write_position(source)
    finally:
        rt.release(source)
    if status.error:
        return f"replica: stopped: {status.error}"
    behind = "unknown" if status.seconds_behind is None else f"{status.seconds_behind} s"
    return (
        f"replica: {behind} behind (Seconds_Behind_Master), received up to {status.gtid_io_pos or 'nothing'}, "
        f"the source at {at}; IO thread {status.io_running}, SQL thread {'Yes' if status.sql_running else 'No'}"
    )
