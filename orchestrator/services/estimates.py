"""What a migration would move and how long it would take, measured read-only on the real hosts.

Bytes and files come from rsync itself (`--dry-run --stats` of the very command each pre-sync runs, on the source
against the target), the database's size from information_schema, the rate from the plan's bwlimit or a short
bounded read of the source's largest datadir file. The window is predicted part by part: what can be measured
without blocking the source is measured (the final passes cost about what a dry-run's comparison of the same trees
costs, since their delta is small), the rest is an assumption the report names as such.

Nothing here changes either host: rsync runs with --dry-run, the rest are reads.
"""

from __future__ import annotations

import functools
import re
import shlex
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from orchestrator.contracts import StepRuntime, Which
from orchestrator.database.protocol import DatabaseError
from orchestrator.plan.model import Plan
from orchestrator.transports import rsync

# Assumptions for the parts of the window a read-only rehearsal cannot time (NOTES: a lab datadir's clean shutdown
# took about 1.5 s, a start about 0.25 s): `migrate rehearse` on the target times them for real.
ASSUMED_SHUTDOWN_SECONDS = 2.0
ASSUMED_START_SECONDS = 1.0
READ_SAMPLE_BYTES = 64 * 1024 * 1024
READ_SAMPLE_SECONDS = 10
_UNITS = {"": 1024, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}


@dataclass(frozen=True)
class TransferEstimate:
    step: str
    name: str
    bytes: int
    files: int
    total_size: int
    scan_seconds: float  # the dry-run's own time: listing and comparing both sides
    predicted_seconds: float


@dataclass(frozen=True)
class WindowPart:
    name: str
    seconds: float
    basis: str  # "measured: ..." or "assumed: ..."
    step: str = ""  # the step of the run that does this part ("" when unnamed)
    beside: str = ""  # the step this part runs beside (its time overlaps that step's): the longer of them counts


def beside_text(part: WindowPart) -> str:
    return f"; beside {part.beside}: the longer of the two counts" if part.beside else ""


def window_span(parts: list[WindowPart]) -> float:
    """The window the parts make: in sequence they add up, a part that runs beside another step counts only where
    it outlasts it (the replicate mode's uploads delta runs beside the switch: the longer of the two)."""
    steps = {part.step for part in parts if part.step}
    total = 0.0
    for part in parts:
        if part.beside and part.beside in steps:
            continue
        alongside = [p.seconds for p in parts if p.beside and p.beside == part.step]
        total += max([part.seconds, *alongside])
    return round(total, 3)


class EstimatedMode(Protocol):
    """What an estimate asks of the cut-over mode it predicts (steps/modes: each mode answers for itself; the
    arithmetic of each stays here, beside the unit costs it counts in)."""

    name: str

    def database_transfer(self, rt: StepRuntime) -> TransferEstimate: ...
    def window_shell(self, host: Any) -> bool: ...
    def health_rounds(self, rt: StepRuntime) -> tuple[list[float], str]: ...
    def datadir_delta(self, rt: StepRuntime) -> tuple[int, float]: ...
    def window_parts(self, basis: WindowBasis) -> list[WindowPart]: ...
    def measure_compare(self, rt: StepRuntime) -> tuple[float, int] | None: ...
    def before_parts(self, units: UnitCosts, plan: Plan, compare: tuple[float, int] | None) -> list[WindowPart]: ...


@dataclass
class Estimate:
    transfers: list[TransferEstimate] = field(default_factory=list)
    rate_bytes_per_second: float = 0.0
    rate_basis: str = ""
    database_bytes: int | None = None
    window: list[WindowPart] = field(default_factory=list)
    mode: str = "shutdown"  # the cut-over mode the window was predicted for
    units: dict[str, Any] = field(default_factory=dict)  # the unit costs measured (UnitCosts), for the record
    before: list[WindowPart] = field(default_factory=list)  # steps before the window without a transfer of their own
    measured_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    @property
    def window_seconds(self) -> float:
        return window_span(self.window)

    def bytes_of(self, step: str) -> int:
        return sum(t.bytes for t in self.transfers if t.step == step)

    def as_dict(self) -> dict[str, object]:
        return {
            "transfers": [asdict(t) for t in self.transfers],
            "rate_bytes_per_second": self.rate_bytes_per_second,
            "rate_basis": self.rate_basis,
            "database_bytes": self.database_bytes,
            "window": [asdict(part) for part in self.window],
            "before": [asdict(part) for part in self.before],
            "window_seconds": self.window_seconds,
            "mode": self.mode,
            "units": self.units,
            "measured_at": self.measured_at,
        }


def bwlimit_bytes(value: str) -> float:
    """rsync's --bwlimit value as bytes per second (a bare number is KiB; suffixes as rsync reads them)."""
    match = re.match(r"^([0-9.]+)([A-Za-z]?)", value)
    if not match:
        raise ValueError(f"not a rate: {value}")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit and unit not in _UNITS:
        raise ValueError(f"not a rate: {value}")
    decimal = value.lower().endswith("b") and not value.lower().endswith("ib") and unit not in ("", "b")
    return number * (1000 ** "bkmgtp".index(unit) if decimal else _UNITS[unit])


_DD = re.compile(r"^(\d+) bytes .* copied, ([\d.,]+) s", re.MULTILINE)


def parse_read_rate(output: str) -> float | None:
    """dd's summary line → bytes per second (None when it read nothing)."""
    match = _DD.search(output)
    if not match:
        return None
    copied, seconds = int(match.group(1)), float(match.group(2).replace(",", "."))
    return copied / seconds if copied and seconds > 0 else None


