"""What several steps share, written once: the datadir's excludes, when the pre-sync began, a tree's push, the
loops that start and stop services, and the wait until a database answers.

Not a step: steps import this module, never each other.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.contracts import Host, Which, runtime
from orchestrator.database.protocol import DatabaseError
from orchestrator.engine.step import StepContext, StepError
from orchestrator.plan.model import FileTree, Plan, Service
from orchestrator.results import TreeFigures
from orchestrator.services import owned, probes
from orchestrator.services.tracking import ChangeTracker, TrackingError, final_pass_command, verify_listed_command
from orchestrator.transports import rsync, rsync_daemon
from orchestrator.transports.ssh import TransportError

# Runtime files of a server that must never travel with its datadir (the steps' name for rsync's).
DATADIR_EXCLUDES = rsync.DATADIR_EXCLUDES
COMMAND_TIMEOUT = 300.0
DB_POLL_INTERVAL = 0.5


# Preflight's figure: each host's datadir as that host resolves it ({"source": path, "target": path}).
RESOLVED_DATADIRS = "datadirs"


def resolved_datadir(ctx: StepContext, which: Which) -> str:
    """`which`'s datadir as preflight resolved it on its host, every symbolic link followed: a /var/lib/mysql that
    links to another disk is that disk's directory, the one every copy, rename and checksum must act on (renaming
    the link would leave the real directory stale, and the server, configured by either name, would not find the new
    data). A journal from before preflight resolved it: resolved now, once more."""
    rt = runtime(ctx)
    resolved = (ctx.output("preflight") or {}).get(RESOLVED_DATADIRS) or {}
    if resolved.get(which):
        return str(resolved[which])
    endpoint = rt.plan.database.source if which == "source" else rt.plan.database.target
    return probes.ask(rt.host(which), probes.resolve([endpoint.datadir]), timeout=60)[0].real


def presync_began(ctx: StepContext) -> float | None:
    """When this run's datadir pre-sync started (orchestrator clock), from the journal; None if unknown."""
    starts = ctx.history().starts("db_presync")
    return starts[0].ts if starts else None


def throttle_text(plan: Plan) -> str:
    """How the live copies pause, for the dry-run: '' when the plan sets no threshold."""
    parts = []
    if plan.transfer.max_load is not None:
        parts.append(f"the source's load is above {plan.transfer.max_load:g}")
    probe = plan.latency_probe() if plan.transfer.max_latency_ms is not None else None
    if probe is not None:
        parts.append(f"{probe[0]} takes over {plan.transfer.max_latency_ms:g} ms to answer")
    return f"paused while {' or '.join(parts)}" if parts else ""


# --- file trees ---


def tree_push_command(plan: Plan, tree: FileTree, *, live: bool) -> str:
    """The rsync that pushes one tree, run on the source.

    Inside the downtime window (live=False) mtimes are compared to the nanosecond: rsync's default quick check
    compares whole seconds, so a file rewritten at the same size within the second the pre-sync copied it would
    look unchanged and its last write would be lost.
    """
    extra = [] if live else ["--modify-window=-1"]
    return rsync.push_command(
        plan, tree.source, tree.target, exclude=tree.exclude, live=live, chown=tree.owner, extra=extra
    )


def sync_tree(ctx: StepContext, tree: FileTree, *, live: bool) -> TreeFigures:
    """Push one tree source → target, logging progress; the figures of the transfer.

    Inside the downtime window the push, retries included, is bounded by what is left of the budget.
    """
    rt = runtime(ctx)
    plan = rt.plan
    window = ctx.window
    command = tree_push_command(plan, tree, live=live)

    def _progress(p: rsync.Progress) -> None:
        ctx.log.info("rsync_progress", tree=tree.name, bytes=p.bytes, pct=p.pct, files=p.files_done,
                     rate=p.rate, eta=p.eta)  # fmt: skip

    started = time.monotonic()
    try:
        rt.target.run(f"mkdir -p {shlex.quote(tree.target)}", timeout=60)
        throttled = 0.0
        push_options: dict[str, Any] = {"what": f"tree {tree.name}", "retry": window.bounded(plan.retry),
                                        "on_progress": _progress, "timeout": window.timeout()}  # fmt: skip
        if live:  # the source serves: nocache, and paused while it is loaded (transfer.max_load)
            stats, throttled = rsync.push_live(rt.source, plan, command, **push_options)
        else:
            stats = rsync.push(rt.source, command, **push_options)
    except TransportError as exc:
        raise StepError(f"copying tree {tree.name}: {exc}") from None
    figures = TreeFigures(
        bytes=stats.transferred_bytes,
        files=stats.files_transferred,
        total_size=stats.total_size,
        entries=stats.files_total,
        seconds=round(time.monotonic() - started, 3),
        throttled_seconds=throttled,
    )
    ctx.log.info("tree_synced", tree=tree.name, **figures.journal())
    return figures


# --- services ---


