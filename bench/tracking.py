"""Benchmark: the in-window file work with a tracked change list against today's full scans, at two tree sizes.

    .venv/bin/python bench/tracking.py --files 10000 1000000 [--changes 300] [--lab-dir DIR]   (about 20 min)

For each size: N small uploads (lab's seeded tree) on the source, a tracker started, a full pre-sync, then a few hundred
changes (new files, overwrites at the same size, renames, deletions). Timed, side by side on the same trees:
- tracked: the change list made on the source + the final pass of only those paths + the checksum of only those paths;
- full: the final pass as today (rsync of the whole tree, nanosecond mtimes) + the full --dry-run --checksum.
The same number of changes is made before each. Printed as seconds and ratios; and the peak RSS of this process.
The page cache is warm for both (both read the same trees just before). Run by hand; not part of CI.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from migrate_lab import hosts
from migrate_lab.state import LabState
from migrate_lab.uploads_tree import file_path, write_tree
from orchestrator.plan.loader import load_plan
from orchestrator.runtime import Runtime
from orchestrator.services.tracking import ChangeTracker, final_pass_command, verify_listed_command
from orchestrator.transports import rsync


@dataclass
class Figures:
    files: int
    listed: int
    list_s: float
    tracked_pass_s: float
    tracked_verify_s: float
    full_pass_s: float
    full_verify_s: float

    @property
    def tracked_s(self) -> float:
        return self.list_s + self.tracked_pass_s + self.tracked_verify_s

    @property
    def full_s(self) -> float:
        return self.full_pass_s + self.full_verify_s


def change(root: Path, files: int, count: int, rng: random.Random, tag: str) -> None:
    """`count` changes like a live upload store's: a quarter each of creations, overwrites, renames, deletions."""
    for index in range(count):
        path = file_path(root, rng.randrange(files))
        kind = index % 4
        if kind == 0:
            (path.parent / f"new-{tag}-{index}.bin").write_bytes(rng.randbytes(rng.randint(1024, 16384)))
        elif not path.exists():
            continue
        elif kind == 1:
            path.write_bytes(rng.randbytes(path.stat().st_size))
        elif kind == 2:
            path.rename(path.parent / f"moved-{tag}-{index}.bin")
        else:
            path.unlink()


def timed(rt: Runtime, command: str) -> float:
    started = time.monotonic()
    result = rt.source.run(command, timeout=3600, check=False)
    if result.exit_status not in (0, 24):
        raise SystemExit(f"failed ({result.exit_status}): {command[:120]}: {result.stderr[-300:]}")
    return time.monotonic() - started


def measure(rt: Runtime, lab: LabState, files: int, changes: int) -> Figures:
    plan = rt.plan
    ssh = rsync.target_ssh_command(plan)
    source = lab.source.path / f"bench-tracking-{files}"
    target = lab.target.path / f"bench-tracking-{files}"
    destination = rsync.target_spec(plan, str(target))
    target.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    write_tree(source, files)
    print(f"  {files} files written in {time.monotonic() - started:.1f} s", flush=True)
    tracker = ChangeTracker(rt.source, str(source), str(lab.source.path / "tracker-state"), name=f"bench-{files}")
    tracker.start(timeout=600)
    try:
        full_pass = shlex.join(["rsync", "-a", "--delete", "--modify-window=-1", "-e", ssh, f"{source}/", destination])
        full_verify = shlex.join(
            ["rsync", "-a", "--delete", "--dry-run", "--checksum", "-i", "-e", ssh, f"{source}/", destination]
        )
        presync = timed(rt, full_pass)
        print(f"  pre-sync {presync:.1f} s", flush=True)
        rng = random.Random(files)
        change(source, files, changes, rng, "a")
        started = time.monotonic()
        listed = tracker.changes(timeout=600)
        list_s = time.monotonic() - started
        if not listed.trust.trusted:
            raise SystemExit(f"tracking untrusted: {listed.trust.reasons}")
        tracked_pass = timed(rt, final_pass_command(str(source), destination, listed.path, ssh=ssh))
        tracked_verify = timed(rt, verify_listed_command(str(source), destination, listed.path, ssh=ssh))
        change(source, files, changes, rng, "b")
        full_pass_s = timed(rt, full_pass)
        full_verify_s = timed(rt, full_verify)
        return Figures(files, listed.count, list_s, tracked_pass, tracked_verify, full_pass_s, full_verify_s)
    finally:
        tracker.stop()
        tracker.remove()
        shutil.rmtree(source, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--changes", type=int, default=300)
    parser.add_argument("--lab-dir", type=Path, default=None, help="an existing lab (default: a temporary one)")
    args = parser.parse_args()
    temporary = args.lab_dir is None
    lab_dir = Path(tempfile.mkdtemp(prefix="bench-tracking-")) if temporary else args.lab_dir
    lab = hosts.up(lab_dir, default_ports=False)
    results: list[Figures] = []
    rt: Runtime | None = None
    try:
        os.environ.update(lab.secrets())
        rt = Runtime(load_plan(lab.plan_file).plan, lab.plan_file)
        for files in args.files:
            print(f"tree of {files} files, {args.changes} changes:", flush=True)
            results.append(measure(rt, lab, files, args.changes))
    finally:
        if rt is not None:
            rt.close()
        if temporary:
            hosts.down(lab_dir, purge=True)
    print()
    print(f"{'files':>9} {'listed':>7} {'list s':>7} {'pass s':>7} {'check s':>8} | {'full pass':>9} "
          f"{'full check':>10} | {'tracked/full':>12}")  # fmt: skip
    for f in results:
        print(
            f"{f.files:>9} {f.listed:>7} {f.list_s:>7.2f} {f.tracked_pass_s:>7.2f} {f.tracked_verify_s:>8.2f} | "
            f"{f.full_pass_s:>9.2f} {f.full_verify_s:>10.2f} | {f.tracked_s / f.full_s:>12.3f}"
        )
    if len(results) > 1:
        small, large = results[0], results[-1]
        print(
            f"growth {small.files} → {large.files} files: tracked {large.tracked_s / small.tracked_s:.2f}x, "
            f"full {large.full_s / small.full_s:.2f}x"
        )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {peak_mib:.0f} MiB (the trees are written by it; the lists never enter it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
