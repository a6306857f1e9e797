"""The replicate cut-over mode: the target a GTID replica of the source before the window, promoted inside it; the
target already runs (fenced) when the window begins, so nothing is started there; the audit compares the promoted
target's snapshot with the read-only source in chunks; finish sets up reverse replication (kept, or torn down).

The way back over the reverse replica (a reverse run in this mode) is its variant: no datadir moves, the old
source's services start again inside the window when the forward run's finish stopped them."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from orchestrator.contracts import StepRuntime, runtime
from orchestrator.database.engines import open_engine
from orchestrator.engine.step import StepContext, StepError
from orchestrator.plan.model import Plan
from orchestrator.results import AuditResult, StartTargetResult, SwitchResult, VerifyResult
from orchestrator.services import audit, estimates, health
from orchestrator.services.health import HealthCheck
from orchestrator.steps.common import COMMAND_TIMEOUT, run_services
from orchestrator.steps.modes.base import AuditKit, CutoverMode, FinishKit, VerifyKit, with_door
from orchestrator.steps.repl_common import REPLICA_STEP, SWITCH_STEP, TORN_DOWN, replication


class Replicate(CutoverMode):
    name = "replicate"
    # Seed the target with a hot backup, keep it a GTID replica through an SSH tunnel, compare and catch up before
    # the window; inside it, read_only on the source, the replica's last transactions, the promotion with proof.
    own_steps: tuple[str, ...] = ("repl_seed", "repl_replica", "repl_catchup", "repl_switch")
    # No start_target: the replica step started the target's database and services (fenced) before the window.
    shared_end: tuple[str, ...] = ("files_final", "verify_target", "dns_flip", "audit", "finish")
    forward_replication_on = ("target", "source")
    audit_method = "chunks"

    def probes_replication(self, declared: str) -> bool:
        return True

    def requirement_problems(self, found: list[str], app_users: Callable[[], list[str]]) -> list[str]:
        return [f"replicate mode: {problem}" for problem in found] + app_users()

    # -- start_target (the way back over the reverse replica only: the forward sequence does not hold it)
    def describe_start(self, ctx: StepContext, lines: Callable[[], list[str]]) -> list[str]:
        return [
            "replicate mode: the target's database runs (promoted) and its services run fenced since the "
            "replica step: nothing is started inside the window (verify_target reads the database next)"
        ]

    def start_target(self, ctx: StepContext, start: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The database and the services started before the window (the replica step) and passed their health
        checks there; the switch has just promoted the database over a live connection and verify_target reads its
        position next, so no round trip is spent here inside the window."""
        ctx.window.check("checking the target")
        started = self.services_started(ctx)
        fenced = runtime(ctx).plan.services.target_fence.enable is not None
        return StartTargetResult(db_ready_seconds=0.0, services=started, target_fenced=fenced).journal()

    def services_started(self, ctx: StepContext) -> list[str]:
        return list(ctx.output(REPLICA_STEP).get("services") or [])

    def undo_start(self, ctx: StepContext, stop: Callable[[], None]) -> None:
        """This mode started nothing here: the replica step's undo stops the target."""

    # -- verify_target
    def inside_checks(self, plan: Plan) -> list[HealthCheck]:
        return health.checks_for(plan.health, health.INSIDE, replicate=True)

    def describe_verify(self, ctx: StepContext, checks: list[str], trees: list[str]) -> list[str]:
        verify = runtime(ctx).plan.database.verify
        lines = [f"{line} (run by the switch side by side with its wait; here if it did not)" for line in checks]
        snapshot = (
            ["beside them, open a read-only consistent snapshot on the promoted, still fenced target and keep it: "
             "the audit after the commit compares it in chunks with the read-only source"]
            if verify.row_counts or verify.checksum else []
        )  # fmt: skip
        return [
            *lines,
            *replication(runtime(ctx)).describe("positions", runtime(ctx).plan),
            *snapshot,
            *trees,
        ]

    def open_audit_snapshot(self, conn: Any, schemas: list[str] | None, database: Any) -> dict[str, str] | None:
        # One statement: the tables and their engines are read on the frozen source after the commit.
        found = database.replication()
        assert found is not None  # this mode runs only on an engine with one (repl_common.replication)
        found.open_audit_snapshot(conn)
        return None

    def verify(self, ctx: StepContext, kit: VerifyKit) -> dict[str, Any]:
        switched = SwitchResult.of(ctx.output(SWITCH_STEP))
        # Side by side: the positions and the trees' final pass (the file trees move by rsync in both modes) in
        # threads carrying the log context, the health checks here, unless the switch ran them side by side with its
        # wait and promotion (they passed then).
        # The audit's snapshot of the target is opened by the positions' thread on the connection that read the
        # target's position: after the promotion (the switch has returned), before the commit (the commit point,
        # switch_traffic or the DNS flip, lifts the target's fence after this step).
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="verify") as pool:
            positions_future = pool.submit(contextvars.copy_context().run, kit.positions, ctx)
            trees_future = pool.submit(contextvars.copy_context().run, kit.trees, ctx)
            if switched.health_tries is not None:
                tries, problems = switched.health_tries, list[str]()
            else:
                tries, problems = kit.health(ctx)
            snapshot_figures, position_problems = positions_future.result()
            tree_figures, tree_problems = trees_future.result()
        problems += position_problems + tree_problems
        if problems:
            raise StepError(f"verify_target: {len(problems)} problem(s): " + "; ".join(problems))
        ctx.window.check("the verification")
        ctx.log.info("target_verified", gtid=ctx.output(SWITCH_STEP).get("final_gtid"))
        return VerifyResult(health_tries=tries, **snapshot_figures, **tree_figures).journal()

    # -- audit
    def describe_audit(self, plan: Plan) -> list[str]:
        rows = plan.replication.chunk_rows if plan.replication else 2000
        return [
            f"every table compared in chunks of {rows} rows (checksums, as before the window): the target's "
            "snapshot, opened at the promotion before its fence lifted, against the source, read-only at its "
            "final position (proven again)",
            "a difference is reported naming the table and the chunk (report, status, exit code 4): the run is "
            "committed",
        ]

    def audit(self, ctx: StepContext, kit: AuditKit, held: audit.Held) -> AuditResult:
        if replication(runtime(ctx)).source_stops:
            # Nothing to compare against: the source was stopped inside the window and follows the target by now.
            return AuditResult(method="chunks", status="not_run", reason=(
                "the source was stopped cleanly inside the window: the promotion proved the target replayed every "
                "WAL record it wrote, its shutdown checkpoint included, and the tables were compared in chunks "
                "before the window"))  # fmt: skip
        return kit.audit_chunks(ctx, held)

    # -- finish (a forward run)
    def describe_finish(self, plan: Plan) -> list[str]:
        keep = plan.replication.keep_reverse if plan.replication else 0.0
        found = open_engine(plan.database.engine).replication()
        reverse, ends = found.describe("finish", plan) if found is not None else ["", ""]
        lines = [reverse]
        if keep:
            lines.append(
                f"keep that reverse path {keep:g} s (replication.keep_reverse) after the run: meanwhile `migrate "
                "rollback` moves back through it losing nothing, `migrate status` shows its lag, `migrate finish` "
                f"ends it ({ends}; tunnels ended)"
            )
        else:
            lines.append(f"then tear replication down on both sides (replication.keep_reverse 0): {ends}, tunnels "
                         "ended")  # fmt: skip
        return lines

    def reverse_path(self, ctx: StepContext, kit: FinishKit) -> dict[str, Any] | None:
        return None if ctx.saved(TORN_DOWN) else kit.reverse_replication(ctx)

    def end_reverse_path(self, ctx: StepContext, kit: FinishKit, reverse: dict[str, Any] | None) -> None:
        if ctx.saved(TORN_DOWN):
            return
        settings = runtime(ctx).plan.replication
        keep = settings.keep_reverse if settings else 0.0
        if keep and reverse is not None and reverse.get("healthy"):
            reverse.update(kit.keep_reverse(ctx, keep))
            return
        if keep:
            ctx.log.warning("finish.reverse_not_kept", why="reverse replication is not healthy")
        kit.tear_down(ctx)
        if reverse is not None:
            reverse["torn_down"] = True

    def undo_finish(self, ctx: StepContext, kit: FinishKit) -> None:
        if not ctx.saved(TORN_DOWN):
            kit.tear_down(ctx)  # the old source stops following the target before it serves again

    # -- the estimate
    def database_transfer(self, rt: StepRuntime) -> estimates.TransferEstimate:
        return estimates.seed_estimate(rt)  # the seed streams the datadir whatever the target holds

    def window_shell(self, host: Any) -> bool:
        # The window's short commands run in a shell kept open before it (steps/common.keep_shells).
        if not hasattr(host, "keep_shell"):
            return False
        host.keep_shell()
        return True

    def health_rounds(self, rt: StepRuntime) -> tuple[list[float], str]:
        return estimates.health_rounds(rt, on_target=True)  # the target serves, fenced, before the window

    def datadir_delta(self, rt: StepRuntime) -> tuple[int, float]:
        return 0, 0.0  # no datadir moves inside the window

    def window_parts(self, basis: estimates.WindowBasis) -> list[estimates.WindowPart]:
        return estimates.replicate_window(basis)

    def measure_compare(self, rt: StepRuntime) -> tuple[float, int] | None:
        return estimates.measure_compare(rt)

    def before_parts(self, units: estimates.UnitCosts, plan: Plan,
                     compare: tuple[float, int] | None) -> list[estimates.WindowPart]:  # fmt: skip
        return [estimates.catchup_part(units, plan, compare)]


