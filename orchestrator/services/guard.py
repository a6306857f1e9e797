"""The guard on the source: restores the source when the run that blocked its writes is gone.

Started on the source host when the downtime window begins, as a small detached shell process that needs nothing
of the orchestrator. It lives in a directory named after the run (`guard_dir`) and reads markers there:
- `committed`: the run reached its commit point (written BEFORE the target takes writes): the guard leaves the
  source as the run left it and exits;
- `released`: the run lifted the block itself (rolled back): the guard exits;
- `db_stopped` / `read_only`: this run stopped the source database / made it read-only (written before the act);
- `heartbeat`: touched every HEARTBEAT_INTERVAL s by the live run (`Heartbeat`, over its own SSH connection), from
  the window's start until the run's process ends; a resumed run (or `migrate rollback`) touches it again.
The guard acts only when both hold: its deadline has passed (when writes were first blocked, plus
cutover.max_write_block, plus MARGIN, on the source's clock; the backoffs between lock tries do not move it: a run
lets writes in between its tries, and a dead run has no tries left to make) AND the heartbeat
is older than HEARTBEAT_STALE s (mtime against the source's own clock: no clock offset matters). A live run that is
slow (a long rollback) keeps its heartbeat and is never raced; a dead one stops it before its budget ends, so the
guard acts by its deadline: within budget + margin. It then restores the source with the plan's own commands (a
read-only database still running is restarted, which clears read_only; a stopped one is started; the fence is
lifted), writing each act to the `trace` file. A later `migrate apply` or `migrate rollback` reads that trace
(`read_trace`) and knows what it did. A guard that leaves in peace (committed, released) deletes its directory:
only a guard that acted leaves one behind, with its trace, for the operator.

Every command is idempotent on purpose: a resumed run rolling back at the same moment does the same things.
"""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import threading
from dataclasses import dataclass
from typing import Any

from orchestrator.contracts import Host
from orchestrator.services import owned
from orchestrator.transports.ssh import TransportError

# Seconds past the budget before the guard acts: a run that is alive ends its window well within its budget.
MARGIN = 10.0
# Seconds a front door keeps holding requests past the guard's deadline: the guard's restore (a read-only database
# restarted, a stopped one started, the fence lifted) has that long before held requests reach the source. A hold
# that ran out before the guard acted would turn held requests into refusals while nobody decides.
RESTORE_ALLOWANCE = 5.0
POLL = 0.5
# The live run touches the heartbeat this often; the guard takes the run for dead once it is older than
# HEARTBEAT_STALE (several beats missed, a slow SSH round trip is not death). Below MARGIN: a run killed inside its
# budget has stopped beating long enough before the guard's deadline.
HEARTBEAT_INTERVAL = 1.0
HEARTBEAT_STALE = 8
COMMITTED, RELEASED, DB_STOPPED, READ_ONLY, TRACE = "committed", "released", "db_stopped", "read_only", "trace"
HEARTBEAT = "heartbeat"
PID = "pid"  # the guard's own pid, written as it starts (a later run tells a waiting guard from one that is gone)


@dataclass(frozen=True)
class GuardPlan:
    """What the guard needs, all from the plan: where it lives, when it acts, and the commands it runs."""

    directory: str
    deadline: float  # epoch seconds on the source's clock
    db_start: str
    db_stop: str
    fence_off: str | None
    stale: int = HEARTBEAT_STALE  # seconds without a heartbeat before the run is taken for dead


def guard_dir(owner: str, base: str) -> str:
    """The guard's directory in the run's private directory on the source (`base`, plan `run_dir`), named after its
    owner (orchestrator/services/owned.py: the plan and the run), so a later run of the plan finds a guard an earlier
    one left waiting."""
    return f"{base.rstrip('/')}/{owned.GUARD_PREFIX}{owner}"


def deadline(blocked_at: float, budget: float, source_clock_offset: float | None) -> float:
    """When the guard acts, on the source's clock (ours plus its measured offset)."""
    return blocked_at + budget + MARGIN + (source_clock_offset or 0.0)


def script(guard: GuardPlan) -> str:
    """The guard itself: a POSIX shell loop (no dependency beyond coreutils on the source)."""
    d = shlex.quote(guard.directory)
    fence_off = guard.fence_off or "true"

    def act(what: str, command: str) -> str:
        return (
            f'if sh -c {shlex.quote(command)} >>{d}/{TRACE}.out 2>&1; then note "{what}: done";'
            f' else note "{what}: FAILED (exit $?)"; fi'
        )

    return f"""#!/bin/sh
echo $$ > {d}/{PID}
note() {{ echo "$(date +%s.%N) $1" >> {d}/{TRACE}; }}
deadline={math.ceil(guard.deadline)}
stale={int(guard.stale)}
note "guarding: acts after $deadline once the run's heartbeat is $stale s old, unless the run commits or releases"
while :; do
  # Left in peace (the run committed, or released the source itself): nothing to keep, the directory goes.
  if [ -e {d}/{COMMITTED} ] || [ -e {d}/{RELEASED} ]; then rm -rf {d}; exit 0; fi
  now=$(date +%s)
  if [ "$now" -ge "$deadline" ]; then
    beat=$(stat -c %Y {d}/{HEARTBEAT} 2>/dev/null || echo 0)
    [ $((now - beat)) -ge "$stale" ] && break
  fi
  sleep {POLL}
done
note "deadline passed and no heartbeat since $beat, with no commit and no release: restoring the source"
if [ -e {d}/{READ_ONLY} ] && [ ! -e {d}/{DB_STOPPED} ]; then
  {act("stop the read-only database (a restart clears read_only)", guard.db_stop)}
  touch {d}/{DB_STOPPED}
fi
if [ -e {d}/{DB_STOPPED} ]; then {act("start the database", guard.db_start)}; fi
{act("lift the fence", fence_off)}
note "restored"
"""


