"""Fault paths on the lab, each under `migrate lab load` and checked with `lab verify` (0 acknowledged writes lost).

- The write budget is a hard bound: a Cloudflare fault at the flip of each kind (transient: 429 with a long
  Retry-After; an edit in flight: slow answers; permanent: a revoked token) ends in a rollback with writes blocked no
  longer than cutover.max_write_block, measured from the journal.
- A table held by an idle session (LOCK TABLES … WRITE, then nothing): writes flow between lock attempts (the
  load has writes acknowledged in every gap between two of them) and the message names the idle holder.
- DNS converges: a slow edit in flight at SIGTERM ends with every record at the source; an API outage after the
  first edit ends with every record at the one host that serves.
- Where every DNS record points is always shown: a run ending with DNS split says so, and so do status and report.

The writers that bypass the fence, kill -9 with a resume, and the guard on the source are in test_faults_kill.py
(split for the suite's workers: each file runs on one).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from migrate_lab.state import LabState
from migrate_lab.verify import main_verify
from orchestrator import exit_codes
from orchestrator.window import journaled_intervals
from tests.test_e2e import (
    MIGRATE,
    NO_DOOR,
    PLAN_NAMES,
    assert_source_serves_and_dns_unchanged,
    cf_control,
    dns_contents,
    http,
    live_lab,
    migrate_apply,
    outcome,
    plan_copy,
    plan_name,
    record_ids,
    start_load,
)

pytestmark = pytest.mark.lab
__all__ = ["live_lab"]

BUDGET = 20.0


# --- helpers ------------------------------------------------------------------------------------------------------


def journal_path(state: LabState, plan: Path) -> Path:
    return state.path / ".migrate" / plan_name(plan) / "journal.jsonl"


def journal_text(state: LabState, plan: Path) -> str:
    path = journal_path(state, plan)
    return path.read_text() if path.exists() else ""


def journal_events(state: LabState, plan: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in journal_path(state, plan).read_text().splitlines() if line.strip()]


def blocked_seconds(events: list[dict[str, Any]]) -> float:
    """Seconds writes were blocked, from the journal: every interval must be closed (the fence lifted by the
    rollback) or end at the commit (the target took writes)."""
    intervals = journaled_intervals(events)
    assert intervals, "the journal shows no write block"
    committed = [float(ev["ts"]) for ev in events if ev.get("event") == "committed"]
    total = 0.0
    for start, end in intervals:
        if end is None:
            assert committed, f"writes still blocked at the end of the run: {intervals}"
            end = committed[0]
        total += end - float(start)  # type: ignore[arg-type]
    return total


class Load:
    """`migrate lab load` for the duration of a block, then `lab verify` on the host that serves."""

    def __init__(self, state: LabState, directory: Path) -> None:
        self.state = state
        self.directory = directory
        self.proc = start_load(state, directory, duration=900)

    def stop(self, host: str) -> Any:
        self.proc.send_signal(signal.SIGTERM)
        output, _ = self.proc.communicate(timeout=90)
        print(output[-2000:])
        return main_verify(self.state, host=host, load_dir=self.directory)


@pytest.fixture
def load(live_lab: LabState, tmp_path: Path) -> Iterator[Load]:
    running = Load(live_lab, tmp_path / "load")
    try:
        yield running
    finally:
        if running.proc.poll() is None:
            running.proc.kill()
            running.proc.wait(timeout=30)


def assert_nothing_lost(verify: Any) -> None:
    print(f"lost {verify.acknowledged_lost}, longest write stall {verify.longest_write_stall_s} s")
    assert verify.error is None, verify.error
    assert verify.reviews_acknowledged > 0
    assert verify.acknowledged_lost == 0, verify.lost


def wait_for(predicate: Any, what: str, timeout: float = 180.0, proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}:\n{out[-2000:]}\n{err[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def popen_apply(state: LabState, plan: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY")}
    PLAN_NAMES.add(plan_name(plan))
    return subprocess.Popen(
        [str(MIGRATE), "apply", str(plan), "--yes", "--env-file", str(state.env_file)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def fault_plan(
    state: LabState, suffix: str, budget: float = BUDGET, *, without_door: bool = False, dns_timeout: float = 30.0
) -> Path:
    return plan_copy(
        state,
        suffix,
        {
            "cutover": {"max_write_block": budget},
            "retry": {"attempts": 50, "max_seconds": 300, "max_wait": 2},
            "dns": {"timeout": dns_timeout},
            **(NO_DOOR if without_door else {}),
        },
    )


# --- 1. the budget is a hard bound ----------------------------------------------------------------------------------

# One fault per way the flip can end, each a whole migration on the lab: a transient error the run retries until the
# budget says stop (a 429 whose Retry-After is longer than what is left), an edit still in flight when the run gives
# up, and a permanent error. The other answers (a 429 storm with short waits, 5xx, success:false) are classified by
# the adapter through the real SDK against the double (tests/test_cloudflare.py) into one of these same paths, and
# the retries' bound against the budget is tested in tests/test_faults_logic.py.
CLOUDFLARE_FAULTS = {
    "429_long_retry_after": {"mode": "429", "retry_after": 120},
    # Every edit slower than the API timeout (the plan's `dns.timeout` below): the client gives up on each, the API
    # applies each later; the retries run out with the budget, so edits are still in flight when the run rolls back.
    "slow": {"mode": "slow", "delay": 6, "count": -1},
    "invalid_token": {"mode": "invalid_token"},
}
# The API timeout per fault (the plan's dns.timeout): shorter than the slow edits, long enough for the others.
DNS_TIMEOUT = {"slow": 4.0}


@pytest.mark.parametrize("fault", sorted(CLOUDFLARE_FAULTS))
def test_cloudflare_fault_at_the_flip_keeps_writes_blocked_within_the_budget(
    live_lab: LabState, load: Load, fault: str
) -> None:
    state = live_lab
    budget = BUDGET
    # Without a front door DNS is the commit, inside the window (with one, it comes after: test_frontdoor_e2e.py).
    plan = fault_plan(
        state, f"cf-{fault.replace('_', '-')}", budget, without_door=True, dns_timeout=DNS_TIMEOUT.get(fault, 30.0)
    )
    spec = {"count": -1, "methods": ["PATCH", "PUT"], **CLOUDFLARE_FAULTS[fault]}
    cf_control(state, "faults", spec)
    try:
        if fault == "slow":
            # The API recovers once the run gives up: its edits still in flight land late, after the rollback read
            # the records, and must be waited out and superseded (the put-back edits themselves answer in time).
            run = popen_apply(state, plan)
            wait_for(lambda: "rollback_started" in journal_text(state, plan), "the rollback", proc=run)
            cf_control(state, "faults", {"mode": "none"})
            stdout, stderr = run.communicate(timeout=300)
            result = subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)
        else:
            result = migrate_apply(state, plan, timeout=400)
    finally:
        cf_control(state, "faults", {"mode": "none"})
    verify = load.stop("source")
    assert result.returncode == exit_codes.FAILED, outcome(result)
    events = journal_events(state, plan)
    blocked = blocked_seconds(events)
    reserve = next(ev["value"] for ev in events if ev.get("key") == "rollback_reserve")
    print(f"{fault}: writes blocked {blocked:.2f} s of a {budget:g} s budget; rollback reserve {reserve}")
    assert blocked <= budget, f"{fault}: writes blocked {blocked:.1f} s, budget {budget:g} s\n" + outcome(result)
    # As the clients saw it: no write waited longer than the budget plus what one request and the fence's own
    # lifting take (the records are put back only once the source takes writes again, however slow the API).
    stall = verify.longest_write_stall_s
    assert stall is not None and stall <= budget + 2, f"{fault}: a write stalled {stall} s, budget {budget:g} s"
    if fault == "slow":
        # The abandoned edit landed after the rollback; the run waited for it and put the old content back.
        assert "dns_flip.record_set" in result.stdout + result.stderr, outcome(result)
    assert_source_serves_and_dns_unchanged(state)
    assert_nothing_lost(verify)


# --- the lock held by an idle session -------------------------------------------------------------------------------

IDLE_HOLDER = """
import sys, time, pymysql
conn = pymysql.connect(unix_socket=sys.argv[1], user="root", database="coursereview", autocommit=True)
with conn.cursor() as cur:
    cur.execute("CREATE TABLE IF NOT EXISTS held (id INT PRIMARY KEY)")
    cur.execute("LOCK TABLES held WRITE")
