"""Estimates: offline (rates, the window's parts, the comparison with a run) and on the lab (read-only, and within
10 % of the bytes the real pre-syncs that follow move)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from ruamel.yaml import YAML

from migrate_lab.state import LabState
from orchestrator.engine.step import StepContext
from orchestrator.plan.loader import load_plan
from orchestrator.plan.model import Plan
from orchestrator.results import DbPresyncResult, FilesResult
from orchestrator.run.commands import describe
from orchestrator.run.compose import resolve_mode
from orchestrator.run.rehearse import compare, compare_parts
from orchestrator.runtime import Runtime
from orchestrator.services import estimates
from orchestrator.services.estimates import TransferEstimate
from orchestrator.steps.db_presync import DbPresync
from orchestrator.steps.files_presync import FilesPresync
from orchestrator.steps.modes import REPLICATE, SHUTDOWN
from tests.conftest import migrate
from tests.test_e2e import live_lab, migrate_apply, outcome, plan_copy, plan_name, run_report

__all__ = ["live_lab"]  # a fixture, used by name

# --- offline ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("50M", 50 * 1024**2), ("1500K", 1500 * 1024), ("100", 100 * 1024), ("2MB", 2_000_000), ("1.5MiB", 1.5 * 1024**2)],
)
def test_bwlimit_reads_as_rsync_does(value: str, expected: float) -> None:
    assert estimates.bwlimit_bytes(value) == expected


def test_read_rate_from_dd() -> None:
    output = "64+0 records in\n64+0 records out\n67108864 bytes (67 MB, 64 MiB) copied, 0.5 s, 134 MB/s\n"
    assert estimates.parse_read_rate(output) == 67108864 / 0.5
    assert estimates.parse_read_rate("dd: failed to open\n") is None


def test_checksum_rate_from_the_hosts_own_clock() -> None:
    assert estimates.parse_hash_rate("33554432 100.25 100.75") == 33554432 / 0.5
    assert estimates.parse_hash_rate("") is None and estimates.parse_hash_rate("0 1 2") is None


def test_prediction_adds_bytes_at_the_rate_to_the_comparison() -> None:
    transfer = TransferEstimate("files_presync", "uploads", 10_000_000, 10, 20_000_000, 0.5, 0.0)
    (predicted,) = estimates.predict([transfer], 5_000_000)
    assert predicted.predicted_seconds == 2.5


def units(**changes: object) -> estimates.UnitCosts:
    base = estimates.UnitCosts(ssh_source=0.5, ssh_target=0.25, ssh_how="new session", rsync_pass=1.0, sql=0.01,
                               dns=0.02, haproxy=0.01, health=0.3, health_basis="2 checks", tracked=True, request=0.4,
                               datadir_delta_bytes=10_000_000, rate=10_000_000, hash_rate=10_000_000)  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


SHAPE = estimates.PlanShape(trees=1, records=2, target_services=1, source_fence=True, target_fence=True,
                            front_door=True)  # fmt: skip
TRANSFERS = [
    TransferEstimate("files_presync", "uploads", 0, 0, 0, 4.0, 4.0),
    TransferEstimate("db_presync", "datadir", 0, 0, 0, 0.3, 0.3),
]


def test_window_parts_are_the_steps_operations_at_the_measured_unit_costs() -> None:
    """Each part counts what its step does at what one operation costs on the hosts now: a host twice as slow to
    run a command makes the parts made of commands twice as long, and every part says what it is made of."""
    parts = {p.step: p for p in estimates.predict_window(TRANSFERS, units(), plan_shape=SHAPE, mode=SHUTDOWN)}
    # The tracked pass: one command on the source (the change list with its trust probe) and one rsync, not the
    # whole tree's comparison (4 s).
    assert parts["files_final"].seconds == 1 * 0.5 + 1.0
    # With a front door on the source the commit is made there, driven from the source host: one command there
    # (the hold checked, the guard told, the commit recorded, the target's fence lifted over the hosts' hop and the
    # door repointed); no DNS call inside the window.
    assert "dns_flip" not in parts
    assert parts["switch_traffic"].seconds == round(1 * 0.5, 3)
    # Without one, DNS is the commit: 5 DNS calls per record, 11 HAProxy commands (none: no door), the target's
    # fence lift and the guard told on the source.
    no_door = dataclasses.replace(SHAPE, front_door=False)
    flip = {p.step: p for p in estimates.predict_window(TRANSFERS, units(), plan_shape=no_door, mode=SHUTDOWN)}[
        "dns_flip"
    ]
    assert flip.seconds == round(10 * 0.02 + 0.25 + 0.5, 3)
    # The fence, 3 commands of the cut-over on the source, 8 SQL statements, 4 HAProxy exchanges, the shutdown.
    assert parts["cutover"].seconds == round(4 * 0.5 + 8 * 0.01 + 4 * 0.01 + estimates.ASSUMED_SHUTDOWN_SECONDS, 3)
    # 3 commands (the changed list, the mtimes, the checksums side by side), one rsync, the changed files read three
    # times at the checksum rate (rsync's delta on both hosts, then the verification).
    assert parts["db_final"].seconds == round(0.5 + 0.25 + 0.5 + 1.0 + 3 * 1.0, 3)
    assert all(part.basis.startswith(("measured:", "assumed:")) for part in parts.values())
    slow = {
        p.step: p for p in estimates.predict_window(TRANSFERS, units(ssh_source=1.0), plan_shape=SHAPE, mode=SHUTDOWN)
    }
    assert slow["files_final"].seconds == 1 * 1.0 + 1.0
    # Without a change tracker on the source, the final pass compares the whole tree.
    untracked = {
        p.step: p for p in estimates.predict_window(TRANSFERS, units(tracked=False), plan_shape=SHAPE, mode=SHUTDOWN)
    }
    assert untracked["files_final"].seconds == 4.0 + 0.25


def test_the_replicate_window_has_no_shutdown_nor_datadir_pass() -> None:
    parts = {p.step: p for p in estimates.predict_window(TRANSFERS, units(), plan_shape=SHAPE, mode=REPLICATE)}
    # No target start: its database and services run (fenced) since the replica step, and the mode runs no
    # start_target.
    assert set(parts) == {"repl_switch", "files_final", "verify_target", "switch_traffic"}
    assert "start_target" not in REPLICATE.steps(door_commits=True)
    # One command on the source (the door's hold, the drain of the writes in flight looked at there, the fence),
    # 2 SQL round trips (read_only with the final position; the wait with the promotion), and the drain (about one
    # request).
    assert parts["repl_switch"].seconds == round(0.5 + 2 * 0.01 + 0.4, 3)
    assert parts["verify_target"].seconds == 0.3
    # The uploads' delta runs beside the switch (from the fence on): the window counts the longer of the two, not
    # their sum.
    assert parts["files_final"].beside == "repl_switch"
    window = list(parts.values())
    longer = max(parts["repl_switch"].seconds, parts["files_final"].seconds)
    rest = parts["verify_target"].seconds + parts["switch_traffic"].seconds
    assert estimates.window_span(window) == round(longer + rest, 3)
    assert estimates.window_span(window) < round(sum(p.seconds for p in window), 3)


def test_a_part_beside_a_step_counts_only_where_it_outlasts_it() -> None:
    part = estimates.WindowPart
    assert estimates.window_span([part("a", 1.0, "", "a"), part("b", 0.4, "", "b", beside="a")]) == 1.0
    assert estimates.window_span([part("a", 1.0, "", "a"), part("b", 1.5, "", "b", beside="a")]) == 1.5
    # Beside a step that is not in the window: it counts in full.
    assert estimates.window_span([part("b", 0.4, "", "b", beside="x"), part("c", 0.1, "", "c")]) == 0.5


def test_a_rehearsal_for_real_replaces_the_assumptions() -> None:
    rehearsed = {"stages": {"target start (fenced)": 3.5, "target stop": 1.25, "health checks": 0.75},
                 "measured_at": "2026-01-01T00:00:00Z"}  # fmt: skip
    measured = estimates.with_rehearsal(units(), rehearsed)
    parts = {p.step: p for p in estimates.predict_window(TRANSFERS, measured, plan_shape=SHAPE, mode=SHUTDOWN)}
    assert parts["start_target"].seconds == 3.5 and "rehearsal of 2026-01-01" in parts["start_target"].basis
    assert "1.25 s" in parts["cutover"].basis and "assumed" not in parts["cutover"].basis
    assert parts["verify_target"].seconds == 1.0  # the trees' tracked checksums (one rsync) outlast the checks
    assert estimates.with_rehearsal(units(), None) == units()


def test_the_report_sets_each_predicted_part_beside_the_real_one() -> None:
    predicted = [{"step": "cutover", "seconds": 3.0}, {"step": "dns_flip", "seconds": 0.5}]
    real = {"cutover": 2.5, "dns_flip": 1.0, "between steps": 0.01, "switch: fence": 0.1}
    assert compare_parts(predicted, real) == [
        "cutover: predicted 3.00 s, took 2.50 s",
        "dns_flip: predicted 0.50 s, took 1.00 s",
    ]


def test_compare_states_the_error_per_step() -> None:
    estimate = {"transfers": [{"step": "files_presync", "bytes": 110}, {"step": "db_presync", "bytes": 90}]}
    assert compare(estimate, {"files_presync": 100, "db_presync": 100}) == [
        "files_presync: estimated 110 bytes, moved 100 (+10.0 %)",
        "db_presync: estimated 90 bytes, moved 100 (-10.0 %)",
    ]


# --- on the lab -------------------------------------------------------------------------------------------------


def tree_state(root: Path) -> str:
    """A tree's file list with sizes, mtimes (ns) and modes: any write, creation or removal changes it."""
    digest = hashlib.sha256()
    for directory, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(files) + dirs:
            path = Path(directory) / name
            stat = path.lstat()
            digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_mode}\n".encode())
    return digest.hexdigest()


