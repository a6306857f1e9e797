"""The whole migration on the lab, through `migrate apply` as an operator runs it.

The success test under the lab's load generator (clients resolving through the Cloudflare double with a short
cache, so some keep talking to the old server after the flip; nothing acknowledged lost, a clean copy, the audit
equal) is the front door's, in test_frontdoor_e2e.py: one migration proves both; kill -9 inside the cut-over and the
resume is test_faults_kill.py's.
The failure tests each break one thing (a health check, the write-block budget, the database lock, the DNS API)
and prove the run rolled back: the source serves reads and writes again and DNS never moved.

Every test starts and ends with the lab's source live and its target stopped (`restore_source_live`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from migrate_lab import haproxy, planfile, procs
from migrate_lab.load import ACKS_FILE
from migrate_lab.state import HostState, LabState
from migrate_lab.verify import main_verify, read_acks
from orchestrator import exit_codes
from orchestrator.transports.cloudflare import DnsClient

pytestmark = pytest.mark.lab

MIGRATE = Path(sys.executable).with_name("migrate")
PLAN_NAMES: set[str] = set()
DNS_TTL = 3.0


# --- the lab, driven from outside ------------------------------------------------------------------------------


def run_bin(host: HostState, script: str) -> None:
    subprocess.run([str(host.bin_dir / script)], check=True, capture_output=True, timeout=120)


def cf_control(state: LabState, path: str, body: dict[str, Any] | None = None) -> Any:
    token = state.secrets()[state.token_env]
    request = urllib.request.Request(
        f"http://{state.cf_address}:{state.cf_port}/__lab/{path}",
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read() or b"null")


def dns_client(state: LabState) -> DnsClient:
    return DnsClient(state.secrets()[state.token_env], base_url=state.cf_base_url, timeout=10)


def dns_contents(state: LabState) -> dict[str, str]:
    """Each lab record's current content, as the Cloudflare double serves it."""
    with dns_client(state) as client:
        zone_id = client.zone_id(state.zone)
        return {
            name: ",".join(sorted(r.content for r in client.find_records(zone_id, name, "A"))) for name in state.records
        }


def plan_name(plan: Path) -> str:
    return str(YAML(typ="safe").load(plan.read_text())["name"])


def restore_source_live(state: LabState) -> None:
    """The source serves (database, app, no fence), the target is stopped, DNS points at the source.

    Copies nothing: after a successful migration the source simply becomes the live side again with the data it
    had at the cut-over, which is what the next test needs.
    """
    cf_control(state, "faults", {"mode": "none"})
    run_bin(state.target, "app-stop")
    run_bin(state.target, "db-stop")
    run_bin(state.source, "db-start")
    run_bin(state.source, "app-start")
    run_bin(state.source, "fence-off")
    run_bin(state.target, "fence-off")  # a reverse run leaves the target fenced
    for host in (state.source, state.target):
        if host.has_front_door:
            haproxy.reset(host)  # a migration leaves the source's front door forwarding to the target
    with dns_client(state) as client:
        zone_id = client.zone_id(state.zone)
        for name in state.records:
            for record in client.find_records(zone_id, name, "A"):
                if record.content != state.source.address:
                    client.set_content(zone_id, record, state.source.address)
    # A completed run's journal would make the next `migrate apply` of that plan a no-op.
    for name in PLAN_NAMES | {plan_name(state.plan_file)}:
        shutil.rmtree(state.path / ".migrate" / name, ignore_errors=True)
        shutil.rmtree(state.path / ".migrate" / f"{name}-reverse", ignore_errors=True)


@pytest.fixture
def live_lab(lab: LabState) -> Iterator[LabState]:
    """The lab live on the source, its plan in the shutdown mode (these tests prove that mode; the replicate mode's
    own are in test_replicate_e2e.py)."""
    restore_source_live(lab)
    planfile.write_plan(lab, "shutdown")
    try:
        yield lab
    finally:
        planfile.write_plan(lab)
        restore_source_live(lab)


# The changes that make a plan's DNS flip its commit point: no front door (with one, the commit is made at the door
# and DNS follows after the window).
NO_DOOR: dict[str, Any] = {"proxy": None}