class ReverseOverReplica(Replicate):
    """The way back over the reverse replica: the old source already replicates from the target and runs
    (read-only, fenced), so nothing is stopped, seeded or set up; the comparison ran forward. The uploads are
    pre-synced back (their change trackers started), the lag gate and the switch run with the roles swapped, and
    the shared end carries the uploads' delta and points DNS back."""

    own_steps: tuple[str, ...] = ("repl_catchup", "repl_switch")
    # start_target starts the old source's services again when the forward run's finish stopped them.
    shared_end: tuple[str, ...] = ("files_final", "start_target", "verify_target", "dns_flip", "audit", "finish")

    def steps(self, *, door_commits: bool = False) -> tuple[str, ...]:
        return ("preflight", "lower_ttl", "files_presync", *self.own_steps, *with_door(self.shared_end, door_commits))

    def preflight_lines(self, lines: list[str]) -> list[str]:
        # No datadir moves and the service lands on the storage it ran on before the migration.
        return [line for line in lines if not line.startswith(("enough free space", "storage, source"))]

    def check_storage(self, check: Callable[[], None]) -> None:
        """Neither the space nor the storage comparison applies (the forward run made them)."""

    def services_started(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        if plan.finish.source != "stop":
            return super().services_started(ctx)
        # The way back to an old source whose services the forward run's finish stopped (its fence is up).
        done = run_services(
            ctx, runtime(ctx).target, plan.services.target, "start", event="target_service_started",
            keep_going=False, kind="target service", timeout=lambda: ctx.window.timeout(COMMAND_TIMEOUT),
        )  # fmt: skip
        return done.done