def read_rate_command(directory: str) -> str:
    """Read up to READ_SAMPLE_BYTES of the largest file under `directory`, bypassing the page cache when the
    filesystem allows (iflag=direct), bounded in time; dd's summary on stdout."""
    limit = READ_SAMPLE_BYTES // (1024 * 1024)
    return (
        f"f=$(find {shlex.quote(directory)} -type f -printf '%s %p\\n' 2>/dev/null | sort -rn | head -n 1 "
        "| cut -d' ' -f2-); [ -n \"$f\" ] || exit 0; "
        f'timeout {READ_SAMPLE_SECONDS} dd if="$f" of=/dev/null bs=1M count={limit} iflag=direct 2>&1 '
        f'|| timeout {READ_SAMPLE_SECONDS} dd if="$f" of=/dev/null bs=1M count={limit} 2>&1'
    )


def _dry_run(rt: StepRuntime, command: str, what: str) -> tuple[rsync.Stats, float]:
    started = time.monotonic()
    stats = rsync.push(rt.source, command, what=f"{what} (dry-run)", retry=rt.plan.retry)
    return stats, round(time.monotonic() - started, 3)


def measure_transfers(rt: StepRuntime, mode: EstimatedMode) -> list[TransferEstimate]:
    """rsync --dry-run --stats of every pre-sync, as the steps will run it (predicted_seconds filled later); in the
    replicate mode the database travels as the seed instead: its size as mariadb-backup would stream it."""
    plan = rt.plan
    found: list[TransferEstimate] = []
    for tree in plan.files:
        # The tree's own pre-sync command (common.tree_push_command, live) with rsync's --dry-run.
        command = rsync.push_command(
            plan, tree.source, tree.target, exclude=tree.exclude, live=True, chown=tree.owner, extra=["--dry-run"]
        )
        stats, seconds = _dry_run(rt, command, f"tree {tree.name}")
        found.append(TransferEstimate("files_presync", tree.name, stats.transferred_bytes, stats.files_transferred,
                                      stats.total_size, seconds, 0.0))  # fmt: skip
    found.append(mode.database_transfer(rt))
    return found


def datadir_estimate(rt: StepRuntime) -> TransferEstimate:
    """The shutdown mode's datadir pre-sync, as db_presync runs it (live, in place), with rsync's --dry-run."""
    plan = rt.plan
    db = plan.database
    datadir = rsync.push_command(
        plan,
        db.source.datadir,
        db.target.datadir,
        exclude=rsync.DATADIR_EXCLUDES,
        live=True,
        inplace=True,
        extra=["--dry-run"],
    )
    stats, seconds = _dry_run(rt, datadir, "datadir")
    return TransferEstimate("db_presync", "datadir", stats.transferred_bytes, stats.files_transferred,
                            stats.total_size, seconds, 0.0)  # fmt: skip


def seed_size_command(datadir: str) -> str:
    """Run on the source: bytes and files of what mariadb-backup streams (the datadir without binlogs, relay logs,
    the redo log and ibtmp1, as database.mysql.seed.seed_size_command counts it), on two lines."""
    quoted = shlex.quote(datadir.rstrip("/"))
    excluded = ("*.[0-9][0-9][0-9][0-9][0-9][0-9]", "*.index", "ib_logfile*", "ibtmp*")
    names = " ".join(f"! -name {shlex.quote(pattern)}" for pattern in excluded)
    total = "awk '{s += $1; n += 1} END {printf \"%.0f\\n%.0f\\n\", s, n}'"
    return f"find {quoted} -type f {names} -printf '%s\\n' | {total}"


def parse_seed_size(output: str) -> tuple[int, int]:
    """seed_size_command's two lines → (bytes, files)."""
    lines = output.split()
    if len(lines) < 2 or not lines[0].isdigit() or not lines[1].isdigit():
        raise ValueError(f"unexpected answer from the seed's size: {output[:80]!r}")
    return int(lines[0]), int(lines[1])


def seed_estimate(rt: StepRuntime) -> TransferEstimate:
    """The seed: the whole datadir (but its logs) streams, whatever the target holds; the listing's time stands in
    for the comparison a dry-run would make."""
    started = time.monotonic()
    output = rt.source.run(seed_size_command(rt.plan.database.source.datadir), timeout=600).stdout
    size, files = parse_seed_size(output)
    return TransferEstimate("repl_seed", "seed", size, files, size, round(time.monotonic() - started, 3), 0.0)


def database_bytes(rt: StepRuntime) -> int | None:
    conn = rt.db("source", retry=False, read_timeout=60.0)
    try:
        return rt.database.data_bytes(conn)
    finally:
        rt.release(conn)


def predict(transfers: list[TransferEstimate], rate: float) -> list[TransferEstimate]:
    """Each transfer's duration: its comparison (the dry-run's time) plus its bytes at the rate."""
    return [
        TransferEstimate(
            t.step,
            t.name,
            t.bytes,
            t.files,
            t.total_size,
            t.scan_seconds,
            round(t.scan_seconds + t.bytes / rate, 3) if rate > 0 else t.scan_seconds,
        )
        for t in transfers
    ]


