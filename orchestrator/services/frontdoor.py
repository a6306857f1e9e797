"""The front doors during a run: hold, don't refuse; forward after the flip (plan section `proxy`).

What the steps call, each a no-op when the plan has no front door for that host:

- `hold_source(ctx, blocked_at)` (the step that begins the window, `cutover` or `repl_switch`, before the fence):
  the source's HAProxy holds every new request until what is left of `cutover.max_write_block` plus HOLD_MARGIN (a
  deadline on the HAProxy host's clock, journaled before it is set), then in-flight requests get `drain_timeout` to
  finish. The fence still goes up behind it. `prepare_hold(ctx)` reads, before the window, what the hold needs
  (whether it can hold writes alone, the door's pid and clock, that it sends requests to the source's app: one
  batch, which opens the door's kept admin connection), so the window spends only the hold's own round trips on the
  door (one exchange sets the hold and lists the requests in flight; the drain asks again only while some are).
- `keep_holding_for_rollback(ctx)` / `release_source(ctx)` (that step's undo, and between its tries when it lets
  writes in): the hold is stretched while the source takes writes again (its database started or made writable,
  its fence lifted), then released: held requests go to the source, none fails.
- `before_flip(ctx)` (DNS flip, before any record moves): proves the source still holds (an HAProxy restarted
  mid-window forgot its hold: one line, rollback) and holds the target's door, for clients that follow the new
  records before the target's fence is lifted.
- `forward_to_target(ctx)` (the commit point, once the target's fence is lifted): the target's door is released,
  the source's server is pointed at `forward_to` (the target's front door) and released: held requests and every
  later one from a client with a stale DNS answer are served by the target.
- `release_target(ctx)` (DNS flip's undo): the target's door sends what it held to its own `forward_to` (the
  source's door, which holds them until the source takes writes again) and releases.
- `forwarding_report(ctx)` (finish, after its drain wait): makes sure the source forwards, counts the requests that
  still arrived at the old address since the commit, and says until when forwarding must stay (the commit plus the
  records' TTL plus `forward_margin`): the door keeps forwarding after the run. With `wait_forwarding` it waits
  until then first, and also counts the requests that arrived after the records' TTL had run out (clients or
  resolvers that keep an answer longer than its TTL).

If migrate dies (kill -9) while requests are held, nothing is held forever: the hold is a deadline HAProxy's Lua
action compares with its own clock, so at the deadline the held requests go on to the source's app (fenced: writes
get its refusal, as without a front door) until `migrate apply` or `migrate rollback` carries on.
"""

from __future__ import annotations

import contextvars
import shlex
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.contracts import runtime
from orchestrator.engine.step import StepContext, StepError
from orchestrator.plan.model import FrontDoorProxy
from orchestrator.results import DnsFlipResult
from orchestrator.services import guard, owned, source_commit
from orchestrator.transports import rsync
from orchestrator.transports.haproxy import (
    HOLD_KEY,
    HOLD_WRITES_KEY,
    READ_METHODS,
    WRITES_ONLY_CAPABILITY,
    AdminSocketUnreachable,
    FrontDoor,
    HaproxyError,
    HaproxyRefused,
    host_clock,
    over_ssh,
    parse_info,
    parse_map,
    parse_servers_state,
    requests_of,
)
from orchestrator.transports.ssh import TransportError

Side = Literal["source", "target"]

# Seconds a hold outlives the budget: the rollback that follows a spent budget stretches it before it runs out, and
# with nobody left to roll back, it outlives the guard's deadline (guard.MARGIN past the budget) by the guard's
# restore: the held requests then reach a source that takes writes, never a fence that refuses them.
HOLD_MARGIN = guard.MARGIN + guard.RESTORE_ALLOWANCE
# How long the rollback keeps the source holding while its database starts again and its fence is lifted.
ROLLBACK_HOLD = 180.0
MIN_HOLD = 1.0
AUTOMATIC_TTL_SECONDS = 300  # Cloudflare's automatic TTL (1), as resolvers are told it

# Journaled facts (step_saved keys): the cut-over's hold of the source, the flip's of the target, the forwarding.
SOURCE_HOLD = "source_door_hold"
TARGET_HOLD = "target_door_hold"
FORWARDED = "source_door_forwarded"
OWN_APP = "target_door_own_app"  # a reverse run's flip pointed the old source's door back at its own app


def section(ctx: StepContext, side: Side) -> FrontDoorProxy | None:
    proxy = runtime(ctx).plan.proxy
    return None if proxy is None else getattr(proxy, side)


def door(ctx: StepContext, side: Side) -> FrontDoor | None:
    """The front door of that host, reached through its SSH connection (one tunnel per run, kept on the run's
    runtime: `front_doors`)."""
    config = section(ctx, side)
    if config is None:
        return None
    rt = runtime(ctx)
    cache = rt.front_doors
    if side not in cache:
        cache[side] = over_ssh(
            rt.host(side),  # type: ignore[arg-type]  # an SshHost: the admin socket is reached over its connection
            config.admin_socket,
            frontend=config.frontend,
            backend=config.backend,
            server=config.server,
            hold_map=config.hold_map,
        )
    return cache[side]


