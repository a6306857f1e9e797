"""Benchmark: how long writes are unavailable with `migrate apply` in each cut-over mode, against the naive procedure.

    .venv/bin/python bench/cutover.py --db-size-mb 256,2048 --modes replicate,shutdown,naive
    .venv/bin/python bench/cutover.py --engine postgresql --db-size-mb 256,2048 --modes replicate,naive

For each database size, brings up a lab of that size (in a temporary directory unless --lab-dir), runs the lab's
load (clients resolving through the Cloudflare double, short DNS cache) and, one after the other under the same
load, with the source put back as the live side before each:
- replicate: `migrate apply` in cutover.mode replicate (seed, replica, compare, then a window of read_only → the
  replica's last transactions → promotion → DNS);
- shutdown: `migrate apply` in cutover.mode shutdown (pre-syncs while live, then lock, clean shutdown, final pass);
- naive: stop the service and the database, copy everything (datadir and uploads, from scratch), start on the
  target, flip DNS.
For each: the write-unavailability window seen by the clients (their longest write stall, from the load's own
records: a write's first attempt → its acknowledgement, retries and a front door's hold included; the same measure
for the three procedures), the window from the run report (writes blocked → the commit: at the front door, or
the DNS flip without one),
total time and bytes moved; then the ratios and the replicate mode's targets (≤ 0.5 s, larger size ≤ 1.2x the
smaller, naive ≥ 10x at the larger size); where each run's window went (the report's window_parts); then, for
each, the failed requests (reads, writes) and the latency p99 / max the clients saw (the lab's front door
holds requests during migrate's window instead of refusing them).
With --latency MS and/or --api-latency MS, each migrate run is made twice under the same load, one right after the
other on the same lab: with no distance, then with that one-way delay between migrate and the hosts / the Cloudflare
double (the lab's latency relay, `lab up --latency --api-latency`); the run's window, the clients' stall and each
part of the window are printed side by side, with their ratios. Several values (comma-separated) make a run at each
pair (here 20/0 and 20/250 beside 0/0):

    .venv/bin/python bench/cutover.py --db-size-mb 16 --modes replicate --latency 20 --api-latency 0,250

Run by hand; not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql

from migrate_lab import haproxy, hosts, planfile, relay
from migrate_lab import postgres as pglab
from migrate_lab.load import REQUESTS_FILE
from migrate_lab.state import HostState, LabState
from orchestrator.database.mysql import replica, switch
from orchestrator.database.pg import primitives as pg
from orchestrator.plan.loader import load_plan
from orchestrator.report.build import render_report
from orchestrator.runtime import Runtime
from orchestrator.transports import rsync
from orchestrator.transports.cloudflare import DnsClient

MIGRATE = Path(sys.executable).with_name("migrate")
# How long a client waits for an answer: longer than the lab plan's write-block budget, so a request the front door
# holds is answered, not abandoned (the same clients for both procedures).
HTTP_TIMEOUT = 90.0


@dataclass
class Outcome:
    name: str
    total_seconds: float
    client_window_seconds: float | None  # the clients' longest write stall: first attempt → acknowledgement
    blocked_seconds: float | None  # writes blocked → the commit (the procedure's own clock)
    bytes_moved: int | None
    writes_acked: int
    write_attempts_failed: int
    bytes_in_window: int | None = None  # what travelled while writes were blocked
    parts: dict[str, float] | None = None  # the report's window_parts: each step's share of the window
    slowest: str | None = None  # the slowest request the clients sent, and during which step it began
    window_stall_seconds: float | None = None  # the clients' longest write stall among writes that met the window
    distance: tuple[float, float] = (0.0, 0.0)  # one-way ms between migrate and the hosts, and the API

    def projected_window(self, link_mbit: float) -> float | None:
        """The clients' window if the bytes moved inside it crossed a real link instead of loopback."""
        if self.client_window_seconds is None or self.bytes_in_window is None:
            return None
        return self.client_window_seconds + self.bytes_in_window * 8 / (link_mbit * 1e6)


