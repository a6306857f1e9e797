"""The lab's front door: Debian's HAProxy in front of each host's app, as nginx/HAProxy front a real PHP app.

HAProxy listens where clients reach the service (HostState.address:app_port, so DNS answers and clients are
unchanged); the app moves to HostState.app_internal_port on the same address. Per host:

    <host>/haproxy/haproxy.cfg  frontdoor.lua  frontdoor.map    the config, the hold action and its map
    <host>/run/haproxy.sock  haproxy.pid                         the admin socket (runtime API) and the pid
    <host>/log/haproxy.log                                       one line per request (HAProxy's httplog)

It runs on both hosts from `lab up` to `lab down`, whether or not the app behind it runs (a stopped app: 503).
The front door holds requests with the Lua action of orchestrator.transports.haproxy (see there for what was
measured and why `set maxconn frontend 0` is not used), driven through the admin socket.

The plan section proposed for a front door (one per host; absent: today's fence behaviour stays):

    proxy:
      source:
        kind: haproxy                               # the only kind for now
        admin_socket: /run/haproxy/admin.sock       # reached through the host's SSH connection
        frontend: app_front                         # where clients arrive
        backend: app_backend                        # the backend/server that sends requests to the app;
        server: app                                 #   repointed at the target after the flip
        hold_map: /etc/haproxy/frontdoor.map        # the map the frontdoor_hold Lua action reads
        forward_to: {address: 127.0.0.3, port: 8080}  # default: the target's address and the clients' port
        drain_timeout: 5                            # seconds in-flight requests get to finish after the hold
        hold: writes                                # replicate mode: GET/HEAD/OPTIONS go on to the source
      target: {kind: haproxy, ...}                  # the same keys: holds new-DNS clients until its fence lifts
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from migrate_lab import procs
from migrate_lab.state import HostState
from orchestrator.transports.haproxy import HOLD_KEY, HOLD_WRITES_KEY, FrontDoor, HaproxyError, hold_lua, unix_socket

FRONTEND = "app_front"
BACKEND = "app_backend"
SERVER = "app"
# No request waits longer than this in a hold, whatever the map says: the lab plan's cutover.max_write_block.
MAX_HOLD_S = 60.0
START_TIMEOUT = 10.0
HAPROXY = "haproxy"
SYSTEM_SBIN = "/usr/sbin:/usr/local/sbin:/sbin"


class FrontDoorError(RuntimeError):
    """The lab's HAProxy could not be configured, started or stopped; the message names its log."""


def config_file(host: HostState) -> Path:
    return host.haproxy_dir / "haproxy.cfg"


def lua_file(host: HostState) -> Path:
    return host.haproxy_dir / "frontdoor.lua"


def map_file(host: HostState) -> Path:
    return host.haproxy_dir / "frontdoor.map"


def log_file(host: HostState) -> Path:
    return host.log_dir / "haproxy.log"


def binary() -> str:
    found = shutil.which(HAPROXY) or shutil.which(HAPROXY, path=SYSTEM_SBIN)
    if found is None:
        raise FrontDoorError("haproxy is not installed (Debian package: haproxy)")
    return found


def config_text(host: HostState) -> str:
    return f"""# The front door of the lab's {host.name}: clients reach {host.address}:{host.app_port},
# the app listens on {host.address}:{host.app_internal_port}. Written by `migrate lab up`.
global
    nbthread 1
    stats socket {host.haproxy_socket} {f"mode 660 gid {host.admin_gid}" if host.admin_gid else "mode 600"} level admin
    lua-load {lua_file(host)}
    log stdout format raw local0 info

defaults
    mode http
    log global
    option httplog
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout queue 30s
    timeout http-request 10s
    timeout http-keep-alive 5s

frontend {FRONTEND}
    bind {host.address}:{host.app_port}
    # Held requests wait here (not refused) while the map's hold_until is in the future.
    http-request lua.frontdoor_hold
    default_backend {BACKEND}

backend {BACKEND}
    # From the host's own address, as the app on a real server would see its proxy.
    source {host.address}
    server {SERVER} {host.address}:{host.app_internal_port}
"""


