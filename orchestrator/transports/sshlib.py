"""asyncssh, imported without its start-up search for liboqs where no liboqs is installed.

On import asyncssh asks `ctypes.util.find_library` for liboqs (post-quantum key exchange), which on Linux runs
`ldconfig -p`, then gcc and ld, twice: about half a second before every `migrate` command on a busy host, to find
nothing on a machine without the library. When no liboqs file exists in the library directories the answer is known,
so the search is skipped; where one exists, asyncssh searches as it always does.

Also the one warning asyncssh's import is known to raise: cryptography 47+ deprecates DSA, and asyncssh names the DSA
key types at import (ten lines on stderr before every command's first). The filter matches that warning alone, so
anything else a library says still reaches the run's log.
"""

from __future__ import annotations

import ctypes.util
import glob
import os
import warnings
from collections.abc import Callable

from cryptography.utils import CryptographyDeprecationWarning

LIBOQS_NAMES = ("oqs", "liboqs")
LIBRARY_DIRS = ("/lib", "/usr/lib", "/usr/local/lib", "/lib64", "/usr/lib64")


def liboqs_installed(extra_dirs: str = "") -> bool:
    dirs = [*LIBRARY_DIRS, *(d for d in extra_dirs.split(os.pathsep) if d)]
    patterns = [os.path.join(d, sub, "liboqs.so*") for d in dirs for sub in ("", "*-linux-gnu*")]
    return any(glob.glob(pattern) for pattern in patterns)


def _without_liboqs(find: Callable[[str], str | None]) -> Callable[[str], str | None]:
    return lambda name: None if name in LIBOQS_NAMES else find(name)


# The DSA key types asyncssh names at import and again when it lists the algorithms it offers.
warnings.filterwarnings("ignore", message=r"DSA is deprecated", category=CryptographyDeprecationWarning)

_find_library = ctypes.util.find_library
if not liboqs_installed(os.environ.get("LD_LIBRARY_PATH", "")):
    setattr(ctypes.util, "find_library", _without_liboqs(_find_library))  # noqa: B010 (for the import below only)
try:
    import asyncssh
finally:
    setattr(ctypes.util, "find_library", _find_library)  # noqa: B010

__all__ = ["asyncssh"]