def run_bin(host: HostState, script: str) -> None:
    subprocess.run([str(host.bin_dir / script)], check=True, capture_output=True, timeout=600)


def point_dns(state: LabState, address: str) -> None:
    with DnsClient(state.secrets()[state.token_env], base_url=state.cf_base_url, timeout=10) as client:
        zone_id = client.zone_id(state.zone)
        for name in state.records:
            for record in client.find_records(zone_id, name, "A"):
                if record.content != address:
                    client.set_content(zone_id, record, address)


def source_writable(state: LabState) -> None:
    """After a replicate run the old source is read-only (and, while finish keeps it, a replica): undo both."""
    if state.engine == pglab.ENGINE:
        return pg_source_writable(state)
    conn = pymysql.connect(
        host=state.source.address, port=state.source.db_port, user=state.migrate_user,
        password=state.secrets()[state.db_password_env], autocommit=True, connect_timeout=10,
    )  # fmt: skip
    try:
        replica.forget_replication(conn)
        switch.set_read_only(conn, False, lock_wait_timeout=5)
    finally:
        conn.close()


def pg_source_writable(state: LabState) -> None:
    """PostgreSQL: an old source left a standby (a replicate run) is promoted on its own timeline (the target is
    seeded again by the next run), and the roles a fence marked log in again (a shutdown run's fence came back with
    the server)."""
    password = state.secrets()[state.db_password_env]
    endpoint = pg.Endpoint(state.source.address, state.source.db_port, state.migrate_user, state.db_name)
    with pg.connect(endpoint, password) as conn:
        if pg.in_recovery(conn):
            conn.execute("SELECT pg_promote(true, 60)")
        pg.unfence_marked(conn)


def source_live(state: LabState) -> None:
    """The source serves again with the data it has; the target is stopped; DNS points at the source."""
    run_bin(state.target, "app-stop")
    run_bin(state.target, "db-stop")
    run_bin(state.source, "db-start")
    run_bin(state.source, "app-start")
    run_bin(state.source, "fence-off")
    source_writable(state)
    for host in (state.source, state.target):
        if host.has_front_door:
            haproxy.reset(host)  # a migration leaves the source's front door forwarding to the target
    point_dns(state, state.source.address)
    subprocess.run(["rm", "-rf", str(state.path / ".migrate")], check=True)