@dataclass(frozen=True)
class UnitCosts:
    """What one operation of the window costs on these hosts now, measured read-only just before: the window's parts
    are counted in these (WINDOW_OPERATIONS), so a loaded host's slow SSH sessions show in the prediction instead of
    a constant that held on a quiet one."""

    ssh_source: float  # one short command on the source, as the window runs it (a new session, or the kept shell)
    ssh_target: float
    ssh_how: str  # "new session" or "kept shell"
    rsync_pass: float  # one rsync over the source→target hop with an empty file list: the tracked pass's floor
    sql: float
    dns: float
    haproxy: float  # one runtime-API command to the source's front door (0 without one)
    health: float  # every health check once, side by side (the slowest), on an idle app: the quickest round
    health_basis: str
    tracked: bool  # the trees' final pass copies only the tracked changes (inotifywait on the source)
    ssh_new_source: float = 0.0  # one command through a new session (before the window nothing is kept open)
    ssh_new_target: float = 0.0
    request: float = 0.0  # one round of the checks on the live app as it serves (the median round)
    datadir_delta_bytes: int = 0  # what the final datadir pass would copy (shutdown mode)
    rate: float = 0.0  # bytes per second the transfers move at
    hash_rate: float = 0.0  # bytes per second the source checksums a datadir file at now (rsync's delta, cksum)
    target_start: float | None = None  # the target's own start (database and services), when a rehearsal timed it
    target_start_basis: str = ""
    shutdown: float = ASSUMED_SHUTDOWN_SECONDS  # the source database's own clean shutdown
    shutdown_basis: str = "assumed: a clean shutdown"
    start_work: float = ASSUMED_START_SECONDS  # the target's database and services' own start, past the commands
    start_basis: str = "assumed: database and services start"


# How many operations each part of the window makes, as the steps make them (counted in steps/cutover.py, db_final.py,
# files_final.py, start_target.py, verify_target.py, dns_flip.py, repl_switch.py and frontdoor.py, and checked
# against real runs with bench/window_profile.py): commands on each host in sequence, SQL statements, HAProxy
# runtime-API exchanges (each one round trip on the door's kept connection, a batch of commands on one line
# included), DNS API calls per record. Commands a step runs side by side count once.
SHUTDOWN_CUTOVER = {"ssh_source": 3, "sql": 8, "haproxy": 4}  # + the fence; the guard's marker, the stop, the
# wait for InnoDB's files to be released; the door: the target's read, what the hold needs (one batch), the hold
# with the requests in flight (one batch), the drain's poll
DB_FINAL = {"ssh_source": 1, "ssh_target": 1, "ssh_both": 1}  # changed-file list, mtimes, checksums on both sides
FILES_FINAL_TRACKED = {"ssh_source": 1}  # per tree: the change list with its trust probe (one command); the rsync
FLIP = {"dns_per_record": 5, "haproxy": 11}  # find, edit, read back, two converging reads; + the target's fence lift
# The commit at the source's front door (switch_traffic), driven from the source host
# (orchestrator/services/source_commit.py): one command checks the hold on the door's local socket, tells the guard,
# records the commit, lifts the target's fence over the hosts' hop and repoints and releases the door (the target's
# door released beside it). No DNS call: it comes after.
DOOR_COMMIT = {"ssh_source": 1}
# read_only with the final position (one compound statement), the replica's wait with its promotion (one more); the
# hold with the requests in flight (one batch), the drain's poll. + the fence (beside read_only: counted in full
# here); + the drain of the writes in flight.
SWITCH = {"sql": 2, "haproxy": 2}
# With a front door the source drives it (services/source_commit.hold_and_fence_script): the hold, the drain of the
# writes in flight (looked at every 2 ms there) and the fence are one command on the source; then read_only and the
# promotion (the positions verify_target reads go beside the promotion).
DOOR_SWITCH = {"ssh_source": 1, "sql": 2}
VERIFY_SQL = 1  # each side's position, side by side, on a spare connection opened before the window


_OPERATION = {
    "ssh_source": "command(s) on the source",
    "ssh_target": "on the target",
    "ssh_both": "on both side by side",
    "sql": "SQL statement(s)",
    "haproxy": "HAProxy command(s)",
}


def _ssh_part(name: str, count: Mapping[str, float], units: UnitCosts) -> tuple[float, str]:
    seconds = (
        count.get("ssh_source", 0) * units.ssh_source
        + count.get("ssh_target", 0) * units.ssh_target
        + count.get("ssh_both", 0) * max(units.ssh_source, units.ssh_target)
        + count.get("sql", 0) * units.sql
        + count.get("haproxy", 0) * units.haproxy
    )
    what = ", ".join(f"{int(v)} {_OPERATION[k]}" for k, v in count.items() if v)
    return seconds, f"{what} at the measured round trips ({units.ssh_how})" if what else name


@dataclass(frozen=True)
class WindowBasis:
    """What every mode's window is predicted from: the plan's shape, the unit costs, the trees' scan (their dry-run
    comparison), and the parts every mode shares: the uploads' delta, the health checks' round."""

    shape: PlanShape
    units: UnitCosts
    trees_scan: float
    uploads: WindowPart
    health: str  # the health checks' basis, in words

    def commit(self, source_commands: int) -> WindowPart:
        """The commit: the DNS flip (`source_commands`: on the source besides), or the front door's switch."""
        shape, units = self.shape, self.units
        flip_count = {"ssh_target": 1 if shape.target_fence else 0,
                      "haproxy": FLIP["haproxy"] * (1 if shape.front_door else 0)}  # fmt: skip
        if source_commands:
            flip_count["ssh_source"] = source_commands
        flip_seconds, flip_basis = _ssh_part("DNS flip", flip_count, units)
        dns_calls = FLIP["dns_per_record"] * shape.records
        dns = WindowPart("DNS flip", round(flip_seconds + dns_calls * units.dns, 3),
                         f"measured: {dns_calls} DNS API calls and {flip_basis}", "dns_flip")  # fmt: skip
        if shape.front_door:
            # The commit is made at the source's front door; DNS moves after the window.
            commit_seconds, commit_basis = _ssh_part("commit", DOOR_COMMIT, units)
            dns = WindowPart("commit at the front door", round(commit_seconds, 3),
                             f"measured: {commit_basis}; DNS flips after the window", "switch_traffic")  # fmt: skip
        return dns


