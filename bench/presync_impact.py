"""Benchmark: how much the live site feels the uploads pre-sync, with and without the protections.

    .venv/bin/python bench/presync_impact.py --uploads-size-mb 400

Brings up a lab (in a temporary directory unless --lab-dir), adds that much data to the source's uploads, and
requests the source's app (a database read and an upload read, alternately, at --rate per second) throughout.
For each variant, with the target's uploads emptied first: the app's p99 latency for --baseline seconds before the
pre-sync, then during the real `files_presync` step:
- unprotected: rsync as fast as it goes (no nice/ionice, no nocache, no bwlimit, no load pause);
- protected: nice/ionice, nocache, transfer.bwlimit (--bwlimit) and the pause above transfer.max_load
  (--max-load);
- latency: the same, but paused while the live app answers slower than transfer.max_latency_ms (--max-latency-ms)
  instead of on the load average (which, on a shared machine, is mostly the neighbours').
Prints p99 before, during, their ratio (target: ≤ 1.2), the pre-sync's duration and its throttled time. The
variants run in one invocation, side by side, because this machine is shared. Run by hand; not part of CI.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import structlog
from ruamel.yaml import YAML

from migrate_lab import hosts
from migrate_lab.state import LabState
from orchestrator.engine.step import StepContext
from orchestrator.plan.model import Plan
from orchestrator.results import FilesResult
from orchestrator.runtime import Runtime
from orchestrator.steps.files_presync import FilesPresync

BENCH_DIR = "bench-presync"
FILE_MB = 8


def sample_forever(address: str, port: int, rate: float, upload: str, out: Path) -> None:
    """In a process of its own (the orchestrator's threads must not share its interpreter): request the app at a
    steady rate, one line per answer, 'start seconds' (monotonic clock, comparable across processes) or 'failed'."""
    interval, n = 1 / rate, 0
    next_at = time.monotonic()
    with out.open("a", buffering=1) as log:
        while True:
            path = "/reviews?limit=20" if n % 2 == 0 else f"/uploads/{upload}"
            began = time.monotonic()
            conn = http.client.HTTPConnection(address, port, timeout=10)
            try:
                conn.request("GET", path)
                answer = conn.getresponse()
                answer.read()
                log.write(f"{began} {time.monotonic() - began}\n" if answer.status == 200 else "failed\n")
            except OSError:
                log.write("failed\n")
            finally:
                conn.close()
            n += 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))


class Sampler:
    """The sampling process, and the p99 of its answers within an interval."""

    def __init__(self, address: str, port: int, rate: float, upload: str, out: Path) -> None:
        self.out = out
        self.argv = [sys.executable, __file__, "--sample", address, str(port), str(rate), upload, str(out)]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def _lines(self) -> list[str]:
        return self.out.read_text().splitlines() if self.out.exists() else []

    @property
    def failures(self) -> int:
        return sum(1 for line in self._lines() if line == "failed")

    def p99(self, since: float, until: float) -> float:
        values = []
        for line in self._lines():
            fields = line.split()
            if len(fields) == 2 and since <= float(fields[0]) < until:
                values.append(float(fields[1]))
        if not values:
            return float("nan")
        values.sort()
        return values[min(len(values) - 1, int(len(values) * 0.99))] * 1000


@dataclass
class Variant:
    name: str
    p99_before_ms: float
    p99_during_ms: float
    presync_seconds: float
    throttled_seconds: float

    @property
    def ratio(self) -> float:
        return self.p99_during_ms / self.p99_before_ms


@contextmanager
def a_lab(lab_dir: Path | None) -> Iterator[LabState]:
    if lab_dir is not None:
        yield hosts.up(lab_dir)
        return
    directory = Path(tempfile.mkdtemp(prefix="presync-bench-"))
    try:
        yield hosts.up(directory, default_ports=False)
    finally:
        hosts.down(directory)
        shutil.rmtree(directory, ignore_errors=True)


def grow_uploads(state: LabState, megabytes: int) -> Path:
    bench = state.source.uploads / BENCH_DIR
    bench.mkdir(exist_ok=True)
    for index in range(max(1, megabytes // FILE_MB)):
        path = bench / f"blob-{index:04d}.bin"
        if not path.exists() or path.stat().st_size != FILE_MB * 1024 * 1024:
            path.write_bytes(os.urandom(FILE_MB * 1024 * 1024))
    return bench


def empty(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def run_variant(state: LabState, plan: Plan, name: str, sampler: Sampler, baseline: float) -> Variant:
    empty(state.target.uploads)
    began = time.monotonic()
    time.sleep(baseline)  # the latency before the pre-sync: a measured interval, not a wait for an event
    rt = Runtime(plan, state.plan_file)
    try:
        step = FilesPresync()
        ctx = StepContext(run_id="bench", step=step.name, dry_run=False, rt=rt, log=structlog.get_logger())
        started = time.monotonic()
        result = FilesResult.of(step.run(ctx))
        ended = time.monotonic()
    finally:
        rt.close()
    return Variant(
        name, sampler.p99(began, started), sampler.p99(started, ended), round(ended - started, 2),
        result.throttled_seconds,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab-dir", type=Path, default=None)
    parser.add_argument("--uploads-size-mb", type=int, default=400)
    parser.add_argument("--rate", type=float, default=40.0, help="app requests per second")
    parser.add_argument("--baseline", type=float, default=8.0, help="seconds of latency sampled before each pre-sync")
    parser.add_argument("--bwlimit", default="40M", help="transfer.bwlimit of the protected variant")
    parser.add_argument("--max-load", type=float, default=float(os.cpu_count() or 2), help="transfer.max_load")
    parser.add_argument("--max-latency-ms", type=float, default=150.0, help="transfer.max_latency_ms (latency)")
    if len(sys.argv) > 1 and sys.argv[1] == "--sample":
        address, port, rate, upload, out = sys.argv[2:7]
        sample_forever(address, int(port), float(rate), upload, Path(out))
        return 0
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    with a_lab(args.lab_dir) as state:
        for key, value in state.secrets().items():
            os.environ[key] = value
        base = Plan.model_validate(YAML(typ="safe").load(state.plan_file.read_text()))
        bench = grow_uploads(state, args.uploads_size_mb)
        # A small file the app serves (its names have no '/'): the page cache the pre-sync must not evict.
        upload = sorted(p.name for p in state.source.uploads.iterdir() if p.is_file())[0]
        plans = {
            "unprotected": base.transfer.model_copy(
                update={"nice": False, "nocache": False, "bwlimit": None, "max_load": None}
            ),
            "protected": base.transfer.model_copy(
                update={"nice": True, "nocache": True, "bwlimit": args.bwlimit, "max_load": args.max_load,
                        "load_check_interval": 1.0, "max_pause": 10.0}
            ),
            "latency": base.transfer.model_copy(
                update={"nice": True, "nocache": True, "bwlimit": args.bwlimit, "max_load": None,
                        "max_latency_ms": args.max_latency_ms, "load_check_interval": 1.0, "max_pause": 10.0}
            ),
        }  # fmt: skip
        samples = Path(tempfile.mkdtemp(prefix="presync-samples-")) / "samples.txt"
        sampler = Sampler(state.source.address, state.source.app_port, args.rate, upload, samples)
        sampler.start()
        try:
            variants = [
                run_variant(state, base.model_copy(update={"transfer": transfer}), name, sampler, args.baseline)
                for name, transfer in plans.items()
            ]
        finally:
            sampler.stop()
            shutil.rmtree(bench, ignore_errors=True)
            shutil.rmtree(state.target.uploads / BENCH_DIR, ignore_errors=True)
    failures = sampler.failures
    shutil.rmtree(samples.parent, ignore_errors=True)
    print(f"uploads pre-sync of {args.uploads_size_mb} MiB; app requests at {args.rate}/s; "
          f"failed requests: {failures}")  # fmt: skip
    print(f"{'variant':<12} {'p99 before':>11} {'p99 during':>11} {'ratio':>6} {'pre-sync':>9} {'throttled':>10}")
    for v in variants:
        print(f"{v.name:<12} {v.p99_before_ms:>9.1f}ms {v.p99_during_ms:>9.1f}ms {v.ratio:>5.2f}x "
              f"{v.presync_seconds:>8.1f}s {v.throttled_seconds:>9.1f}s")  # fmt: skip
    print("p99 ratio during/before: " + ", ".join(f"{v.name} {v.ratio:.2f}x" for v in variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
