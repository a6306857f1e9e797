"""The front door on the lab: HAProxy in front of each host's app, holding requests (they wait, none fails),
releasing them, forwarding held requests to the target, and driven through its admin socket over SSH."""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from migrate_lab import haproxy, hosts, procs
from migrate_lab.mariadb import run_sql
from migrate_lab.state import HostState, LabState
from orchestrator.plan.model import Host, Retry
from orchestrator.transports.haproxy import AdminSocketUnreachable, FrontDoor, over_ssh
from orchestrator.transports.ssh import SshHost

pytestmark = pytest.mark.lab

# Generous: what is awaited is an event (HAProxy reporting the held requests), not a duration.
EVENT_TIMEOUT = 30.0
HELD_CLIENTS = 6


@dataclass
class Answer:
    status: int
    body: str


def call(host: HostState, method: str, path: str, body: bytes | None = None) -> Answer:
    conn = http.client.HTTPConnection(host.address, host.app_port, timeout=60)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        response = conn.getresponse()
        return Answer(response.status, response.read().decode(errors="replace"))
    finally:
        conn.close()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + EVENT_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Clients:
    """Requests sent from threads; their answers (or errors) collected."""

    def __init__(self) -> None:
        self.answers: list[Answer | BaseException] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def send(self, request: Callable[[], Answer]) -> None:
        def run() -> None:
            try:
                answer: Answer | BaseException = request()
            except Exception as exc:
                answer = exc
            with self._lock:
                self.answers.append(answer)

        thread = threading.Thread(target=run, daemon=True)
        self._threads.append(thread)
        thread.start()

    def join(self) -> list[Answer | BaseException]:
        for thread in self._threads:
            thread.join(timeout=EVENT_TIMEOUT)
        return list(self.answers)


@pytest.fixture
def source_door(lab: LabState) -> Iterator[FrontDoor]:
    door = haproxy.front_door(lab.source)
    source = lab.source
    yield door
    # Whatever a test did, the source's front door serves the source's app again.
    door.release()
    door.repoint(source.address, source.app_internal_port)


def review(tag: str, n: int) -> tuple[str, bytes]:
    review_id = f"door-{tag}-{n}"
    body = {"id": review_id, "author": "door", "course": "networks-201", "rating": 4, "body": f"held {n}"}
    return review_id, json.dumps(body).encode()


def test_front_door_runs_on_both_hosts_with_the_app_behind_it(lab: LabState) -> None:
    running = {c.name: c for c in hosts.components(lab) if c.running}
    for host in (lab.source, lab.target):
        assert f"{host.name} haproxy" in running
        assert running[f"{host.name} haproxy"].address == f"{host.address}:{host.app_port}"
    # Clients' address is unchanged; the app itself answers on its internal port, behind HAProxy.
    assert call(lab.source, "GET", "/healthz").body.strip() == "ok source"
    assert procs.port_answers(lab.source.address, lab.source.app_internal_port)
    assert lab.source.app_internal_port != lab.source.app_port
    state = haproxy.front_door(lab.source).state()
    assert (state.server.address, state.server.port) == (lab.source.address, lab.source.app_internal_port)
    assert not state.holding
    assert "GET /healthz" in haproxy.log_file(lab.source).read_text()