def predict_window(transfers: list[TransferEstimate], units: UnitCosts, *, plan_shape: PlanShape,
                   mode: EstimatedMode) -> list[WindowPart]:  # fmt: skip
    """The window's parts, each named after the step that does it, each the operations that step makes at the unit
    costs measured on the hosts: what every mode shares here, the mode's own parts from it (shutdown_window,
    replicate_window)."""
    shape = plan_shape
    trees_scan = sum(t.scan_seconds for t in transfers if t.step == "files_presync")
    if units.tracked:
        per_tree, _ = _ssh_part("", FILES_FINAL_TRACKED, units)
        uploads_seconds = shape.trees * (per_tree + units.rsync_pass)
        uploads_basis = (
            f"measured: per tree, {FILES_FINAL_TRACKED['ssh_source']} command(s) on the source and one rsync of the "
            f"tracked changes ({units.rsync_pass:.2f} s for an empty list)"
        )
    else:
        uploads_seconds = trees_scan + units.ssh_target
        uploads_basis = "measured: the trees' dry-run comparison (no change tracker on the source: a full scan)"
    uploads = WindowPart("uploads delta", round(uploads_seconds, 3), uploads_basis, "files_final")
    health = f"measured: the health checks once ({units.health_basis})"
    return mode.window_parts(WindowBasis(shape, units, trees_scan, uploads, health))


def replicate_window(basis: WindowBasis) -> list[WindowPart]:
    """The replicate mode's window: no database stops or copies inside it; the switch waits for the replica's last
    transactions, and the target's database and services already run (nothing starts)."""
    shape, units = basis.shape, basis.units
    if shape.front_door:
        switch_count: dict[str, float] = dict(DOOR_SWITCH)
    else:
        switch_count = {"ssh_source": 1 if shape.source_fence else 0, "sql": SWITCH["sql"]}
    switch_seconds, switch_basis = _ssh_part("switch", switch_count, units)
    # The writes in flight when the source's front door begins holding must end before the fence: about one
    # request's time (looked at on the source itself, every 2 ms).
    drain = units.request if shape.front_door else 0.0
    return [
        WindowPart("fence, drain, read_only, the replica's last transactions and its promotion",
                   round(switch_seconds + drain, 3), f"measured: {switch_basis}; the drain about one request",
                   "repl_switch"),
        replace(basis.uploads, beside="repl_switch"),  # it starts once the fence is up, beside the promotion
        WindowPart("verify", round(max(units.health, VERIFY_SQL * units.sql), 3), basis.health, "verify_target"),
        basis.commit(source_commands=0),
    ]  # fmt: skip


def shutdown_window(basis: WindowBasis) -> list[WindowPart]:
    """The shutdown mode's window: the source's database stopped under the lock, its datadir's delta copied, the
    target started; the DNS flip tells the cut-over's guard of the commit (one command on the source)."""
    shape, units, trees_scan = basis.shape, basis.units, basis.trees_scan
    fence_source = 1 if shape.source_fence else 0
    fence_target = 1 if shape.target_fence else 0
    haproxy_scale = 1 if shape.front_door else 0
    cut_count = {**SHUTDOWN_CUTOVER, "haproxy": SHUTDOWN_CUTOVER["haproxy"] * haproxy_scale}
    cut_count["ssh_source"] += fence_source
    cut_seconds, cut_basis = _ssh_part("cutover", cut_count, units)
    db_seconds, db_basis = _ssh_part("db_final", DB_FINAL, units)
    # rsync's delta transfer reads and checksums each changed file on both hosts, then the pass's verification
    # checksums them again (both hosts side by side): three reads at the checksum rate measured on the source.
    delta = units.datadir_delta_bytes / units.hash_rate if units.hash_rate > 0 else 0.0
    start_commands = (fence_target + 1 + shape.target_services) * units.ssh_target
    if units.target_start is not None:
        start = WindowPart("target start", round(units.target_start, 3), units.target_start_basis, "start_target")
    else:
        start = WindowPart(
            "target start", round(start_commands + units.start_work, 3),
            f"measured: {fence_target + 1 + shape.target_services} commands on the target ({units.ssh_how}); "
            f"{units.start_basis}, {units.start_work:.2f} s",
            "start_target",
        )  # fmt: skip
    verify_trees = shape.trees * units.rsync_pass if units.tracked else trees_scan
    return [
        WindowPart("fence, lock and the source's shutdown", round(cut_seconds + units.shutdown, 3),
                   f"measured: {cut_basis}; {units.shutdown_basis}, {units.shutdown:.2f} s", "cutover"),
        WindowPart("final datadir pass", round(db_seconds + units.rsync_pass + 3 * delta, 3),
                   f"measured: {db_basis}, one rsync, {size_text(units.datadir_delta_bytes)} the live server "
                   f"changed lately checksummed three times at {size_text(units.hash_rate)}/s", "db_final"),
        basis.uploads,
        start,
        WindowPart("verify", round(max(units.health, verify_trees, VERIFY_SQL * units.sql), 3),
                   f"{basis.health}, side by side with the trees' checksums of the tracked paths", "verify_target"),
        basis.commit(source_commands=1),
    ]  # fmt: skip


