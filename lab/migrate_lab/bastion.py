"""The lab's bastion (`lab up --bastion`): a third sshd on its own loopback address, the jump host the lab plan's
`jump:` sections send the orchestrator's SSH connections through (the source → target hop stays direct).

    <dir>/bastion/   sshd/ (host key, config, authorized_keys)  run/  log/ (sshd.log: every login through it)
    <dir>/bastion_known_hosts   the bastion's host key alone: each hop is verified against its own file
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from migrate_lab import sshd
from migrate_lab.state import HostState, LabState

BASTION_ADDRESS = "127.0.0.4"
NAME = "bastion"


def host_state(state: LabState) -> HostState:
    """The bastion as a lab host (an sshd and nothing else), on the lab's SSH port at its own address."""
    return HostState(
        name=NAME,
        address=state.bastion_address or BASTION_ADDRESS,
        ssh_port=state.source.ssh_port,
        db_port=0,
        app_port=0,
        server_id=0,
        root=str(state.path / NAME),
    )


def known_hosts(state: LabState) -> Path:
    return state.path / "bastion_known_hosts"


def log_file(state: LabState) -> Path:
    return host_state(state).log_dir / "sshd.log"


def write_known_hosts(state: LabState) -> None:
    bastion = host_state(state)
    key_type, key_b64 = sshd.host_key(bastion).with_suffix(".pub").read_text().split()[:2]
    tmp = known_hosts(state).with_suffix(".tmp")
    tmp.write_text(f"[{bastion.address}]:{bastion.ssh_port} {key_type} {key_b64}\n")
    tmp.replace(known_hosts(state))


def up(state: LabState) -> int:
    """Start the bastion's sshd unless it runs (its key pair kept across runs); returns its pid."""
    bastion = host_state(state)
    sshd.prepare(state, bastion)
    write_known_hosts(state)
    pid = sshd.start(state, bastion)
    proc = subprocess.run(
        [*sshd.ssh_base_argv(state, bastion, known_hosts=known_hosts(state)), "true"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise sshd.LabSshError(f"ssh to the bastion ({bastion.address}:{bastion.ssh_port}) failed: {proc.stderr}")
    return pid


def stop(state: LabState) -> int | None:
    return sshd.stop(host_state(state))


def running_pid(state: LabState) -> int | None:
    return sshd.running_pid(host_state(state))


def jump_text(state: LabState) -> str:
    bastion = host_state(state)
    return (
        "  jump:   # the orchestrator reaches this host through the lab's bastion (verified with its own file)\n"
        f"    address: {json.dumps(bastion.address)}\n"
        f"    ssh_port: {bastion.ssh_port}\n"
        "    user: root\n"
        f"    key: {json.dumps(str(state.ssh_key))}\n"
        f"    known_hosts: {json.dumps(str(known_hosts(state)))}\n"
    )


def plan_text(text: str, state: LabState) -> str:
    """The lab's plan with a `jump:` section on the source and the target."""
    out: list[str] = []
    section = ""
    for line in text.splitlines(keepends=True):
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            section = line.rstrip()[:-1]
        out.append(line)
        if section in ("source", "target") and line.startswith("  known_hosts:"):
            out.append(jump_text(state))
    return "".join(out)