def _fail(ctx: StepContext, side: Side, doing: str, exc: HaproxyError | ValueError) -> StepError:
    return StepError(f"{side}'s front door, {doing}: {_said(ctx, side, exc)}")


def _said(ctx: StepContext, side: Side, exc: HaproxyError | ValueError) -> str:
    config = section(ctx, side)
    if isinstance(exc, AdminSocketUnreachable) and config is not None:
        # The local end of the SSH tunnel means nothing to the operator: name the socket on its host.
        host = getattr(runtime(ctx).plan, side).address
        return f"HAProxy admin socket {config.admin_socket} on {host} unreachable: {exc.reason}"
    return str(exc)


def _pid(front: FrontDoor) -> str:
    return parse_info(front.ask("show info")).get("Pid", "")


def _saved_by(ctx: StepContext, step: str | None, key: str) -> Any:
    """A value a step (any step: None) journaled in this run, the last one saved."""
    return ctx.history().last_run().saved(step, key)


def engaged(ctx: StepContext) -> bool:
    """Whether this run drives the front doors after the cut-over: a plan with a source door engages them when the
    cut-over journals its hold (a run whose history predates it leaves them alone)."""
    if section(ctx, "source") is None:
        return section(ctx, "target") is not None
    return bool(ctx.history().saves(None, SOURCE_HOLD))


def describe(ctx: StepContext, side: Side) -> list[str]:
    config = section(ctx, side)
    if config is None:
        return []
    where = f"{config.frontend} → {config.backend}/{config.server}"
    if side == "source":
        held = "new requests"
        if config.hold == "writes":
            held = f"new requests (in the replicate mode only writes: {', '.join(READ_METHODS)} go on to the source)"
        return [
            f"the source's front door ({where}) holds {held} (they wait, none is refused) until the flip or "
            f"the budget + {HOLD_MARGIN:g} s; in-flight requests get {config.drain_timeout:g} s to finish",
            f"at the commit point it forwards to {config.forward_to.address}:{config.forward_to.port} and lets "
            "the held requests through; a rollback lets them through to the source",
        ]
    return [f"the target's front door ({where}) holds requests until the target's fence is lifted"]


# --- the source: hold, drain, release -----------------------------------------------------------------------


@dataclass(frozen=True)
class HoldReady:
    """What the source's hold needs to know, read before the window (reads only: nothing is held yet), so the
    window itself spends only the hold's own round trips on the door."""

    writes_only: bool
    pid: str
    clock_offset: float  # the HAProxy host's clock minus ours (the hold is a deadline on its clock)
    target_at_own_app: bool


def prepare_hold(ctx: StepContext, *, source_serves_reads: bool = False) -> HoldReady | None:
    """Read what `hold_source` needs (None: no source door). Fails, one line, when the source's door does not send
    requests to the source's app: nothing was held, no fence went up."""
    front, config = door(ctx, "source"), section(ctx, "source")
    if front is None or config is None:
        return None
    try:
        target_at_own_app = _at_own_app(ctx, "target")
    except (HaproxyError, ValueError) as exc:
        raise _fail(ctx, "target", "reading where it sends requests", exc) from None
    try:
        # One round trip: what the action can hold, the map, where the server points, the pid, the host's clock. It
        # also opens the door's kept connection, which the window's commands then reuse.
        commands = ["frontdoor version", f"show map {front.hold_map}", f"show servers state {front.backend}",
                    "show info", "show activity"]  # fmt: skip
        asked = time.time()
        version, held, servers, info, activity = front.batch(commands)
        offset = host_clock(activity) - (asked + time.time()) / 2
        writes_only = False
        if source_serves_reads and config.hold == "writes":
            writes_only = WRITES_ONLY_CAPABILITY in version.split() and HOLD_WRITES_KEY in parse_map(held)
            if not writes_only:
                _holding_reads_too(ctx, front)
        server = next((s for s in parse_servers_state(servers) if s.server == front.server), None)
        if server is None:
            raise HaproxyRefused(commands[2], f"no server {front.server} in {front.backend}")
        if (server.address, server.port) != (config.app.address, config.app.port):
            raise StepError(
                f"the source's front door sends requests to {server.address}:{server.port}, not to the source's "
                f"app {config.app.address}:{config.app.port} (proxy.source.app): not holding, the fence did not go up"
            )
        pid = parse_info(info).get("Pid", "")
    except (HaproxyError, ValueError) as exc:
        raise _fail(ctx, "source", "holding requests", exc) from None
    _probe_local_door(ctx, config)
    return HoldReady(writes_only, pid, offset, target_at_own_app)