def write_config(host: HostState) -> Path:
    """The config, the Lua action and the map (not held); checked with `haproxy -c`."""
    host.haproxy_dir.mkdir(parents=True, exist_ok=True)
    host.log_dir.mkdir(parents=True, exist_ok=True)
    lua_file(host).write_text(hold_lua(str(map_file(host)), max_hold_s=MAX_HOLD_S))
    # A (re)started front door never begins holding: runtime changes of the map are not written back to it.
    map_file(host).write_text(f"{HOLD_KEY} 0\n{HOLD_WRITES_KEY} 0\n")
    path = config_file(host)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(config_text(host))
    check = subprocess.run(
        [binary(), "-c", "-q", "-f", str(tmp)], capture_output=True, text=True, timeout=30, check=False
    )
    if check.returncode != 0:
        said = " ".join((check.stderr or check.stdout).split())[:300]
        raise FrontDoorError(f"the HAProxy config of {host.name} does not check ({tmp}): {said}")
    tmp.replace(path)
    return path


def running_pid(host: HostState) -> int | None:
    return procs.running_pid(host.haproxy_pid_file, str(config_file(host)))


def front_door(host: HostState) -> FrontDoor:
    """The host's front door through its local admin socket."""
    return FrontDoor(
        unix_socket(str(host.haproxy_socket)),
        frontend=FRONTEND,
        backend=BACKEND,
        server=SERVER,
        hold_map=str(map_file(host)),
        name=f"front door of {host.name}",
    )


def _log_tail(host: HostState, lines: int = 5) -> str:
    try:
        text = log_file(host).read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    return " | ".join(line.strip() for line in text[-lines:] if line.strip()) or "empty log"


def start(host: HostState) -> int:
    """Start the host's HAProxy unless it runs; returns its pid once it listens and its admin socket answers."""
    pid = running_pid(host)
    if pid is not None:
        return pid
    write_config(host)
    host.run_dir.mkdir(parents=True, exist_ok=True)
    host.haproxy_socket.unlink(missing_ok=True)
    # Not daemonised (-db): the pid is ours to record, and HAProxy's log (stdout) goes to the host's log dir.
    with open(log_file(host), "ab") as log:
        proc = subprocess.Popen(
            [binary(), "-db", "-f", str(config_file(host))],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=host.path,
        )
    tmp = host.haproxy_pid_file.with_name(host.haproxy_pid_file.name + ".tmp")
    tmp.write_text(f"{proc.pid}\n")
    tmp.replace(host.haproxy_pid_file)
    deadline = time.monotonic() + START_TIMEOUT
    door = front_door(host)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise FrontDoorError(
                f"HAProxy of {host.name} exited ({proc.returncode}); see {log_file(host)}: {_log_tail(host)}"
            )
        if procs.port_answers(host.address, host.app_port, timeout=0.2):
            try:
                door.host_now()
            except (HaproxyError, ValueError):
                pass
            else:
                return proc.pid
        time.sleep(0.05)
    procs.stop_pid(proc.pid, timeout=5)
    raise FrontDoorError(f"HAProxy of {host.name} did not answer within {START_TIMEOUT:g} s; see {log_file(host)}")


def stop(host: HostState) -> int | None:
    """Stop the host's HAProxy (SIGTERM: it closes its listener at once); returns the pid it stopped."""
    pid = procs.stop_pid_file(host.haproxy_pid_file, str(config_file(host)), timeout=10)
    if pid is not None:
        host.haproxy_pid_file.unlink(missing_ok=True)
        host.haproxy_socket.unlink(missing_ok=True)
    return pid


def reset(host: HostState) -> None:
    """The front door as `lab up` starts it: not holding, its server pointed at the host's own app."""
    door = front_door(host)
    door.release()
    door.repoint(host.address, host.app_internal_port)
