"""The after-commit audit's shared part: what a run holds between verify_target and the audit (the target's
snapshot session, the source server's command line), how that command line is read, and how figures compare.

Row counts and checksums read every row: O(data). They stay out of the downtime window. Inside it, verify_target
only opens a consistent snapshot on the (still fenced) target, which costs one round trip, and keeps that session
open here; after the commit, the `audit` step reads it (the data exactly as migrated, whatever the target took
since) against the stopped source, which the engine starts read-only and isolated and stops again
(`Database.isolated_figures`; MariaDB's: orchestrator/database/mysql/audit.py), or, in the replicate mode, against the
read-only source in chunks (`Replication.audit_chunks`).

What is held lives in this process only, on the run's runtime (`Runtime.audit_hold`): a run resumed by another
process has no snapshot, and says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.contracts import Host
from orchestrator.database.protocol import Session

# One whole-table read per table on a stopped, otherwise idle server: generous, it is after the commit.
READ_TIMEOUT = 4 * 3600.0
TRANSACTIONAL = ("innodb", "heap")  # PostgreSQL's tables are all "heap" (MVCC, in the snapshot)


@dataclass
class ServerLaunch:
    """How the source's database server was started: its binary, arguments and user (read before the window)."""

    binary: str
    args: list[str]
    user: str | None = None


@dataclass
class Held:
    """What one run keeps between verify_target and the audit (on its runtime: `Runtime.audit_hold`)."""

    source: ServerLaunch | None = None
    snapshot: Session | None = None
    snapshot_at: float | None = None
    engines: dict[str, str] = field(default_factory=dict)


class HoldsAudit(Protocol):
    audit_hold: Held


def held(rt: HoldsAudit) -> Held:
    """What this run holds for its audit (kept by the run's runtime: it lives and dies with this process)."""
    return rt.audit_hold


def forget(rt: HoldsAudit) -> Held:
    """What was held, handed over once (the runtime keeps a fresh, empty hold)."""
    hold, rt.audit_hold = rt.audit_hold, Held()
    return hold


# --- the source server's command line ---------------------------------------------------------------------------


def parse_launch(output: str) -> ServerLaunch | None:
    """`launch_command`'s output: the user, the binary (/proc/PID/exe), then the NUL-separated command line."""
    user, _, rest = output.partition("\n")
    exe, _, cmdline = rest.partition("\n")
    args = [a for a in cmdline.split("\0") if a]
    if not args:
        return None
    binary = exe.strip()
    if not binary or binary.endswith(" (deleted)"):  # an upgraded binary: the name it was started by
        binary = args[0]
    return ServerLaunch(binary=binary, args=args[1:], user=user.strip() or None)


def launch_command(pid: int) -> str:
    return f"stat -c %U /proc/{pid} && readlink /proc/{pid}/exe; echo; cat /proc/{pid}/cmdline"


def server_pid(host: Host, pids: Iterable[int], programs: tuple[str, ...]) -> int | None:
    """Of the processes holding the datadir's files, the database server (by its binary's name, one of
    `programs`: `Database.server_programs`), else the oldest."""
    candidates = sorted(pids)
    for pid in candidates:
        out = host.run(f"readlink /proc/{pid}/exe", timeout=10.0, check=False).stdout.strip()
        if out.rsplit("/", 1)[-1].split(" ")[0] in programs:
            return pid
    return candidates[0] if candidates else None


def read_launch(host: Host, pids: Iterable[int], programs: tuple[str, ...]) -> ServerLaunch | None:
    """The command line of the server among `pids` (read before the window: a command line never goes in a
    journal)."""
    pid = server_pid(host, pids, programs)
    if pid is None:
        return None
    return parse_launch(host.run(launch_command(pid), timeout=10.0).stdout)


def differences(kind: str, source: dict[str, Any], target: dict[str, Any]) -> list[str]:
    """One line per table whose figure differs ('schema.table: row counts: source 10, target 9')."""
    lines = []
    for table, want in sorted(source.items()):
        if table not in target:
            lines.append(f"{table}: {kind}: missing on the target")
        elif target[table] != want:
            lines.append(f"{table}: {kind}: source {want}, target {target[table]}")
    return lines


def transactional(engine: str) -> bool:
    return engine in TRANSACTIONAL