def start(host: Host, guard: GuardPlan, *, timeout: float, marks: tuple[str, ...] = ()) -> int:
    """Install and start the guard detached from our session (it outlives us), the `marks` left for it first;
    its pid."""
    d = shlex.quote(guard.directory)
    marked = "".join(f"touch {d}/{shlex.quote(name)} && " for name in marks)
    private = owned.private_dir_command(guard.directory.rsplit("/", 1)[0] or "/")
    out = host.run(
        # In the run's private directory, proven the account's own first; the script replaces whatever had its name
        # (rm, then written new): what runs is what we wrote. Only the guard goes to the background (a backgrounded
        # `cat` would read /dev/null, not the script).
        f"{private} && mkdir -p -m 0700 {d} && [ ! -L {d} ] && [ -O {d} ] && touch {d}/{HEARTBEAT} && {marked}"
        f"rm -f {d}/guard.sh && cat > {d}/guard.sh && "
        f"{{ setsid nohup sh {d}/guard.sh </dev/null >/dev/null 2>&1 & "
        "echo $!; }",
        input=script(guard),
        timeout=timeout,
    ).stdout.split()
    if not out or not out[-1].isdigit():
        raise TransportError(f"the guard did not start on the source (answered {' '.join(out)[:80]!r})", False)
    return int(out[-1])


def marker_command(directory: str, name: str) -> str:
    """Leave `name` for the guard; a directory already gone means a guard already gone (it left in peace after a
    commit or a release, and took its directory with it): nobody to tell, and nothing is recreated."""
    d = shlex.quote(directory)
    return f"{{ [ ! -d {d} ] || touch {d}/{name}; }}"


def mark(host: Host, directory: str, name: str, *, timeout: float | None) -> None:
    host.run(marker_command(directory, name), timeout=timeout)


def read_trace(host: Host, directory: str, *, timeout: float = 30.0) -> list[str]:
    """What the guard wrote (empty when it never ran or the source cannot be read)."""
    try:
        out = host.run(f"cat {shlex.quote(directory)}/{TRACE} 2>/dev/null || true", timeout=timeout).stdout
    except TransportError:
        return []
    return [line for line in out.splitlines() if line.strip()]


def restored(trace: list[str]) -> bool:
    return any(line.endswith(" restored") for line in trace)


def journal_value(pid: int, guard: GuardPlan) -> dict[str, Any]:
    return json.loads(json.dumps({"pid": pid, "dir": guard.directory, "deadline": guard.deadline}))


class Heartbeat:
    """Touches the guard's heartbeat file every `interval` s over the run's SSH connection, from a daemon thread,
    until `stop` (or the process dies: then the beats stop, which is the point). A failed beat is not fatal: the
    guard waits HEARTBEAT_STALE s before taking the run for dead, and the next beat may get through."""

    def __init__(self, host: Host, directory: str, *, interval: float = HEARTBEAT_INTERVAL) -> None:
        self.host = host
        self.directory = directory
        self.interval = interval
        self.beats = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="guard-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._beat()  # the first beat before the caller goes on: the guard sees a live run from the start
        self._thread.start()
        return self

    def _beat(self) -> None:
        try:
            # `touch` without mkdir: once the guard's directory is gone, there is nobody to tell. In a session of its
            # own (an input, even empty, keeps a command out of the host's kept shell): a beat that took the kept
            # shell would send the window's next command (the fence, the commit) through a new session, one round
            # trip more on the window's path.
            self.host.run(f"touch {shlex.quote(self.directory)}/{HEARTBEAT}", timeout=HEARTBEAT_STALE - 1, input="")
            self.beats += 1
        except Exception:  # any failure: the next beat tries again
            self.failures += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._beat()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                # A beat in flight ends on its own timeout; the run's end does not wait for it.
                self._thread.join(timeout=2.0)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()


def keep_alive(rt: Any, directory: str) -> Heartbeat:
    """The run's heartbeat for the guard in `directory`, started once per process (kept on the runtime, which stops
    it when the run's process lets go of its hosts)."""
    running = getattr(rt, "heartbeat", None)
    if isinstance(running, Heartbeat) and running.alive and running.directory == directory:
        return running
    beat = Heartbeat(rt.source, directory).start()
    with contextlib.suppress(AttributeError):
        rt.heartbeat = beat
    return beat