def plan_copy(state: LabState, suffix: str, changes: dict[str, dict[str, Any] | None]) -> Path:
    """A copy of the lab's plan under its own name (its own journal), with some sections changed (None: removed)."""
    yaml = YAML()
    data = yaml.load(state.plan_file.read_text())
    data["name"] = f"{data['name']}-{suffix}"
    data["cutover"]["mode"] = "shutdown"  # unless `changes` says otherwise
    for section, values in changes.items():
        if values is None:  # the section removed (e.g. `proxy`: a plan without front doors)
            data.pop(section, None)
            continue
        if section not in data:
            data[section] = {}
        for key, value in values.items():
            data[section][key] = value
    PLAN_NAMES.add(str(data["name"]))
    path = state.path / f"plan-{suffix}.yaml"
    with path.open("w") as out:
        yaml.dump(data, out)
    return path


def migrate_apply(state: LabState, plan: Path, *options: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY")}
    PLAN_NAMES.add(plan_name(plan))
    return subprocess.run(
        [str(MIGRATE), "apply", str(plan), "--yes", "--env-file", str(state.env_file), *options],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def http(state: LabState, host: HostState, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://{host.address}:{host.app_port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def assert_source_serves_and_dns_unchanged(state: LabState) -> None:
    review = {
        "id": f"after-rollback-{uuid.uuid4().hex[:8]}",
        "author": "check",
        "course": "rollback",
        "rating": 5,
        "body": "the source takes writes again",
    }
    status, body = http(state, state.source, "POST", "/reviews", review)
    assert status == 201, f"the source refused a write after the rollback: {status} {body[:200]!r}"
    status, body = http(state, state.source, "GET", f"/reviews/{review['id']}")
    assert status == 200 and json.loads(body)["body"] == review["body"]
    assert dns_contents(state) == {name: state.source.address for name in state.records}


def run_report(state: LabState, plan_name: str) -> dict[str, Any]:
    reports = sorted((state.path / ".migrate" / plan_name).glob("report-*.json"), key=lambda p: p.stat().st_mtime)
    assert reports, f"no run report for {plan_name}"
    return json.loads(reports[-1].read_text())


def outcome(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"


# --- the failure paths: each must leave the source serving and DNS where it was --------------------------------


def test_failing_health_check_rolls_back(live_lab: LabState) -> None:
    state = live_lab
    plan = plan_copy(
        state,
        "health",
        {
            "health": {
                "checks": [
                    {
                        "kind": "http",
                        "name": "app never says this",
                        "url": f"http://{state.target.address}:{state.target.app_port}/healthz",
                        "expect_body": "a body that never comes",
                    }
                ],
                "attempts": 2,
                "interval": 0.2,
            }
        },
    )
    result = migrate_apply(state, plan)
    assert result.returncode == exit_codes.FAILED, outcome(result)
    assert "a body that never comes" in result.stdout + result.stderr
    assert "rolled back" in result.stdout + result.stderr
    assert_source_serves_and_dns_unchanged(state)


def test_write_block_budget_exceeded_rolls_back(live_lab: LabState) -> None:
    state = live_lab
    # Entered although the forecast says it cannot fit: the budget itself must roll it back.
    plan = plan_copy(state, "budget", {"cutover": {"max_write_block": 0.05, "refuse_predicted_overrun": False}})
    result = migrate_apply(state, plan)
    assert result.returncode == exit_codes.FAILED, outcome(result)
    assert "more than cutover.max_write_block" in result.stdout + result.stderr, outcome(result)
    assert_source_serves_and_dns_unchanged(state)


def test_a_window_predicted_past_the_budget_is_not_begun(live_lab: LabState) -> None:
    """The shutdown mode predicts its window before the fence (the last datadir round, the shutdown, the start):
    past the budget it says so and what would help, and writes were never blocked. A reverse run needs a forward
    run past the flip: refused before any run, and after this one, which rolled back before the flip."""
    state = live_lab
    plan = plan_copy(state, "forecast", {"cutover": {"max_write_block": 2.0}})
    never = migrate_apply(state, plan, "--reverse")
    assert never.returncode == exit_codes.REFUSED, outcome(never)
    assert "has no run: nothing to reverse" in " ".join(never.stderr.split()), outcome(never)
    result = migrate_apply(state, plan)
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == exit_codes.FAILED, outcome(result)
    assert "the shutdown mode's window is predicted at" in said, outcome(result)
    assert "writes were not blocked" in said and "the replicate mode" in said, outcome(result)
    assert "cutover.max_write_block ≥" in said, outcome(result)
    journal = (state.path / ".migrate" / plan_name(plan) / "journal.jsonl").read_text()
    assert '"key":"writes_blocked_at"' not in journal and '"key":"fenced"' not in journal
    # Rolled back before the flip: there is nothing on the target to carry back.
    refused = migrate_apply(state, plan, "--reverse")
    assert refused.returncode == exit_codes.REFUSED, outcome(refused)
    text = " ".join(refused.stderr.split())
    assert "is rolled_back: nothing to reverse" in text and "migrate rollback" in text, outcome(refused)
    assert not (state.path / ".migrate" / f"{plan_name(plan)}-reverse").exists(), "a refused reverse run began"
    assert_source_serves_and_dns_unchanged(state)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_sessions_running(host: HostState, query_like: str) -> None:
    """KILL the database sessions on `host` whose running statement is LIKE `query_like`."""
    root = ["mariadb", "--no-defaults", f"--socket={host.db_socket}", "-uroot", "-N", "-B", "-e"]
    found = subprocess.run(
        [*root, f"SELECT ID FROM information_schema.PROCESSLIST WHERE INFO LIKE '{query_like}'"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    for session in found.stdout.split():
        subprocess.run([*root, f"KILL {int(session)}"], capture_output=True, timeout=30, check=False)


def test_lock_held_by_another_session_gives_up_cleanly(live_lab: LabState, tmp_path: Path) -> None:
    """A session holding a table (LOCK TABLES ... WRITE and a long query) keeps FTWRL out: bounded wait, a report
    naming the blocker, and the source database never stopped."""
    state = live_lab
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    holder_pid = tmp_path / "holder.pid"
    holder_ready = tmp_path / "holder.ready"
    # Taken right before the cut-over (the hook), so the live steps before it are not blocked by it.
    hook = hooks / "before-cutover"
    hook.write_text(
        "#!/bin/bash\nset -e\n"
        f"setsid mariadb --no-defaults --socket={state.source.db_socket} -uroot -e "
        "\"LOCK TABLES coursereview.reviews WRITE; SELECT 'locked' INTO OUTFILE "
        f"'{holder_ready}'; SELECT SLEEP(600);\" >/dev/null 2>&1 &\n"
        f"echo $! > {holder_pid}\n"
        f"for i in $(seq 100); do [ -e {holder_ready} ] && exit 0; sleep 0.1; done\nexit 1\n"
    )
    hook.chmod(0o755)
    db_pid_before = state.source.db_pid_file.read_text().strip()
    plan = plan_copy(
        state,
        "lock",
        {
            "cutover": {"lock_wait_timeout": 1, "lock_attempts": 2, "lock_retry_backoff": 0.2},
            "hooks": {"dir": str(hooks)},
        },
    )
    try:
        result = migrate_apply(state, plan)
        assert result.returncode == exit_codes.FAILED, outcome(result)
        text = " ".join((result.stdout + result.stderr).split())
        assert "could not get FLUSH TABLES WITH READ LOCK in 2 tries of 1 s" in text, outcome(result)
        assert "SLEEP(600)" in text and "coursereview.reviews" in text, outcome(result)
        # The wait was bounded: the run gave up while the holder still held the table (it holds it until this test
        # ends it), not after waiting the holder out.
        assert holder_pid.exists() and process_alive(int(holder_pid.read_text())), "the holder had ended first"
        # Nothing was changed: the same database process still runs on the source.
        assert state.source.db_pid_file.read_text().strip() == db_pid_before
    finally:
        if holder_pid.exists():
            os.kill(int(holder_pid.read_text()), signal.SIGTERM)
        # The server may not notice its client gone while SLEEP runs: the session is ended on the server too.
        kill_sessions_running(state.source, "SELECT SLEEP(600)%")
    # The holder's session ends; then the source takes writes again.
    deadline = time.monotonic() + 30
    while http(state, state.source, "GET", "/healthz")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert_source_serves_and_dns_unchanged(state)


def test_cloudflare_failing_at_the_flip_rolls_back(live_lab: LabState) -> None:
    state = live_lab
    plan = plan_copy(state, "dns", {"retry": {"attempts": 2, "max_seconds": 5, "max_wait": 0.2}, **NO_DOOR})
    cf_control(state, "faults", {"mode": "5xx", "count": -1, "methods": ["PATCH", "PUT"]})
    try:
        result = migrate_apply(state, plan)
    finally:
        cf_control(state, "faults", {"mode": "none"})
    assert result.returncode == exit_codes.FAILED, outcome(result)
    assert "dns_flip" in result.stdout + result.stderr
    assert_source_serves_and_dns_unchanged(state)


def record_ids(state: LabState) -> dict[str, str]:
    """Each lab record's id: the path of its edits, /zones/{zone}/dns_records/{id}."""
    with dns_client(state) as client:
        zone_id = client.zone_id(state.zone)
        return {name: client.find_records(zone_id, name, "A")[0].id for name in state.records}


def fail_edits_of_second_record(state: LabState) -> str:
    """From now on every edit of the plan's second record fails with 5xx; the first record's edits succeed."""
    second = state.records[1]
    cf_control(
        state,
        "faults",
        {"mode": "5xx", "count": -1, "methods": ["PATCH", "PUT"], "path_contains": record_ids(state)[second]},
    )
    return second


def write_probe_hook(hooks: Path, host: HostState, out: Path) -> None:
    """A before-step hook that, right before the DNS flip, POSTs a review to `host`'s app and notes the status."""
    hooks.mkdir(exist_ok=True)
    hook = hooks / "before-step"
    hook.write_text(
        f"#!{sys.executable}\n"
        "import json, os, urllib.error, urllib.request, uuid\n"
        "if os.environ.get('MIGRATE_STEP') == 'dns_flip':\n"
        "    review = {'id': 'probe-' + uuid.uuid4().hex[:8], 'author': 'probe', 'course': 'flip', 'rating': 3,\n"
        "              'body': 'written on the target before the DNS flip'}\n"
        f"    request = urllib.request.Request('http://{host.address}:{host.app_port}/reviews',\n"
        "        data=json.dumps(review).encode(), method='POST', headers={'Content-Type': 'application/json'})\n"
        "    try:\n"
        "        status = urllib.request.urlopen(request, timeout=10).status\n"
        "    except urllib.error.HTTPError as exc:\n"
        "        status = exc.code\n"
        f"    with open({str(out)!r}, 'a') as probe:\n"
        "        probe.write(f'{status}\\n')\n"
    )
    hook.chmod(0o755)


def writes_on(host: HostState, since: float) -> list[dict[str, Any]]:
    """The writes (POST, PUT) `host`'s app answered since `since`, from its access log."""
    if not host.access_log.exists():
        return []
    entries = [json.loads(line) for line in host.access_log.read_text().splitlines() if line.strip()]
    return [e for e in entries if e.get("ts", 0) >= since and e.get("method") in ("POST", "PUT")]


def test_flip_failing_on_the_second_record_rolls_back_and_the_target_took_no_write(
    live_lab: LabState, tmp_path: Path
) -> None:
    """The first record moves, the second's edit fails: the run rolls back (DNS restored, target stopped), and the
    target, fenced from its start until the flip would have completed, acknowledged no write meanwhile."""
    state = live_lab
    hooks, probe = tmp_path / "hooks", tmp_path / "probe-statuses"
    write_probe_hook(hooks, state.target, probe)
    plan = plan_copy(
        state,
        "flip2",
        {"retry": {"attempts": 2, "max_seconds": 5, "max_wait": 0.2}, "hooks": {"dir": str(hooks)}, **NO_DOOR},
    )
    began = time.time()
    requests_before = len(cf_control(state, "state")["requests"])
    second = fail_edits_of_second_record(state)
    try:
        result = migrate_apply(state, plan)
    finally:
        cf_control(state, "faults", {"mode": "none"})
    assert result.returncode == exit_codes.FAILED, outcome(result)
    assert "dns_flip" in result.stdout + result.stderr and "rolled back" in result.stdout + result.stderr
    # The first record did move (and was put back): the failure really was half-way.
    first_id = record_ids(state)[state.records[0]]
    requests = cf_control(state, "state")["requests"][requests_before:]
    edits = [r for r in requests if r["method"] in ("PATCH", "PUT")]
    assert sum(1 for r in edits if first_id in r["path"] and r["status"] == 200) == 2, edits
    assert any(record_ids(state)[second] in r["path"] and r["status"] >= 500 for r in edits), edits

    # The target was up and serving reads, yet refused the write POSTed to it before the flip.
    assert probe.read_text().split() == ["503"], "the target app was not up and fenced before the DNS flip"
    acknowledged = [w for w in writes_on(state.target, began) if isinstance(w["status"], int) and w["status"] < 300]
    assert acknowledged == [], f"the target acknowledged writes a rollback then discarded: {acknowledged}"
    assert state.target.fence_file.exists(), "the rolled-back target must stay fenced"
    assert not target_app_listens(state), "the rollback stops the target's services"
    assert_source_serves_and_dns_unchanged(state)


def test_partial_flip_without_a_target_fence_is_finished_forward_not_rolled_back(live_lab: LabState) -> None:
    """Without a target fence the target takes writes as soon as it starts: once one record points at it, a rollback
    would lose them. The run stops needing attention (exit 4), DNS half-flipped, and `migrate apply` finishes it."""
    state = live_lab
    plan = plan_copy(
        state,
        "nofence",
        {"services": {"target_fence": {}}, "retry": {"attempts": 2, "max_seconds": 5, "max_wait": 0.2}, **NO_DOOR},
    )
    second = fail_edits_of_second_record(state)
    try:
        stuck = migrate_apply(state, plan)
    finally:
        cf_control(state, "faults", {"mode": "none"})
    assert stuck.returncode == exit_codes.NEEDS_ATTENTION, outcome(stuck)
    assert "rolled back" not in stuck.stdout + stuck.stderr, outcome(stuck)
    assert dns_contents(state) == {state.records[0]: state.target.address, second: state.source.address}
    # The target keeps serving (and taking writes): nothing it acknowledged is thrown away.
    review = a_review("half-flipped")
    status, body = http(state, state.target, "POST", "/reviews", review)
    assert status == 201, f"the target refused a write after a partial flip: {status} {body[:200]!r}"

    done = migrate_apply(state, plan)
    assert done.returncode == exit_codes.OK, outcome(done)
    assert dns_contents(state) == {name: state.target.address for name in state.records}
    assert run_report(state, plan_name(plan))["status"] == "completed"
    status, body = http(state, state.target, "GET", f"/reviews/{review['id']}")
    assert status == 200 and json.loads(body)["body"] == review["body"]


# --- the migration itself, under load ---------------------------------------------------------------------------


def tree_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def wait_for_load_ack(load_dir: Path, wanted: Callable[[dict[str, Any]], bool], what: str, timeout: float) -> None:
    """Until the load has acknowledged a write `wanted` says is the one: an order of events, not a fixed sleep (a
    slow machine only waits longer)."""
    deadline = time.monotonic() + timeout
    acks = load_dir / ACKS_FILE
    while time.monotonic() < deadline:
        if acks.exists() and any(wanted(ack) for ack in read_acks(acks)):
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout:g} s")


def wait_for_load_acks_on(load_dir: Path, address: str, since: float, timeout: float = 240.0) -> None:
    """Until the load has a write acknowledged by `address` after `since` (time.time()): its clients' DNS caches
    expired and they moved."""
    wait_for_load_ack(
        load_dir, lambda ack: ack.get("server") == address and float(ack.get("ack_ts", 0)) > since,
        f"no write acknowledged by {address} after the run's end", timeout,
    )  # fmt: skip


def last_server_start(host: HostState) -> str:
    """The target server's error log since its latest start."""
    text = (host.log_dir / "mysqld.err").read_text(errors="replace")
    return text[text.rfind("Starting MariaDB") :]


def test_rollback_after_the_flip_needs_consent_then_points_dns_back(live_lab: LabState) -> None:
    """With `finish.source: stop` the source's services are stopped at the end; discarding the target's writes
    starts them again (as well as the source database), fences the target and points DNS back."""
    state = live_lab
    plan = plan_copy(state, "back", {"finish": {"source": "stop"}})
    result = migrate_apply(state, plan)
    assert result.returncode == exit_codes.OK, outcome(result)
    assert dns_contents(state) == {name: state.target.address for name in state.records}
    assert not app_listens(state, state.source), "finish.source: stop stops the source's services"

    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY")}
    command = [str(MIGRATE), "rollback", str(plan), "--yes", "--env-file", str(state.env_file)]
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == exit_codes.REFUSED, outcome(refused)
    assert dns_contents(state) == {name: state.target.address for name in state.records}

    done = subprocess.run([*command, "--discard-target-writes"], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == exit_codes.OK, outcome(done)
    assert_source_serves_and_dns_unchanged(state)
    assert not target_app_listens(state), "the rollback stops the target's services"
    assert state.target.fence_file.exists(), "the rollback fences the target again"


def app_listens(state: LabState, host: HostState) -> bool:
    """The app itself, behind the host's front door (which answers whether or not an app runs behind it)."""
    return procs.port_answers(host.address, host.app_listen_port)


def target_app_listens(state: LabState) -> bool:
    return app_listens(state, state.target)


# --- the reverse migration: back to the source after the flip, with the target's writes ---------------------------


def start_load(
    state: LabState, load_dir: Path, duration: float, overwrite_every: int = 0, delete_every: int = 0
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "migrate_lab.load", "--lab", str(state.path),
            "--duration", str(duration), "--rate", "20", "--clients", "4", "--dns-ttl", str(DNS_TTL),
            "--upload-every", "5", "--overwrite-every", str(overwrite_every), "--delete-every", str(delete_every),
            "--out", str(load_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def rewritten_uploads(load_dir: Path) -> set[str]:
    """Names (relative to the uploads tree) the load acknowledged more than once: rewritten in place."""
    seen: dict[str, int] = {}
    for ack in read_acks(load_dir / ACKS_FILE):
        if ack.get("kind") == "upload":
            seen[ack["name"]] = seen.get(ack["name"], 0) + 1
    return {name for name, times in seen.items() if times > 1}


def deleted_uploads(load_dir: Path) -> set[str]:
    """Names the load deleted with an acknowledgement (on whichever host answered it)."""
    return {ack["name"] for ack in read_acks(load_dir / ACKS_FILE) if ack.get("kind") == "upload_deleted"}


def a_review(label: str) -> dict[str, Any]:
    return {
        "id": f"{label}-{uuid.uuid4().hex[:8]}",
        "author": "check",
        "course": "reverse",
        "rating": 4,
        "body": f"written {label}",
    }


def test_reverse_migration_carries_the_target_writes_back(live_lab: LabState, tmp_path: Path) -> None:
    state = live_lab
    load_dir = tmp_path / "load"
    load = start_load(state, load_dir, duration=400, overwrite_every=3)  # uploads also rewritten in place
    try:
        # Writes flowing to the source before the migration begins: its first acknowledged one.
        wait_for_load_ack(load_dir, lambda ack: ack.get("server") == state.source.address, "no write on the source", 60)
        forward = migrate_apply(state, state.plan_file)
        assert forward.returncode == exit_codes.OK, outcome(forward)
        # The service lives on the target now: clients move there as their DNS caches expire, and it takes writes.
        wait_for_load_acks_on(load_dir, state.target.address, since=time.time())
        on_target = a_review("on-the-target")
        status, body = http(state, state.target, "POST", "/reviews", on_target)
        assert status == 201, f"the target refused a write after the flip: {status} {body[:200]!r}"

        back = migrate_apply(state, state.plan_file, "--reverse")
        assert back.returncode == exit_codes.OK, outcome(back)
        wait_for_load_acks_on(load_dir, state.source.address, since=time.time())
    finally:
        load.send_signal(signal.SIGTERM)
        load_output, _ = load.communicate(timeout=60)
    print(load_output)

    assert dns_contents(state) == {name: state.source.address for name in state.records}
    # The source takes writes again, and holds what the target took between the two migrations.
    on_source = a_review("back-on-the-source")
    status, body = http(state, state.source, "POST", "/reviews", on_source)
    assert status == 201, f"the source refused a write after the reverse run: {status} {body[:200]!r}"
    for review in (on_target, on_source):
        status, body = http(state, state.source, "GET", f"/reviews/{review['id']}")
        assert status == 200 and json.loads(body)["body"] == review["body"], (status, body[:200])
    # The target's app is fenced now, as the source's was after the forward run (its front door forwards stale
    # clients to the source, so the app itself is asked).
    fenced = urllib.request.Request(
        f"http://{state.target.address}:{state.target.app_listen_port}/reviews",
        data=json.dumps(a_review("on-the-fenced-target")).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(fenced, timeout=10)
    assert refused.value.code == 503

    report = run_report(state, f"{plan_name(state.plan_file)}-reverse")
    assert report["status"] == "completed"
    assert report["audit"]["status"] == "equal" and report["audit"]["tables"] == len(report["row_counts"]) > 0
    verify = main_verify(state, host="source", load_dir=load_dir)
    print(
        f"reverse run: writes blocked (report) {report['write_block_seconds']} s; longest write stall "
        f"{verify.longest_write_stall_s} s, failed write attempts {verify.write_attempts_failed}, "
        f"acknowledged {verify.reviews_acknowledged} reviews / {verify.uploads_acknowledged} uploads, "
        f"lost {verify.acknowledged_lost}"
    )
    assert verify.error is None, verify.error
    assert verify.reviews_acknowledged > 0 and verify.uploads_acknowledged > 0
    assert verify.acknowledged_lost == 0, verify.lost
    # Acknowledged writes on both servers: the target's (between the two migrations) are on the source too.
    assert set(verify.per_server) == {state.source.address, state.target.address}, verify.per_server
    # Every upload the target held at the reverse cut-over is on the source; byte for byte, unless the load
    # rewrote it on the source after the reverse run (an upload rewritten in place): then the source holds the
    # name's last acknowledged version, which main_verify checked above.
    target_files, source_files = tree_files(state.target.uploads), tree_files(state.source.uploads)
    assert target_files.keys() <= source_files.keys()
    rewritten = rewritten_uploads(load_dir)
    differing = {name for name, data in target_files.items() if source_files[name] != data}
    assert differing <= rewritten, sorted(differing - rewritten)[:5]
    assert "crash recovery" not in last_server_start(state.source), "the source's datadir copy was not clean"

    # The reverse run has its own status and rollback; the forward rollback now points at --reverse.
    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY")}
    shown = subprocess.run(
        [str(MIGRATE), "status", str(state.plan_file), "--reverse", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == exit_codes.OK, outcome(shown)
    assert json.loads(shown.stdout)["run"]["status"] == "completed"
    rollback = [str(MIGRATE), "rollback", str(state.plan_file), "--yes", "--env-file", str(state.env_file)]
    forward_refused = subprocess.run(rollback, env=env, capture_output=True, text=True, timeout=60)
    assert forward_refused.returncode == exit_codes.REFUSED, outcome(forward_refused)
    assert "(--reverse) is completed" in " ".join(forward_refused.stderr.split()), outcome(forward_refused)
    reverse_refused = subprocess.run([*rollback, "--reverse"], env=env, capture_output=True, text=True, timeout=60)
    assert reverse_refused.returncode == exit_codes.REFUSED, outcome(reverse_refused)
    assert dns_contents(state) == {name: state.source.address for name in state.records}

    # There and back again: the next forward apply is a new run, the two finished journals kept in history.
    again = migrate_apply(state, state.plan_file)
    assert again.returncode == exit_codes.OK, outcome(again)
    assert "nothing to do" not in again.stdout
    assert dns_contents(state) == {name: state.target.address for name in state.records}
    for name in (plan_name(state.plan_file), f"{plan_name(state.plan_file)}-reverse"):
        assert len(list((state.path / ".migrate" / name / "history").glob("*.journal.jsonl"))) == 1, name
