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


def _slice(digest: str) -> tuple[int, int]:
    """(size, offset in the pool) of a file, from its digest."""
    size = MIN_SIZE + int(digest[15:23], 16) % (MAX_SIZE - MIN_SIZE + 1)
    return size, int(digest[23:31], 16) % (POOL_SIZE - size)


def _write_range(root: Path, start: int, stop: int, step: int, seed: int) -> int:
    """Files start, start+step, ... below stop (those already there at their size are kept)."""
    pool = random.Random(seed).randbytes(POOL_SIZE)
    made_dirs: set[Path] = set()
    written = 0
    for index in range(start, stop, step):
        digest = _digest(index)
        path = root / digest[0] / digest[1:3] / f"{digest[3:15]}-{index}.bin"
        size, offset = _slice(digest)
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


def write_tree(root: Path, count: int, *, seed: int = TREE_SEED, workers: int | None = None) -> int:
    """`count` files under `root` (those already there at their size are kept); returns how many it wrote.

    `workers`: processes writing side by side (default: twice the core count, at least 4, since creating a file
    waits on the filesystem's journal as much as it uses a core; one below PARALLEL_FROM files)."""
    if workers is None:
        workers = max(4, 2 * (os.cpu_count() or 1)) if count >= PARALLEL_FROM else 1
    if workers <= 1:
        return _write_range(root, 0, count, 1, seed)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_write_range, root, first, count, workers, seed) for first in range(workers)]
        return sum(f.result() for f in futures)