# Set on the run's runtime once the source host was found able to drive its own door
# (orchestrator/services/source_commit.py).
LOCAL_DOOR = "source_door_local"
LOCAL_TIMEOUT = 30.0


def _probe_local_door(ctx: StepContext, config: FrontDoorProxy) -> None:
    """Before the window: can the source host drive its own door (socat reaching the admin socket), and does it pay?
    Driven from there the commit is two commands instead of four round trips, but the source starts processes for
    it (socat, the hop's command): it runs there only when two round trips from here cost more than that work,
    both measured now (source_commit.worth_driving_from_source). The hop to the target is opened now for it. Best
    effort: otherwise the commit is driven from here."""
    rt = runtime(ctx)
    if config.commit_from == "orchestrator":
        ctx.log.info("frontdoor.local_door", commit_from_source=False, why="proxy.commit_from: orchestrator")
        setattr(rt, LOCAL_DOOR, False)
        return
    command = source_commit.probe_command(config.admin_socket)
    fence = rt.plan.services.target_fence
    hop = None  # the command over the hosts' hop that opens (or keeps) its shared connection
    if fence.enable and fence.disable:
        hop = rsync.open_master_command(rt.plan)
        command += f"; {hop} >/dev/null 2>&1 || true"
    able, round_trip, local_cost = False, None, None
    try:
        able = source_commit.probe_ok(rt.source.run(command, timeout=LOCAL_TIMEOUT, check=False).stdout)
        if able and config.commit_from == "auto":
            began = time.monotonic()
            answer = rt.source.run(
                source_commit.cost_probe_command(config.admin_socket, hop), timeout=LOCAL_TIMEOUT, check=False
            ).stdout
            local_cost = source_commit.parse_local_cost(answer)
            round_trip = max(0.0, time.monotonic() - began - (local_cost or 0.0))
    except TransportError as exc:
        able = False
        ctx.log.warning("frontdoor.local_probe_failed", error=str(exc))
    if config.commit_from == "auto":
        worth = able and round_trip is not None and source_commit.worth_driving_from_source(round_trip, local_cost)
    else:
        worth = able and config.commit_from == "source"
    setattr(rt, LOCAL_DOOR, worth)
    ctx.log.info(
        "frontdoor.local_door",
        commit_from_source=worth,
        drivable=able,
        round_trip_s=None if round_trip is None else round(round_trip, 4),
        source_work_s=None if local_cost is None else round(local_cost, 4),
    )


def drivable_from_source(ctx: StepContext) -> bool:
    """The commit may run on the source host: found able before the window, in this process, on a forward run."""
    rt = runtime(ctx)
    return bool(getattr(rt, LOCAL_DOOR, False)) and engaged(ctx) and rt.plan.reverse_of is None


# Journaled by the commit step before its one command on the source: where that command records the commit there.
COMMIT_SENT = "commit_sent"


def forget_commit_record(ctx: StepContext) -> None:
    """At the run's end: the commit's record on the source (and an answer a dead run left beside it) deleted, best
    effort (a file left in the private directory says nothing to a later run: each run has its own)."""
    record = _saved_by(ctx, None, COMMIT_SENT)
    if not record:
        return
    path = shlex.quote(str(record))
    try:
        runtime(ctx).source.run(f"rm -f {path} {path}.out", timeout=LOCAL_TIMEOUT, check=False)
    except TransportError as exc:
        ctx.log.warning("frontdoor.commit_record_left", record=record, error=str(exc))


def commit_record(ctx: StepContext) -> str:
    """Where the commit driven from the source records itself on the source (source_commit.commit_record)."""
    rt = runtime(ctx)
    return source_commit.commit_record(rt.plan.source.private_dir, owned.owner(rt.plan.name, rt.plan_path, ctx.run_id))


def committed_on_source(ctx: StepContext, record: str) -> float | None:
    """When the commit driven from the source recorded itself there (the record's time on the source), None when it
    did not (one round trip): asked by a run that sent that command and whose journal does not say committed (it
    died before the answer), before anything else."""
    try:
        out = runtime(ctx).source.run(source_commit.record_probe(record), timeout=LOCAL_TIMEOUT).stdout
    except TransportError as exc:
        raise StepError(f"cannot read on the source whether this run committed there ({record}): {exc}") from None
    return _commit_time(source_commit.recorded_at(out), recorded=source_commit.recorded(out))


def settle_commit_on_source(ctx: StepContext, record: str) -> float | None:
    """The commit sent to the source decided for good (source_commit.settle_probe), before anything is decided about
    a run stopped at its commit: its time when it had recorded itself, None when it is cancelled now (it never will).
    A command cut short by the stop is ended first (the transport ends it before its next command there). Raises
    StepError when it cannot be told (the source unreachable): nothing may then be undone."""
    try:
        out = runtime(ctx).source.run(source_commit.settle_probe(record), timeout=LOCAL_TIMEOUT).stdout
    except TransportError as exc:
        raise StepError(f"cannot settle on the source whether this run committed there ({record}): {exc}") from None
    if source_commit.recorded(out):
        return _commit_time(source_commit.recorded_at(out), recorded=True)
    if source_commit.CANCELLED in out.split():
        ctx.log.info("frontdoor.commit_cancelled", record=record)
        return None
    raise StepError(
        f"cannot settle on the source whether this run committed there ({record}): neither claimed nor read"
    )