@dataclass(frozen=True)
class PlanShape:
    """What of the plan sets how many operations the window makes."""

    trees: int
    records: int
    target_services: int
    source_fence: bool
    target_fence: bool
    front_door: bool

    @classmethod
    def of(cls, plan: Plan) -> PlanShape:
        return cls(
            trees=len(plan.files),
            records=len(plan.dns.records),
            target_services=len(plan.services.target),
            source_fence=plan.services.fence.enable is not None,
            target_fence=plan.services.target_fence.enable is not None,
            front_door=plan.proxy is not None and plan.proxy.source is not None,
        )


def _median(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 2]


def _timed(action: Callable[[], object]) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


ROUND_TRIP_SAMPLES = 3
# Files every clean shutdown rewrites (InnoDB's system tablespace and redo log, Aria's log and control file): the
# final pass copies them whatever the load.
SHUTDOWN_WRITES = ("ibdata*", "ib_logfile*", "aria_log*", "undo[0-9]*")
RECENT_SECONDS = 10  # a file the live server wrote this recently is one it keeps writing: it will differ after the
# last pre-sync round (longer would count a datadir restored or bulk-loaded minutes ago as changing whole)


def delta_size_command(datadir: str) -> str:
    """Run on the source: the bytes of the datadir's files the live server wrote in the last RECENT_SECONDS or that
    a clean shutdown rewrites (what the final pass copies whole), on one line."""
    quoted = shlex.quote(datadir.rstrip("/"))
    names = " -o ".join(f"-name {shlex.quote(pattern)}" for pattern in SHUTDOWN_WRITES)
    return (
        f"find {quoted} -type f \\( -newermt '-{RECENT_SECONDS} seconds' -o {names} \\) -printf '%s\\n' "
        "| awk '{s += $1} END {printf \"%.0f\\n\", s}'"
    )


HASH_SAMPLE_BYTES = 32 * 1024 * 1024


def hash_rate_command(directory: str) -> str:
    """Run on the source: checksum up to HASH_SAMPLE_BYTES of the largest file under `directory`, timed by the host
    itself (no SSH round trip in the figure): '<bytes> <began> <ended>' (cksum of stdin prints its CRC and size)."""
    return (
        f"f=$(find {shlex.quote(directory)} -type f -printf '%s %p\\n' 2>/dev/null | sort -rn | head -n 1 "
        "| cut -d' ' -f2-); [ -n \"$f\" ] || exit 0; s=$(date +%s.%N); "
        f'r=$(head -c {HASH_SAMPLE_BYTES} "$f" | cksum); e=$(date +%s.%N); '
        'echo "${r#* } $s $e"'
    )


def parse_hash_rate(output: str) -> float | None:
    """hash_rate_command's line → bytes per second (None without a sample)."""
    fields = output.split()
    try:
        count, began, ended = int(fields[0]), float(fields[1]), float(fields[2])
    except (IndexError, ValueError):
        return None
    return count / (ended - began) if count and ended > began else None


def health_rounds(rt: StepRuntime, *, on_target: bool = False) -> tuple[list[float], str]:
    """Every health check, side by side as verify_target runs them, ROUND_TRIP_SAMPLES times: against the target
    where it already runs (`on_target`: the replicate mode's target serves, fenced, before the window), else the same
    checks aimed at the source (its app and database, read-only): what one round of them costs on these hosts."""
    checks = list(rt.plan.health.checks)
    if not checks:
        return [0.0], "none declared"
    if on_target:
        try:
            rounds = [_checks_once(rt, checks, "target") for _ in range(ROUND_TRIP_SAMPLES)]
            return rounds, f"{len(checks)} check(s) side by side, on the target"
        except (OSError, CheckUnanswered, DatabaseError):
            pass  # not running yet (the seed comes later): the source's answers stand for it
    rounds = [_checks_once(rt, checks, "source") for _ in range(ROUND_TRIP_SAMPLES)]
    return rounds, f"{len(checks)} check(s) side by side, aimed at the source"


class CheckUnanswered(Exception):
    pass


def _checks_once(rt: StepRuntime, checks: list[Any], where: Which) -> float:
    from orchestrator.plan.model import HttpCheck, SqlCheck

    plan = rt.plan

    def one(check: object) -> float:
        started = time.monotonic()
        if isinstance(check, HttpCheck):
            url = check.url if where == "target" else plan.aimed_at_source(check.url)
            request = urllib.request.Request(url, headers={"Host": check.host_header} if check.host_header else {})
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            try:
                with opener.open(request, timeout=check.timeout) as answer:
                    answer.read(1 << 20)
            except urllib.error.HTTPError as exc:  # an answer all the same (a fenced app's 503)
                exc.close()
            except (urllib.error.URLError, OSError) as exc:
                raise CheckUnanswered(str(exc)) from None
        elif isinstance(check, SqlCheck):
            conn = rt.db(where, retry=False, read_timeout=30.0)
            try:
                with conn.cursor() as cur:
                    cur.execute(check.query)
                    cur.fetchall()
            finally:
                rt.release(conn)
        return time.monotonic() - started

    with ThreadPoolExecutor(max_workers=len(checks)) as pool:
        return max(pool.map(one, checks))


