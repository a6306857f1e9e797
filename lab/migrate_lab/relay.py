"""Distance for the lab: a TCP relay that delivers every byte a fixed one-way delay late, in each direction.

The lab's hosts sit on loopback, a millisecond from the orchestrator; real servers are tens of milliseconds away and
Cloudflare's API hundreds. This kernel has no netem qdisc, so the distance is added in user space: the relay listens
where the lab's plan tells the orchestrator to connect (a host's SSH and HTTP ports on a "far" loopback address of
its own, the Cloudflare double's API on a port of its own) and forwards to the real listener.

Each direction is a pipeline, not a chain of sleeps: a chunk leaves `delay` after it arrived, whatever the chunks
before it wait for, in arrival order; a stream keeps its throughput, only its latency grows. A new connection
costs its round trip too: the kernel completes the client's handshake at once, so the relay holds the client's
first bytes until the handshake would have ended (one round trip after the connect) and opens the far end when
the real server would have seen it (one and a half round trips).

Only the orchestrator's own connections go through it; the hosts between them (rsync, replication, the front
doors' forwarding) and the load's clients stay direct. Lab tooling, not a product component.

    python -m migrate_lab.relay --config <lab>/relay/routes.json
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from migrate_lab import planfile, procs, sshd

if TYPE_CHECKING:
    from migrate_lab.state import HostState, LabState

MODULE = "migrate_lab.relay"
CONFIG_FILE = "routes.json"
PID_FILE = "relay.pid"
READY_FILE = "relay.ready"
LOG_FILE = "relay.log"
CHUNK = 64 * 1024
# At most this many chunks wait in one direction (16 MiB): a sender faster than the far end is slowed by TCP, not
# by our memory.
QUEUE_CHUNKS = 256
MAX_LATENCY_MS = 10_000.0


@dataclass(frozen=True)
class Route:
    name: str
    listen_host: str
    listen_port: int
    upstream_host: str
    upstream_port: int
    delay: float  # seconds, one way

    @property
    def listen(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    @property
    def upstream(self) -> str:
        return f"{self.upstream_host}:{self.upstream_port}"


class DelayLine:
    """When each chunk of one direction may leave: `delay` after it arrived, and never before `not_before` (the
    moment the connection exists at the far end). Independent of the chunks ahead of it: a pipeline."""

    def __init__(self, delay: float, not_before: float) -> None:
        self.delay = delay
        self.not_before = not_before

    def due(self, arrived: float) -> float:
        return max(arrived, self.not_before) + self.delay


# --- the relay process ---------------------------------------------------------------------------------------


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, line: DelayLine) -> None:
    """Copy one direction: the reader stamps each chunk with its due time, the writer sends it then."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)

    async def read() -> None:
        while True:
            data = await src.read(CHUNK)
            await queue.put((line.due(loop.time()), data))
            if not data:
                return

    async def write() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:  # the sender's EOF, delivered as late as its bytes
                if dst.can_write_eof():
                    dst.write_eof()
                return
            dst.write(data)
            await dst.drain()

    async with asyncio.TaskGroup() as group:  # one failing (a reset) cancels the other
        group.create_task(read())
        group.create_task(write())


