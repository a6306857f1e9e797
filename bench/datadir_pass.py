"""Benchmark: the shutdown mode's final datadir pass over a big table file, cold against warmed before the window.

    .venv/bin/python bench/datadir_pass.py --size-mb 2048 --changed-pages 120 [--runs 2] [--dir DIR]

A file of --size-mb random bytes (the hot table's .ibd) and its pre-synced copy; before each run, --changed-pages
16 KiB pages of the source are rewritten with O_DIRECT, as InnoDB writes them (a direct write drops those pages
from the page cache). Then the final pass as db_final runs it (rsync --inplace, delta transfer, nanosecond mtimes,
the copy's mtime forced to the epoch), in three variants:
- cold: both files dropped from the page cache first (the source's state after the rounds ran under `nocache` and
  InnoDB wrote with O_DIRECT);
- warmed: both files read into the page cache by db_presync's warm-up (its own command) BEFORE the pages change:
  inside the window only the changed pages come from disk;
- whole file: cold, --whole-file (no delta: the file's every byte is sent and written).
Printed: each variant's pass (the window's part) per run, the warm-up's time (before the window), the literal data
sent, the ratio warmed / cold, and the load average. Local rsync (no SSH: the delta's few MiB are not what costs).
Run by hand; not part of CI. Compare only figures of one invocation.
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from orchestrator.steps.db_presync import warm_command

PAGE = 16 * 1024
CHUNK = 64 * 1024 * 1024


def drop_cache(*paths: Path) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def change_pages(path: Path, pages: int, rng: random.Random) -> None:
    """Rewrite `pages` random pages with O_DIRECT (page-aligned buffer from mmap), as InnoDB does."""
    size = path.stat().st_size
    buf = mmap.mmap(-1, PAGE)
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    try:
        for _ in range(pages):
            buf.seek(0)
            buf.write(rng.randbytes(PAGE))
            os.pwrite(fd, buf, rng.randrange(size // PAGE) * PAGE)
    finally:
        os.close(fd)
        buf.close()


def final_pass(source: Path, target: Path, *, whole_file: bool) -> tuple[float, int]:
    """db_final's pass: (seconds, literal bytes)."""
    os.utime(target / "hot.ibd", ns=(0, 0))  # forced, as db_final forces every file changed since the pre-sync
    argv = ["rsync", "-a", "--inplace", "--modify-window=-1", "--stats"]
    argv.append("--whole-file" if whole_file else "--no-whole-file")
    started = time.monotonic()
    out = subprocess.run([*argv, f"{source}/", f"{target}/"], capture_output=True, text=True, check=True).stdout
    seconds = time.monotonic() - started
    match = re.search(r"^Literal data: ([\d,]+)", out, re.MULTILINE)
    return seconds, int(match.group(1).replace(",", "")) if match else 0


def warm(*directories: Path) -> float:
    started = time.monotonic()
    for directory in directories:
        subprocess.run(["sh", "-c", warm_command(str(directory))], input="hot.ibd\0", text=True, check=True,
                       capture_output=True)  # fmt: skip
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=2048)
    parser.add_argument("--changed-pages", type=int, default=120)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None, help="where the two files go (default: a temporary dir)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-datadir-", dir=args.dir))
    source, target = root / "source", root / "target"
    source.mkdir()
    target.mkdir()
    rng = random.Random(7)
    try:
        with open(source / "hot.ibd", "wb") as out:
            for _ in range(args.size_mb * 1024 * 1024 // CHUNK):
                out.write(os.urandom(CHUNK))
        shutil.copyfile(source / "hot.ibd", target / "hot.ibd")
        results: dict[str, list[tuple[float, int]]] = {"cold": [], "warmed": [], "whole file": []}
        warm_seconds: list[float] = []
        for _ in range(args.runs):
            for variant in results:
                if variant == "warmed":
                    warm_seconds.append(warm(source, target))
                else:
                    drop_cache(source / "hot.ibd", target / "hot.ibd")
                change_pages(source / "hot.ibd", args.changed_pages, rng)
                results[variant].append(final_pass(source, target, whole_file=variant == "whole file"))
                print(f"  {variant}: {results[variant][-1][0]:.2f} s", flush=True)
        print(f"\n{args.size_mb} MiB file, {args.changed_pages} pages of 16 KiB changed before each pass "
              f"(load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}):\n")  # fmt: skip
        print("| final pass variant | inside the window (each run) | literal data sent | before the window |")
        print("|---|---|---|---|")
        for variant, runs in results.items():
            before = f"warm-up {', '.join(f'{s:.1f} s' for s in warm_seconds)}" if variant == "warmed" else "-"
            print(f"| {variant} | {', '.join(f'{s:.2f} s' for s, _ in runs)} | "
                  f"{runs[-1][1] / 1024 / 1024:.1f} MiB | {before} |")  # fmt: skip
        cold = sum(s for s, _ in results["cold"])
        print(f"\nwarmed / cold: {sum(s for s, _ in results['warmed']) / cold:.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