def measure_units(rt: StepRuntime, mode: EstimatedMode, transfers: list[TransferEstimate], rate: float,
                  rehearsed: dict[str, Any] | None = None) -> UnitCosts:  # fmt: skip
    """The window's unit costs, read-only, on the hosts as they are now. The replicate mode runs the window's short
    commands in a shell kept open before it (steps/common.keep_shells): so are they measured."""
    from orchestrator.services import probes
    from orchestrator.services.tracking import final_pass_command

    plan = rt.plan
    hosts = {"source": rt.source, "target": rt.target}
    ssh: dict[str, float] = {}
    fresh: dict[str, float] = {}
    how = "new session"
    for which, host in hosts.items():
        fresh[which] = _median(
            [_timed(functools.partial(host.run, "true", timeout=60)) for _ in range(ROUND_TRIP_SAMPLES)]
        )
        ssh[which] = fresh[which]
        if mode.window_shell(host):
            how = "kept shell"
            ssh[which] = _median(
                [_timed(functools.partial(host.run, "true", timeout=60)) for _ in range(ROUND_TRIP_SAMPLES)]
            )
    tree = plan.files[0] if plan.files else None
    rsync_pass = 0.0
    if tree is not None:
        command = final_pass_command(tree.source, rsync.target_spec(plan, tree.target), "/dev/null",
                                     ssh=rsync.target_ssh_command(plan), exclude=tree.exclude,
                                     timeout=plan.transfer.rsync_timeout, whole_file=plan.transfer.whole_file,
                                     extra=["--dry-run", *rsync.remote_rsync(plan)])  # fmt: skip
        rsync_pass = _median([_timed(lambda: rsync.push(rt.source, command, what="an empty tracked pass (dry-run)",
                                                        retry=plan.retry, short=True))
                              for _ in range(ROUND_TRIP_SAMPLES)])  # fmt: skip

    def select_one() -> None:
        conn = rt.db("source", retry=False, read_timeout=30.0)
        try:
            with conn.cursor() as cur:
                for _ in range(ROUND_TRIP_SAMPLES):
                    started = time.monotonic()
                    cur.execute("SELECT 1")
                    cur.fetchall()
                    sql_samples.append(time.monotonic() - started)
        finally:
            rt.release(conn)

    sql_samples: list[float] = []
    select_one()
    client = rt.dns
    zone = client.zone_id(plan.dns.zone)  # first: the client's own set-up, which the run pays before the window
    # The median: one slow answer of a busy API would multiply into every record's part.
    dns = _median([_timed(lambda: client.find_records(zone, plan.dns.records[0], plan.dns.type))
                   for _ in range(ROUND_TRIP_SAMPLES)])  # fmt: skip
    haproxy_rtt = 0.0
    if plan.proxy is not None and plan.proxy.source is not None:
        from orchestrator.transports.haproxy import over_ssh

        door = plan.proxy.source
        front = over_ssh(rt.source, door.admin_socket, frontend=door.frontend, backend=door.backend,  # type: ignore[arg-type]  # an SshHost, see frontdoor
                         server=door.server, hold_map=door.hold_map)  # fmt: skip
        # The window's commands ride a connection opened before it: its opening is not what one of them costs.
        front.connect()
        try:
            haproxy_rtt = _median([_timed(lambda: front.ask("show info")) for _ in range(ROUND_TRIP_SAMPLES)])
        finally:
            front.close()
    # The quickest round for the checks inside the window (the app they ask serves nobody else then: its clients are
    # held or fenced), the median for a request of the live source's (the writes in flight the switch drains).
    rounds, health_basis = mode.health_rounds(rt)
    tracked = bool(plan.files) and probes.ask(rt.source, probes.has_program("inotifywait"))
    delta, hash_rate = mode.datadir_delta(rt)
    units = UnitCosts(
        ssh_source=round(ssh["source"], 4), ssh_target=round(ssh["target"], 4), ssh_how=how,
        ssh_new_source=round(fresh["source"], 4), ssh_new_target=round(fresh["target"], 4),
        rsync_pass=round(rsync_pass, 4), sql=round(_median(sql_samples), 4), dns=round(dns, 4),
        haproxy=round(haproxy_rtt, 4), health=round(min(rounds), 4), health_basis=health_basis, tracked=tracked,
        request=round(_median(rounds), 4),
        datadir_delta_bytes=delta, rate=rate, hash_rate=round(hash_rate, 1),
    )  # fmt: skip
    return with_rehearsal(units, rehearsed)


def datadir_delta(rt: StepRuntime) -> tuple[int, float]:
    """The shutdown mode's final datadir pass: the bytes the live server changed lately, and the rate the source
    checksums a datadir file at now."""
    datadir = rt.plan.database.source.datadir
    output = rt.source.run(delta_size_command(datadir), timeout=120).stdout.strip()
    timed = rt.source.run(hash_rate_command(datadir), timeout=60, check=False).stdout
    return int(output) if output.isdigit() else 0, parse_hash_rate(timed) or 0.0


def with_rehearsal(units: UnitCosts, rehearsed: dict[str, Any] | None) -> UnitCosts:
    """The parts a read-only estimate can only assume, from what `migrate rehearse --for-real` timed on the target
    (its start on a copy of the data, its clean shutdown of that copy, its health checks), when one ran."""
    if not rehearsed:
        return units
    stages = rehearsed.get("stages") or {}
    when = rehearsed.get("measured_at", "?")
    changes: dict[str, Any] = {}
    if "target start (fenced)" in stages:
        changes["target_start"] = float(stages["target start (fenced)"])
        changes["target_start_basis"] = f"measured: the rehearsal of {when} started the target on a copy"
    if "health checks" in stages:
        changes["health"] = float(stages["health checks"])
        changes["health_basis"] = f"the rehearsal of {when} checked the target it started"
    if "target stop" in stages:
        changes["shutdown"] = float(stages["target stop"])
        changes["shutdown_basis"] = f"measured: the rehearsal of {when} stopped the target's copy cleanly"
    return replace(units, **changes)