def test_held_requests_wait_then_all_complete_on_release(lab: LabState, source_door: FrontDoor) -> None:
    tag = uuid.uuid4().hex[:8]
    source_door.hold(EVENT_TIMEOUT * 2)
    clients = Clients()
    ids = []
    for n in range(HELD_CLIENTS // 2):
        review_id, body = review(tag, n)
        ids.append(review_id)
        clients.send(lambda body=body: call(lab.source, "POST", "/reviews", body))
        clients.send(lambda: call(lab.source, "GET", "/healthz"))
    # Every request reached HAProxy and waits there: none has been answered, none has failed.
    wait_for(lambda: source_door.held_requests() == HELD_CLIENTS, f"{HELD_CLIENTS} held requests")
    assert clients.answers == []
    assert source_door.state().holding
    assert any(f"holding {HELD_CLIENTS} requests" in line for line in hosts.status(lab.path))

    source_door.release()
    answers = clients.join()
    assert len(answers) == HELD_CLIENTS
    assert all(isinstance(a, Answer) for a in answers), answers
    assert sorted(a.status for a in answers if isinstance(a, Answer)) == [200] * 3 + [201] * 3
    listed = ", ".join(f"'{i}'" for i in ids)
    stored = run_sql(lab.source, f"SELECT COUNT(*) FROM reviews WHERE id IN ({listed});", database=lab.db_name)
    assert stored.strip() == str(len(ids))


def test_a_hold_of_the_writes_lets_reads_through(lab: LabState, source_door: FrontDoor) -> None:
    assert source_door.holds_writes_only()  # the lab's action and map can
    tag = uuid.uuid4().hex[:8]
    source_door.hold(EVENT_TIMEOUT * 2, writes_only=True)
    clients = Clients()
    review_id, body = review(tag, 0)
    clients.send(lambda: call(lab.source, "POST", "/reviews", body))
    wait_for(lambda: source_door.held_requests() == 1, "the write held")
    # Reads are answered while the write waits.
    assert call(lab.source, "GET", "/healthz").status == 200
    assert call(lab.source, "GET", "/reviews?limit=1").status == 200
    assert clients.answers == [] and source_door.held_requests() == 1

    source_door.release()
    answers = clients.join()
    assert [a.status if isinstance(a, Answer) else a for a in answers] == [201]
    assert source_door.held_until(haproxy.HOLD_WRITES_KEY) == 0
    stored = run_sql(lab.source, f"SELECT COUNT(*) FROM reviews WHERE id = '{review_id}';", database=lab.db_name)
    assert stored.strip() == "1"


def test_a_hold_nobody_releases_ends_by_itself_and_the_held_requests_complete(
    lab: LabState, source_door: FrontDoor
) -> None:
    # What protects clients when the process that set the hold dies (kill -9): the hold is a deadline on the
    # HAProxy host's clock, so it ends without anyone releasing it.
    source_door.hold(20)
    clients = Clients()
    for _ in range(HELD_CLIENTS):
        clients.send(lambda: call(lab.source, "GET", "/healthz"))
    wait_for(lambda: source_door.held_requests() == HELD_CLIENTS, f"{HELD_CLIENTS} held requests")
    answers = clients.join()  # no release()
    assert [a.status if isinstance(a, Answer) else a for a in answers] == [200] * HELD_CLIENTS
    assert not source_door.state().holding


def test_requests_held_on_a_keep_alive_connection_wait_too(lab: LabState, source_door: FrontDoor) -> None:
    conn = http.client.HTTPConnection(lab.source.address, lab.source.app_port, timeout=60)
    try:
        conn.request("GET", "/healthz")
        first = conn.getresponse()
        assert first.status == 200 and first.read()
        assert not first.will_close  # the connection stays open to HAProxy
        source_door.hold(EVENT_TIMEOUT * 2)
        clients = Clients()

        def second() -> Answer:
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            return Answer(response.status, response.read().decode())

        clients.send(second)
        # The request on the already open connection is held at HAProxy too, unanswered until released.
        wait_for(lambda: source_door.held_requests() == 1, "the held request")
        assert clients.answers == []
        source_door.release()
        (answer,) = clients.join()
        assert isinstance(answer, Answer) and answer.status == 200, answer
    finally:
        conn.close()


@pytest.fixture
def target_app(lab: LabState) -> Iterator[HostState]:
    """The target's app running (its database as it is: a stopped one answers 503 "database unavailable")."""
    target = lab.target
    was_running = hosts.app_pid(lab, target) is not None
    subprocess.run([str(target.bin_dir / "app-start")], check=True, capture_output=True, timeout=120)
    yield target
    if not was_running:
        subprocess.run([str(target.bin_dir / "app-stop")], check=True, capture_output=True, timeout=120)


def test_repointed_while_held_the_held_requests_are_answered_by_the_target(
    lab: LabState, source_door: FrontDoor, target_app: HostState
) -> None:
    source_door.hold(EVENT_TIMEOUT * 2)
    clients = Clients()
    for _ in range(HELD_CLIENTS):
        clients.send(lambda: call(lab.source, "GET", "/healthz"))
    wait_for(lambda: source_door.held_requests() == HELD_CLIENTS, f"{HELD_CLIENTS} held requests")
    assert clients.answers == []

    # The source's front door forwards to the target's front door (the clients' port on the target's address).
    state = source_door.repoint(target_app.address, target_app.app_port)
    assert (state.address, state.port) == (target_app.address, target_app.app_port)
    source_door.release()
    answers = clients.join()
    assert len(answers) == HELD_CLIENTS
    bodies = {a.body.strip() if isinstance(a, Answer) else repr(a) for a in answers}
    # The target's app answered every one (its own words; "ok target" once its database runs).
    assert bodies <= {"ok target", "database unavailable target"}, bodies
    # And so is every later request that still arrives at the source's address (a stale DNS answer).
    assert call(lab.source, "GET", "/healthz").body.strip() in {"ok target", "database unavailable target"}
    # The operator sees it.
    forwarding = f"forwards to {target_app.address}:{target_app.app_port}"
    assert any(forwarding in line for line in hosts.status(lab.path)), hosts.status(lab.path)


def ssh_host(lab: LabState, host: HostState) -> SshHost:
    spec = Host(address=host.address, ssh_port=host.ssh_port, key=str(lab.ssh_key), known_hosts=str(lab.known_hosts))
    return SshHost(spec, name=host.name, base_dir=lab.path, retry=Retry(attempts=2, max_wait=0.05))


def test_front_door_through_ssh(lab: LabState, source_door: FrontDoor) -> None:
    ssh = ssh_host(lab, lab.source)
    try:
        door = over_ssh(
            ssh,
            str(lab.source.haproxy_socket),
            frontend=haproxy.FRONTEND,
            backend=haproxy.BACKEND,
            server=haproxy.SERVER,
            hold_map=str(haproxy.map_file(lab.source)),
        )
        deadline = door.hold(30)
        assert source_door.state().held_until == deadline  # the same HAProxy, seen through its local socket
        door.release()
        assert not source_door.state().holding
        assert door.server_state().port == lab.source.app_internal_port
    finally:
        ssh.close()


def test_unreachable_admin_socket_is_one_clear_error(lab: LabState) -> None:
    ssh = ssh_host(lab, lab.source)
    missing = lab.source.run_dir / "no-such-haproxy.sock"
    try:
        door = over_ssh(ssh, str(missing), frontend="f", backend="b", server="s", hold_map="/m")
        with pytest.raises(AdminSocketUnreachable) as caught:
            door.hold(10)
    finally:
        ssh.close()
    message = str(caught.value)
    assert "\n" not in message
    assert "front door of source" in message and "unreachable" in message
