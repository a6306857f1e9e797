"""What a migration would move and how long it would take, measured read-only on the real hosts.

Bytes and files come from rsync itself (`--dry-run --stats` of the very command each pre-sync runs, on the source
against the target), the database's size from information_schema, the rate from the plan's bwlimit or a short
bounded read of the source's largest datadir file. The window is predicted part by part: what can be measured
without blocking the source is measured (the final passes cost about what a dry-run's comparison of the same trees
costs, since their delta is small), the rest is an assumption the report names as such.

Nothing here changes either host: rsync runs with --dry-run, the rest are reads.
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import asdict, dataclass, field

from orchestrator.contracts import StepRuntime
from orchestrator.steps.common import DATADIR_EXCLUDES
from orchestrator.transports import rsync

# Assumptions for the parts of the window a read-only rehearsal cannot time (NOTES: a lab datadir's clean shutdown
# took about 1.5 s, a start about 0.25 s): `migrate rehearse` on the target times them for real.
ASSUMED_SHUTDOWN_SECONDS = 2.0
ASSUMED_START_SECONDS = 1.0
READ_SAMPLE_BYTES = 64 * 1024 * 1024
DNS_SAMPLES = 3
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


@dataclass
class Estimate:
    transfers: list[TransferEstimate] = field(default_factory=list)
    rate_bytes_per_second: float = 0.0
    rate_basis: str = ""
    database_bytes: int | None = None
    window: list[WindowPart] = field(default_factory=list)
    mode: str = "shutdown"  # the cut-over mode the window was predicted for
    measured_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    @property
    def window_seconds(self) -> float:
        return round(sum(part.seconds for part in self.window), 3)

    def bytes_of(self, step: str) -> int:
        return sum(t.bytes for t in self.transfers if t.step == step)

    def as_dict(self) -> dict[str, object]:
        return {
            "transfers": [asdict(t) for t in self.transfers],
            "rate_bytes_per_second": self.rate_bytes_per_second,
            "rate_basis": self.rate_basis,
            "database_bytes": self.database_bytes,
            "window": [asdict(part) for part in self.window],
            "window_seconds": self.window_seconds,
            "mode": self.mode,
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
    stats = rsync.push(rt.source, command, what=f"{what} (dry-run)", retry=rt.plan.retry)  # type: ignore[arg-type]
    return stats, round(time.monotonic() - started, 3)


def measure_transfers(rt: StepRuntime, mode: str = "shutdown") -> list[TransferEstimate]:
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
    if mode == "replicate":
        found.append(seed_estimate(rt))
        return found
    db = plan.database
    datadir = rsync.push_command(
        plan,
        db.source.datadir,
        db.target.datadir,
        exclude=DATADIR_EXCLUDES,
        live=True,
        inplace=True,
        extra=["--dry-run"],
    )
    stats, seconds = _dry_run(rt, datadir, "datadir")
    found.append(TransferEstimate("db_presync", "datadir", stats.transferred_bytes, stats.files_transferred,
                                  stats.total_size, seconds, 0.0))  # fmt: skip
    return found


def seed_size_command(datadir: str) -> str:
    """Run on the source: bytes and files of what mariadb-backup streams (the datadir without binlogs, relay logs,
    the redo log and ibtmp1, as transports.replication.seed_size_command counts it), on two lines."""
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
        with conn.cursor() as cur:
            # The user's schemas only: opening the server's own (Aria) tables would make it write their headers.
            cur.execute(
                "SELECT COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables"
                " WHERE table_schema NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')"
            )
            row = cur.fetchone()
            return int(row[0]) if row else None
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


def predict_window(transfers: list[TransferEstimate], *, sql_round_trip: float, dns_round_trip: float,
                   records: int, checks: int, mode: str = "shutdown") -> list[WindowPart]:  # fmt: skip
    """The window's parts, each named after the step that does it. The final passes compare the same trees the
    dry-runs compared, with a small delta. In the replicate mode no database stops or copies inside the window: the
    switch waits for the replica's last transactions, and the target's database already runs."""
    datadir_scan = sum(t.scan_seconds for t in transfers if t.step == "db_presync")
    trees_scan = sum(t.scan_seconds for t in transfers if t.step == "files_presync")
    sql = "measured: three SQL round trips to the source"
    dns = WindowPart("DNS flip", round(dns_round_trip * 3 * records, 3),
                     "measured: a DNS API read; edit and read back per record", "dns_flip")  # fmt: skip
    uploads = WindowPart("uploads delta", trees_scan, "measured: the trees' dry-run comparison", "files_final")
    if mode == "replicate":
        return [
            WindowPart("fence and read_only", round(sql_round_trip * 3, 3), sql, "repl_switch"),
            WindowPart("the replica's last transactions and its promotion", round(sql_round_trip * 4, 3),
                       "measured: four SQL round trips (wait, stop, reset, read_only off)", "repl_switch"),
            uploads,
            WindowPart("target start", round(sql_round_trip, 3),
                       "measured: one SQL round trip (its database and services already run)", "start_target"),
            WindowPart("verify", round(sql_round_trip * (max(checks, 1) + 2), 3),
                       "measured: one SQL round trip per check and two for the GTID positions", "verify_target"),
            dns,
        ]  # fmt: skip
    return [
        WindowPart("fence and lock", round(sql_round_trip * 3, 3), sql, "cutover"),
        WindowPart("source database shutdown", ASSUMED_SHUTDOWN_SECONDS, "assumed: a clean shutdown", "cutover"),
        WindowPart("final datadir pass", datadir_scan, "measured: the datadir's dry-run comparison", "db_final"),
        uploads,
        WindowPart("target start", ASSUMED_START_SECONDS, "assumed: database and services start", "start_target"),
        WindowPart(
            "verify",
            round(trees_scan + sql_round_trip * max(checks, 1), 3),
            "measured: the trees' comparison and one SQL round trip per check",
            "verify_target",
        ),
        dns,
    ]


def estimate(rt: StepRuntime, mode: str = "shutdown") -> Estimate:
    """The whole estimate, read-only, for the cut-over mode given (`auto` resolved by the caller)."""
    plan = rt.plan
    transfers = measure_transfers(rt, mode)
    if plan.transfer.bwlimit:
        rate, basis = bwlimit_bytes(plan.transfer.bwlimit), f"transfer.bwlimit {plan.transfer.bwlimit}"
    else:
        output = rt.source.run(read_rate_command(plan.database.source.datadir), timeout=60, check=False).stdout
        measured = parse_read_rate(output)
        rate, basis = (measured or 0.0), "measured: a bounded read of the source's largest datadir file"
    started = time.monotonic()
    size = database_bytes(rt)
    sql_round_trip = time.monotonic() - started
    client = rt.dns
    zone = client.zone_id(plan.dns.zone)  # first: the client's own set-up, which the run pays before the window
    samples = []
    for _ in range(DNS_SAMPLES):  # the median: one slow answer of a busy API would triple every record's part
        started = time.monotonic()
        client.find_records(zone, plan.dns.records[0], plan.dns.type)
        samples.append(time.monotonic() - started)
    dns_round_trip = sorted(samples)[len(samples) // 2]
    window = predict_window(transfers, sql_round_trip=sql_round_trip, dns_round_trip=dns_round_trip,
                            records=len(plan.dns.records), checks=len(plan.health.checks), mode=mode)  # fmt: skip
    return Estimate(predict(transfers, rate), round(rate, 1), basis, size, window, mode)


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
    out += [f"  {part.name}: {part.seconds:.2f} s ({part.basis})" for part in est.window]
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