def _commit_time(at: float | None, *, recorded: bool) -> float | None:
    """The record's time on the source (a clock ahead of ours is no later than now here); now when none was read."""
    if not recorded:
        return None
    now = time.time()
    return now if at is None else min(at, now)


def commit_from_source(
    ctx: StepContext, guard_dir: str | None, record: str, *, timeout: float | None
) -> source_commit.ForwardOutcome:
    """The commit in one command on the source (source_commit.commit_script): the hold checked on the door's local
    socket and, only when it stands, the guard told, the commit recorded (`record`), the target's fence lifted over
    the hosts' hop and the door forwarding to the target; the target's door released beside it (from here).

    Fails, one line, when the commit was not recorded (the hold lost, the guard or the record not written, the door
    unanswered): nothing irreversible happened, the run rolls back. Once recorded, returns what the fence and the
    door did (the caller journals the commit first, then says what failed), and journals the forwarding as
    _forward_source_door does."""
    rt = runtime(ctx)
    config = section(ctx, "source")
    front = door(ctx, "source")
    assert config is not None and front is not None
    held = _saved_by(ctx, None, SOURCE_HOLD)
    hold = None
    if held and "deadline" in held:
        hold = source_commit.HoldToCheck(
            str(held.get("pid", "")), float(held["deadline"]), bool(held.get("writes_only"))
        )
    fence = rt.plan.services.target_fence
    fence_command = None
    if fence.enable and fence.disable:
        login = f"{rt.plan.target.user}@{rt.plan.target.address}"
        fence_command = source_commit.fence_command_on_target(
            rsync.target_ssh_command(rt.plan), login, fence.disable, sudo=rt.plan.target.become == "sudo"
        )
    to = config.forward_to
    forward = source_commit.Forward(front.backend, front.server, front.hold_map, to.address, to.port)
    script = source_commit.commit_script(config.admin_socket, config.hold_map, hold, guard_dir, record,
                                         fence_on_target=fence_command, forward=forward)  # fmt: skip
    if _saved_by(ctx, None, FORWARDED) is None:
        # Before: undo and finish know the door may forward (the request count comes with the switch itself).
        ctx.save(FORWARDED, {"to": f"{to.address}:{to.port}", "requests": None})
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="door") as pool:
        target_released = pool.submit(contextvars.copy_context().run, _release_target_door, ctx)
        try:
            out = rt.source.run(script, timeout=timeout or LOCAL_TIMEOUT, check=False).stdout
            check, outcome = source_commit.parse_commit(out, hold, fenced=fence_command is not None,
                                                        frontend=front.frontend, forward=forward)  # fmt: skip
        except TransportError as exc:
            raise StepError(f"cannot tell the guard on the source that the run commits: {exc}") from None
        except (source_commit.DoorUnanswered, HaproxyError, ValueError) as exc:
            raise StepError(f"source's front door, checking its hold: {exc}") from None
        finally:
            released = target_released.result()
    if outcome is None:
        if hold is not None and check.pid != hold.pid:
            raise StepError(
                f"the source's front door lost its hold (HAProxy pid {hold.pid} → {check.pid}, hold_until "
                f"{hold.deadline} → {check.until}): HAProxy restarted mid-window and requests reached the fenced "
                "source"
            )
        if hold is not None and (
            check.until is None or abs(check.until - hold.deadline) > source_commit.DEADLINE_TOLERANCE
        ):
            raise StepError(
                f"the source's front door lost its hold ({hold.key} {hold.deadline} → {check.until} in "
                f"{config.hold_map}): something else changed it mid-window and requests may have reached the "
                "fenced source"
            )
        raise StepError("cannot tell the guard on the source that the run commits: the marker was not written")
    if outcome.door_error is None and outcome.requests is not None:
        ctx.save(FORWARDED, {"to": f"{to.address}:{to.port}", "requests": outcome.requests})
        ctx.log.info("frontdoor.source_forwarding", to=f"{to.address}:{to.port}", from_source=True)
    elif outcome.fence_lifted is not False:
        ctx.log.error("frontdoor.forward_failed", error=outcome.door_error)
    if not released:
        why = outcome.door_error or "the target's front door could not be released"
        return source_commit.ForwardOutcome(outcome.fence_lifted, outcome.fence_said, outcome.requests, why)
    return outcome


