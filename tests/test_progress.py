"""Live progress: bars with an honest ETA on a terminal, plain lines (no escape codes) or JSON lines otherwise.

The ETA logic is tested on a clock the test drives; the console on the lab through `migrate apply` run on a
pseudo-terminal (bars and an ETA appear) and piped (plain lines, not one escape code), the piped run failing a
health check so the DNS TTLs it lowered must be put back by the rollback.
"""

from __future__ import annotations

import json
import logging
import os
import pty
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from migrate_lab.state import LabState
from orchestrator import exit_codes
from orchestrator.output.console import ConsoleFilter
from orchestrator.output.progress import TRANSFER_EVENT, EtaEstimator, TransferProgress
from tests.test_e2e import (
    MIGRATE,
    PLAN_NAMES,
    assert_source_serves_and_dns_unchanged,
    dns_client,
    migrate_apply,
    outcome,
    plan_copy,
    plan_name,
    restore_source_live,
)

ANSI = re.compile(r"\x1b\[")
LAB_TTL = 60  # the lab's records' TTL (LabState.record_ttl)
LOWERED = 30


# --- the ETA, on a clock the test drives -------------------------------------------------------------------------


def test_eta_says_estimating_until_it_has_seen_enough_then_counts_down() -> None:
    eta = EtaEstimator(window=10, min_seconds=2, stall_after=5)
    assert eta.update(0.0, 0, 0)[3] == "estimating"
    assert eta.update(1.0, 1_000_000, 10)[3] == "estimating"  # one second seen: too little to tell
    rate, left, total, state = eta.update(2.0, 2_000_000, 20)
    assert state == "running" and rate == pytest.approx(1_000_000) and total == 10_000_000
    assert left == pytest.approx(8.0)
    _, later, _, _ = eta.update(4.0, 4_000_000, 40)
    assert later is not None and later < left


def test_a_stalled_transfer_says_stalled_instead_of_a_climbing_eta() -> None:
    eta = EtaEstimator(window=10, min_seconds=2, stall_after=5)
    eta.update(0.0, 0, 0)
    eta.update(3.0, 3_000_000, 30)
    seen = [eta.update(t, 3_000_000, 30) for t in (4.0, 6.0, 8.0, 10.0, 14.0)]
    etas = [left for _, left, _, state in seen if state == "running"]
    assert etas == sorted(etas, reverse=True) or not etas  # while "running", never climbing
    assert seen[-1][3] == "stalled" and seen[-1][1] is None
    assert TransferProgress.of({"id": "t", "state": "stalled"}).eta_text() == "stalled"


def test_a_stalled_start_gives_no_eta() -> None:
    eta = EtaEstimator(window=10, min_seconds=2, stall_after=5)
    states = [eta.update(float(t), 0, 0)[1:4:2] for t in range(0, 12)]
    assert all(left is None for left, _ in states)
    assert states[-1][1] == "stalled"
    assert TransferProgress.of({"id": "t", "bytes": 0}).eta_text() == "estimating"


def test_off_a_terminal_one_transfer_line_every_few_seconds_and_always_the_last() -> None:
    keep = ConsoleFilter(every=3600)

    def record(state: str) -> logging.LogRecord:
        event = {"event": TRANSFER_EVENT, "progress": {"id": "tree uploads", "state": state}}
        return logging.LogRecord("migrate", logging.INFO, __file__, 1, event, (), None)

    assert [keep.filter(record(s)) for s in ("running", "running", "running", "done")] == [True, False, False, True]
    warning = logging.LogRecord("py.warnings", logging.WARNING, __file__, 1, "DeprecationWarning: x", (), None)
    assert keep.filter(warning) is False  # library warnings go to the run's log only
    # The event loop's report of a library callback that failed (a traceback an operator cannot act on): the log only.
    loop = logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "Exception in callback", (), None)
    assert keep.filter(loop) is False
    ours = logging.LogRecord("migrate", logging.ERROR, __file__, 1, {"event": "step failed"}, (), None)
    assert keep.filter(ours) is True


# --- on the lab ------------------------------------------------------------------------------------------------


@pytest.fixture
def source_live(lab: LabState) -> Iterator[LabState]:
    """The lab with its source serving and DNS on it, before and after the test (as tests/test_e2e.py's)."""
    restore_source_live(lab)
    try:
        yield lab
    finally:
        restore_source_live(lab)


def ttls(state: LabState) -> dict[str, list[int]]:
    with dns_client(state) as client:
        zone_id = client.zone_id(state.zone)
        return {name: sorted(r.ttl for r in client.find_records(zone_id, name, "A")) for name in state.records}