def backoff_delays(attempts: int, first: float) -> list[float]:
    """Seconds to wait after each failed attempt but the last: first, 2*first, 4*first, ..."""
    return [first * (2**i) for i in range(max(attempts - 1, 0))]


@dataclass
class ServicesOutcome:
    done: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def run_services(
    ctx: StepContext,
    host: Host,
    services: Iterable[Service],
    action: Literal["start", "stop"],
    *,
    event: str,
    keep_going: bool,
    kind: str = "service",
    timeout: Callable[[], float | None] = lambda: COMMAND_TIMEOUT,
    before: Callable[[Service], None] | None = None,
    after: Callable[[Service], None] | None = None,
) -> ServicesOutcome:
    """Start or stop each service in the order given, logging `event` for each.

    `keep_going`: try every service and collect the failures (a compensation); otherwise the first failure
    raises StepError. `before` runs ahead of each command (journal first), `after` once it succeeded.
    """
    outcome = ServicesOutcome()
    for service in services:
        if before is not None:
            before(service)
        command = service.start if action == "start" else service.stop
        try:
            host.run(command, timeout=timeout())
        except TransportError as exc:
            if not keep_going:
                verb = "starting" if action == "start" else "stopping"
                raise StepError(f"{verb} {kind} {service.name}: {exc}") from None
            outcome.failures.append(f"service {service.name}: {exc}")
            continue
        ctx.log.info(event, service=service.name)
        outcome.done.append(service.name)
        if after is not None:
            after(service)
    return outcome


# --- databases ---


def wait_db_answers(ctx: StepContext, which: Which, timeout: float, *, refusal_is_up: bool = False) -> float:
    """Seconds until that database answered after its start command; StepError when it does not in `timeout`.

    A server that answers but refuses our login is running: with `refusal_is_up` that counts as answering, else
    it fails at once (waiting would not help).
    """
    rt = runtime(ctx)
    started = time.monotonic()
    while True:
        try:
            conn = rt.db(which, retry=False, read_timeout=10.0)
            rt.release(conn)
            return time.monotonic() - started
        except TransportError:
            raise  # the way to the host (the tunnel), not a server starting up: nothing to wait for
        except DatabaseError as exc:
            if exc.server_answered:
                if refusal_is_up:
                    return time.monotonic() - started
                raise StepError(f"the {which} database answers but refuses the connection: {exc}") from None
        if time.monotonic() - started > timeout:
            raise StepError(
                f"the {which} database did not answer within {timeout:.0f} s of its start command: see its error log"
            )
        time.sleep(DB_POLL_INTERVAL)


# --- the last tracked pass before the window ---

PREWINDOW_LIST = "prewindow.list"


def tracked_prepass(ctx: StepContext, tree: FileTree, presync: TreeFigures | None) -> TreeFigures | None:
    """Copy the paths the tree's tracker saw change since the pre-sync, while the source still serves (the replicate
    mode's long stretch between the pre-sync and the window: the seed, the replica, the comparison), then check
    them (rsync --dry-run --checksum of the listed paths): what still differs (written since, on a live tree)
    becomes the tracker's extra list, and the figures say where this list ended (`since`). The final pass inside
    the window then lists only what changed after that, plus the extra list: its work, and its check's, are the
    changes of the last moments, not every change since the pre-sync (which grows with the seed's and the
    comparison's time). A pass or check that failed leaves `since` unset: the final pass lists everything since the
    pre-sync, as rsync's quick check then skips what this pass copied.
    Also opens the shared SSH connection the final pass reuses. None: no tracker to ask (the final pass scans).
    """
    ref = presync.tracker if presync else None
    if ref is None or ref.unavailable:
        return None
    rt = runtime(ctx)
    plan = rt.plan
    tracker = ChangeTracker(rt.source, tree.source, ref.state_dir, name=ref.name)
    started = time.monotonic()
    try:
        changes = tracker.changes(f"{tracker.dir}/{PREWINDOW_LIST}", timeout=COMMAND_TIMEOUT)
        if not changes.trust.trusted:
            ctx.log.info("prewindow_pass_skipped", tree=tree.name, reasons=list(changes.trust.reasons))
            return None
        stats = rsync.Stats()
        if changes.count:
            command = final_pass_command(
                tree.source, rsync.target_spec(plan, tree.target), changes.path, ssh=rsync.target_ssh_command(plan),
                exclude=tree.exclude, chown=tree.owner, timeout=plan.transfer.rsync_timeout,
                whole_file=plan.transfer.whole_file, extra=rsync.remote_rsync(plan),
            )  # fmt: skip
            stats, _ = rsync.push_live(rt.source, plan, command, what=f"pre-window pass of tree {tree.name}",
                                       retry=plan.retry)  # fmt: skip
        else:
            rt.source.run(rsync.open_master_command(plan), timeout=COMMAND_TIMEOUT)
    except (TrackingError, TransportError) as exc:
        ctx.log.warning("prewindow_pass_failed", tree=tree.name, error=str(exc))  # the final pass copies it all
        return None
    figures = TreeFigures(
        bytes=stats.transferred_bytes, files=stats.files_transferred, total_size=stats.total_size,
        seconds=round(time.monotonic() - started, 3), mode="tracked", listed=changes.count,
    )  # fmt: skip
    differing = _check_prepass(ctx, tree, tracker, changes.path) if changes.count else []
    if differing is not None and changes.end is not None:
        figures.since = changes.end
        figures.differing, figures.differing_items = len(differing), differing[:MAX_DIFFERING_KEPT]
    ctx.log.info("prewindow_pass", tree=tree.name, **figures.journal())
    return figures


