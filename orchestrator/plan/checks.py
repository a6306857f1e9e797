"""Checks that refuse dangerous plans: paths rsync would write into, control characters, sizes.

These are used by field validators in `model.py`, and by its cross-field checks (`cross_field_problems`, beside the
`Plan` they read), which return each problem with the location of the field to blame, so the loader can point at the
exact line of the plan. This module imports nothing of the model.

The protected-directory policy (docs/plan.md, "Protected directories"):
- `PROTECTED_TREES`: the operating system's own trees. They and everything beneath them are refused as a tree's
  source or target and as a datadir (both ends: a reverse run writes into the forward source).
- `PROTECTED_DIRECTORIES`: refused themselves; a directory inside them is an ordinary place (/var/www/app,
  /srv/data, /opt/shop/uploads, /tmp/build).
- A user's home itself (/home/NAME) and every key directory (a `.ssh` or `.gnupg` component, wherever it is).
- A datadir may live under /var/lib when it is a database's own directory (/var/lib/mysql, /var/lib/mariadb-10.11,
  /var/lib/mysql/data): that is where packaged servers keep it.
- `allow_protected_path: true` on a tree or database endpoint lifts the policy for the rare legitimate case
  (e.g. /etc/nginx/sites-enabled), except for `NEVER_ALLOWED`: the root, the top of every protected tree, /var,
  /home, and anything under the kernel's pseudo file systems.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import unicodedata

# Refused with everything beneath them.
PROTECTED_TREES: tuple[str, ...] = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root", "/run", "/sbin",
    "/snap", "/sys", "/usr", "/var/backups", "/var/cache", "/var/lib", "/var/log", "/var/mail", "/var/spool",
    # Links to /run and /run/lock on every current distribution: refused as what they resolve to is.
    "/var/run", "/var/lock",
)  # fmt: skip
# Refused themselves only: their children are where services usually keep their data.
PROTECTED_DIRECTORIES: frozenset[str] = frozenset(
    {"/", "/home", "/media", "/mnt", "/opt", "/srv", "/tmp", "/var", "/var/local", "/var/opt", "/var/tmp", "/var/www"}
)
# Kernel pseudo file systems: never a place for data, whatever the plan says.
PSEUDO_TREES: tuple[str, ...] = ("/dev", "/proc", "/sys")
NEVER_ALLOWED: frozenset[str] = frozenset({"/", "/var", "/home", *PROTECTED_TREES})
KEY_DIRECTORIES: frozenset[str] = frozenset({".ssh", ".gnupg"})
# A database's own directory under /var/lib: mysql, mysql2, mariadb, mariadb-10.11, mysql-8.0, ...
DATADIR_UNDER_VAR_LIB = re.compile(r"^/var/lib/(mysql|mariadb)[A-Za-z0-9._-]*(/.*)?$")

# Characters that reorder what a terminal shows: a path must read as it is.
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
GLOB_CHARACTERS = ("*", "?", "[")
MAX_PATH_BYTES = 4096  # PATH_MAX on Linux
MAX_NAME_BYTES = 255  # NAME_MAX: one component
MAX_SOCKET_BYTES = 107  # sun_path holds 108 bytes with the terminating NUL

Location = tuple[str | int, ...]


def dns_content_form(content: str) -> str:
    """A record's content as a DNS provider stores it, to compare what was sent with what reads back: an address in
    its canonical form (IPv6 compressed, lower-case), a host name lower-cased without its trailing dot (Cloudflare
    stores a CNAME target so)."""
    text = content.strip()
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return text.lower().rstrip(".")


def control_character(text: str) -> str | None:
    """The first control character in `text` (C0, DEL, C1, line/paragraph separators, bidi controls), as U+XXXX."""
    for index, char in enumerate(text):
        if unicodedata.category(char) in ("Cc", "Zl", "Zp") or char in BIDI_CONTROLS:
            return f"U+{ord(char):04X} at character {index + 1}"
    return None


def text_problem(text: str, *, allow_newlines: bool = False) -> str | None:
    """Why `text` (a command, a pattern, a name) holds a character that could change its meaning, or None."""
    checked = text.replace("\n", "").replace("\t", "") if allow_newlines else text
    found = control_character(checked)
    if found is not None:
        allowed = " (only newlines and tabs are allowed here)" if allow_newlines else ""
        return f"must not contain control characters: {found}{allowed}"
    return None


def path_problem(path: str, *, absolute: bool = True, max_bytes: int = MAX_PATH_BYTES) -> str | None:
    """Why `path` is unacceptable as a file or directory name passed to a host, or None when it is fine."""
    if not path or not path.strip():
        return "must not be empty"
    problem = text_problem(path)
    if problem is not None:
        return problem
    if absolute and not path.startswith("/"):
        return "must be an absolute path"
    size = len(path.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        return f"too long: {size} bytes, at most {max_bytes}"
    longest = max((len(part.encode("utf-8", "surrogatepass")) for part in path.split("/")), default=0)
    if longest > MAX_NAME_BYTES:
        return f"a path component is {longest} bytes long, at most {MAX_NAME_BYTES}"
    return None


def _normalised(path: str) -> str:
    normalised = posixpath.normpath(path)
    if normalised.startswith("//"):  # POSIX keeps a leading '//' as is
        normalised = "/" + normalised.lstrip("/")
    return normalised


def inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def protected_problem(normalised: str, *, datadir: bool, allowed: bool) -> str | None:
    """Why the normalised absolute `normalised` is a protected place, or None."""
    opt_in = "; if you really mean it, set allow_protected_path: true here (docs/plan.md: protected directories)"
    if any(inside(normalised, tree) for tree in PSEUDO_TREES) or normalised in NEVER_ALLOWED:
        return f"refusing to sync into {normalised}: a system directory (never allowed)"
    if allowed:
        return None
    parts = normalised.split("/")
    key_dir = next((part for part in parts if part in KEY_DIRECTORIES), None)
    if key_dir is not None:
        return f"refusing to sync into {normalised}: {key_dir} is a key directory{opt_in}"
    if datadir and DATADIR_UNDER_VAR_LIB.match(normalised):
        return None
    tree = next((tree for tree in PROTECTED_TREES if inside(normalised, tree)), None)
    if tree is not None:
        return f"refusing to sync into {normalised}: inside {tree}, a protected system tree{opt_in}"
    if normalised in PROTECTED_DIRECTORIES:
        return f"refusing to sync into {normalised} itself: a protected directory (use a directory inside it)"
    if len(parts) == 3 and parts[1] == "home":
        return f"refusing to sync into {normalised} itself: a user's home directory (use a directory inside it)"
    return None


def directory_problem(path: str, *, datadir: bool = False, allow_protected: bool = False) -> str | None:
    """Why `path` is unacceptable as a directory rsync copies from or into, or None when it is fine."""
    problem = path_problem(path)
    if problem is not None:
        return problem
    wildcard = next((char for char in GLOB_CHARACTERS if char in path), None)
    if wildcard is not None:
        # rsync expands wildcards in its remote arguments (with or without -s), on the host: '/srv/[prod]' would
        # be synced, with --delete, into an existing '/srv/p'.
        return f"must not contain {wildcard!r}: rsync would expand '*', '?' and '[' as a pattern on the host"
    normalised = _normalised(path)
    problem = protected_problem(normalised, datadir=datadir, allowed=allow_protected)
    if problem is not None:
        return problem
    if normalised != path:
        return f"must be a normalised path: write '{normalised}' (no trailing '/', '//', '.' or '..')"
    return None