def hold_source(
    ctx: StepContext, blocked_at: float, *, source_serves_reads: bool = False, ready: HoldReady | None = None
) -> None:
    """Hold the source's requests until the budget (+ margin) runs out; then let in-flight requests finish.

    `source_serves_reads`: the source database keeps serving reads through the window (the replicate mode's
    read_only). With the plan's `hold: writes` only the requests that may write are held then, and reads go on to
    the source; an HAProxy whose hold action cannot tell them apart holds everything (said in the log).
    `ready`: what `prepare_hold` read before the window (else it is read now)."""
    front, config = door(ctx, "source"), section(ctx, "source")
    if front is None or config is None:
        return
    rt = runtime(ctx)
    if ready is None:
        ready = prepare_hold(ctx, source_serves_reads=source_serves_reads)
        assert ready is not None
    if not ready.target_at_own_app:
        _point_at_own_app(ctx, "target")
    budget_left = rt.plan.cutover.max_write_block - (time.time() - blocked_at)
    seconds = max(budget_left + HOLD_MARGIN, MIN_HOLD)
    writes_only, pid = ready.writes_only, ready.pid
    facts: dict[str, Any] = {"seconds": round(seconds, 3), "writes_only": writes_only}
    ctx.save(SOURCE_HOLD, facts)  # before: a crash still knows a hold may stand
    try:
        # The hold and the requests in flight in one round trip. Holding writes alone: only the writes in flight
        # must end before the fence and read_only (reads in flight meet neither), so the drain waits for those only.
        deadline, in_flight = front.hold_and_in_flight(seconds, writes_only=writes_only,
                                                       host_now=time.time() + ready.clock_offset)  # fmt: skip
    except (HaproxyError, ValueError) as exc:
        raise _fail(ctx, "source", "holding requests", exc) from None
    ctx.save(SOURCE_HOLD, {**facts, "deadline": deadline, "pid": pid})
    ctx.log.info("frontdoor.source_held", seconds=round(seconds, 3), deadline=deadline, writes_only=writes_only)
    bound = min(config.drain_timeout, ctx.window.timeout() or config.drain_timeout) if config.drain_timeout else 0
    try:
        # Wait for the requests that were in flight when the hold began (none: no round trip at all).
        drained = front.wait_finished(in_flight, bound) if bound else True
    except (HaproxyError, ValueError) as exc:
        raise _fail(ctx, "source", "waiting for in-flight requests", exc) from None
    # Not drained in time: those requests meet the fence (and the database lock) as they would without a door.
    ctx.log.info("frontdoor.source_drained", drained=drained, within_s=bound)


def holds_from_source(ctx: StepContext, ready: HoldReady | None) -> bool:
    """Whether the window's first command runs on the source (hold_and_fence_from_source): a source door found
    drivable from the source host and worth it (the same finding as the commit's), a fence to put up, a forward run."""
    rt = runtime(ctx)
    return (
        ready is not None
        and bool(getattr(rt, LOCAL_DOOR, False))
        and bool(rt.plan.services.fence.enable)
        and rt.plan.reverse_of is None
    )


def journal_hold_ahead(ctx: StepContext, ready: HoldReady) -> None:
    """Before the window's clock starts: the journal says a hold may stand (its facts), so that
    hold_and_fence_from_source writes no record before its command. The seconds are the whole budget's (the
    hold's own, a few milliseconds shorter, are journaled with its deadline)."""
    if not ctx.saved(SOURCE_HOLD):
        seconds = max(runtime(ctx).plan.cutover.max_write_block + HOLD_MARGIN, MIN_HOLD)
        ctx.save(SOURCE_HOLD, {"seconds": round(seconds, 3), "writes_only": ready.writes_only})


