"""The front door during a real migration on the lab (plan section `proxy`): clients see no failed request.

Under `migrate lab load` (clients caching DNS for 5 s, waiting longer for an answer than the budget): the source's
HAProxy holds requests while writes are blocked and forwards them (and every stale-DNS client) to the target at the
commit point; a rollback lets them through to the source; kill -9 of migrate leaves nothing held past the hold's
deadline; every front-door failure (admin socket unreachable, HAProxy refusing a command, HAProxy restarted mid-
window) is one line and a rollback that loses nothing.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from migrate_lab import haproxy
from migrate_lab.load import REQUESTS_FILE, read_requests
from migrate_lab.state import LabState
from migrate_lab.verify import VerifyReport, main_verify
from orchestrator import exit_codes
from orchestrator.services.frontdoor import SOURCE_HOLD
from tests.test_e2e import (
    MIGRATE,
    assert_source_serves_and_dns_unchanged,
    cf_control,
    dns_contents,
    last_server_start,
    migrate_apply,
    outcome,
    plan_copy,
    plan_name,
    restore_source_live,
    run_report,
    tree_files,
    wait_for_load_acks_on,
)

pytestmark = pytest.mark.lab

CLIENT_DNS_CACHE = 5.0
# Longer than any hold of these runs: a client gives up only on its own timeout, and none should.
CLIENT_HTTP_TIMEOUT = 90.0
EVENT_TIMEOUT = 120.0


# --- helpers -------------------------------------------------------------------------------------------------------


@pytest.fixture
def door_lab(lab: LabState) -> Iterator[LabState]:
    """The source live behind its front door (not holding, pointed at its own app), the target stopped."""
    restore_source_live(lab)
    try:
        yield lab
    finally:
        restore_source_live(lab)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = EVENT_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def journal_of(state: LabState, plan: Path) -> Path:
    return state.path / ".migrate" / plan_name(plan) / "journal.jsonl"


def events(journal: Path) -> list[dict[str, Any]]:
    if not journal.exists():
        return []
    out = []
    for line in journal.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


def saved(journal: Path, key: str) -> list[Any]:
    return [e.get("value") for e in events(journal) if e.get("event") == "step_saved" and e.get("key") == key]


def start_load(state: LabState, load_dir: Path, journal: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "migrate_lab.load", "--lab", str(state.path),
            "--duration", "300", "--rate", "20", "--clients", "4", "--dns-ttl", str(CLIENT_DNS_CACHE),
            "--upload-every", "5", "--out", str(load_dir), "--journal", str(journal),
            "--http-timeout", str(CLIENT_HTTP_TIMEOUT),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def requests_sent(load_dir: Path) -> int:
    path = load_dir / REQUESTS_FILE
    return len(path.read_text().splitlines()) if path.exists() else 0


def stop_load(load: subprocess.Popen[str]) -> None:
    load.send_signal(signal.SIGTERM)
    output, _ = load.communicate(timeout=CLIENT_HTTP_TIMEOUT + 30)
    print(output)


def no_failed_requests(verify: VerifyReport) -> None:
    assert set(verify.requests_failed) == {"reads", "writes"}, verify.requests_failed
    failed = {kind: sum(causes.values()) for kind, causes in verify.requests_failed.items()}
    assert failed == {"reads": 0, "writes": 0}, verify.requests_failed


def stall_bound(load_dir: Path, window: tuple[float, float]) -> float:
    """The longest a write can stall (first attempt to acknowledgement) when the front door holds it for the window
    and nothing else: the window, plus the held write's own processing once released, counted twice as slack, at
    what a request takes here outside the window (p99 of the load's own requests then, which grows with the
    machine's load like the rest), plus half a second. Measured quantities only: it holds on a slow machine as on a
    fast one."""
    start, end = window
    outside = sorted(
        float(r["ms"]) / 1000 for r in read_requests(load_dir / REQUESTS_FILE)
        if float(r["t"]) + float(r["ms"]) / 1000 < start or float(r["t"]) > end
    )  # fmt: skip
    assert outside, "no request outside the window to compare with"
    p99 = outside[min(len(outside) - 1, int(len(outside) * 0.99))]
    return (end - start) + 2 * p99 + 0.5


def proxy_section(state: LabState, side: str, **changes: Any) -> dict[str, Any]:
    data = YAML(typ="safe").load(state.plan_file.read_text())
    proxy = data["proxy"]
    proxy[side] = {**proxy[side], **changes}
    return proxy


def one_clear_line(result: subprocess.CompletedProcess[str], *words: str) -> None:
    text = result.stdout + result.stderr
    assert "Traceback" not in text, outcome(result)
    lines = [line for line in text.splitlines() if all(w in line for w in words)]
    assert lines, f"no line says {words}: {outcome(result)}"


# --- the migration, under load ---------------------------------------------------------------------------------------


def test_migration_under_load_fails_no_request_and_stalls_no_longer_than_the_window(
    door_lab: LabState, tmp_path: Path
) -> None:
    state = door_lab
    plan = plan_copy(state, "door", {})
    journal = journal_of(state, plan)
    load_dir = tmp_path / "load"
    load = start_load(state, load_dir, journal)
    try:
        wait_for(lambda: requests_sent(load_dir) > 20, "requests flowing to the source before the migration")
        result = migrate_apply(state, plan)
        assert result.returncode == exit_codes.OK, outcome(result)
        # Clients whose cached answer is the old address keep reaching the source's front door, which forwards
        # them: wait until every cache has expired and a few more requests went out.
        flipped, ended = requests_sent(load_dir), time.time()
        time.sleep(CLIENT_DNS_CACHE + 1)
        wait_for(lambda: requests_sent(load_dir) > flipped + 20, "requests after the caches expired")
        # Clients whose cache expired reach the target itself (a write it acknowledged after the run).
        wait_for_load_acks_on(load_dir, state.target.address, since=ended)
    finally:
        stop_load(load)

    assert dns_contents(state) == {name: state.target.address for name in state.records}
    report = run_report(state, plan_name(plan))
    assert report["status"] == "completed"
    assert report["cutover"]["mode"] == "shutdown"
    # The files the final datadir pass reads were read into both hosts' page cache before the window.
    warm = report["datadir_cache_warm"]
    assert warm["source"].startswith("warmed ") and warm["target"].startswith("warmed "), warm
    verification = report["verification"]
    assert all(n == 0 for n in verification["trees_differing_items"].values()), verification
    # Nothing inside the window read whole tables: the datadir files the final pass copied were checksummed on both
    # hosts there; every table's row count was compared after the commit, the target's snapshot at the commit
    # against the stopped source: equal (0 lost).
    checks = {c["check"].split(":")[0]: c for c in report["checks"]}
    assert checks["datadir"]["where"] == "inside" and "row counts of every table" not in checks, report["checks"]
    audited = next(c for c in report["checks"] if c["check"].startswith("row counts"))
    assert audited["where"] == "after" and audited["status"] == "equal" and audited["differing"] == 0, audited
    assert report["audit"]["tables"] == len(report["row_counts"]) > 0 and not report["audit"]["differences"]
    assert "row_counts" not in verification
    held = [v for v in saved(journal, SOURCE_HOLD) if v and "deadline" in v]
    assert held, "the source's front door never held"
    verify = main_verify(state, host="target", load_dir=load_dir, journal=journal)
    assert verify.error is None, verify.error
    assert verify.reviews_acknowledged > 0 and verify.uploads_acknowledged > 0
    assert verify.acknowledged_lost == 0, verify.lost
    # The load really crossed the migration: acknowledged writes on both servers.
    assert set(verify.per_server) == {state.source.address, state.target.address}, verify.per_server
    no_failed_requests(verify)
    assert verify.window is not None
    window = float(verify.window["to"]) - float(verify.window["from"])
    print(
        f"window {window:.2f} s, longest write stall {verify.longest_write_stall_s} s, latency {verify.latency}, "
        f"failed {verify.requests_failed}"
    )
    bound = stall_bound(load_dir, (float(verify.window["from"]), float(verify.window["to"])))
    assert verify.longest_write_stall_s is not None and verify.longest_write_stall_s <= bound, bound
    finish = next(e["result"] for e in events(journal) if e.get("event") == "step_completed" and e["step"] == "finish")
    assert finish["forwarded_to"] == f"{state.target.address}:{state.target.app_port}"
    assert isinstance(finish["requests_at_old_address"], int)
    flip = next(e["result"] for e in events(journal) if e.get("event") == "step_completed" and e["step"] == "dns_flip")
    # Forwarding is due at least while resolvers may still answer with the old address: the records' TTL.
    assert finish["forwarding_until"] >= flip["flipped_at"] + max(r["ttl"] for r in flip["old"])
    # The source's front door still forwards after the run: a stale client is served by the target.
    server = haproxy.front_door(state.source).server_state()
    assert (server.address, server.port) == (state.target.address, state.target.app_port)
    # The source's uploads froze at the fence: every one of them is on the target, byte for byte (the target
    # also holds what clients uploaded after the flip).
    source_files, target_files = tree_files(state.source.uploads), tree_files(state.target.uploads)
    assert source_files.items() <= target_files.items()
    # A consistent copy of a cleanly shut down datadir starts without InnoDB crash recovery.
    assert "crash recovery" not in last_server_start(state.target), "the target's datadir copy was not clean"
    # The guard on the source left in peace at the commit and took its directory with it.
    guard_dir = Path(saved(journal, "guard")[-1]["dir"])
    wait_for(lambda: not guard_dir.exists(), f"the guard's directory to leave the source: {guard_dir}", 60)


def cf_requests_between(state: LabState, start: float, end: float) -> list[dict[str, Any]]:
    """The requests migrate (the official SDK) made to the Cloudflare double between two moments (unix seconds; its
    log is stamped as each request arrives). The load's clients look their DNS up there too, with urllib."""
    log = cf_control(state, "state")["requests"]
    return [
        r for r in log
        if start <= datetime.fromisoformat(r["time"].replace("Z", "+00:00")).timestamp() <= end
        and r.get("agent", "").startswith("Cloudflare/Python")
    ]  # fmt: skip


def test_a_failing_then_slow_dns_api_after_the_commit_at_the_door_holds_no_write_and_is_finished_forward(
    door_lab: LabState, tmp_path: Path
) -> None:
    """With a front door the commit is made there: the target's fence lifted and the source's door forwarding to it.
    DNS follows after the window. Every record edit refused: the run ends committed with DNS pending (exit 4, one
    line), no DNS call was made while writes were held, and no client request failed; then, with the API answering
    every call slowly, `migrate apply` finishes the flip forward."""
    state = door_lab
    plan = plan_copy(
        state, "door-dns",
        {"dns": {"timeout": 10, "converge_timeout": 2}, "retry": {"attempts": 2, "max_seconds": 2, "max_wait": 0.5}},
    )  # fmt: skip
    journal = journal_of(state, plan)
    load_dir = tmp_path / "load"
    load = start_load(state, load_dir, journal)
    try:
        wait_for(lambda: requests_sent(load_dir) > 20, "requests flowing to the source before the migration")
        cf_control(state, "faults", {"mode": "invalid_token", "count": -1, "methods": ["PATCH", "PUT"]})
        try:
            pending = migrate_apply(state, plan)
        finally:
            cf_control(state, "faults", {"mode": "none"})
        assert pending.returncode == exit_codes.NEEDS_ATTENTION, outcome(pending)
        said = [line for line in pending.stdout.splitlines() if line.startswith("committed, DNS pending")]
        assert len(said) == 1, outcome(pending)
        assert "Traceback" not in pending.stdout + pending.stderr
        assert dns_contents(state) == {name: state.source.address for name in state.records}
        # Clients reach the target through the source's door meanwhile.
        server = haproxy.front_door(state.source).server_state()
        assert (server.address, server.port) == (state.target.address, state.target.app_port)
        run = events(journal)
        blocked_at = float(next(e["value"] for e in run if e.get("key") == "writes_blocked_at"))
        switched = next(e for e in run if e.get("event") == "step_completed" and e["step"] == "switch_traffic")
        flowing_at = float(switched["result"]["writes_flow_at"])
        assert any(e.get("event") == "committed" and e["ts"] <= flowing_at for e in run)
        assert cf_requests_between(state, blocked_at, flowing_at) == [], "a DNS call inside the window"
        # Not for want of telling migrate's calls apart: its refused edits came after the window.
        after = cf_requests_between(state, flowing_at, time.time())
        assert any(r["method"] in ("PATCH", "PUT") for r in after), after

        # The API answers again, every call slowly: `migrate apply` finishes the flip (the window is long closed).
        cf_control(state, "faults", {"mode": "slow", "delay": 0.5, "count": -1})
        try:
            done = migrate_apply(state, plan)
        finally:
            cf_control(state, "faults", {"mode": "none"})
        assert done.returncode == exit_codes.OK, outcome(done)
        assert dns_contents(state) == {name: state.target.address for name in state.records}
        flipped = requests_sent(load_dir)
        time.sleep(CLIENT_DNS_CACHE + 1)
        wait_for(lambda: requests_sent(load_dir) > flipped + 20, "requests after the caches expired")
    finally:
        stop_load(load)
    verify = main_verify(state, host="target", load_dir=load_dir, journal=journal)
    assert verify.error is None, verify.error
    assert verify.acknowledged_lost == 0, verify.lost
    no_failed_requests(verify)
    assert verify.window is not None and verify.window["until"] == "switch_traffic", verify.window
    bound = stall_bound(load_dir, (float(verify.window["from"]), float(verify.window["to"])))
    print(f"window {verify.window}, longest write stall {verify.longest_write_stall_s} s (bound {bound:.2f} s)")
    assert verify.longest_write_stall_s is not None and verify.longest_write_stall_s <= bound, bound


def test_budget_spent_while_holding_rolls_back_and_no_request_fails(door_lab: LabState, tmp_path: Path) -> None:
    state = door_lab
    plan = plan_copy(state, "doorbudget", {"cutover": {"max_write_block": 1.0, "refuse_predicted_overrun": False}})
    journal = journal_of(state, plan)
    load_dir = tmp_path / "load"
    load = start_load(state, load_dir, journal)
    try:
        wait_for(lambda: requests_sent(load_dir) > 20, "requests flowing to the source before the migration")
        result = migrate_apply(state, plan)
        assert result.returncode == exit_codes.FAILED, outcome(result)
        # Where the 1 s budget runs out varies (the lock, the shutdown, the final pass cut short): it rolls back.
        assert "rolled back" in result.stdout + result.stderr, outcome(result)
        after = requests_sent(load_dir)
        wait_for(lambda: requests_sent(load_dir) > after + 20, "requests after the rollback")
    finally:
        stop_load(load)

    assert [v for v in saved(journal, SOURCE_HOLD) if v and "deadline" in v], "the source's front door never held"
    assert saved(journal, SOURCE_HOLD)[-1] is None, "the rollback did not release the hold"
    verify = main_verify(state, host="source", load_dir=load_dir, journal=journal)
    assert verify.error is None, verify.error
    assert verify.acknowledged_lost == 0, verify.lost
    no_failed_requests(verify)
    assert_source_serves_and_dns_unchanged(state)


# --- kill -9 while requests are held ---------------------------------------------------------------------------------


def test_killed_while_requests_are_held_they_complete_at_the_deadline(door_lab: LabState) -> None:
    state = door_lab
    plan = plan_copy(state, "doorkill", {"cutover": {"max_write_block": 5.0, "refuse_predicted_overrun": False}})
    journal = journal_of(state, plan)
    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY")}
    command = [str(MIGRATE), "apply", str(plan), "--yes", "--env-file", str(state.env_file)]
    run = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(
            lambda: run.poll() is not None or any(v and "deadline" in v for v in saved(journal, SOURCE_HOLD)),
            "the source's front door holding",
        )
    finally:
        run.kill()
        run.wait(timeout=30)
    assert run.returncode == -signal.SIGKILL, "the run ended before the front door held"
    deadline = float(next(v for v in saved(journal, SOURCE_HOLD) if v and "deadline" in v)["deadline"])

    door = haproxy.front_door(state.source)
    answers: list[tuple[float, int | str]] = []

    def ask() -> None:
        conn = http.client.HTTPConnection(state.source.address, state.source.app_port, timeout=120)
        try:
            conn.request("GET", "/healthz")
            status = conn.getresponse().status
            answers.append((time.time(), status))
        except OSError as exc:
            answers.append((time.time(), type(exc).__name__))
        finally:
            conn.close()

    client = threading.Thread(target=ask, daemon=True)
    if door.state().holding:
        client.start()
        wait_for(lambda: door.held_requests() >= 1 or bool(answers), "the request held by the orphaned hold")
    else:
        client.start()
    client.join(timeout=EVENT_TIMEOUT)
    assert answers, "the held request never completed"
    answered_at, status = answers[0]
    assert isinstance(status, int), f"the held request failed: {status}"
    assert answered_at >= deadline - 0.05, "answered before the hold's deadline, which nobody was left to release"
    assert not door.state().holding


# --- front-door failures: one line, a rollback that loses nothing ----------------------------------------------------


def test_unreachable_admin_socket_is_one_line_and_a_rollback(door_lab: LabState) -> None:
    state = door_lab
    proxy = proxy_section(state, "source", admin_socket=str(state.path / "no-such-dir" / "haproxy.sock"))
    plan = plan_copy(state, "doorsock", {"proxy": proxy})
    result = migrate_apply(state, plan)
    assert result.returncode == exit_codes.FAILED, outcome(result)
    one_clear_line(result, "front door", "unreachable")
    assert "rolled back" in result.stdout + result.stderr, outcome(result)
    assert_source_serves_and_dns_unchanged(state)


def test_haproxy_refusing_a_command_is_one_line_and_a_rollback(door_lab: LabState) -> None:
    state = door_lab
    proxy = proxy_section(state, "source", hold_map=str(state.path / "not-a-loaded-map.map"))
    plan = plan_copy(state, "doormap", {"proxy": proxy})
    result = migrate_apply(state, plan)
    assert result.returncode == exit_codes.FAILED, outcome(result)
    one_clear_line(result, "HAProxy refused")
    assert_source_serves_and_dns_unchanged(state)


def test_haproxy_restarted_mid_window_is_detected_and_rolled_back(door_lab: LabState, tmp_path: Path) -> None:
    state = door_lab
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    restart = (
        "import sys; from pathlib import Path; from migrate_lab import haproxy; "
        "from migrate_lab.state import LabState; h = LabState.load(Path(sys.argv[1])).source; "
        "haproxy.stop(h); haproxy.start(h)"
    )
    hook = hooks / "before-step"
    hook.write_text(
        '#!/bin/sh\n[ "$MIGRATE_STEP" = switch_traffic ] || exit 0\n'
        f'exec {sys.executable} -c "{restart}" {state.path}\n'
    )
    hook.chmod(0o755)
    plan = plan_copy(state, "doorrestart", {"hooks": {"dir": str(hooks)}})
    result = migrate_apply(state, plan)
    assert result.returncode == exit_codes.FAILED, outcome(result)
    one_clear_line(result, "lost its hold", "restarted mid-window")
    assert dns_contents(state) == {name: state.source.address for name in state.records}
    assert_source_serves_and_dns_unchanged(state)
    assert not haproxy.front_door(state.source).state().holding
