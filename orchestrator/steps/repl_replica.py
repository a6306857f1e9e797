"""Replica (replicate mode): the seeded target starts as a read-only GTID replica of the live source, reached
through an SSH tunnel; its services start fenced against the replica's data, before any window.

Order (the app must never see a writable or half-configured server): the tunnel (`ssh -R` run on the source over
its verified hop to the target: the target's 127.0.0.1:<port> reaches the source's database; nothing of the
replication protocol crosses the network outside SSH) → the target's database started → read_only → its binlog
started at the seed's position (start_binlog_at) → CHANGE MASTER … MASTER_USE_GTID=slave_pos from the seed's
position → START SLAVE → the target's fence, then its services.

The tunnel outlives this process (its name and port are journaled before it starts): a resume finds it with
`tunnel_check`, undo and finish end it with `tunnel_down`.
"""

from __future__ import annotations

from typing import Any

from orchestrator.contracts import runtime
from orchestrator.database.protocol import ReplicationError
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.model import Service
from orchestrator.results import ReplicaResult
from orchestrator.steps.common import COMMAND_TIMEOUT, run_services, wait_db_answers
from orchestrator.steps.repl_common import (
    FORWARD_TUNNEL,
    SEED_POSITION,
    SEED_STEP,
    close_tunnel,
    open_tunnel,
    replica_source,
    replication,
    saved_from,
)
from orchestrator.transports.ssh import TransportError

DB_READY_TIMEOUT = 300.0
TARGET_DB_STARTED = "target_db_started"
REPLICA_POINTED = "replica_pointed"
TARGET_FENCED = "target_fenced"
SERVICES_STARTED = "target_services_started"


class ReplReplica(Step):
    name = "repl_replica"
    title = "Start the target as a read-only GTID replica of the source, through an SSH tunnel"

    def describe(self, ctx: StepContext) -> list[str]:
        rt = runtime(ctx)
        plan = rt.plan
        lines = [
            f"on the source: ssh -f -N -R 127.0.0.1:<free port>:… to {plan.target.address} (the replication "
            "tunnel, over the host-key-verified hop; journaled, it outlives this run until finish)",
            *replication(rt).describe("replica", plan),
        ]
        fence = plan.services.target_fence.enable
        if fence:
            lines.append(f"on the target: fence it ({fence}), then start its services (fenced: reads only)")
        lines += [f"on the target: start service {s.name}: {s.start}" for s in plan.services.target]
        return lines

    def check(self, ctx: StepContext) -> bool:
        return False  # re-entered after a crash: every action below is idempotent and re-checked

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = runtime(ctx)
        plan = rt.plan
        start_at = saved_from(ctx, SEED_STEP, SEED_POSITION)
        if not start_at:
            raise StepError("no seed position in the journal: the seed did not finish")
        rep = replication(rt)
        position = rep.parse_position(str(start_at))
        tunnel = open_tunnel(ctx, "remote", FORWARD_TUNNEL)
        try:
            ctx.save(TARGET_DB_STARTED, True)
            if not rt.db_answers("target"):
                rt.target.run(plan.database.target.start, timeout=COMMAND_TIMEOUT)
            wait_db_answers(ctx, "target", DB_READY_TIMEOUT)
            conn = rt.db("target")
            try:
                self._check_target(ctx, conn)
                rep.set_read_only(conn, True, lock_wait_timeout=plan.cutover.lock_wait_timeout)
                status = rep.replica_status(conn)
                if not (ctx.saved(REPLICA_POINTED) and status is not None and status.master_port == tunnel.port):
                    ctx.save(REPLICA_POINTED, True)
                    # Nothing applied yet: the change log starts where the copy's data does (seeded).
                    rep.follow(conn, replica_source(rt, tunnel.port), position, seeded=True)
                rep.start_replica(conn)
            finally:
                rt.release(conn)
        except TransportError as exc:
            raise StepError(f"starting the replica: {exc}") from None
        except ReplicationError as exc:
            raise StepError(f"starting the replica: {exc}") from None
        services = self._start_services(ctx)
        ctx.log.info("repl.replica_started", tunnel=tunnel.name, port=tunnel.port, start_at=str(position))
        return ReplicaResult(
            tunnel=tunnel.name, tunnel_port=tunnel.port, start_gtid=str(position), services=services
        ).journal()

    def _check_target(self, ctx: StepContext, conn: Any) -> None:
        """What preflight could not see while the target was stopped (MariaDB: its own server id)."""
        rt = runtime(ctx)
        rep = replication(rt)
        facts = rep.server_facts(conn)
        source = rt.db("source")
        try:
            source_facts = rep.server_facts(source)
        finally:
            rt.release(source)
        problems = rep.pair_problems(source_facts, facts)
        if problems:
            raise StepError("; ".join(problems))

    def _start_services(self, ctx: StepContext) -> list[str]:
        rt = runtime(ctx)
        plan = rt.plan
        fence = plan.services.target_fence.enable
        if fence:
            ctx.save(TARGET_FENCED, True)
            try:
                rt.target.run(fence, timeout=COMMAND_TIMEOUT)
            except TransportError as exc:
                raise StepError(f"fencing the target: {exc}") from None
        started: list[str] = list(ctx.saved(SERVICES_STARTED) or [])

        def _journal_first(service: Service) -> None:
            if service.name not in started:
                started.append(service.name)
                ctx.save(SERVICES_STARTED, started)

        run_services(
            ctx, rt.target, plan.services.target, "start", event="target_service_started", keep_going=False,
            kind="target service", before=_journal_first,
        )  # fmt: skip
        return started

    def undo(self, ctx: StepContext) -> None:
        """Services stopped, replication stopped and forgotten, the tunnel ended, the target's database stopped.

        The target's fence stays up (as start_target's undo leaves it).
        """
        rt = runtime(ctx)
        plan = rt.plan
        failures: list[str] = []
        if ctx.saved(SERVICES_STARTED):
            stopped = run_services(
                ctx, rt.target, reversed(plan.services.target), "stop", event="target_service_stopped",
                keep_going=True,
            )  # fmt: skip
            failures += stopped.failures
        if ctx.saved(TARGET_DB_STARTED) and rt.db_answers("target"):
            try:
                conn = rt.db("target", retry=False)
                try:
                    replication(rt).forget_replication(conn)
                finally:
                    rt.release(conn)
            except Exception as exc:  # the database is stopped next anyway: say it, go on
                failures.append(f"stopping replication: {exc}")
        close_tunnel(ctx, FORWARD_TUNNEL)
        if ctx.saved(TARGET_DB_STARTED):
            try:
                rt.target.run(plan.database.target.stop, timeout=COMMAND_TIMEOUT)
            except TransportError as exc:
                failures.append(f"stopping the target database: {exc}")
        if failures:
            raise StepError("undoing the replica: " + "; ".join(failures))