def run_on_a_terminal(argv: list[str], timeout: float = 300) -> tuple[int, str]:
    """Run a command with a pseudo-terminal as its stdin, stdout and stderr; its exit code and all it drew."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY")}
    env.update(TERM="xterm-256color", COLUMNS="160", LINES="50")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=30)
    os.close(master)
    return code, b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.lab
def test_on_a_terminal_a_transfer_draws_a_bar_with_an_eta(source_live: LabState) -> None:
    state = source_live
    # A bandwidth limit makes the datadir's pre-sync last long enough for an ETA to be known (≈15 s at 4 MB/s);
    # the old TTL holds the cut-over 5 s after it was lowered, while the pre-syncs run.
    plan = plan_copy(
        state, "pty", {"transfer": {"bwlimit": "4M"}, "dns": {"lower_ttl_to": LOWERED, "lower_ttl_wait": 5}}
    )
    PLAN_NAMES.add(plan_name(plan))
    code, drawn = run_on_a_terminal([str(MIGRATE), "apply", str(plan), "--yes", "--env-file", str(state.env_file)])
    assert code == exit_codes.OK, drawn[-3000:]
    assert ANSI.search(drawn), "a terminal gets colours and redraws"
    assert "━" in drawn, "no progress bar was drawn"
    assert "datadir round 1" in drawn and "ETA estimating" in drawn
    assert re.search(r"ETA \d+:\d\d", drawn), "no ETA was ever shown"
    assert "limited to 4M/s" in drawn
    assert re.search(r"step \d+/\d+ db_presync \(running\) · writes flow", drawn), "no phase line"
    assert "✓ datadir round 1" in drawn  # a finished transfer leaves its summary line
    assert re.search(r"waiting out the old DNS TTL: 0:0\d left", drawn)
    # The cut-over began only once the old TTL had run out, counted from when the records were lowered.
    events = [json.loads(line) for line in (state.path / ".migrate" / plan_name(plan) / "journal.jsonl").open()]
    [until] = [e["value"] for e in events if e["event"] == "step_saved" and e["key"] == "wait_until"]
    [cutover] = [e["ts"] for e in events if e["event"] == "step_started" and e["step"] == "cutover"]
    assert cutover >= until
    assert ttls(state) == {name: [LAB_TTL] for name in state.records}  # put back after the commit


@pytest.mark.lab
def test_piped_output_is_plain_lines_and_a_rollback_puts_the_ttls_back(source_live: LabState) -> None:
    state = source_live
    plan = plan_copy(
        state,
        "plain-rollback",
        {
            "dns": {"lower_ttl_to": LOWERED, "lower_ttl_wait": 0},
            "health": {
                "checks": [
                    {
                        "kind": "http",
                        "name": "app never says this",
                        "url": f"http://{state.target.address}:{state.target.app_port}/healthz",
                        "expect_body": "a body that never comes",
                    }
                ],
                "attempts": 1,
                "interval": 0.2,
            },
        },
    )
    assert ttls(state) == {name: [LAB_TTL] for name in state.records}
    result = migrate_apply(state, plan)
    assert result.returncode == exit_codes.FAILED, outcome(result)
    assert not ANSI.search(result.stdout + result.stderr), "an escape code reached a pipe"
    lines = result.stderr.splitlines()
    assert any(re.search(r"transfer tree uploads: 100%.*ETA done", line) for line in lines), outcome(result)
    assert any("lower_ttl.lowered" in line and f"ttl={LOWERED}" in line for line in lines)
    assert any("lower_ttl.restored" in line and f"ttl={LAB_TTL}" in line for line in lines)
    assert "rolled back" in result.stdout + result.stderr
    assert ttls(state) == {name: [LAB_TTL] for name in state.records}
    assert_source_serves_and_dns_unchanged(state)


WARNING_SCRIPT = """
import sys, warnings
from pathlib import Path
from orchestrator.output import logging as mlog
warnings.simplefilter("always")
mlog.configure(output=sys.argv[2])
mlog.log_to_file(Path(sys.argv[1]))
warnings.warn("a library's deprecation notice", DeprecationWarning)
mlog.get_logger().info("the run goes on")
"""


@pytest.mark.parametrize("output", ["plain", "json", "live"])
def test_a_library_warning_goes_to_the_run_log_not_the_console(tmp_path: Path, output: str) -> None:
    log_file = tmp_path / "run.log.jsonl"
    res = subprocess.run(
        [sys.executable, "-c", WARNING_SCRIPT, str(log_file), output], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert "the run goes on" in res.stderr
    assert "deprecation notice" not in res.stdout + res.stderr
    assert "deprecation notice" in log_file.read_text()
