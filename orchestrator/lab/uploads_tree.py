"""Many small upload files for `lab up --files N`: the scale at which change tracking matters, reproducible.

Files are spread as upload stores spread them, in two levels of hashed directories (16 x 256), 1-16 KiB each. The
same N and seed give the same names and bytes. Written by this process directly (one open/write per file, no process
per file): 100,000 files take seconds.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

TREE_SEED = 12
MIN_SIZE = 1024
MAX_SIZE = 16 * 1024
POOL_SIZE = 8 * 1024 * 1024


def file_path(root: Path, index: int) -> Path:
    digest = hashlib.sha1(f"upload-{index}".encode()).hexdigest()
    return root / digest[0] / digest[1:3] / f"{digest[3:15]}-{index}.bin"


def write_tree(root: Path, count: int, *, seed: int = TREE_SEED) -> int:
    """`count` files under `root` (those already there at their size are kept); returns how many it wrote."""
    rng = random.Random(seed)
    pool = rng.randbytes(POOL_SIZE)
    made_dirs: set[Path] = set()
    written = 0
    for index in range(count):
        size = rng.randint(MIN_SIZE, MAX_SIZE)
        offset = rng.randrange(POOL_SIZE - size)
        path = file_path(root, index)
        try:
            if path.stat().st_size == size:
                continue
        except FileNotFoundError:
            pass
        if path.parent not in made_dirs:
            path.parent.mkdir(parents=True, exist_ok=True)
            made_dirs.add(path.parent)
        with open(path, "wb") as out:
            out.write(pool[offset : offset + size])
        written += 1
    return written
