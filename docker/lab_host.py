"""Entry point of the lab's containers (docker-compose.test.yml): `source`, `target` or `cloudflare-api`.

Each container does its own host's part of `migrate lab up` with the same code, on the shared /lab volume (the native
lab's directory), then stays in the foreground until SIGTERM, when it stops its daemons cleanly (MariaDB included).
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from migrate_lab import binscripts, cfapi, hosts, mariadb, planfile, procs, sshd, wordpress
from migrate_lab.state import STATE_FILE, HostState, LabState

LAB_DIR = Path("/lab")
ADDRESSES = {"source": "172.30.0.2", "target": "172.30.0.3", "cloudflare-api": "172.30.0.4"}
WAIT_FOR_PEER = 180.0


@contextmanager
def locked(name: str) -> Iterator[None]:
    """One container at a time in the shared volume's set-up (keys, secrets, lab.json, known_hosts)."""
    LAB_DIR.mkdir(parents=True, exist_ok=True)
    with open(LAB_DIR / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def lab_state() -> LabState:
    with locked("init"):
        if (LAB_DIR / STATE_FILE).exists():
            state = LabState.load(LAB_DIR)
        else:

            def host(name: str, server_id: int) -> HostState:
                return HostState(
                    name=name,
                    address=ADDRESSES[name],
                    ssh_port=hosts.DEFAULT_SSH_PORT,
                    db_port=hosts.DEFAULT_DB_PORT,
                    app_port=hosts.DEFAULT_APP_PORT,
                    server_id=server_id,
                    root=str(LAB_DIR / name),
                )

            state = LabState(
                dir=str(LAB_DIR),
                source=host("source", 1),
                target=host("target", 2),
                cf_address=ADDRESSES["cloudflare-api"],
                cf_port=hosts.DEFAULT_CF_PORT,
                app=os.environ.get("LAB_APP", "demo"),  # "wordpress": nginx + php8.2-fpm + WordPress
            )
            state.save()
        hosts.ensure_env_file(state)
        sshd.keygen(state.ssh_key, "migrate-lab")
    return state


def write_known_hosts(state: LabState) -> None:
    """known_hosts lines for every host whose key exists yet (each host container adds its own)."""
    with locked("known_hosts"):
        lines = []
        for host in (state.source, state.target):
            pub = sshd.host_key(host).with_suffix(".pub")
            if pub.exists():
                key_type, key_b64 = pub.read_text().split()[:2]
                lines.append(f"[{host.address}]:{host.ssh_port} {key_type} {key_b64}\n")
        state.known_hosts.write_text("".join(lines))


def wait_for(what: str, ready: Callable[[], bool], timeout: float = WAIT_FOR_PEER) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.5)


def run_host(name: str) -> LabState:
    state = lab_state()
    host = state.host(name)
    for sub in (host.run_dir, host.log_dir, host.uploads, host.app_dir):
        sub.mkdir(parents=True, exist_ok=True)
    sshd.prepare(state, host)
    write_known_hosts(state)
    sshd.start(state, host)
    binscripts.write_scripts(state, host, python=sys.executable)
    if state.app == wordpress.APP_NAME:
        wordpress.write_host(state, host)
    mariadb.install_datadir(host)
    if name == "target":
        return state  # the target's database and app stay stopped: the migration brings them
    hosts.run_script(host, "db-start")
    mariadb.provision_users(state, state.secrets())
    mariadb.fill_reviews(state, 5)
    hosts.seed_uploads(state, 4)
    if state.app == wordpress.APP_NAME:
        wordpress.install(state, host)
    hosts.run_script(host, "app-start", timeout=60)
    # The source checks its hop to the target once the target's sshd is up, then writes the plan.
    target = state.target
    wait_for("the target's sshd", lambda: procs.port_answers(target.address, target.ssh_port))
    write_known_hosts(state)
    sshd.verify_login(state, target)
    sshd.verify_source_to_target(state)
    planfile.write_plan(state)
    return state


def stop_host(state: LabState, name: str) -> None:
    host = state.host(name)
    for script in ("app-stop", "db-stop"):
        hosts.run_script(host, script)
    sshd.stop(host)


def run_cloudflare() -> None:
    state = lab_state()
    cfapi.write_token(state.cf_dir, state.secrets()[state.token_env])
    cfapi.seed(state.cf_dir, state.zone, state.records, state.source.address, state.record_ttl)
    cfapi.main(["--dir", str(state.cf_dir), "--host", state.cf_address, "--port", str(state.cf_port)])


def main(role: str) -> None:
    if role == "cloudflare-api":
        run_cloudflare()
        return
    if role not in ("source", "target"):
        raise SystemExit(f"unknown role {role!r}: source, target or cloudflare-api")
    state = run_host(role)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"lab {role} is up", flush=True)
    stop.wait()
    stop_host(state, role)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "source")