open(sys.argv[2], "w").write(str(conn.thread_id()))
time.sleep(600)
"""


def test_idle_lock_holder_lets_writes_flow_between_attempts_and_is_named(
    live_lab: LabState, load: Load, tmp_path: Path
) -> None:
    state = live_lab
    attempt_seconds, attempts = 2, 3
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    ready = tmp_path / "holder.thread"
    holder_pid = tmp_path / "holder.pid"
    hook = hooks / "before-cutover"
    hook.write_text(
        "#!/bin/bash\nset -e\n"
        f"setsid {sys.executable} -c '{IDLE_HOLDER}' {state.source.db_socket} {ready} >/dev/null 2>&1 &\n"
        f"echo $! > {holder_pid}\n"
        f"for i in $(seq 200); do [ -s {ready} ] && exit 0; sleep 0.05; done\nexit 1\n"
    )
    hook.chmod(0o755)
    plan = plan_copy(
        state,
        "idle-lock",
        {
            "cutover": {
                "lock_wait_timeout": attempt_seconds,
                "lock_attempts": attempts,
                "lock_retry_backoff": 2,
                "max_write_block": 60,
            },
            "hooks": {"dir": str(hooks)},
        },
    )
    try:
        result = migrate_apply(state, plan)
    finally:
        if holder_pid.exists():
            os.kill(int(holder_pid.read_text()), signal.SIGTERM)
    verify = load.stop("source")
    assert result.returncode == exit_codes.FAILED, outcome(result)
    text = " ".join((result.stdout + result.stderr).split())
    holder = ready.read_text().strip()
    assert f"held by #{holder} root Sleep" in text, outcome(result)
    assert "INSERT" not in text.split("held by", 1)[1].split(";")[0], "a waiting INSERT named as the holder"
    # Between attempts the fence was lifted and writes flowed: in every gap between two blocked intervals (the
    # journal's), the load had writes acknowledged. An order of events, not a duration: it holds on a slow machine.
    events = journal_events(state, plan)
    intervals = journaled_intervals(events)
    assert len(intervals) >= attempts and all(end is not None for _, end in intervals), intervals
    acks = [
        float(json.loads(line)["ack_ts"])
        for line in (load.directory / "acks.jsonl").read_text().splitlines()
        if line.strip()
    ]
    for (_, lifted), (blocked_again, _) in itertools.pairwise(intervals):
        assert any(lifted <= ack <= blocked_again for ack in acks), (  # type: ignore[operator]
            f"no write acknowledged between the lock attempts ({lifted} .. {blocked_again})"
        )
    assert_source_serves_and_dns_unchanged(state)
    assert_nothing_lost(verify)


# --- 2. DNS converges -----------------------------------------------------------------------------------------------


def clear_requests(state: LabState) -> None:
    token = state.secrets()[state.token_env]
    request = urllib.request.Request(
        f"http://{state.cf_address}:{state.cf_port}/__lab/requests",
        method="DELETE",
        headers={"Authorization": f"Bearer {token}"},
    )
    urllib.request.urlopen(request, timeout=10).close()


def saved_keys(journal: Path) -> list[str]:
    if not journal.exists():
        return []
    return [ev.get("key", "") for ev in map(json.loads, journal.read_text().splitlines()) if ev.get("key")]


def test_slow_edit_in_flight_at_sigterm_converges_to_the_source(live_lab: LabState, load: Load) -> None:
    state = live_lab
    plan = plan_copy(state, "inflight", {"dns": {"timeout": 8}, **NO_DOOR})
    # The first record's edit is answered slowly, and applied when the answer finally goes out: after the run
    # gave up on it.
    first = record_ids(state)[state.records[0]]
    cf_control(state, "faults", {"mode": "slow", "delay": 5, "count": 1, "methods": ["PATCH"], "path_contains": first})
    run = popen_apply(state, plan)
    try:
        # The double took the slow fault (its count went to 0): the edit is in the API's hands, unanswered.
        wait_for(lambda: cf_control(state, "faults")["count"] == 0, "the first DNS edit in flight", proc=run)
        run.send_signal(signal.SIGTERM)
        stdout, stderr = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
        cf_control(state, "faults", {"mode": "none"})
    verify = load.stop("source")
    print(stdout[-2000:], stderr[-3000:])
    assert run.returncode == exit_codes.FAILED, (run.returncode, stderr[-3000:])
    # The abandoned edit landed on the API after the rollback had read the record: it was waited out, then
    # superseded by the old content.
    assert "dns_flip.record_set" in stdout + stderr, stderr[-3000:]
    assert dns_contents(state) == {name: state.source.address for name in state.records}
    assert_source_serves_and_dns_unchanged(state)
    assert_nothing_lost(verify)


def test_api_outage_after_the_first_edit_ends_with_one_serving_host(live_lab: LabState, load: Load) -> None:
    state = live_lab
    plan = plan_copy(state, "outage", {"dns": {"timeout": 5}, "retry": {"attempts": 20, "max_wait": 1}})
    ids = record_ids(state)
    first, second = ids[state.records[0]], ids[state.records[1]]
    # The second edit is slow, so the outage begins while it is in flight, after the first edit went through.
    cf_control(state, "faults", {"mode": "slow", "delay": 3, "count": 1, "methods": ["PATCH"], "path_contains": second})
    clear_requests(state)
    run = popen_apply(state, plan)

    def first_edit_applied() -> bool:
        return any(
            r["method"] == "PATCH" and first in r["path"] and r["status"] == 200
            for r in cf_control(state, "state")["requests"]
        )

    try:
        wait_for(first_edit_applied, "the first DNS edit", proc=run)
        cf_control(state, "faults", {"mode": "5xx", "status": 503, "count": 12})
        stdout, stderr = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
        cf_control(state, "faults", {"mode": "none"})
    assert run.returncode in (exit_codes.OK, exit_codes.FAILED), (run.returncode, stdout[-2000:], stderr[-3000:])
    serving = state.target if run.returncode == exit_codes.OK else state.source
    verify = load.stop("target" if serving is state.target else "source")
    assert dns_contents(state) == {name: serving.address for name in state.records}, stderr[-3000:]
    review = {"id": f"outage-{uuid.uuid4().hex[:8]}", "author": "check", "course": "x", "rating": 5, "body": "b"}
    assert http(state, serving, "POST", "/reviews", review)[0] == 201
    assert_nothing_lost(verify)


# --- 7. where every DNS record points, always shown -------------------------------------------------------------------

LATE_EDIT = """
import sys
from orchestrator.transports.cloudflare import DnsClient
env, token_name, base_url, zone, name, content = sys.argv[1:]
values = dict(line.strip().split("=", 1) for line in open(env) if "=" in line)
with DnsClient(values[token_name].strip("'\\""), base_url=base_url, timeout=10) as client:
    zone_id = client.zone_id(zone)
    for record in client.find_records(zone_id, name, "A"):
        client.set_content(zone_id, record, content)
"""


def migrate_status(state: LabState, plan: Path, *options: str, token: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != state.token_env}
    extra = ["--env-file", str(state.env_file)] if token else []
    return subprocess.run(
        [str(MIGRATE), "status", str(plan), *extra, *options], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_run_ending_with_dns_split_says_so_and_status_and_report_show_every_record(
    live_lab: LabState, tmp_path: Path
) -> None:
    state = live_lab
    first, second = state.records[0], state.records[1]
    # Someone else's edit (or a late one) lands after the flip: the second record points back at the source,
    # which is stopped and fenced once the run completes.
    script = tmp_path / "late_edit.py"
    script.write_text(LATE_EDIT)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    hook = hooks / "before-step"
    hook.write_text(
        '#!/bin/sh\n[ "$MIGRATE_STEP" = finish ] || exit 0\n'
        f"exec {sys.executable} {script} {state.env_file} {state.token_env} {state.cf_base_url} {state.zone} "
        f"{second} {state.source.address}\n"
    )
    hook.chmod(0o755)
    plan = plan_copy(state, "split", {"hooks": {"dir": str(hooks)}})
    result = migrate_apply(state, plan)
    assert result.returncode == exit_codes.NEEDS_ATTENTION, outcome(result)
    # One line says it (the report's summary below it repeats the verdict, indented).
    said = [line for line in result.stdout.splitlines() if line.startswith("needs attention: DNS split")]
    assert len(said) == 1 and f"{second} → source" in said[0] and f"{first} → target" in said[0], outcome(result)
    # The report: the run's end reading, every record with where it points, and the verdict.
    events = journal_events(state, plan)
    run_id = next(ev["run_id"] for ev in events if ev.get("event") == "run_started")
    report = json.loads((journal_path(state, plan).parent / f"report-{run_id}.json").read_text())
    assert report["dns"]["end"] is True and report["dns"]["origin"] == "journal"
    assert report["dns"]["records"][first] == [{"content": state.target.address, "points_at": "target"}]
    assert report["dns"]["records"][second] == [{"content": state.source.address, "points_at": "source"}]
    assert "DNS split" in report["dns"]["problem"]
    print(f"rollback reserve: {report['rollback_reserve']}")
    page = (journal_path(state, plan).parent / f"report-{run_id}.html").read_text()
    assert 'id="dns"' in page and "Needs attention" in page
    # `status` reads the records live with the token, in text and JSON.
    live = migrate_status(state, plan, "--json")
    doc = json.loads(live.stdout)
    assert doc["dns"]["origin"] == "live", live.stdout + live.stderr
    assert doc["dns"]["records"][second][0]["points_at"] == "source"
    assert doc["dns"]["records"][first][0]["points_at"] == "target"
    assert "DNS split" in doc["dns_problem"]
    text = migrate_status(state, plan)
    assert "DNS (read live at" in text.stdout and "needs attention: DNS split" in text.stdout, text.stdout
    # Without the token: the run's last reading, saying why not live, in one line (no traceback).
    blind = migrate_status(state, plan, token=False)
    assert blind.returncode == 0 and "Traceback" not in blind.stderr, blind.stderr
    line = next(line for line in blind.stdout.splitlines() if line.startswith("DNS ("))
    assert "the run's last reading" in line and "no API token" in line, blind.stdout