def dns_state(lab: LabState) -> Any:
    import urllib.request

    token = lab.secrets()[lab.token_env]
    request = urllib.request.Request(
        f"{lab.cf_base_url}/zones?per_page=50", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        zones = json.loads(answer.read())["result"]
    records = {}
    for zone in zones:
        request = urllib.request.Request(
            f"{lab.cf_base_url}/zones/{zone['id']}/dns_records?per_page=100",
            headers={"Authorization": f"Bearer {token}"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            records[zone["id"]] = json.loads(answer.read())["result"]
    return records


def everything(lab: LabState) -> dict[str, Any]:
    state: dict[str, Any] = {"dns": dns_state(lab)}
    for host in (lab.source, lab.target):
        state[f"{host.name} uploads"] = tree_state(host.uploads)
        state[f"{host.name} datadir"] = tree_state(host.datadir)
    return state


@pytest.fixture
def plan(lab: LabState, monkeypatch: pytest.MonkeyPatch) -> Iterator[Plan]:
    for key, value in lab.secrets().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CLOUDFLARE_EMAIL", raising=False)
    monkeypatch.delenv("CLOUDFLARE_API_KEY", raising=False)
    yield Plan.model_validate(YAML(typ="safe").load(lab.plan_file.read_text()))


# InnoDB's pages and redo log, Aria's (system tables, its log and checkpoints) and the binary log.
SERVER_WRITES = (
    "Innodb_data_written",
    "Innodb_os_log_written",
    "Innodb_pages_written",
    "Aria_pagecache_writes",
    "Aria_transaction_log_syncs",
    "Binlog_bytes_written",
)


def server_writes(rt: Runtime) -> tuple[int, ...]:
    """The source server's own write counters: while they stand still, any change to its files is someone else's."""
    conn = rt.db("source")
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN %s", (SERVER_WRITES,))
            values = dict(cur.fetchall())
        return tuple(int(values.get(name, 0)) for name in SERVER_WRITES)
    finally:
        rt.release(conn)


def wait_until_still(rt: Runtime, *, settle: float = 1.0, limit: float = 180.0) -> None:
    """Until the source server's write counters stood still for `settle` seconds (after a load, InnoDB purges and
    flushes for a while), at most `limit` seconds."""
    deadline = time.monotonic() + limit
    last = server_writes(rt)
    while time.monotonic() < deadline:
        time.sleep(settle)
        now = server_writes(rt)
        if now == last:
            return
        last = now


READ_ONLY_COMMANDS = {
    # `migrate rehearse` saves its estimate in the state directory it is given, and nowhere else.
    "rehearse": lambda lab, state: ["rehearse", str(lab.plan_file), "--state-dir", str(state)],
    # The dry-run measures the same estimate and saves nothing: not even the plan's own state directory (a real
    # run's journal lives there) may change.
    "apply --dry-run": lambda lab, _state: ["apply", str(lab.plan_file), "--dry-run"],
}


@pytest.mark.lab
@pytest.mark.parametrize("command", list(READ_ONLY_COMMANDS))
def test_estimating_changes_nothing_on_either_host_nor_in_dns(
    lab: LabState, plan: Plan, tmp_path: Path, command: str
) -> None:
    """Both hosts' trees and datadirs (names, sizes, mtimes, modes), every DNS record and the plan's own state
    directory (where a real run's journal is), before and after.

    The live source database flushes pages by itself now and then: an estimate during which its own write counters
    moved proves nothing about its datadir, so it is repeated (at most 5 times) until one ran while it was still.
    """
    state_dir = lab.plan_file.parent / ".migrate"

    def snapshot() -> dict[str, Any]:
        return {**everything(lab), "plan state": tree_state(state_dir) if state_dir.exists() else None}

    rt = Runtime(plan, lab.plan_file)
    try:
        for _attempt in range(5):
            wait_until_still(rt)
            counters, before = server_writes(rt), snapshot()
            argv = READ_ONLY_COMMANDS[command](lab, tmp_path / "state")
            result = migrate(*argv, env=lab.secrets(), timeout=180)
            after = snapshot()
            if server_writes(rt) == counters:
                break
            before.pop("source datadir"), after.pop("source datadir")
            assert after == before  # everything but the live datadir, whatever its server did
        else:
            pytest.fail("the source database never stood still during an estimate")
    finally:
        rt.close()
    assert result.returncode == 0, result.stderr
    assert after == before
    assert all(secret not in result.stdout + result.stderr for secret in lab.secrets().values())
    if command == "rehearse":
        # The lab's plan says `cutover.mode: auto`: estimated for the mode the run would take (its own probe).
        assert plan.cutover.mode == "auto"
        mode = resolve_mode(plan, lab.plan_file, tmp_path / "no-journal.jsonl", probe=True).cutover.mode
        assert f"predicted window ({mode} mode):" in result.stdout
        assert f"mode: {mode} (chosen by 'auto')" in result.stdout and "files_presync" in result.stdout
        saved = json.loads((tmp_path / "state" / "estimate.json").read_text())
        assert saved["window_seconds"] > 0 and saved["mode"] == mode
        moved = "repl_seed" if mode == "replicate" else "db_presync"
        assert {t["step"] for t in saved["transfers"]} == {"files_presync", moved}
        return
    # The dry-run: every step still listed, each transfer's bytes and duration under its step, the window's parts.
    assert "DOWNTIME BEGINS" in result.stdout and "COMMIT POINT" in result.stdout
    assert "~ estimate: tree uploads: " in result.stdout and "predicted window (" in result.stdout
    assert "~ estimate (window): uploads delta" in result.stdout and "not measured" not in result.stdout
    # The steps before the window that move nothing have their durations too.
    assert "~ estimate: the checks about" in result.stdout and "~ estimate: nothing to lower" in result.stdout
    assert not (tmp_path / "state").exists()


def empty(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


@pytest.mark.lab
def test_estimates_are_within_ten_percent_of_the_presyncs_that_follow(lab: LabState, plan: Plan) -> None:
    rt = Runtime(plan, lab.plan_file)
    try:
        assert not rt.db_answers("target"), "the lab's target database must be stopped"
        # An empty target: the estimate has something real to predict.
        empty(lab.target.uploads)
        empty(lab.target.datadir)
        estimate = estimates.estimate(rt, SHUTDOWN)
        moved: dict[str, int] = {}
        for step in (FilesPresync(), DbPresync()):
            ctx = StepContext(run_id="test", step=step.name, dry_run=False, rt=rt, log=structlog.get_logger())
            output = step.run(ctx) or {}
            if step.name == "files_presync":
                moved[step.name] = FilesResult.of(output).bytes
            else:
                moved[step.name] = DbPresyncResult.of(output).rounds[0].files_size
    finally:
        rt.close()
    assert estimate.bytes_of("files_presync") > 0 and estimate.bytes_of("db_presync") > 0
    for step, actual in moved.items():
        predicted = estimate.bytes_of(step)
        assert abs(predicted - actual) <= 0.10 * actual, compare(estimate.as_dict(), moved)


@pytest.mark.lab
def test_the_real_run_states_the_rehearsals_estimate_beside_what_happened(
    live_lab: LabState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`migrate apply --dry-run` and `migrate rehearse`, then `migrate apply` of the same plan onto an empty target:
    the run's report carries the rehearsal's estimate beside the bytes each pre-sync moved, each within 10 %, and
    the predicted window beside the real one; the dry-run's bytes are within 10 % too."""
    for key, value in live_lab.secrets().items():
        monkeypatch.setenv(key, value)  # the in-process dry-run reads them; restored after the test
    monkeypatch.delenv("CLOUDFLARE_EMAIL", raising=False)
    monkeypatch.delenv("CLOUDFLARE_API_KEY", raising=False)
    plan = plan_copy(live_lab, "estimate", {})
    empty(live_lab.target.uploads)
    empty(live_lab.target.datadir)
    # The dry-run's estimate first (the same measurement, saved nowhere): held against the same run below.
    dry = describe(plan)
    assert dry.estimate_data is not None, dry.estimate_summary
    rehearsed = migrate("rehearse", str(plan), "--env-file", str(live_lab.env_file), timeout=180)
    assert rehearsed.returncode == 0, rehearsed.stderr
    applied = migrate_apply(live_lab, plan)
    assert applied.returncode == 0, outcome(applied)
    assert "beside this run" in applied.stdout and "window: predicted" in applied.stdout
    report = run_report(live_lab, plan_name(plan))
    estimate = report["estimate"]["estimate"]
    for step in ("files_presync", "db_presync"):
        predicted = sum(t["bytes"] for t in estimate["transfers"] if t["step"] == step)
        actual = report["bytes_by_step"][step]
        assert actual > 0 and abs(predicted - actual) <= 0.10 * actual, report["estimate"]["lines"]
        from_dry_run = sum(t["bytes"] for t in dry.estimate_data["transfers"] if t["step"] == step)
        assert abs(from_dry_run - actual) <= 0.10 * actual, (step, from_dry_run, actual)
    assert estimate["window_seconds"] > 0 and report["write_block_seconds"] > 0
    print(
        f"\ndry-run: window {dry.estimate_data['window_seconds']} s, bytes "
        f"{ {t['step']: t['bytes'] for t in dry.estimate_data['transfers']} }; real: writes blocked "
        f"{report['write_block_seconds']} s, bytes {report['bytes_by_step']}"
    )


@pytest.mark.lab
def test_rehearse_for_real_leaves_the_source_as_it_was_and_the_target_clean(live_lab: LabState, plan: Plan) -> None:
    """Pre-syncs, the target started fenced on a copy and health-checked, DNS read, the window predicted from the
    measured parts; the source's trees and DNS unchanged and the source still serving; with --clean, the target
    stopped and empty."""
    plan_file = plan_copy(live_lab, "rehearsal-clean", {})
    before = {"dns": dns_state(live_lab), "uploads": tree_state(live_lab.source.uploads)}
    done = migrate("rehearse", str(plan_file), "--for-real", "--clean", "--env-file", str(live_lab.env_file),
                   timeout=600)  # fmt: skip
    assert done.returncode == 0, outcome(done)
    assert "predicted window:" in done.stdout and "target start: " in done.stdout and "target left clean" in done.stdout
    assert {"dns": dns_state(live_lab), "uploads": tree_state(live_lab.source.uploads)} == before
    assert list(live_lab.target.uploads.iterdir()) == [] and list(live_lab.target.datadir.iterdir()) == []
    assert not list(live_lab.target.datadir.parent.glob("*.rehearsal-warm"))
    rt = Runtime(plan, plan_file)
    try:
        assert not rt.db_answers("target") and rt.db_answers("source")
    finally:
        rt.close()


@pytest.mark.lab
def test_rehearse_for_real_leaves_the_target_warm_and_the_run_that_follows_states_the_prediction(
    live_lab: LabState, plan: Plan
) -> None:
    """A warm rehearsal is not wasted work: the real run that follows finds the uploads already there, and its
    report sets the rehearsal's predicted window beside the writes-blocked window it measured."""
    plan_file = plan_copy(live_lab, "rehearsal-warm", {})
    empty(live_lab.target.uploads)
    empty(live_lab.target.datadir)
    done = migrate("rehearse", str(plan_file), "--for-real", "--env-file", str(live_lab.env_file), timeout=600)
    assert done.returncode == 0, outcome(done)
    assert "target left warm" in done.stdout
    assert tree_digest(live_lab.target.uploads) == tree_digest(live_lab.source.uploads)
    assert (live_lab.target.datadir / "ibdata1").exists()
    assert not list(live_lab.target.datadir.parent.glob("*.rehearsal-warm"))
    applied = migrate_apply(live_lab, plan_file)
    assert applied.returncode == 0, outcome(applied)
    assert "rehearsal --for-real of" in applied.stdout and "window: predicted" in applied.stdout
    report = run_report(live_lab, plan_name(plan_file))
    assert report["estimate"]["rehearsal"]["window_seconds"] > 0 and report["write_block_seconds"] > 0
    assert report["bytes_by_step"].get("files_presync", 0) == 0  # the warm target already had every upload


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_the_steps_before_the_window_have_their_durations() -> None:
    """preflight, lower_ttl and (replicate) repl_catchup each get a duration from the unit costs measured, and say
    what it is made of; lower_ttl names the wait the cut-over will have (the records' TTL read now)."""
    plan = load_plan(Path(__file__).parents[1] / "plans" / "course-review.yaml").plan
    measured = dataclasses.replace(units(), ssh_new_source=0.5, ssh_new_target=0.25)
    parts = {p.step: p for p in estimates.predict_before(measured, plan=plan, mode=SHUTDOWN, records_ttl=300,
                                                         compare=None)}  # fmt: skip
    assert set(parts) == {"preflight", "lower_ttl"}
    assert parts["preflight"].seconds >= 2 * plan.preflight.fsync_seconds
    lowered = plan.model_copy(update={"dns": plan.dns.model_copy(update={"lower_ttl_to": 30})})
    parts = {p.step: p for p in estimates.predict_before(measured, plan=lowered, mode=REPLICATE, records_ttl=300,
                                                         compare=(0.01, 50))}  # fmt: skip
    records = len(plan.dns.records)
    assert parts["lower_ttl"].seconds == round(2 * records * 0.02, 3) and "300 s after it" in parts["lower_ttl"].basis
    # 50 chunks, each checksummed on both sides and bounded first; the checks' median round; one tracked pre-pass
    # per tree; the shells kept open on both hosts.
    expected = 50 * 0.01 * 3 + 0.4 + len(plan.files) * 1.0 + 0.5 + 0.25
    assert parts["repl_catchup"].seconds == round(expected, 3) and "50 chunk(s)" in parts["repl_catchup"].basis