async def _connection(route: Route, client_reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
    loop = asyncio.get_running_loop()
    accepted = loop.time()
    delay = route.delay
    upstream: asyncio.StreamWriter | None = None
    try:
        # The handshake a real link makes the client wait for: its connect returns a round trip after it began, and
        # the server accepts half a round trip after that.
        await asyncio.sleep(3 * delay)
        upstream_reader, upstream = await asyncio.open_connection(route.upstream_host, route.upstream_port)
        async with asyncio.TaskGroup() as group:
            group.create_task(_pump(client_reader, upstream, DelayLine(delay, accepted + 2 * delay)))
            group.create_task(_pump(upstream_reader, client, DelayLine(delay, accepted)))
    except* OSError as group:
        for exc in group.exceptions:
            sys.stderr.write(f"{time.strftime('%H:%M:%S')} {route.name}: {type(exc).__name__}: {exc}\n")
    finally:
        for writer in (client, upstream):
            if writer is not None:
                writer.close()


async def _serve(routes: list[Route], ready: Path) -> None:
    servers = []
    for route in routes:

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, route: Route = route) -> None:
            await _connection(route, reader, writer)

        servers.append(await asyncio.start_server(handle, route.listen_host, route.listen_port, reuse_address=True))
        sys.stderr.write(f"{route.name}: {route.listen} → {route.upstream}, +{route.delay * 1000:g} ms each way\n")
    sys.stderr.flush()
    ready.write_text(f"{os.getpid()}\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args(argv)
    raw = json.loads(args.config.read_text())
    routes = [Route(**r) for r in raw["routes"]]
    asyncio.run(_serve(routes, args.config.with_name(READY_FILE)))


# --- the lab's side: which routes, start, stop --------------------------------------------------------------


def relay_dir(state: LabState) -> Path:
    return state.path / "relay"


def config_file(state: LabState) -> Path:
    return relay_dir(state) / CONFIG_FILE


def pid_file(state: LabState) -> Path:
    return relay_dir(state) / PID_FILE


def running_pid(state: LabState) -> int | None:
    return procs.running_pid(pid_file(state), str(config_file(state)))


def _host_ports(host: HostState) -> list[tuple[str, int]]:
    """What the orchestrator reaches on a host directly: its SSH, and its front door (the HTTP health checks)."""
    return [("ssh", host.ssh_port), ("http", host.app_port)]


def routes(state: LabState) -> list[Route]:
    """The relay's routes for the lab's distances (none when both are zero)."""
    found: list[Route] = []
    if state.latency_ms > 0:
        for host in (state.source, state.target):
            for kind, port in _host_ports(host):
                found.append(
                    Route(f"{host.name} {kind}", host.far_address, port, host.address, port, state.latency_ms / 1000)
                )
    if state.api_latency_ms > 0:
        found.append(
            Route("cloudflare api", state.cf_address, state.relay_api_port, state.cf_address, state.cf_port,
                  state.api_latency_ms / 1000)
        )  # fmt: skip
    return found


def _lab_addresses(state: LabState) -> set[str]:
    return {state.source.address, state.target.address, state.cf_address}


def _free_for(address: str, ports: list[int]) -> bool:
    return all(procs.port_is_free(address, port) for port in ports)


def _pick_far_address(state: LabState, host: HostState, taken: set[str]) -> str:
    """A loopback address of the host's own for the relay, where its ports are free: 127.0.1.<last octet of the
    host's address> when it is, else a random one."""
    ports = [port for _, port in _host_ports(host)]
    last = ipaddress.ip_address(host.address).packed[-1]
    preferred = f"127.0.1.{last}"
    if preferred not in taken and _free_for(preferred, ports):
        return preferred
    rng = random.SystemRandom()
    for _ in range(200):
        candidate = f"127.{rng.randint(1, 254)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
        if candidate not in taken and _free_for(candidate, ports):
            return candidate
    raise RuntimeError(f"no loopback address with ports {ports} free for the relay of {host.name}")


def ensure_addresses(state: LabState) -> None:
    """Far addresses and the API's relay port, picked once and kept (re-picked only when someone else took them
    while the relay is down)."""
    running = running_pid(state) is not None
    taken = set(_lab_addresses(state))
    for host in (state.source, state.target):
        ports = [port for _, port in _host_ports(host)]
        if not host.far_address or (not running and not _free_for(host.far_address, ports)):
            host.far_address = _pick_far_address(state, host, taken)
        taken.add(host.far_address)
    if not state.relay_api_port or (not running and not procs.port_is_free(state.cf_address, state.relay_api_port)):
        state.relay_api_port = procs.free_port([state.cf_address], avoid=[state.cf_port])


def start(state: LabState, *, timeout: float = 10.0) -> int | None:
    """Run the relay for the lab's distances: (re)started when its routes changed, stopped when there are none.
    Returns its pid (None when no distance is set)."""
    wanted = routes(state)
    current = json.loads(config_file(state).read_text()).get("routes") if config_file(state).exists() else None
    pid = running_pid(state)
    if pid is not None and current == [asdict(r) for r in wanted]:
        return pid
    stop(state)
    if not wanted:
        return None
    relay_dir(state).mkdir(parents=True, exist_ok=True)
    config_file(state).write_text(json.dumps({"routes": [asdict(r) for r in wanted]}, indent=1))
    ready = relay_dir(state) / READY_FILE
    ready.unlink(missing_ok=True)
    log = relay_dir(state) / LOG_FILE
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", MODULE, "--config", str(config_file(state))],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    pid_file(state).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pid_file(state).unlink(missing_ok=True)
            tail = " ".join(log.read_text(errors="replace").strip().splitlines()[-1:])
            raise RuntimeError(f"the latency relay exited with code {proc.returncode}: {tail} (see {log})")
        if ready.exists() and ready.read_text().strip() == str(proc.pid):
            return proc.pid
        time.sleep(0.05)
    procs.stop_pid(proc.pid, timeout=5)
    raise RuntimeError(f"the latency relay did not listen within {timeout:.0f} s (see {log})")


def stop(state: LabState) -> int | None:
    """Stop the relay (by its pid file, only if it is ours); returns the pid it stopped."""
    pid = procs.stop_pid_file(pid_file(state), str(config_file(state)), timeout=10)
    pid_file(state).unlink(missing_ok=True)
    (relay_dir(state) / READY_FILE).unlink(missing_ok=True)
    return pid


def check_latency(name: str, value: float) -> None:
    if not 0 <= value <= MAX_LATENCY_MS:
        raise ValueError(f"{name} is milliseconds between 0 and {MAX_LATENCY_MS:g}, not {value:g}")


def set_distance(state: LabState, latency_ms: float, api_latency_ms: float) -> int | None:
    """Give the lab these one-way delays (milliseconds; 0: direct) between the orchestrator and the hosts, and the
    Cloudflare double: the relay (re)started or stopped, known_hosts and the lab's plan follow (the plan in the
    mode it has). Returns the relay's pid, None when everything is direct."""
    check_latency("--latency", latency_ms)
    check_latency("--api-latency", api_latency_ms)
    state.latency_ms = float(latency_ms)
    state.api_latency_ms = float(api_latency_ms)
    if latency_ms > 0 or api_latency_ms > 0:
        ensure_addresses(state)
    state.save()
    pid = start(state)
    sshd.write_known_hosts(state)
    planfile.write_plan(state, planfile.current_mode(state))
    return pid


if __name__ == "__main__":
    main()
