"""The lab's latency relay: a real delay on the orchestrator's own connections, none on the hop between the hosts.

Only lower bounds are asserted: a relay that holds each byte `d` seconds each way can never answer a round trip in
less than 2·d, whatever the machine's load; how much more it takes is the bench's business, not a test's.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from migrate_lab import hosts, procs, relay
from migrate_lab.state import HostState, LabState
from orchestrator.plan.loader import load_plan
from orchestrator.runtime import Runtime
from orchestrator.transports import rsync
from orchestrator.transports.cloudflare import DnsClient

DELAY_MS = 100.0
DELAY = DELAY_MS / 1000


def test_each_chunk_is_due_its_delay_after_it_arrived_not_after_the_one_ahead() -> None:
    """A pipeline: chunks arriving 10 ms apart leave 10 ms apart, 100 ms late each (serial sleeps would space them
    100 ms apart and a stream's throughput would collapse); none leaves before the connection exists."""
    line = relay.DelayLine(0.1, not_before=5.0)
    assert [line.due(t) for t in (5.0, 5.01, 5.02, 5.03)] == pytest.approx([5.1, 5.11, 5.12, 5.13])
    assert line.due(4.0) == pytest.approx(5.1)  # sent before the far end accepted: held until it exists


@pytest.fixture
def echo_server() -> Iterator[int]:
    """A TCP server on loopback that sends back whatever it receives, until the client closes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        listener.close()


def _state(root: Path, upstream_port: int) -> LabState:
    def host(name: str, address: str) -> HostState:
        return HostState(name, address, 0, 0, 0, 1, str(root / name))

    state = LabState(dir=str(root), source=host("source", "127.0.0.2"), target=host("target", "127.0.0.3"))
    state.cf_port = upstream_port
    state.api_latency_ms = DELAY_MS
    state.relay_api_port = procs.free_port(["127.0.0.1"], avoid=[upstream_port])
    return state


def _exchange(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    got = b""
    while len(got) < len(data):
        chunk = sock.recv(65536)
        assert chunk, "the relay closed the connection"
        got += chunk
    return got


def test_relay_delays_each_way_keeps_order_and_stops(tmp_path: Path, echo_server: int) -> None:
    state = _state(tmp_path, echo_server)
    pid = relay.start(state)
    try:
        assert pid is not None and relay.running_pid(state) == pid
        assert relay.start(state) == pid  # the same routes: left running
        with socket.create_connection(("127.0.0.1", state.relay_api_port), timeout=10) as sock:
            began = time.monotonic()
            assert _exchange(sock, b"ping") == b"ping"
            # A new connection: the handshake's round trip, then the request's.
            assert time.monotonic() - began >= 4 * DELAY
            began = time.monotonic()
            assert _exchange(sock, b"pong") == b"pong"
            assert time.monotonic() - began >= 2 * DELAY
            # A stream: every byte back, in order.
            payload = os.urandom(4 * 1024 * 1024)
            echoed = _exchange(sock, payload)
            assert hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()
    finally:
        stopped = relay.stop(state)
    assert stopped == pid and not procs.is_alive(pid)
    assert procs.port_is_free("127.0.0.1", state.relay_api_port)
    state.api_latency_ms = 0
    assert relay.start(state) is None  # no distance: no relay


@pytest.mark.lab
def test_the_orchestrators_connections_cross_the_relay_and_the_hop_between_hosts_does_not(lab: LabState) -> None:
    plan_before = lab.plan_file.read_text()
    try:
        relay.set_distance(lab, DELAY_MS, DELAY_MS)
        plan = load_plan(lab.plan_file).plan
        assert plan.target.address == lab.target.far_address != lab.target.address
        assert plan.target.dns_content == lab.target.address  # the records still point at the host itself
        status = "\n".join(hosts.status(lab.path))
        assert f"relay target ssh     {lab.target.far_address}:{lab.target.ssh_port} → " in status

        with Runtime(plan, lab.plan_file) as rt:
            rt.target.run("true")  # connected through the relay, the host key verified at the far address
            began = time.monotonic()
            rt.target.run("true")
            ssh_round_trip = time.monotonic() - began
            login = shlex.quote(f"{plan.target.user}@{plan.target.address}")
            hop = rt.source.run(f"{rsync.target_ssh_command(plan, control='no')} {login} 'echo $SSH_CLIENT'")
        assert ssh_round_trip >= 2 * DELAY
        # The hop rsync and replication take arrives from the source's own address: straight, not relayed.
        assert hop.exit_status == 0, hop.stderr
        assert hop.stdout.split()[0] == lab.source.address

        url = plan.aimed_at_source(plan.health.checks[0].url)  # type: ignore[union-attr]
        began = time.monotonic()
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert answer.read().strip() == b"ok source"  # the source's app, through the relay
        assert time.monotonic() - began >= 4 * DELAY  # a new connection's handshake, then the request

        with DnsClient(lab.secrets()[lab.token_env], base_url=plan.dns.base_url, timeout=10) as dns:
            dns.verify_token(plan.dns.zone)
            began = time.monotonic()
            dns.verify_token(plan.dns.zone)
            assert time.monotonic() - began >= 2 * DELAY
    finally:
        relay.set_distance(lab, 0, 0)
        lab.plan_file.write_text(plan_before)
    assert relay.running_pid(lab) is None
    assert load_plan(lab.plan_file).plan.target.address == lab.target.address