@contextmanager
def load_running(state: LabState, out: Path, dns_ttl: float, rate: float):  # type: ignore[no-untyped-def]
    load = subprocess.Popen(
        [
            sys.executable, "-m", "migrate_lab.load", "--lab", str(state.path), "--duration", "3600",
            "--rate", str(rate), "--clients", "4", "--dns-ttl", str(dns_ttl), "--upload-every", "5",
            "--out", str(out), "--http-timeout", str(HTTP_TIMEOUT),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(3)  # writes flowing to the source first
        yield
        time.sleep(dns_ttl + 2)  # stale clients move over
    finally:
        load.send_signal(signal.SIGTERM)
        load.wait(timeout=60)


def client_window(out: Path) -> tuple[float | None, int, int]:
    """The clients' write unavailability: their longest write stall (a write's first attempt → its acknowledgement,
    whether it waited in a front door's hold or was refused and retried), the writes acknowledged, the attempts
    that failed. "Last write acknowledged by the source → first by the target" cannot serve: with a front door that
    holds writes and forwards them at the commit, the two are not the window's ends (it can come out negative)."""
    stats = json.loads((out / "stats.json").read_text())
    stall = stats.get("longest_write_stall_s")
    return (
        (None if stall is None else float(stall)),
        int(stats.get("writes_acked", 0)),
        int(stats.get("write_attempts_failed", 0)),
    )


def with_migrate(
    state: LabState, work: Path, dns_ttl: float, rate: float, mode: str, distance: Distance = (0.0, 0.0)
) -> Outcome:
    """One `migrate apply` under load, at this distance between migrate and the lab (the relay; none at 0/0)."""
    relay.set_distance(state, *distance)
    out = work / f"load-{mode}" if distance == NEAR else work / f"load-{mode}-far-{distance[0]:g}-{distance[1]:g}"
    planfile.write_plan(state, mode)
    started = time.monotonic()
    with load_running(state, out, dns_ttl, rate):
        result = subprocess.run(
            [str(MIGRATE), "apply", str(state.plan_file), "--yes", "--env-file", str(state.env_file)],
            capture_output=True,
            text=True,
        )
        total = time.monotonic() - started - 3
    if result.returncode != 0:
        # Said and kept in the table (a run rolled back under load is a result too); the next mode goes on.
        print(f"migrate apply failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
        window, acked, failed = client_window(out)
        name = with_distance(f"{mode} (rolled back)", distance)
        return Outcome(name, total, window, None, None, acked, failed, distance=distance)
    reports = sorted((state.path / ".migrate").glob("*/report-*.json"), key=lambda p: p.stat().st_mtime)
    report: dict[str, Any] = json.loads(reports[-1].read_text())
    print(render_report(report))
    window, acked, failed = client_window(out)
    slowest = slowest_request(out, report)
    blocked_at = (report.get("cutover") or {}).get("writes_blocked_at")
    # The window ends at the commit: at the front door when there is one (DNS moves after it), else the DNS flip.
    ended_at = report.get("committed_at_door") or report.get("dns_flipped_at")
    met = window_stall(out, float(blocked_at), float(ended_at)) if blocked_at and ended_at else None
    in_window = sum(
        int((report.get("bytes_by_step") or {}).get(step, 0))
        for step in ("cutover", "db_final", "repl_switch", "files_final")
    )
    return Outcome(with_distance(mode, distance), total, window, report.get("write_block_seconds"),
                   report.get("bytes_moved"), acked, failed, in_window, report.get("window_parts"), slowest, met,
                   distance)  # fmt: skip


def window_stall(out: Path, began: float, ended: float) -> float | None:
    """The clients' longest write stall (first attempt → acknowledgement) among the writes whose stall overlapped
    the procedure's window [began, ended]: the window as the clients felt it, apart from stalls elsewhere in the run
    (the seed's, say)."""
    acks = [json.loads(line) for line in (out / "acks.jsonl").read_text().splitlines() if line.strip()]
    stalls = [
        float(a["ack_ts"]) - float(a["first_attempt_ts"])
        for a in acks
        if float(a["first_attempt_ts"]) <= ended and float(a["ack_ts"]) >= began
    ]
    return round(max(stalls), 3) if stalls else None


def slowest_request(out: Path, report: dict[str, Any]) -> str | None:
    """The slowest request of a load run, and which step of the run it began in (or before or after the run), so a
    stall outside the window is seen for what it is."""
    records = [json.loads(line) for line in (out / REQUESTS_FILE).read_text().splitlines() if line.strip()]
    if not records:
        return None
    worst = max(records, key=lambda r: float(r["ms"]))
    began = float(worst["t"])
    step = next(
        (s["name"] for s in report.get("steps") or []
         if s.get("started_at") and s.get("ended_at") and s["started_at"] <= began <= s["ended_at"]),
        None,
    )  # fmt: skip
    blocked = (report.get("cutover") or {}).get("writes_blocked_at")
    when = f", {began - float(blocked):+.2f} s from writes blocked" if blocked else ""
    seed = report.get("seed") or {}
    if step == "repl_seed" and seed.get("commits_blocked_at"):
        # The lab's hosts share one clock: the backup's own hold on commits, against the request's wait.
        held = float(seed["commits_blocked_at"])
        when += (f", {began - held:+.3f} s from the backup's hold on commits "
                 f"({float(seed.get('commits_blocked_seconds') or 0):.3f} s)")  # fmt: skip
    where = f"during {step}" if step else "outside the run's steps"
    answered = "answered" if worst["ok"] else "failed"
    return f"{float(worst['ms']) / 1000:.2f} s, a {worst['kind']} request ({answered}), began {where}{when}"


def naive(state: LabState, work: Path, dns_ttl: float, rate: float) -> Outcome:
    """Stop everything, copy everything from scratch, start on the target, flip DNS (with no distance)."""
    relay.set_distance(state, *NEAR)
    plan = load_plan(state.plan_file).plan
    for key, value in state.secrets().items():
        os.environ.setdefault(key, value)
    out = work / "load-naive"
    moved = 0
    with Runtime(plan, state.plan_file) as rt, load_running(state, out, dns_ttl, rate):
        began = time.monotonic()
        stopped_at = time.time()
        run_bin(state.source, "app-stop")
        run_bin(state.source, "db-stop")
        for tree_source, tree_target in [
            (plan.database.source.datadir, plan.database.target.datadir),
            *[(tree.source, tree.target) for tree in plan.files],
        ]:
            rt.target.run(f"rm -rf {shlex.quote(tree_target)} && mkdir -p {shlex.quote(tree_target)}")
            # (a PostgreSQL data directory's own mode and owner come with it: rsync -a sets the top directory's)
            command = rsync.push_command(plan, tree_source, tree_target, live=False)
            moved += rsync.push(rt.source, command, what="naive copy", retry=plan.retry).transferred_bytes
        run_bin(state.target, "db-start")
        run_bin(state.target, "app-start")
        point_dns(state, state.target.address)
        flipped_at = time.time()
        total = time.monotonic() - began
    window, acked, failed = client_window(out)
    met = window_stall(out, stopped_at, flipped_at)
    return Outcome("naive", total, window, flipped_at - stopped_at, moved, acked, failed, moved, None, None, met)


def show(outcome: Outcome) -> str:
    def secs(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f} s"

    mib = "n/a" if outcome.bytes_moved is None else f"{outcome.bytes_moved / 2**20:.1f} MiB"
    return (
        f"{outcome.name:<24} longest write stall (clients) {secs(outcome.client_window_seconds):>9} "
        f"(meeting the window {secs(outcome.window_stall_seconds)}), "
        f"blocked → committed {secs(outcome.blocked_seconds):>9}, total {secs(outcome.total_seconds):>9}, "
        f"moved {mib:>10}, writes acked {outcome.writes_acked}, failed attempts {outcome.write_attempts_failed}"
    )


def table(rows: list[tuple[int, Outcome]], link_mbit: float) -> str:
    """The measured figures, one line per size and mode, with each window's ratio to the replicate mode's."""

    def secs(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f} s"

    lines = [
        "| database | mode | longest write stall (clients) | of it, meeting the window | writes blocked → committed "
        f"(run) | total | bytes moved | xreplicate (run's window) | window over {link_mbit:g} Mbit/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size, outcome in rows:
        base = median_window(rows, size, "replicate")
        ratio = "n/a"
        if base and outcome.blocked_seconds:
            ratio = f"{outcome.blocked_seconds / base:.1f}x"
        mib = "n/a" if outcome.bytes_moved is None else f"{outcome.bytes_moved / 2**20:.1f} MiB"
        lines.append(
            f"| {size} MiB | {outcome.name} | {secs(outcome.client_window_seconds)} | "
            f"{secs(outcome.window_stall_seconds)} | {secs(outcome.blocked_seconds)} |"
            f" {secs(outcome.total_seconds)} | {mib} | {ratio} | {secs(outcome.projected_window(link_mbit))} |"
        )
    sizes = list(dict.fromkeys(size for size, _ in rows))
    for mode in dict.fromkeys(o.name for _, o in rows):
        stalls = [median_window(rows, size, mode, MEASURES[1][1]) for size in (sizes[0], sizes[-1])]
        if len(sizes) >= 2 and stalls[0] and stalls[1]:
            lines.append(f"{mode}: the clients' longest write stall at {sizes[-1]} MiB is {stalls[1] / stalls[0]:.2f}x "
                         f"the one at {sizes[0]} MiB (medians)")  # fmt: skip
    lines += targets(rows)
    return "\n".join(lines)


Measure = Callable[[Outcome], "float | None"]
MEASURES: list[tuple[str, Measure]] = [
    ("the run's window", lambda o: o.blocked_seconds),
    ("the clients' longest write stall", lambda o: o.client_window_seconds),
    ("the clients' longest write stall that met the window", lambda o: o.window_stall_seconds),
]


def median_window(
    rows: list[tuple[int, Outcome]], size: int, mode: str, measure: Measure = MEASURES[0][1]
) -> float | None:
    """The median of one measure of one mode at one size, over its repetitions (runs that rolled back left out:
    they have no window)."""
    windows = [value for s, o in rows if s == size and o.name == mode and (value := measure(o)) is not None]
    return statistics.median(windows) if windows else None


def targets(rows: list[tuple[int, Outcome]]) -> list[str]:
    """The replicate mode's targets (the medians of the repetitions): ≤ 0.5 s, the same at both sizes (larger ≤ 1.2x
    smaller), ≥ 10x shorter than naive at the larger size; judged on the run's own window (writes blocked →
    the commit) and on the clients' longest write stall (which adds what one request takes on this machine)."""
    sizes = list(dict.fromkeys(size for size, o in rows if o.name == "replicate"))
    if not sizes:
        return []
    lines = []
    for label, measure in MEASURES:
        for size in sizes:
            runs = [measure(o) for s, o in rows if s == size and o.name.startswith("replicate")]
            window = median_window(rows, size, "replicate", measure)
            verdict = "met" if window is not None and window <= 0.5 else "not met"
            shown = "n/a" if window is None else f"{window:.3f} s"
            each = ", ".join("n/a" if run is None else f"{run:.3f}" for run in runs)
            lines.append(f"target replicate ≤ 0.5 s at {size} MiB, {label}: median {shown} of [{each}]: {verdict}")
        small, large = sizes[0], sizes[-1]
        first, last = median_window(rows, small, "replicate", measure), median_window(rows, large, "replicate", measure)
        if large != small and first and last:
            ratio = last / first
            lines.append(f"target replicate {large} MiB ≤ 1.2x {small} MiB, {label} (medians): {ratio:.2f}x: "
                         f"{'met' if ratio <= 1.2 else 'not met'}")  # fmt: skip
        naive = median_window(rows, large, "naive", measure)
        if naive and last:
            ratio = naive / last
            lines.append(f"target naive ≥ 10x replicate at {large} MiB, {label}: {ratio:.1f}x: "
                         f"{'met' if ratio >= 10 else 'not met'}")  # fmt: skip
    return lines


Distance = tuple[float, float]
NEAR: Distance = (0.0, 0.0)


def distance_label(distance: Distance) -> str:
    return f"hosts {distance[0]:g} ms / API {distance[1]:g} ms"


def with_distance(name: str, distance: Distance) -> str:
    """A run's name: its mode, and its distance when it has one (the ratios and targets read the near runs)."""
    return name if distance == NEAR else f"{name} @{distance[0]:g}/{distance[1]:g} ms"


def distance_table(rows: list[tuple[int, Outcome]], fars: list[Distance]) -> str:
    """Each mode's window and its parts with no distance and at each of `fars`, side by side, each with its ratio
    far / near (medians of the repetitions; runs that rolled back left out)."""

    def median(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    def cell(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f} s"

    def ratio(near: float | None, away: float | None) -> str:
        return f"{away / near:.1f}x" if near and away is not None else "n/a"

    head = "".join(f" {distance_label(far)} | ratio |" for far in fars)
    lines = [
        f"| database | mode | measure | {distance_label(NEAR)} |{head}",
        "|---|---|---|---|" + "---|---|" * len(fars),
    ]
    for size in dict.fromkeys(size for size, _ in rows):
        modes = dict.fromkeys(o.name for s, o in rows if s == size and o.distance == NEAR and o.parts is not None)
        for mode in modes:

            def runs(distance: Distance, mode: str = mode, size: int = size) -> list[Outcome]:
                return [o for s, o in rows if s == size and o.distance == distance and o.parts is not None
                        and o.name == with_distance(mode, distance)]  # fmt: skip

            near, aways = runs(NEAR), [runs(far) for far in fars]
            measures: list[tuple[str, Callable[[Outcome], float | None]]] = [
                ("window (writes blocked → commit)", lambda o: o.blocked_seconds),
                ("clients' longest write stall meeting it", lambda o: o.window_stall_seconds),
            ]
            parts = dict.fromkeys(p for o in near + [o for a in aways for o in a] for p in (o.parts or {}))
            measures += [(f"part: {p}", lambda o, p=p: (o.parts or {}).get(p)) for p in parts]
            for label, measure in measures:
                base = median([measure(o) for o in near])
                cells = ""
                for away in aways:
                    value = median([measure(o) for o in away])
                    cells += f" {cell(value)} | {ratio(base, value)} |"
                lines.append(f"| {size} MiB | {mode} | {label} | {cell(base)} |{cells}")
    return "\n".join(lines)


def client_requests(name: str, out: Path) -> str:
    """What the clients saw of one procedure: failed requests (reads, writes) and their latency p99 / max."""
    stats = json.loads((out / "stats.json").read_text())
    failed = stats.get("requests_failed") or {}
    run = (stats.get("latency") or {}).get("run") or {}

    def count(kind: str) -> int:
        return sum(int(n) for n in (failed.get(kind) or {}).values())

    def ms(key: str) -> str:
        return "n/a" if key not in run else f"{float(run[key]) / 1000:.2f} s"

    return f"| {name:<24} | {count('reads'):>12} | {count('writes'):>13} | {ms('p99_ms'):>11} | {ms('max_ms'):>11} |"


def requests_table(work: Path, sizes: list[int], modes: list[str]) -> str:
    lines = [
        "| database | procedure | failed reads | failed writes | latency p99 | latency max |",
        "|---|---|---|---|---|---|",
    ]
    for size in sizes:
        for mode in modes:
            # naive's load directory is the size's own; each migrate run's is under its repetition's number (with
            # "-far" at a distance).
            for suffix, name in (("", mode), ("-far-*", mode)):
                outs = sorted((work / str(size)).glob(f"*/load-{mode}{suffix}")) or [
                    work / str(size) / f"load-{mode}{suffix}"
                ]
                for out in outs:
                    if (out / "stats.json").exists():
                        far = out.name.partition("-far-")[2].replace("-", "/")
                        lines.append(f"| {size} MiB " + client_requests(f"{mode} @{far} ms" if far else name, out))
    return "\n".join(lines)


@contextmanager
def lab_of_size(
    work: Path, size: int, lab_dir: Path | None, uploads_size_mb: int, engine: str = "mariadb"
) -> Iterator[LabState]:
    """A lab whose source database holds about `size` MiB, up for the block; stopped and removed after it unless
    `lab_dir` (kept) was given. Its plan is put back to the lab's default."""
    directory = lab_dir or work / f"lab-{size}"
    began = time.monotonic()
    state = hosts.up(directory, db_size_mb=size, uploads_size_mb=uploads_size_mb, default_ports=False, say=print,
                     engine=engine)  # fmt: skip
    print(f"lab of {size} MiB up in {time.monotonic() - began:.1f} s: {directory}", flush=True)
    distance = (state.latency_ms, state.api_latency_ms)
    try:
        yield state
    finally:
        relay.set_distance(state, *distance)  # the lab's own distance back (none for a lab made here)
        planfile.write_plan(state)
        if lab_dir is None:
            hosts.down(directory, purge=True)


@contextmanager
def bench_work(prefix: str, parent: str | None = None) -> Iterator[Path]:
    """A scratch directory for a bench's labs and load records, removed at the end. A SIGTERM (the bench stopped by
    hand) unwinds like an exception: the labs' servers are stopped, nothing is left. `parent`: where (a PostgreSQL
    lab must be reachable by the `postgres` account: /var/tmp, the directory opened to it)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    if parent is not None:
        work.chmod(0o755)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db-size-mb", default="200", help="one size or several, comma-separated (e.g. 64,512)")
    parser.add_argument("--modes", default="replicate,shutdown,naive", help="comma-separated: replicate,shutdown,naive")
    parser.add_argument("--uploads-size-mb", type=int, default=20)
    parser.add_argument("--engine", default="mariadb", choices=("mariadb", "postgresql"), help="the lab's database")
    parser.add_argument("--dns-ttl", type=float, default=1.0, help="clients' DNS cache, seconds")
    parser.add_argument("--rate", type=float, default=40.0, help="load requests per second")
    parser.add_argument("--lab-dir", type=Path, default=None, help="reuse/keep this lab (one size only)")
    parser.add_argument("--link-mbit", type=float, default=1000.0, help="link speed for the projected windows")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each migrate mode per size (medians compared)")
    parser.add_argument(
        "--latency",
        default="0",
        help="also run each migrate mode at this one-way delay (ms) between migrate and the hosts (several: a,b)",
    )
    parser.add_argument("--api-latency", default="0",
                        help="... and this one between migrate and the Cloudflare double (ms; several: a,b; each "
                        "--latency with each --api-latency)")  # fmt: skip
    args = parser.parse_args(argv)
    sizes = [int(size) for size in str(args.db_size_mb).split(",") if size.strip()]
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = [mode for mode in modes if mode not in ("replicate", "shutdown", "naive")]
    if unknown or not modes or not sizes or (args.lab_dir is not None and len(sizes) > 1):
        parser.error("--modes takes replicate, shutdown, naive; --lab-dir takes one --db-size-mb")
    try:
        latencies = [float(v) for v in str(args.latency).split(",") if v.strip()] or [0.0]
        api_latencies = [float(v) for v in str(args.api_latency).split(",") if v.strip()] or [0.0]
        for value in latencies:
            relay.check_latency("--latency", value)
        for value in api_latencies:
            relay.check_latency("--api-latency", value)
    except ValueError as exc:
        parser.error(str(exc))
    fars: list[Distance] = [(h, a) for h in latencies for a in api_latencies if (h, a) != NEAR]
    distances = [NEAR, *fars]

    rows: list[tuple[int, Outcome]] = []
    parent = "/var/tmp" if args.engine == pglab.ENGINE else None
    with bench_work("migrate-bench-", parent) as work:
        for size in sizes:
            with lab_of_size(work, size, args.lab_dir, args.uploads_size_mb, args.engine) as state:
                for mode in modes:
                    for run in range(1 if mode == "naive" else max(1, args.repeat)):
                        for distance in [NEAR] if mode == "naive" else distances:
                            source_live(state)
                            if mode == "naive":
                                outcome = naive(state, work / str(size), args.dns_ttl, args.rate)
                            else:
                                outcome = with_migrate(state, work / str(size) / str(run), args.dns_ttl, args.rate,
                                                       mode, distance)  # fmt: skip
                            print(f"{size} MiB: {show(outcome)}")
                            rows.append((size, outcome))
        print(table([(size, o) for size, o in rows if o.distance == NEAR], args.link_mbit))
        if fars:
            print("the window at a distance (one way) against none, the same lab and load, one run after the other:")
            print(distance_table(rows, fars))
        print("where each run's window went (the report's window_parts, seconds):")
        for size, outcome in rows:
            if outcome.parts:
                parts = ", ".join(f"{name} {seconds:.3f}" for name, seconds in outcome.parts.items())
                print(f"  {size} MiB {outcome.name}: {parts}")
        print("the slowest request of each run:")
        for size, outcome in rows:
            if outcome.slowest:
                print(f"  {size} MiB {outcome.name}: {outcome.slowest}")
        print("what the clients saw (requests of each load run):")
        print(requests_table(work, sizes, modes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