# What preflight does, counted as for the window (bench/window_profile.py on the lab): commands on each host in
# sequence (new sessions: nothing is kept open yet), SQL statements, DNS API calls, and the storage preflight's
# fsync samples, one host after the other, each at most preflight.fsync_seconds. (+1 command per host since: the
# paths resolved; +2 statements: the lab's app account read with SHOW GRANTS on each of its two hosts' rows.)
PREFLIGHT = {"ssh_source": 21, "ssh_target": 17, "sql": 32}
PREFLIGHT_DNS = 2  # the zone, then each record


def predict_before(units: UnitCosts, *, plan: Plan, mode: EstimatedMode, records_ttl: int | None,
                   compare: tuple[float, int] | None) -> list[WindowPart]:  # fmt: skip
    """The steps before the window that move nothing of their own, at the unit costs measured (new sessions:
    before the window no shell is kept open)."""
    fresh = replace(units, ssh_source=units.ssh_new_source, ssh_target=units.ssh_new_target, ssh_how="new session")
    seconds, basis = _ssh_part("preflight", PREFLIGHT, fresh)
    fsync = 2 * plan.preflight.fsync_seconds
    dns_calls = PREFLIGHT_DNS + len(plan.dns.records)
    parts = [
        WindowPart("the checks", round(seconds + dns_calls * units.dns + fsync, 3),
                   f"measured: {basis}, {dns_calls} DNS API calls; the fsync samples at most {fsync:g} s", "preflight"),
    ]  # fmt: skip
    lower = plan.dns.lower_ttl_to
    if lower is None:
        parts.append(WindowPart("nothing to lower", 0.0, "dns.lower_ttl_to unset: the step changes nothing",
                                "lower_ttl"))  # fmt: skip
    else:
        calls = 2 * len(plan.dns.records)  # each record read, then its TTL edited
        wait = plan.dns.lower_ttl_wait if plan.dns.lower_ttl_wait is not None else records_ttl
        waits = (f"; the cut-over then waits out the old TTL, {wait:g} s after it (the pre-syncs meanwhile)"
                 if wait else "")  # fmt: skip
        parts.append(WindowPart("the TTLs lowered", round(calls * units.dns, 3),
                                f"measured: {calls} DNS API calls{waits}", "lower_ttl"))  # fmt: skip
    return parts + mode.before_parts(units, plan, compare)


def catchup_part(units: UnitCosts, plan: Plan, compare: tuple[float, int] | None) -> WindowPart:
    """The replicate mode's step before the window that moves nothing of its own: the comparison, the checks, the
    trees' tracked pre-pass and the lag gate (`compare`: one chunk's checksum and how many chunks, measured)."""
    keep = units.ssh_new_source + units.ssh_new_target
    trees = len(plan.files) * units.rsync_pass if units.tracked else 0.0
    if compare is not None:
        chunk_seconds, chunks = compare
        pause = plan.replication.compare_pause if plan.replication else 0.0
        # compare_tables checksums each chunk on the source, then on the replica, and finds its bounds first.
        compared = chunks * chunk_seconds * 3 * (1 + pause)
        what = (f"{chunks} chunk(s) of replication.chunk_rows, each {chunk_seconds * 1000:.0f} ms to checksum "
                "on the source now, on both sides")  # fmt: skip
    else:
        compared, what = 0.0, "no comparison (replication.compare off)"
    return WindowPart(
        "the comparison, the health checks, the trees' tracked pre-pass, the lag gate",
        round(compared + units.request + trees + keep, 3),
        f"measured: {what}; the checks' median round; the lag gate assumed passed at once (the replica "
        "caught up)", "repl_catchup",
    )  # fmt: skip


def measure_compare(rt: StepRuntime) -> tuple[float, int] | None:
    """What the replicate mode's comparison costs: one chunk's checksum on the largest table of the plan's schemas,
    and how many chunks every table makes (the server's row estimates), read-only on the source
    (`Replication.compare_cost`)."""
    plan = rt.plan
    found = rt.database.replication()
    if plan.replication is None or not plan.replication.compare or found is None:
        return None
    conn = rt.db("source", retry=False, read_timeout=120.0)
    try:
        tables = rt.database.list_tables(conn, plan.database.schemas)
        if not tables:
            return 0.0, 0
        return found.compare_cost(conn, tables, plan.replication.chunk_rows)
    finally:
        rt.release(conn)


def estimate(rt: StepRuntime, mode: EstimatedMode, rehearsed: dict[str, Any] | None = None) -> Estimate:
    """The whole estimate, read-only, for the cut-over mode given (`auto` resolved by the caller); `rehearsed`: the
    last `migrate rehearse --for-real`'s figures (rehearsal.json), whose timings replace assumptions."""
    plan = rt.plan
    transfers = measure_transfers(rt, mode)
    if plan.transfer.bwlimit:
        rate, basis = bwlimit_bytes(plan.transfer.bwlimit), f"transfer.bwlimit {plan.transfer.bwlimit}"
    else:
        output = rt.source.run(read_rate_command(plan.database.source.datadir), timeout=60, check=False).stdout
        measured = parse_read_rate(output)
        rate, basis = (measured or 0.0), "measured: a bounded read of the source's largest datadir file"
    size = database_bytes(rt)
    units = measure_units(rt, mode, transfers, rate, rehearsed)
    window = predict_window(transfers, units, plan_shape=PlanShape.of(plan), mode=mode)
    before = predict_before(units, plan=plan, mode=mode, records_ttl=records_ttl(rt),
                            compare=mode.measure_compare(rt))  # fmt: skip
    return Estimate(predict(transfers, rate), round(rate, 1), basis, size, window, mode.name, asdict(units), before)


