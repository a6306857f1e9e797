"""A fleet of lab services, end to end: embedded (a forced rollback stops the wave; the fleet process killed
mid-wave and run again completes every plan, under load, 0 lost) and on Temporal (a worker killed -9 while its plan
is inside the pre-sync: the plan completes on the other worker, 0 lost).

One fleet lab (3 small services) serves the whole module; each test brings the services it uses back live on their
source first (copying nothing).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from migrate_lab import fleet as lab_fleet
from migrate_lab.state import LabState
from migrate_lab.verify import main_verify
from orchestrator import exit_codes
from orchestrator.engine.journal import RunStatus
from orchestrator.engine.lock import is_locked
from orchestrator.fleet.loader import load_fleet
from orchestrator.fleet.planrun import journal_state
from orchestrator.report.html import read_journal
from tests.conftest import MIGRATE
from tests.test_e2e import DNS_TTL, assert_source_serves_and_dns_unchanged, restore_source_live

pytestmark = pytest.mark.lab
PRESYNC = ("files_presync", "db_presync")
TEMPORAL = Path(sys.executable).with_name("temporal")


@pytest.fixture(scope="module")
def fleet_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[LabState]]]:
    directory = tmp_path_factory.mktemp("fleet")
    try:
        yield directory, lab_fleet.up(directory, 3, max_parallel=2)
    finally:
        lab_fleet.down(directory)


def live(states: list[LabState]) -> None:
    """The services a test before moved, back live on their source (≈ 10 s each: only those that moved)."""
    for state in states:
        if journal_of(state).exists():
            restore_source_live(state)


def fleet_file(directory: Path, name: str, text: str) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(text)
    shutil.rmtree(directory / ".migrate-fleet" / name, ignore_errors=True)
    return path


def run_fleet(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MIGRATE), "fleet", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=clean_env())  # fmt: skip


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY")}


def journal_of(state: LabState, plan_name: str = "course-review-lab") -> Path:
    return state.path / ".migrate" / plan_name / "journal.jsonl"


def run_status(journal: Path) -> RunStatus | None:
    state = journal_state(journal)
    return state.status if state else None


def step_started(journal: Path, steps: tuple[str, ...]) -> bool:
    return any(ev.get("event") == "step_started" and ev.get("step") in steps for ev in read_journal(journal))


def wait_until(condition: object, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout:g} s")


def start_loads(states: list[LabState], base: Path) -> list[tuple[subprocess.Popen[str], Path]]:
    loads = []
    for state in states:
        out = base / f"load-{state.path.name}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "migrate_lab.load", "--lab", str(state.path), "--duration", "900",
             "--rate", "4", "--clients", "2", "--dns-ttl", str(DNS_TTL), "--upload-every", "5", "--out", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        loads.append((proc, out))
    return loads


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def verify_none_lost(states: list[LabState], loads: list[tuple[subprocess.Popen[str], Path]], clients: Path) -> None:
    for state, (_, out) in zip(states, loads, strict=True):
        report = main_verify(state, host="target", load_dir=out, out=clients / f"{state.path.name}.json")
        assert report.error is None, report.error
        assert report.reviews_acknowledged > 0, f"{state.path.name}: the load wrote nothing"
        assert report.acknowledged_lost == 0, (state.path.name, report.lost)


def test_a_forced_rollback_stops_the_fleet_and_leaves_the_others_untouched(
    fleet_lab: tuple[Path, list[LabState]],
) -> None:
    directory, states = fleet_lab
    live(states)
    broken = states[0].path / "plan-broken.yaml"
    yaml = YAML()
    data = yaml.load(states[0].plan_file.read_text())
    data["name"] = "course-review-lab-broken"
    target = states[0].target
    data["health"] = {"checks": [{"kind": "http", "name": "app never says this", "expect_body": "never",
                                  "url": f"http://{target.address}:{target.app_port}/healthz"}],
                      "attempts": 2, "interval": 0.2}  # fmt: skip
    with broken.open("w") as out:
        yaml.dump(data, out)
    names = [s.path.name for s in states]
    path = fleet_file(directory, "rollback", (
        "name: rollback\nplans:\n"
        "  - {name: broken, plan: svc-1/plan-broken.yaml, env_file: svc-1/lab.env}\n"
        + "".join(f"  - {{name: {n}, plan: {n}/plan.yaml, env_file: {n}/lab.env}}\n" for n in names[1:])
        + f"waves: [[broken], [{', '.join(names[1:])}]]\nmax_parallel: 2\nstop: {{on_rollback: true}}\n"
    ))  # fmt: skip
    result = run_fleet("apply", str(path), "--yes")
    assert result.returncode == exit_codes.FAILED, result.stdout + result.stderr
    assert "stopped: plan 'broken' rolled back (stop.on_rollback)" in result.stdout, result.stdout
    assert_source_serves_and_dns_unchanged(states[0])
    for state in states[1:]:
        assert not journal_of(state).exists(), f"{state.path.name} was started after the stop"
    status = json.loads(run_fleet("status", str(path), "--json").stdout)
    assert status["stopped"] == "plan 'broken' rolled back (stop.on_rollback)"
    by_name = {p["name"]: p for p in status["plans"]}
    assert by_name["broken"]["state"] == "rolled_back" and by_name["broken"]["fleet_end"] == exit_codes.FAILED
    assert all(by_name[n]["state"] == "not started" for n in names[1:]), status


def test_killed_mid_wave_the_fleet_resumes_every_plan_under_load(
    fleet_lab: tuple[Path, list[LabState]], tmp_path: Path
) -> None:
    directory, states = fleet_lab
    live(states)
    path = directory / lab_fleet.FLEET_FILE  # canary svc-1 alone, then svc-2 and svc-3: 2 at a time
    shutil.rmtree(directory / ".migrate-fleet" / "lab-fleet", ignore_errors=True)
    loads = start_loads(states, tmp_path)
    try:
        fleet = subprocess.Popen([str(MIGRATE), "fleet", "apply", str(path), "--yes"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=clean_env())  # fmt: skip
        try:
            # The second wave: a plan inside its pre-sync.
            wait_until(lambda: any(step_started(journal_of(s), PRESYNC) for s in states[1:]), "wave 2 pre-sync", 300)
        finally:
            fleet.kill()
            fleet.wait()
        # Its `migrate apply` processes died with it: no plan is left running unsupervised.
        wait_until(lambda: all(is_locked(journal_of(s).parent / "lock") is None for s in states), "locks free", 15)
        unfinished = [s for s in states if run_status(journal_of(s)) != RunStatus.COMPLETED]
        assert unfinished, "the kill came after every plan had ended"
        result = run_fleet("apply", str(path), "--yes")
        assert result.returncode == exit_codes.OK, result.stdout + result.stderr
        assert "1 of 3 plans already ended" in result.stdout, result.stdout
    finally:
        stop([proc for proc, _ in loads])
    for state in states:
        assert run_status(journal_of(state)) == RunStatus.COMPLETED, state.path.name
    for state in unfinished:  # resumed from its journal, not begun again
        events = read_journal(journal_of(state))
        assert [ev["event"] for ev in events].count("run_started") == 1
        assert any(ev["event"] == "run_resumed" for ev in events), state.path.name
    clients = tmp_path / "clients"
    verify_none_lost(states, loads, clients)
    # Never more than 2 plans at once (max_parallel, and the shared storage's limit).
    record = read_journal(directory / ".migrate-fleet" / "lab-fleet" / "fleet.jsonl")
    running, most = set(), 0
    for ev in record:
        if ev["event"] == "plan_started":
            running.add(ev["plan"])
        elif ev["event"] in ("plan_ended", "fleet_started"):
            running = running - {ev.get("plan")} if ev["event"] == "plan_ended" else set()
        most = max(most, len(running))
    assert most == 2, record
    page = run_fleet("report", str(path), "--clients-dir", str(clients))
    html = Path(page.stdout.strip()).read_text()
    for state in states:
        assert f'id="plan-{state.path.name}"' in html
    assert html.count("0 acknowledged write(s) lost") == 3 and html.count("Writes blocked") == 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def temporal_server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(
        [str(TEMPORAL), "server", "start-dev", "--headless", "--port", str(port), "--http-port", str(free_port()),
         "--metrics-port", str(free_port()), "--db-filename", str(tmp_path / "temporal.db")],
        stdout=(tmp_path / "temporal.out").open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    try:
        healthy = [str(TEMPORAL), "operator", "cluster", "health", "--address", address]
        wait_until(lambda: subprocess.run(healthy, capture_output=True).returncode == 0, "temporal healthy", 60)
        yield address
    finally:
        stop([server])


def test_on_temporal_a_worker_killed_in_the_presync_is_replaced(
    fleet_lab: tuple[Path, list[LabState]], temporal_server: str, tmp_path: Path
) -> None:
    directory, states = fleet_lab
    states = states[:2]
    live(states)
    names = [s.path.name for s in states]
    path = fleet_file(directory, "on-temporal", (
        "name: on-temporal\nplans:\n"
        + "".join(f"  - {{name: {n}, plan: {n}/plan.yaml, env_file: {n}/lab.env}}\n" for n in names)
        + f"waves: [[{', '.join(names)}]]\nmax_parallel: 2\n"
    ))  # fmt: skip
    workers = []
    for index in range(2):
        out = (tmp_path / f"worker-{index}.out").open("w")
        workers.append(subprocess.Popen([str(MIGRATE), "worker", "--temporal", temporal_server], stdout=out,
                                        stderr=subprocess.STDOUT, env=clean_env()))  # fmt: skip
    loads = start_loads(states, tmp_path)
    fleet = subprocess.Popen([str(MIGRATE), "fleet", "apply", str(path), "--yes", "--temporal", temporal_server],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env())  # fmt: skip
    try:
        wait_until(lambda: any(step_started(journal_of(s), PRESYNC) for s in states), "a plan's pre-sync", 300)
        victim_state = next(s for s in states if step_started(journal_of(s), PRESYNC))
        holder = is_locked(journal_of(victim_state).parent / "lock")
        assert holder is not None, "the plan in its pre-sync holds its lock"
        parent = int(Path(f"/proc/{holder.pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        victim = next(w for w in workers if w.pid == parent)
        victim.kill()
        victim.wait()
        output, _ = fleet.communicate(timeout=400)
        assert fleet.returncode == exit_codes.OK, output
    finally:
        stop([fleet, *workers, *[proc for proc, _ in loads]])
    survivor = next(i for i, w in enumerate(workers) if w is not victim)
    said = (tmp_path / f"worker-{survivor}.out").read_text()
    assert f"plan {victim_state.path.name}: attempt 2" in said, said
    assert f"plan {victim_state.path.name}: exit 0 (completed)" in said, said
    events = read_journal(journal_of(victim_state))
    assert [ev["event"] for ev in events].count("run_started") == 1
    assert run_status(journal_of(victim_state)) == RunStatus.COMPLETED
    assert any(ev["event"] == "run_resumed" for ev in events)
    verify_none_lost(states, loads, tmp_path / "clients")
    assert load_fleet(path).fleet.name == "on-temporal"
