"""The replication tunnel, as command lines for the source and their parsers: an `ssh -N` run on the source over the
same host-key-verified hop rsync uses. `-R` makes the target listen on its loopback and carries the replica's
connection to the source's database; `-L` (reverse replication) makes the source listen and reach the target's.
Nothing of the replication protocol crosses the network outside SSH. The ssh is its own control master (a
per-tunnel socket): `-O check` names its pid, `-O exit` ends it, and starting it again after it died is the same
idempotent command. Every engine's replica uses it (the database knows nothing of it).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from orchestrator.plan.model import ROOT_RUN_DIR


def _bash(script: str) -> str:
    return "bash -c " + shlex.quote(script)


@dataclass(frozen=True)
class TunnelSpec:
    """An SSH tunnel run on the source over its hop to the target.

    `remote`: the target listens on its 127.0.0.1:`listen_port` and the connection goes on, from the source, to
    `connect_host`:`connect_port` (the source's MariaDB): the forward replica's path. `local`: the source listens on
    its 127.0.0.1:`listen_port` and reaches `connect_host`:`connect_port` as seen from the target: the reverse path.
    """

    name: str
    direction: Literal["remote", "local"]
    ssh_to_target: tuple[str, ...]
    listen_port: int
    connect_host: str
    connect_port: int
    control_dir: str = ROOT_RUN_DIR  # the source's private directory (plan `run_dir`)
    alive_interval: int = 5
    alive_count: int = 3

    @property
    def control_path(self) -> str:
        return f"{self.control_dir.rstrip('/')}/migrate-tunnel-{self.name}.ctl"

    @property
    def log_path(self) -> str:
        return f"{self.control_dir.rstrip('/')}/migrate-tunnel-{self.name}.log"

    @property
    def forward(self) -> list[str]:
        flag = "-R" if self.direction == "remote" else "-L"
        return [flag, f"127.0.0.1:{self.listen_port}:{self.connect_host}:{self.connect_port}"]


def _with_options(ssh_argv: Sequence[str], options: Iterable[str]) -> list[str]:
    # ssh keeps the FIRST value of an option: ours go right after the program name, before the plan's.
    return [ssh_argv[0], *options, *ssh_argv[1:]]


def _control(spec: TunnelSpec, operation: str) -> str:
    argv = _with_options(spec.ssh_to_target, ["-o", f"ControlPath={spec.control_path}", "-O", operation])
    return shlex.join(argv)


def tunnel_up_command(spec: TunnelSpec) -> str:
    """Run on the source: start the tunnel unless it runs; returns once the forward is listening.

    `-f` with ExitOnForwardFailure makes ssh wait for the forward to be set up before it goes to the background,
    and fail when the port is taken. Keepalives end a tunnel whose peer vanished; this same command brings it back
    (a socket left by a killed master is removed first). Prints 'pid N'.
    """
    options = [
        "-f", "-N",
        "-o", "ControlMaster=yes", "-o", f"ControlPath={spec.control_path}", "-o", "ControlPersist=no",
        "-o", "ExitOnForwardFailure=yes",
        "-o", f"ServerAliveInterval={spec.alive_interval}", "-o", f"ServerAliveCountMax={spec.alive_count}",
        *spec.forward,
    ]  # fmt: skip
    start = shlex.join(_with_options(spec.ssh_to_target, options))
    control = shlex.quote(spec.control_path)
    log = shlex.quote(spec.log_path)
    script = f"""set -u
umask 077; mkdir -p -m 0700 {shlex.quote(spec.control_dir)}
if ! {_control(spec, "check")} 2>/dev/null; then
  rm -f {control}
  if ! {start} </dev/null >{log} 2>&1; then
    echo "tunnel {spec.name}: ssh failed: $(tail -n 3 {log} | tr '\\n' ' ')" >&2
    exit 1
  fi
fi
{_control(spec, "check")} 2>&1 | sed -n 's/.*pid=\\([0-9]*\\).*/pid \\1/p'"""
    return _bash(script)


def tunnel_check_command(spec: TunnelSpec) -> str:
    """Run on the source: prints 'pid N' while the tunnel's ssh runs (exit 0), nothing otherwise (exit 1)."""
    return _bash(
        f"set -o pipefail; {_control(spec, 'check')} 2>&1 | sed -n 's/.*pid=\\([0-9]*\\).*/pid \\1/p' | grep ."
    )


def parse_tunnel_pid(stdout: str) -> int | None:
    match = re.search(r"pid (\d+)", stdout)
    return int(match.group(1)) if match else None


def tunnel_down_command(spec: TunnelSpec) -> str:
    """Run on the source: end the tunnel (its connections close with it) and remove its socket and log; nothing to
    do when it is not running."""
    files = f"{shlex.quote(spec.control_path)} {shlex.quote(spec.log_path)}"
    return _bash(f"{_control(spec, 'exit')} 2>/dev/null; rm -f {files}; true")


def free_port_command(low: int = 20000, high: int = 60000) -> str:
    """Run on a host: print a TCP port nothing listens on at 127.0.0.1 now (a tunnel's listening end).

    Only a hint: the tunnel's ssh fails on a port taken meanwhile (ExitOnForwardFailure) and is tried again.
    """
    return _bash(
        f"for i in $(seq 50); do p=$(( {low} + (RANDOM * 32768 + RANDOM) % ({high} - {low}) )); "
        "if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo $p; exit 0; fi; done; exit 1"
    )


def parse_port(stdout: str) -> int:
    return int(stdout.strip().split()[0])