def hold_and_fence_from_source(
    ctx: StepContext, blocked_at: float, ready: HoldReady, *, timeout: float | None, then: str | None = None
) -> source_commit.HoldAndFence:
    """The hold, the drain of the writes in flight and the source's fence in one command on the source
    (source_commit.hold_and_fence_script): one round trip where hold_source and the fence cost two, plus one per
    look while a write is in flight. `then`: what else runs there once the fence is up, in the same command (its
    status and output come back in the answer). Journaled as hold_source journals its hold. Fails, one line, when
    the hold was not set (nothing fenced) or the fence failed (held: the rollback releases)."""
    front, config = door(ctx, "source"), section(ctx, "source")
    assert front is not None and config is not None
    rt = runtime(ctx)
    if not ready.target_at_own_app:
        _point_at_own_app(ctx, "target")
    budget_left = rt.plan.cutover.max_write_block - (time.time() - blocked_at)
    seconds = max(budget_left + HOLD_MARGIN, MIN_HOLD)
    facts: dict[str, Any] = {"seconds": round(seconds, 3), "writes_only": ready.writes_only}
    if not ctx.saved(SOURCE_HOLD):
        ctx.save(SOURCE_HOLD, facts)  # before: a crash still knows a hold may stand
    deadline = round(time.time() + ready.clock_offset + seconds, 3)
    drain = min(config.drain_timeout, ctx.window.timeout() or config.drain_timeout) if config.drain_timeout else 0
    script = source_commit.hold_and_fence_script(
        config.admin_socket, front.hold_map, key=_hold_key({"writes_only": ready.writes_only}), deadline=deadline,
        frontend=front.frontend, writes_only=ready.writes_only, drain_seconds=drain,
        fence=str(rt.plan.services.fence.enable), then=then,
    )  # fmt: skip
    try:
        out = rt.source.run(script, timeout=timeout or LOCAL_TIMEOUT, check=False).stdout
    except TransportError as exc:
        ctx.window.check("holding requests and fencing the source")
        raise StepError(f"holding requests and fencing the source: {exc}") from None
    done = source_commit.parse_hold_and_fence(out)
    if not done.held:
        raise StepError(f"source's front door, holding requests: {done.door_said}")
    # What the commit checks, long after: the window's next fsync'd record (the final position's or a step's) makes
    # it durable, with no fsync of its own between the fence and read_only.
    ctx.save(SOURCE_HOLD, {**facts, "deadline": deadline, "pid": ready.pid}, sync=False)
    ctx.log.info("frontdoor.source_held", seconds=round(seconds, 3), deadline=deadline,
                 writes_only=ready.writes_only, from_source=True)  # fmt: skip
    # Not drained in time: those requests met the fence (and meet read_only) as they would without a door.
    ctx.log.info("frontdoor.source_drained", drained=done.drained, in_flight=done.in_flight, within_s=drain)
    if not done.fenced:
        ctx.window.check("fencing the source")
        raise StepError(f"fencing the source: {done.fence_said}")
    return done


def _holding_reads_too(ctx: StepContext, front: FrontDoor) -> None:
    ctx.log.warning(
        "frontdoor.holding_reads_too",
        why=f"proxy.source.hold is 'writes', but the HAProxy hold action (or its map {front.hold_map}) cannot hold "
        "writes alone: `frontdoor version` does not answer hold_writes, or the map has no hold_writes_until line",
    )


def _hold_key(held: dict[str, Any]) -> str:
    return HOLD_WRITES_KEY if held.get("writes_only") else HOLD_KEY


def check_source_hold(ctx: StepContext) -> None:
    """The source still holds what the cut-over held: an HAProxy restarted mid-window lost the hold."""
    held = _saved_by(ctx, None, SOURCE_HOLD)  # the window's first step (cut-over or switch) journaled it
    if section(ctx, "source") is None or not held or "deadline" not in held:
        return
    front = door(ctx, "source")
    assert front is not None
    try:
        pid, until = front.pid_and_hold(_hold_key(held))
    except (HaproxyError, ValueError) as exc:
        raise _fail(ctx, "source", "checking its hold", exc) from None
    if pid != held.get("pid"):
        raise StepError(
            f"the source's front door lost its hold (HAProxy pid {held.get('pid')} → {pid}, hold_until "
            f"{held['deadline']} → {until}): HAProxy restarted mid-window and requests reached the fenced source"
        )
    if abs(until - float(held["deadline"])) > 0.01:
        raise StepError(
            f"the source's front door lost its hold ({_hold_key(held)} {held['deadline']} → {until} in "
            f"{front.hold_map}): "
            "something else changed it mid-window and requests may have reached the fenced source"
        )


def keep_holding_for_rollback(ctx: StepContext) -> None:
    """Stretch the hold while the rollback brings the source back (its database starts, its fence lifts)."""
    if section(ctx, "source") is None or not ctx.saved(SOURCE_HOLD):
        return
    front = door(ctx, "source")
    assert front is not None
    try:
        deadline = front.hold(ROLLBACK_HOLD, writes_only=bool(ctx.saved(SOURCE_HOLD).get("writes_only")))
    except (HaproxyError, ValueError) as exc:
        # Not fatal: held requests go on at the old deadline; nothing is lost (the fence refuses writes).
        ctx.log.warning("frontdoor.rollback_hold_failed", error=_said(ctx, "source", exc))
        return
    ctx.save(SOURCE_HOLD, {**ctx.saved(SOURCE_HOLD), "deadline": deadline, "rollback": True})


def release_source(ctx: StepContext) -> None:
    """Let the held requests through to the source (it takes writes again); idempotent. Never fails the rollback:
    a hold that cannot be released ends by itself at its deadline, and the held requests then go to the source."""
    held = ctx.saved(SOURCE_HOLD)
    if section(ctx, "source") is None or not held:
        return
    front = door(ctx, "source")
    assert front is not None
    try:
        front.release()
    except (HaproxyError, ValueError) as exc:
        deadline = held.get("deadline")
        if deadline is None:
            # The hold was never confirmed: nothing may be held at all.
            ctx.log.warning("frontdoor.release_failed", error=_said(ctx, "source", exc))
        else:
            ctx.log.error(
                "frontdoor.release_failed",
                error=_said(ctx, "source", exc),
                held_requests_go_on_at=_clock(deadline),
            )
        return
    ctx.save(SOURCE_HOLD, None)
    ctx.log.info("frontdoor.source_released")