MAX_DIFFERING_KEPT = 20


def _check_prepass(ctx: StepContext, tree: FileTree, tracker: ChangeTracker, list_file: str) -> list[str] | None:
    """The pre-window pass's paths compared on both hosts (checksums); what differs is written as the tracker's
    extra list (replacing the pre-sync's, which this pass's list held). None: the check failed (nothing written)."""
    rt = runtime(ctx)
    plan = rt.plan
    command = verify_listed_command(
        tree.source, rsync.target_spec(plan, tree.target), list_file, ssh=rsync.target_ssh_command(plan),
        exclude=tree.exclude, chown=tree.owner, extra=rsync.remote_rsync(plan),
    )  # fmt: skip
    try:
        result = rt.source.run(command, timeout=COMMAND_TIMEOUT, check=False)
        if result.exit_status not in (0, rsync.VANISHED) and not (
            result.exit_status == rsync.PARTIAL and rsync.only_vanished(result.stderr)
        ):
            ctx.log.warning("prewindow_check_failed", tree=tree.name, exit=result.exit_status)
            return None
        differing = [path for line in result.stdout.splitlines() if (path := rsync.item_path(line)) and path != "."]
        tracker.write_extra(differing, timeout=COMMAND_TIMEOUT)
    except TransportError as exc:
        ctx.log.warning("prewindow_check_failed", tree=tree.name, error=str(exc))
        return None
    return differing


def open_window_route(ctx: StepContext) -> None:
    """Before the window: the rsync daemon route for the window's passes over the file trees (see
    transports/rsync_daemon.py). Best effort: without it those passes run over `-e ssh`, and the log says why."""
    rt = runtime(ctx)
    if not rt.plan.files or getattr(rt, "window_route", False) is not None:
        return  # no trees, a route already open, or a runtime that has none (offline tests)
    started = time.monotonic()
    try:
        owner = owned.owner(rt.plan.name, rt.plan_path, ctx.run_id)
        # SshHosts: the route needs their connections.
        route = rsync_daemon.open_route(rt.plan, rt.source, rt.target, owner)  # type: ignore[arg-type]  # see above
    except rsync_daemon.RouteUnavailable as exc:
        ctx.log.warning("window_route_unavailable", reason=str(exc), instead="rsync -e ssh inside the window")
        return
    rt.window_route = route  # type: ignore[attr-defined]  # the runtime's own slot, not part of what steps may use
    ctx.log.info("window_route_opened", seconds=round(time.monotonic() - started, 3), modules=len(route.modules))


def window_route(ctx: StepContext) -> rsync_daemon.DaemonRoute | None:
    """The route open_window_route made, if any."""
    return getattr(runtime(ctx), "window_route", None)


def keep_shells(ctx: StepContext) -> None:
    """Before the window: a shell kept open on each host (SshHost.keep_shell), so the window's short commands (the
    fence, the change list, the target's fence) run without a new SSH session each. Best effort: a host that cannot
    open one runs its commands as before."""
    rt = runtime(ctx)
    for which, host in (("source", rt.source), ("target", rt.target)):
        keep = getattr(host, "keep_shell", None)
        if keep is None:
            continue
        try:
            keep()
        except TransportError as exc:
            ctx.log.warning("shell_not_kept", host=which, error=str(exc))


# Journaled once the target's fence is lifted (by the step that commits): a resumed run lifts it again if not.
TARGET_FENCE_LIFTED = "target_fence_lifted"
TARGET_FENCE_TIMEOUT = 120.0


def lift_target_fence(ctx: StepContext, *, committed_because: str) -> bool:
    """Let the target take writes: the plan's `services.target_fence.disable`, journaled once done. Called after the
    commit is journaled (a failure then needs `migrate apply`, never a rollback); `committed_because` says in the
    error why the run was committed. False when the plan declares no target fence."""
    fence = runtime(ctx).plan.services.target_fence
    if not (fence.enable and fence.disable):
        return False
    try:
        runtime(ctx).target.run(fence.disable, timeout=TARGET_FENCE_TIMEOUT)
    except TransportError as exc:
        raise StepError(
            f"{committed_because} but lifting the target's fence failed ({exc}): it refuses writes until "
            "`migrate apply` lifts it"
        ) from None
    ctx.save(TARGET_FENCE_LIFTED, True)
    ctx.log.info("target_fence_lifted")
    return True
