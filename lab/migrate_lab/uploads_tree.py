"""Many small upload files for `lab up --files N`: the scale at which change tracking matters, reproducible.

Files are spread as upload stores spread them, in two levels of hashed directories (16 x 256), 1-16 KiB each. The
same N and seed give the same names and bytes: each file's size and bytes (a slice of a seeded pool of random bytes)
come from the hash of its index alone, so any worker can write any file. Written by a few worker processes directly
(one open/write per file, no process per file): the cost is the kernel's file creation, spread over the cores.
"""

from __future__ import annotations

import hashlib
import os
import random
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

TREE_SEED = 12
MIN_SIZE = 1024
MAX_SIZE = 16 * 1024
POOL_SIZE = 8 * 1024 * 1024
# Below this many files one process writes them all: starting workers costs more than it saves.
PARALLEL_FROM = 20_000


def _digest(index: int) -> str:
    return hashlib.sha1(f"upload-{index}".encode()).hexdigest()


def file_path(root: Path, index: int) -> Path:
    digest = _digest(index)
    return root / digest[0] / digest[1:3] / f"{digest[3:15]}-{index}.bin"


SIZES = (MIN_SIZE, MAX_SIZE)


def _slice(digest: str, sizes: tuple[int, int] = SIZES) -> tuple[int, int]:
    """(size, offset in the pool) of a file, from its digest: a size within `sizes` (bytes, both ends included)."""
    smallest, largest = sizes
    size = smallest + int(digest[15:23], 16) % (largest - smallest + 1)
    return size, int(digest[23:31], 16) % (POOL_SIZE - size)


def _write_range(root: Path, start: int, stop: int, step: int, seed: int, sizes: tuple[int, int] = SIZES) -> int:
    """Files start, start+step, ... below stop (those already there at their size are kept)."""
    pool = random.Random(seed).randbytes(POOL_SIZE)
    made_dirs: set[Path] = set()
    written = 0
    for index in range(start, stop, step):
        digest = _digest(index)
        path = root / digest[0] / digest[1:3] / f"{digest[3:15]}-{index}.bin"
        size, offset = _slice(digest, sizes)
        if path.parent not in made_dirs:
            path.parent.mkdir(parents=True, exist_ok=True)
            made_dirs.add(path.parent)
        try:
            if path.stat().st_size == size:
                continue
        except FileNotFoundError:
            pass
        with open(path, "wb") as out:
            out.write(pool[offset : offset + size])
        written += 1
    return written


def write_tree(
    root: Path, count: int, *, seed: int = TREE_SEED, workers: int | None = None, sizes: tuple[int, int] = SIZES
) -> int:
    """`count` files under `root` (those already there at their size are kept); returns how many it wrote.

    `sizes`: the smallest and largest file, in bytes (where the number of files matters, not their bytes, smaller
    files make the same tree faster to write, copy and compare).

    `workers`: processes writing side by side (default: twice the core count, at least 4, since creating a file
    waits on the filesystem's journal as much as it uses a core; one below PARALLEL_FROM files)."""
    if workers is None:
        workers = max(4, 2 * (os.cpu_count() or 1)) if count >= PARALLEL_FROM else 1
    if not 0 < sizes[0] <= sizes[1] < POOL_SIZE:
        raise ValueError(f"file sizes must be 0 < smallest <= largest < {POOL_SIZE}, not {sizes}")
    if workers <= 1:
        return _write_range(root, 0, count, 1, seed, sizes)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_write_range, root, first, count, workers, seed, sizes) for first in range(workers)]
        return sum(f.result() for f in futures)
