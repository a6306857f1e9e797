"""Checks that refuse dangerous plans: paths rsync would write into, and combinations of fields that clash.

The path checks are used by field validators in `model.py`. The cross-field checks return each problem with the
location of the field to blame, so the loader can point at the exact line of the plan.
"""

from __future__ import annotations

import ipaddress
import posixpath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.plan.model import Plan

# Directories a tree or a datadir must never be: syncing (with --delete) into one of them wrecks the system.
# Exactly these; their subdirectories (/var/lib/mysql, /var/www, /home/site) are ordinary places.
SYSTEM_DIRECTORIES: frozenset[str] = frozenset(
    {
        "/",
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/lib",
        "/lib64",
        "/proc",
        "/root",
        "/run",
        "/sbin",
        "/sys",
        "/usr",
        "/var",
        "/var/lib",
        "/home",
    }
)

Location = tuple[str | int, ...]


def directory_problem(path: str) -> str | None:
    """Why `path` is unacceptable as a directory rsync copies from or into, or None when it is fine."""
    if not path or not path.strip():
        return "must not be empty"
    if not path.startswith("/"):
        return "must be an absolute path"
    normalised = posixpath.normpath(path)
    if normalised.startswith("//"):  # POSIX keeps a leading '//' as is
        normalised = "/" + normalised.lstrip("/")
    if normalised in SYSTEM_DIRECTORIES:
        return f"refusing to sync into '/' or a system directory ({normalised})"
    if normalised != path:
        return f"must be a normalised path: write '{normalised}' (no trailing '/', '//', '.' or '..')"
    return None


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def _host_key(address: str, port: int) -> tuple[str, int]:
    try:
        return (str(ipaddress.ip_address(address.strip("[]"))), port)
    except ValueError:
        return (address.strip().rstrip(".").lower(), port)


def cross_field_problems(plan: Plan) -> list[tuple[Location, str]]:
    """Problems that involve several fields, each with the location of the field to blame."""
    problems: list[tuple[Location, str]] = []

    if _host_key(plan.source.address, plan.source.ssh_port) == _host_key(plan.target.address, plan.target.ssh_port):
        problems.append((("target", "address"), "source and target are the same host (same address and ssh_port)"))

    target_datadir = plan.database.target.datadir
    seen_targets: dict[str, int] = {}
    for index, tree in enumerate(plan.files):
        if tree.target in seen_targets:
            other = plan.files[seen_targets[tree.target]].name
            problems.append(
                (("files", index, "target"), f"same target as tree '{other}': two trees would overwrite each other")
            )
        else:
            seen_targets[tree.target] = index
        if tree.target == target_datadir:
            problems.append((("files", index, "target"), "a tree may not be synced into the target's datadir"))
        elif _inside(tree.target, target_datadir) or _inside(target_datadir, tree.target):
            problems.append(
                (("files", index, "target"), "a tree may not overlap the target's datadir (one inside the other)")
            )

    names = [tree.name for tree in plan.files]
    for index, name in enumerate(names):
        if name in names[:index]:
            problems.append((("files", index, "name"), f"another tree is already named '{name}'"))

    problems += fence_problems(plan)
    return problems


def fence_problems(plan: Plan) -> list[tuple[Location, str]]:
    """A fence that cannot be lifted, or files moved with nothing stopping uploads on the source."""
    problems: list[tuple[Location, str]] = []
    fence, target_fence = plan.services.fence, plan.services.target_fence
    if fence.enable and not fence.disable:
        problems.append(
            (
                ("services", "fence", "disable"),
                "required with services.fence.enable: a rollback runs it so the source takes writes again "
                "(without it the source would stay fenced while the run says it serves)",
            )
        )
    if target_fence.enable and not target_fence.disable:
        problems.append(
            (
                ("services", "target_fence", "disable"),
                "required with services.target_fence.enable: the DNS flip runs it so the target takes writes "
                "(without it the target would refuse every write after the migration)",
            )
        )
    if plan.files and not fence.enable:
        problems.append(
            (
                ("files",),
                "moving files needs services.fence.enable (how the source refuses writes): without a fence the "
                "source keeps accepting uploads after the final file sync, and those would be lost when DNS moves",
            )
        )
    return problems