def records_ttl(rt: StepRuntime) -> int | None:
    """The longest TTL among the records the flip moves, as the API says it now (automatic: 300 s)."""
    client, plan = rt.dns, rt.plan
    zone = client.zone_id(plan.dns.zone)
    ttls = [300 if r.ttl == 1 else int(r.ttl) for name in plan.dns.records
            for r in client.find_records(zone, name, plan.dns.type)]  # fmt: skip
    return max(ttls) if ttls else None


# --- what the dry-run prints beside each step ---------------------------------------------------------------------


def size_text(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def step_lines(est: Estimate) -> dict[str, list[str]]:
    """{step name: the estimate's lines about it}: each transfer under the step that moves it, with its predicted
    duration; each part of the window under the step that does it."""
    out: dict[str, list[str]] = {}
    rate = size_text(est.rate_bytes_per_second)
    for t in est.transfers:
        what = "tree " + t.name if t.step == "files_presync" else t.name
        line = f"estimate: {what}: {size_text(t.bytes)} in {t.files} files to move (of {size_text(t.total_size)})"
        if t.step == "repl_seed":
            line = f"estimate: the seed: {size_text(t.bytes)} in {t.files} files, all of it streams"
        out.setdefault(t.step, []).append(f"{line}, about {t.predicted_seconds:.1f} s at {rate}/s")
    for step in ("files_presync", "db_presync", "repl_seed"):
        total = sum(t.predicted_seconds for t in est.transfers if t.step == step)
        if step in out and len(out[step]) > 1:
            out[step].append(f"estimate: the step's transfers about {total:.1f} s")
    for part in est.before:
        out.setdefault(part.step, []).append(f"estimate: {part.name} about {part.seconds:.1f} s ({part.basis})")
    for part in est.window:
        if part.step:
            out.setdefault(part.step, []).append(f"estimate (window): {part.name} {part.seconds:.2f} s ({part.basis})")
    return out


def summary_lines(est: Estimate) -> list[str]:
    """The estimate's own lines after the step list: the rate, the database, the predicted window part by part."""
    out = [f"rate: {size_text(est.rate_bytes_per_second)}/s ({est.rate_basis})"]
    if est.database_bytes is not None:
        out.append(f"database: {size_text(est.database_bytes)} of tables and indexes (information_schema)")
    moved = sum(t.bytes for t in est.transfers)
    live = sum(t.predicted_seconds for t in est.transfers)
    out.append(f"before the window: {size_text(moved)} to move, about {live:.1f} s of transfers")
    out.append(f"predicted window ({est.mode} mode): {est.window_seconds:.2f} s")
    out += [f"  {part.name}: {part.seconds:.2f} s ({part.basis}){beside_text(part)}" for part in est.window]
    return out


# --- the shutdown mode's forecast, before it blocks writes ----------------------------------------------------


@dataclass(frozen=True)
class ShutdownForecast:
    """The shutdown mode's window as predicted from what the run measured, against the budget it may use."""

    parts: list[WindowPart]
    budget: float  # cutover.max_write_block less the rollback's reserve: what the window's work may take
    max_write_block: float

    @property
    def seconds(self) -> float:
        return round(sum(part.seconds for part in self.parts), 3)

    @property
    def fits(self) -> bool:
        return self.seconds <= self.budget

    def summary(self) -> str:
        return ", ".join(f"{p.name} {p.seconds:.2f} s ({p.basis})" for p in self.parts)


def shutdown_forecast(
    last_round_seconds: float,
    *,
    last_round_bytes: int,
    rounds: int,
    max_write_block: float,
    reserve: float,
    shutdown_seconds: float = ASSUMED_SHUTDOWN_SECONDS,
    start_seconds: float = ASSUMED_START_SECONDS,
) -> ShutdownForecast:
    """The window the shutdown mode would block writes for: the final datadir pass costs about what the last
    pre-sync round cost (the same comparison of every file, a delta as small or smaller), plus the clean shutdown
    and the target's start (assumed unless a rehearsal timed them)."""
    parts = [
        WindowPart(
            "final datadir pass",
            round(last_round_seconds, 3),
            f"measured: the last pre-sync round, round {rounds}, {last_round_bytes} bytes moved",
        ),
        WindowPart("source database shutdown", shutdown_seconds, "assumed: a clean shutdown"),
        WindowPart("target start", start_seconds, "assumed: database and services start"),
    ]
    return ShutdownForecast(parts, round(max_write_block - reserve, 3), max_write_block)


def overrun_advice(forecast: ShutdownForecast, *, rounds: int, max_rounds: int, converged: bool,
                   replicate_possible: str | None) -> str:  # fmt: skip
    """The one line said when the forecast does not fit: what was predicted, and what would help."""
    helps = []
    if not converged or rounds < max_rounds:
        helps.append(f"more pre-sync rounds (database.presync.max_rounds, {max_rounds} now) or a quieter source")
    helps.append(
        "the replicate mode (cutover.mode: replicate, or auto with a replication section: its window does not grow "
        "with the data)" + (f"; not possible here: {replicate_possible}" if replicate_possible else "")
    )
    needed = forecast.seconds + (forecast.max_write_block - forecast.budget)
    helps.append(f"a larger budget (cutover.max_write_block ≥ {needed:.0f} s)")
    return (
        f"the shutdown mode's window is predicted at {forecast.seconds:.1f} s ({forecast.summary()}), more than the "
        f"{forecast.budget:g} s cutover.max_write_block {forecast.max_write_block:g} s leaves after the rollback's "
        f"reserve: writes were not blocked, nothing changed. What would help: " + "; ".join(helps)
    )