def _clock(deadline: Any) -> str:
    return "the deadline" if not deadline else time.strftime("%H:%M:%S", time.localtime(float(deadline)))


def _at_own_app(ctx: StepContext, side: Side) -> bool:
    """Whether that host's door (if any) sends its requests to its own host's app."""
    front, config = door(ctx, side), section(ctx, side)
    if front is None or config is None:
        return True
    server = front.server_state()
    return (server.address, server.port) == (config.app.address, config.app.port)


def _point_at_own_app(ctx: StepContext, side: Side) -> None:
    """A door that forwarded during an earlier run is pointed back at its own host's app."""
    front, config = door(ctx, side), section(ctx, side)
    if front is None or config is None:
        return
    try:
        server = front.server_state()
        if (server.address, server.port) != (config.app.address, config.app.port):
            front.repoint(config.app.address, config.app.port)
            ctx.log.info("frontdoor.pointed_at_own_app", side=side, app=f"{config.app.address}:{config.app.port}")
    except (HaproxyError, ValueError) as exc:
        raise _fail(ctx, side, "pointing it at its own app", exc) from None


def serve_own_app(ctx: StepContext, side: Side) -> bool:
    """A reverse run's flip: the door that forwarded since the forward run (the old source's, this run's target)
    serves its own host's app again. Committed by then: a failure is logged (the operator repoints it), never fatal."""
    if section(ctx, side) is None:
        return True
    ctx.save(OWN_APP, True)  # before: a rolled-back flip sends that door's requests back where they went
    try:
        _point_at_own_app(ctx, side)
    except StepError as exc:
        ctx.log.error("frontdoor.not_pointed_at_own_app", side=side, error=str(exc))
        return False
    return True


# --- the flip: hold the target, forward the source ---------------------------------------------------------------


def before_flip(ctx: StepContext) -> None:
    """Before any record moves: the source still holds, and the target holds clients that follow the new records."""
    if not engaged(ctx):
        return
    check_source_hold(ctx)
    fence = runtime(ctx).plan.services.target_fence
    if section(ctx, "target") is None or not (fence.enable and fence.disable):
        return  # without a fence to lift, the target takes requests as soon as it starts: nothing to hold for
    front = door(ctx, "target")
    assert front is not None
    left = ctx.window.remaining()
    seconds = max((left if left is not None else runtime(ctx).plan.cutover.max_write_block) + HOLD_MARGIN, MIN_HOLD)
    ctx.save(TARGET_HOLD, {"seconds": round(seconds, 3)})
    try:
        deadline = front.hold(seconds)
    except (HaproxyError, ValueError) as exc:
        raise _fail(ctx, "target", "holding requests", exc) from None
    ctx.save(TARGET_HOLD, {"seconds": round(seconds, 3), "deadline": deadline})
    ctx.log.info("frontdoor.target_held", deadline=deadline)


def forward_to_target(ctx: StepContext) -> bool:
    """The commit point: the target's door lets its requests in, the source's forwards to the target and lets
    the held requests go. Idempotent. False (logged) when a door could not be told: finish tries again."""
    if not engaged(ctx):
        return True
    # The two doors side by side (each a few admin round trips inside the window): held requests the source lets
    # go before the target's door is released wait there, so the order does not matter.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="door") as pool:
        target_released = pool.submit(contextvars.copy_context().run, _release_target_door, ctx)
        forwarding = _forward_source_door(ctx)
        return target_released.result() and forwarding


def _release_target_door(ctx: StepContext) -> bool:
    target = door(ctx, "target")
    if target is None:
        return True
    try:
        target.release()
        if ctx.saved(TARGET_HOLD):
            ctx.save(TARGET_HOLD, None)
        ctx.log.info("frontdoor.target_released")
    except (HaproxyError, ValueError) as exc:
        ctx.log.error("frontdoor.target_release_failed", error=_said(ctx, "target", exc))
        return False
    return True


def _forward_source_door(ctx: StepContext) -> bool:
    front, config = door(ctx, "source"), section(ctx, "source")
    if front is None or config is None:
        return True
    to = config.forward_to
    before = _saved_by(ctx, None, FORWARDED)
    try:
        if before is None:
            # Before: undo and finish know the door may forward (the request count comes with the switch itself).
            ctx.save(FORWARDED, {"to": f"{to.address}:{to.port}", "requests": None})
        requests = front.forward(to.address, to.port)  # repointed and released in one round trip
        if before is None or before.get("requests") is None:
            ctx.save(FORWARDED, {"to": f"{to.address}:{to.port}", "requests": requests})
    except (HaproxyError, ValueError) as exc:
        ctx.log.error("frontdoor.forward_failed", error=_said(ctx, "source", exc))
        return False
    ctx.log.info("frontdoor.source_forwarding", to=f"{to.address}:{to.port}")
    return True


