"""The guard on the source: restores the source when the run that blocked its writes is gone.

Started on the source host when the downtime window begins, as a small detached shell process that needs nothing
of the orchestrator. It lives in a directory named after the run (`guard_dir`) and reads markers there:
- `committed`: the run reached its commit point (written BEFORE the target takes writes): the guard leaves the
  source as the run left it and exits;
- `released`: the run lifted the block itself (rolled back): the guard exits;
- `db_stopped` / `read_only`: this run stopped the source database / made it read-only (written before the act).
If neither `committed` nor `released` appears by its deadline (when writes were first blocked, plus
cutover.max_write_block, plus a margin, on the source's clock), the run is gone or stuck past its budget: the guard
restores the source with the plan's own commands (a read-only database still running is restarted, which clears
read_only; a stopped one is started; the fence is lifted), writing each act to the `trace` file. A later `migrate
apply` or `migrate rollback` reads that trace (`read_trace`) and knows what it did.

Every command is idempotent on purpose: a resumed run rolling back at the same moment does the same things.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from typing import Any

from orchestrator.contracts import Host
from orchestrator.transports.ssh import TransportError

# Seconds past the budget before the guard acts: a run that is alive ends its window well within its budget.
MARGIN = 10.0
POLL = 0.5
COMMITTED, RELEASED, DB_STOPPED, READ_ONLY, TRACE = "committed", "released", "db_stopped", "read_only", "trace"


@dataclass(frozen=True)
class GuardPlan:
    """What the guard needs, all from the plan: where it lives, when it acts, and the commands it runs."""

    directory: str
    deadline: float  # epoch seconds on the source's clock
    db_start: str
    db_stop: str
    fence_off: str | None


def guard_dir(run_id: str, base: str = "/tmp") -> str:
    return f"{base.rstrip('/')}/migrate-guard-{run_id}"


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
note() {{ echo "$(date +%s.%N) $1" >> {d}/{TRACE}; }}
deadline={math.ceil(guard.deadline)}
note "guarding: acts at $deadline unless the run commits or releases the source"
while :; do
  if [ -e {d}/{COMMITTED} ]; then note "the run committed: the source is left as it is"; exit 0; fi
  if [ -e {d}/{RELEASED} ]; then note "the run released the source itself"; exit 0; fi
  [ "$(date +%s)" -ge "$deadline" ] && break
  sleep {POLL}
done
note "deadline passed with no commit and no release: restoring the source"
if [ -e {d}/{READ_ONLY} ] && [ ! -e {d}/{DB_STOPPED} ]; then
  {act("stop the read-only database (a restart clears read_only)", guard.db_stop)}
  touch {d}/{DB_STOPPED}
fi
if [ -e {d}/{DB_STOPPED} ]; then {act("start the database", guard.db_start)}; fi
{act("lift the fence", fence_off)}
note "restored"
"""


def start(host: Host, guard: GuardPlan, *, timeout: float) -> int:
    """Install and start the guard detached from our session (it outlives us); its pid."""
    d = shlex.quote(guard.directory)
    out = host.run(
        # Only the guard goes to the background (a backgrounded `cat` would read /dev/null, not the script).
        f"mkdir -p {d} && cat > {d}/guard.sh && {{ setsid nohup sh {d}/guard.sh </dev/null >/dev/null 2>&1 & "
        "echo $!; }",
        input=script(guard),
        timeout=timeout,
    ).stdout.split()
    if not out or not out[-1].isdigit():
        raise TransportError(f"the guard did not start on the source (answered {' '.join(out)[:80]!r})", False)
    return int(out[-1])


def marker_command(directory: str, name: str) -> str:
    return f"mkdir -p {shlex.quote(directory)} && touch {shlex.quote(directory)}/{name}"


def mark(host: Host, directory: str, name: str, *, timeout: float) -> None:
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
