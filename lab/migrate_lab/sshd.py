"""Each lab host's OpenSSH server, the lab's key pair and its known_hosts.

Host keys are always verified: `<dir>/known_hosts` holds `[address]:port` lines for both hosts, and every ssh the lab
runs uses it with StrictHostKeyChecking=yes.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path

from migrate_lab import procs
from migrate_lab.state import HostState, LabState

SSHD = "/usr/sbin/sshd"
SSH = "ssh"
SSH_KEYGEN = "ssh-keygen"
# Sessions started over ssh find the lab's tools (and a Python with the orchestrator) without a login shell.
SESSION_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class LabSshError(RuntimeError):
    """sshd could not be started or a login failed; the message says which and where the log is."""


def host_key(host: HostState) -> Path:
    return host.sshd_dir / "ssh_host_ed25519_key"


def config_file(host: HostState) -> Path:
    return host.sshd_dir / "sshd_config"


def authorized_keys(host: HostState) -> Path:
    return host.sshd_dir / "authorized_keys"


def keygen(path: Path, comment: str) -> None:
    """An ed25519 key pair at path (kept when it exists: re-making it would invalidate known_hosts)."""
    if path.exists() and path.with_suffix(".pub").exists():
        return
    path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    path.chmod(0o600)


def config_text(host: HostState, state: LabState) -> str:
    return f"""# sshd of the lab host "{host.name}" (written by `lab up`; rewritten on every run)
ListenAddress {host.address}:{host.ssh_port}
HostKey {host_key(host)}
PidFile {host.sshd_pid_file}
AuthorizedKeysFile {authorized_keys(host)}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
# The lab's files live under a shared work tree whose modes sshd's strict checks would reject.
StrictModes no
AllowAgentForwarding yes
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
MaxSessions 20
MaxStartups 50
LogLevel INFO
# Each host's own home: bash, started by sshd for every session, sources $HOME/.bashrc, and this machine's account
# may run heavy initialisation there (a version manager's `init` measured at 0.1 s of CPU per session, about 1 s
# under the lab's load). Such costs belong to a machine, not to a migration.
SetEnv PATH={SESSION_PATH} LAB_DIR={state.dir} LAB_HOST={host.name} HOME={host.home}
Subsystem sftp internal-sftp
"""


def ssh_base_argv(state: LabState, host: HostState, *, known_hosts: Path | None = None) -> list[str]:
    """ssh from this machine (the orchestrator's seat) to a lab host, with its host key verified."""
    return [
        SSH,
        "-F",
        "/dev/null",
        "-i",
        str(state.ssh_key),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "IdentityAgent=none",
        "-o",
        f"UserKnownHostsFile={known_hosts or state.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-p",
        str(host.ssh_port),
        f"root@{host.address}",
    ]


def source_to_target_argv(state: LabState) -> list[str]:
    """ssh as run ON the source to reach the target (the hop rsync uses), from the source's address."""
    return [
        SSH,
        "-i",
        str(state.ssh_key),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={state.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        f"BindAddress={state.source.address}",
        "-p",
        str(state.target.ssh_port),
        f"root@{state.target.address}",
    ]


def prepare(state: LabState, host: HostState) -> None:
    """Host key, authorized_keys and config for one host (safe to repeat)."""
    host.sshd_dir.mkdir(parents=True, exist_ok=True)
    host.run_dir.mkdir(parents=True, exist_ok=True)
    host.log_dir.mkdir(parents=True, exist_ok=True)
    host.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    keygen(host_key(host), f"lab-{host.name}-host")
    authorized_keys(host).write_text(state.ssh_key.with_suffix(".pub").read_text())
    config_file(host).write_text(config_text(host, state))


def write_known_hosts(state: LabState) -> None:
    """Both hosts' keys under their addresses, and under their far addresses once the lab has had distance (the
    orchestrator then reaches them through the latency relay, and verifies the same key there)."""
    lines = []
    for host in (state.source, state.target):
        key_type, key_b64 = host_key(host).with_suffix(".pub").read_text().split()[:2]
        for address in dict.fromkeys(a for a in (host.address, host.far_address) if a):
            lines.append(f"[{address}]:{host.ssh_port} {key_type} {key_b64}\n")
    tmp = state.known_hosts.with_suffix(".tmp")
    tmp.write_text("".join(lines))
    tmp.replace(state.known_hosts)


def marker(host: HostState) -> str:
    return str(config_file(host))


def running_pid(host: HostState) -> int | None:
    return procs.running_pid(host.sshd_pid_file, marker(host))


def start(state: LabState, host: HostState) -> int:
    """Start the host's sshd unless it runs; returns its pid. Raises LabSshError with sshd's own words."""
    pid = running_pid(host)
    if pid is not None:
        return pid
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation directory sshd insists on
    log = host.log_dir / "sshd.log"
    check = subprocess.run([SSHD, "-t", "-f", str(config_file(host))], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise LabSshError(f"sshd config of {host.name} is invalid: {check.stderr.strip()}")
    host.sshd_pid_file.unlink(missing_ok=True)
    proc = subprocess.run(
        [SSHD, "-f", str(config_file(host)), "-E", str(log)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise LabSshError(f"sshd of {host.name} did not start (exit {proc.returncode}); see {log}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pid = running_pid(host)
        if pid is not None and procs.port_answers(host.address, host.ssh_port):
            return pid
        time.sleep(0.05)
    raise LabSshError(f"sshd of {host.name} is not listening on {host.address}:{host.ssh_port}; see {log}")


def stop(host: HostState) -> int | None:
    pid = procs.stop_pid_file(host.sshd_pid_file, marker(host), timeout=10)
    host.sshd_pid_file.unlink(missing_ok=True)
    return pid


def run_on(
    state: LabState, host: HostState, command: str, *, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ssh_base_argv(state, host), command],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def verify_login(state: LabState, host: HostState) -> None:
    proc = run_on(state, host, "true")
    if proc.returncode != 0:
        raise LabSshError(f"ssh to {host.name} ({host.address}:{host.ssh_port}) failed: {proc.stderr.strip()}")


def verify_source_to_target(state: LabState) -> None:
    """The source reaches the target from its own address, verifying the target's host key."""
    hop = " ".join(shlex.quote(a) for a in [*source_to_target_argv(state), 'echo "$SSH_CLIENT"'])
    proc = run_on(state, state.source, hop)
    seen_from = proc.stdout.split()[0] if proc.returncode == 0 and proc.stdout.split() else ""
    if proc.returncode != 0 or seen_from != state.source.address:
        raise LabSshError(
            f"ssh from source to target failed (exit {proc.returncode}, seen from {seen_from or '?'}): "
            f"{proc.stderr.strip()}"
        )
