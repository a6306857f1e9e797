"""The lab's unprivileged operator (`lab up --operator`): an account of this machine the lab plan logs in as on both
hosts, gaining root with passwordless sudo (`become: sudo`), as many real servers are run.

    user      mlab-<8 hex of the lab's directory>, a system account, home <dir>/operator-home, shell /bin/bash
    sudoers   /etc/sudoers.d/<user>: NOPASSWD for /usr/bin/sh (every command of the migration runs as
              `sudo -n -- sh -c …`, the transport's one way to root) and /usr/bin/rsync (rsync's remote end over the
              source → target hop). A shell as root is all of root: the account is as trusted as root is; what it
              spares is a root login over SSH.
    groups    the HAProxy admin sockets of the lab are group-accessible to it (the forward to them runs as it)

The lab's directory must be traversable by the account (mode 0711 on it and its parents): its keys, secrets and
datadirs keep their own modes. `remove` deletes the account and its sudoers file; `lab down --purge` calls it.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import subprocess
from pathlib import Path

from migrate_lab.state import LabState

SUDOERS_DIR = Path("/etc/sudoers.d")
ROOT_COMMANDS = ("/usr/bin/sh", "/usr/bin/rsync")


class OperatorError(RuntimeError):
    """The operator account could not be made; the message says which command failed."""


def user_name(state: LabState) -> str:
    return "mlab-" + hashlib.sha256(state.dir.encode()).hexdigest()[:8]


def home(state: LabState) -> Path:
    return state.path / "operator-home"


def sudoers_file(state: LabState) -> Path:
    return SUDOERS_DIR / user_name(state)


def sudoers_text(state: LabState) -> str:
    return (
        f"# The migrate lab's operator ({state.dir}): root for the migration's commands, without a password.\n"
        f"{user_name(state)} ALL=(root) NOPASSWD: {', '.join(ROOT_COMMANDS)}\n"
    )


def gid(state: LabState) -> int:
    """The account's group id (0 when it does not exist)."""
    try:
        return grp.getgrnam(user_name(state)).gr_gid
    except KeyError:
        return 0


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise OperatorError(f"{' '.join(argv)} failed (exit {proc.returncode}): {proc.stderr.strip()}")


def ensure(state: LabState) -> str:
    """The account, its home and its sudo rights (kept when they exist); the lab's directory made traversable."""
    name = user_name(state)
    try:
        pwd.getpwnam(name)
    except KeyError:
        _run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", str(home(state)),
              "--shell", "/bin/bash", name])  # fmt: skip
        # Not locked ('!'): without PAM, sshd refuses a locked account even with a key. '*': no password either.
        _run(["usermod", "--password", "*", name])
    home(state).mkdir(exist_ok=True)
    entry = pwd.getpwnam(name)
    os.chown(home(state), entry.pw_uid, entry.pw_gid)
    home(state).chmod(0o700)
    text = sudoers_text(state)
    target = sudoers_file(state)
    if not target.exists() or target.read_text() != text:
        tmp = SUDOERS_DIR / f".{name}.tmp"  # sudo ignores files whose name contains a '.'
        tmp.write_text(text)
        tmp.chmod(0o440)
        _run(["visudo", "-c", "-q", "-f", str(tmp)])
        tmp.replace(target)
    state.path.chmod(0o711)
    return name


def remove(state: LabState) -> None:
    """The account and its sudoers file, when they exist."""
    sudoers_file(state).unlink(missing_ok=True)
    try:
        pwd.getpwnam(user_name(state))
    except KeyError:
        return
    _run(["userdel", user_name(state)])


def plan_text(text: str, state: LabState) -> str:
    """The lab's plan logging in as the operator on both hosts, root through sudo."""
    out: list[str] = []
    section = ""
    for line in text.splitlines(keepends=True):
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            section = line.rstrip()[:-1]
        if section in ("source", "target") and line == "  user: root\n":
            out.append(f"  user: {user_name(state)}   # an unprivileged account of the lab\n")
            out.append("  become: sudo   # root for the migration's commands, passwordless\n")
            continue
        out.append(line)
    return "".join(out)
