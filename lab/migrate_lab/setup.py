"""The system tools the lab needs: found, installed with apt-get when we may, or named in one clear error."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

# tool → the Debian/Ubuntu package that provides it
REQUIRED_TOOLS: dict[str, str] = {
    "sshd": "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "rsync": "rsync",
    "mariadbd": "mariadb-server",
    "mariadb-install-db": "mariadb-server",
    "mariadb": "mariadb-client",
    "mariadb-admin": "mariadb-client",
    "mariadb-backup": "mariadb-backup",
    "inotifywait": "inotify-tools",
    "haproxy": "haproxy",
}
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


class SetupError(RuntimeError):
    """The lab's system tools are missing and cannot be installed here."""


def find_tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=SYSTEM_PATH)


def missing_packages() -> list[str]:
    packages = {pkg for tool, pkg in REQUIRED_TOOLS.items() if find_tool(tool) is None}
    return sorted(packages)


def can_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def install(packages: list[str]) -> None:
    """apt-get install, with a policy-rc.d that forbids starting services: installing mariadb-server or
    openssh-server must never start (or restart) a database or an sshd on this machine."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    placed_policy = False
    if not POLICY_RC_D.exists():
        with tempfile.NamedTemporaryFile("w", dir=POLICY_RC_D.parent, delete=False) as tmp:
            tmp.write("#!/bin/sh\n# no service starts while the lab installs packages\nexit 101\n")
        os.chmod(tmp.name, 0o755)
        os.replace(tmp.name, POLICY_RC_D)
        placed_policy = True
    try:
        for argv in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        ):
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
                raise SetupError(f"{' '.join(argv[:2])} failed (exit {proc.returncode}): {tail}")
    finally:
        if placed_policy:
            POLICY_RC_D.unlink(missing_ok=True)


def ensure_system_tools(extra: list[str] | None = None) -> list[str]:
    """Make sure every tool the lab runs exists; returns the packages it installed (usually none). `extra`:
    packages an option of the lab needs and found missing (PostgreSQL's, for `--engine postgresql`)."""
    missing = sorted({*missing_packages(), *(extra or [])})
    if not missing:
        return []
    if not can_install():
        raise SetupError(
            "the lab needs these system packages: "
            + " ".join(missing)
            + f"; install them with: sudo apt-get install -y --no-install-recommends {' '.join(missing)}"
        )
    install(missing)
    still = [p for p in missing_packages() if p not in (extra or [])]
    if still:
        raise SetupError(f"after apt-get install these packages still miss their tools: {' '.join(still)}")
    return missing