def release_target(ctx: StepContext) -> None:
    """The flip is rolled back. The target's door sends what it holds, and later clients of the new records, to its
    own `forward_to` (the source's door), never to the target's fenced app. A source that forwarded since the commit
    holds again and is pointed back at its own app: the cut-over's undo releases it once the source takes writes."""
    forwarded = bool(_saved_by(ctx, None, FORWARDED))
    source = section(ctx, "source")
    if forwarded and source is not None:
        front = door(ctx, "source")
        assert front is not None
        try:
            front.hold(ROLLBACK_HOLD)
            front.repoint(source.app.address, source.app.port)
        except (HaproxyError, ValueError) as exc:
            raise _fail(ctx, "source", "pointing it back at its own app", exc) from None
        ctx.save(FORWARDED, None)
        ctx.log.info("frontdoor.source_forwarding_ended")
    config = section(ctx, "target")
    if config is None or not (ctx.saved(TARGET_HOLD) or forwarded or ctx.saved(OWN_APP)):
        return
    front = door(ctx, "target")
    assert front is not None
    try:
        front.repoint(config.forward_to.address, config.forward_to.port)
        front.release()
    except (HaproxyError, ValueError) as exc:
        raise _fail(ctx, "target", "sending its requests back to the source", exc) from None
    ctx.save(TARGET_HOLD, None)
    if ctx.saved(OWN_APP):
        ctx.save(OWN_APP, None)
    ctx.log.info("frontdoor.target_forwarding_to_source")


# --- finish: the forwarding's figures ----------------------------------------------------------------------------


def _requests(front: FrontDoor) -> int:
    """HTTP requests the frontend received since HAProxy started (`show stat` req_tot)."""
    return requests_of(front.ask("show stat"), front.frontend)


def forwarding_until(ctx: StepContext) -> float | None:
    """Until when the source must keep forwarding: the commit plus the records' TTL (what a resolver may still
    answer with the old address) plus the plan's margin. The door keeps forwarding after the run; this is the
    earliest moment the source may be taken down."""
    config = section(ctx, "source")
    flip = DnsFlipResult.of(ctx.output("dns_flip"))
    if config is None or flip.flipped_at is None:
        return None
    ttl = max((AUTOMATIC_TTL_SECONDS if r.ttl == 1 else int(r.ttl or 0) for r in flip.old), default=0)
    return round(float(flip.flipped_at) + ttl + config.forward_margin, 3)


def forwarding_report(ctx: StepContext, *, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Make sure the source forwards (a door that could not be told at the commit), and count the requests that
    still arrived at the old address since the commit.

    With the source's `wait_forwarding`, wait until forwarding is no longer due first (the commit plus the records'
    TTL plus `forward_margin`; a resumed finish waits only what is left), and count apart the requests that came
    after the TTL had run out: clients or resolvers that keep an answer longer than its TTL, which a source taken
    down at that moment would have failed."""
    config = section(ctx, "source")
    if config is None or not engaged(ctx):
        return {}
    front = door(ctx, "source")
    assert front is not None
    if not forward_to_target(ctx):
        raise StepError("the source's front door could not be pointed at the target: see the log line above")
    since = _saved_by(ctx, None, FORWARDED) or {}
    until = forwarding_until(ctx)
    report: dict[str, Any] = {"forwarded_to": since.get("to"), "forwarding_until": until}
    if config.wait_forwarding and until is not None:
        ttl_out = until - config.forward_margin
        _wait_until(ctx, ttl_out, "the records' TTL runs out", sleep)
        at_ttl = _count(ctx, front)
        _wait_until(ctx, until, f"forward_margin {config.forward_margin:g} s more", sleep)
        report["requests_after_ttl"] = max(_count(ctx, front) - at_ttl, 0)
        report["forwarding_waited"] = True
    now = _count(ctx, front)
    counted = since.get("requests")
    report["requests_at_old_address"] = max(now - int(now if counted is None else counted), 0)
    ctx.log.info(
        "frontdoor.requests_at_old_address",
        requests=report["requests_at_old_address"],
        after_ttl=report.get("requests_after_ttl"),
        forwarded_to=since.get("to"),
        until=until,
    )
    return report


def _count(ctx: StepContext, front: FrontDoor) -> int:
    try:
        return _requests(front)
    except (HaproxyError, ValueError) as exc:
        raise _fail(ctx, "source", "reading its request count", exc) from None


def _wait_until(ctx: StepContext, moment: float, what: str, sleep: Callable[[float], None]) -> None:
    """Sleep until `moment` (unix seconds, the orchestrator's clock), saying so once."""
    left = moment - time.time()
    if left <= 0:
        return
    ctx.log.info("frontdoor.forwarding_wait", until=_clock(moment), seconds=round(left, 1), until_what=what)
    while (left := moment - time.time()) > 0:
        sleep(min(left, 5.0))
