"""A pre-sync the live site does not feel: the live command's wrapping (process group, nocache), the pause decision
(load, the live app's latency, the seed's own bounds) on real process groups, and, on the lab, the pauses that engage
above `transfer.max_load` or `transfer.max_latency_ms` while the copy (and the seed) still completes correctly."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from ruamel.yaml import YAML

from migrate_lab.state import LabState
from orchestrator.database.mysql import seed as mysql_seed
from orchestrator.engine.step import StepContext
from orchestrator.plan.model import Plan
from orchestrator.results import DbPresyncResult, FilesResult
from orchestrator.runtime import Runtime
from orchestrator.steps.db_presync import DbPresync
from orchestrator.steps.files_presync import FilesPresync
from orchestrator.steps.repl_seed import RedoGuard
from orchestrator.transports import rsync, throttle
from orchestrator.transports.ssh import CommandResult, TransportError
from orchestrator.transports.throttle import Thresholds, Throttle, live_command, pause_reason
from tests.fakes import LocalHost

# --- offline ----------------------------------------------------------------------------------------------------


def test_load_check_reads_the_load_the_group_and_its_state() -> None:
    assert rsync.parse_load_check("0.52 0.40 0.33 2/301 4242\n4243\nT\n") == (0.52, 4243, "T")
    assert rsync.parse_load_check("1.00 0.40 0.33 2/301 4242\n\n") == (1.0, None, "")  # rsync not started yet
    with pytest.raises(TransportError):
        rsync.parse_load_check("")


def sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("nocache", [True, False])
def test_live_command_runs_in_its_own_group_and_keeps_the_exit_status(tmp_path: Path, nocache: bool) -> None:
    marker = tmp_path / "group"
    probe = "ps -o pgid= -p $$; exit 24"  # rsync's 'files vanished' exit must come back as it was
    done = sh(rsync.live_command(probe, nocache=nocache, group_marker=str(marker)))
    assert done.returncode == 24
    group = int(marker.read_text())
    assert int(done.stdout.strip()) == group  # the command ran in the group the marker names
    assert group != int(sh("ps -o pgid= -p $$").stdout.strip())  # not the caller's group


def test_live_command_under_nocache_when_installed() -> None:
    if shutil.which("nocache") is None:
        pytest.fail("nocache is in the Makefile's SYSTEM_PACKAGES: install it")
    done = sh(rsync.live_command('echo "$LD_PRELOAD"', nocache=True, group_marker=None))
    assert "nocache" in done.stdout
    assert "nocache" not in sh(rsync.live_command('echo "$LD_PRELOAD"', nocache=False, group_marker=None)).stdout


def test_live_command_stops_itself_before_the_copy_when_loaded(tmp_path: Path) -> None:
    """Above the threshold at the start, the command stops before running anything, until it is continued: a
    copy too short for the watcher's first look is paused all the same."""
    marker, ran = tmp_path / "group", tmp_path / "ran"
    proc = subprocess.Popen(["sh", "-c", rsync.live_command(f"touch {ran}", nocache=False, group_marker=str(marker),
                                                            max_load=-1.0)])  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        state = ""
        while time.monotonic() < deadline and state != "T":
            if marker.exists() and marker.read_text().strip():
                stat = Path(f"/proc/{marker.read_text().strip()}/stat")
                state = stat.read_text().rsplit(")", 1)[1].split()[0] if stat.exists() else ""
            time.sleep(0.05)
        assert state == "T" and not ran.exists()
        os.killpg(int(marker.read_text()), signal.SIGCONT)
        assert proc.wait(timeout=30) == 0 and ran.exists()
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(marker.read_text()), signal.SIGCONT)
            proc.kill()


# --- the decision, offline ----------------------------------------------------------------------------------------


def test_pause_reason_is_the_first_reading_above_its_threshold() -> None:
    both = Thresholds(max_load=2.0, max_latency_ms=200.0, latency_url="http://x/")
    assert pause_reason(1.0, 150.0, both) is None
    assert pause_reason(2.5, 150.0, both) == "load 2.5 > max_load 2"
    assert pause_reason(1.0, 250.0, both) == "app latency 250 ms > max_latency_ms 200"
    assert pause_reason(1.0, None, both) is None  # no latency read (no threshold for it): the load decides
    assert pause_reason(50.0, 5000.0, Thresholds()) is None  # no threshold, never paused
    assert Thresholds(max_latency_ms=200.0).probe_timeout == 1.0
    assert Thresholds(max_latency_ms=3000.0).probe_timeout == 6.0
    assert Thresholds(max_latency_ms=60000.0).probe_timeout == throttle.MAX_PROBE_SECONDS


@contextlib.contextmanager
def app_answering_in(seconds: float) -> Iterator[str]:
    """A local HTTP app that answers every GET after `seconds`; its URL."""

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(seconds)
            self.send_response(503)  # any answer is an answer: a fenced app's 503 has a latency too
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/healthz"
    finally:
        server.shutdown()
        server.server_close()


def test_latency_is_the_apps_answer_time_and_a_refused_request_counts_as_slow() -> None:
    with app_answering_in(0.3) as url:
        assert throttle.measure_latency(url, "shop.example.com", 5.0) >= 300
        assert throttle.measure_latency(url, None, 0.1) >= 100  # timed out: the timeout, slow
    port = closed_port()
    assert throttle.measure_latency(f"http://127.0.0.1:{port}/", None, 2.0) == 2000.0


def closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def group_state(marker: Path) -> str:
    group = marker.read_text().strip() if marker.exists() else ""
    stat = Path(f"/proc/{group}/stat")
    return stat.read_text().rsplit(")", 1)[1].split()[0] if group and stat.exists() else ""


@contextlib.contextmanager
def running_group(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    marker = tmp_path / "group"
    proc = subprocess.Popen(["sh", "-c", live_command("sleep 30", nocache=False, group_marker=str(marker))])
    group: int | None = None
    try:
        deadline = time.monotonic() + 10
        while not (marker.exists() and marker.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.02)
        group = int(marker.read_text())  # the throttle removes its marker when it ends
        yield marker, proc
    finally:
        if group is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGCONT)
                os.killpg(group, signal.SIGKILL)
        proc.kill()
        proc.wait(timeout=30)


SLOW_APP = Thresholds(max_latency_ms=100.0, latency_url="http://app/", interval=0.1, max_pause=30.0)


def wait_for(condition: Callable[[], bool], limit: float = 10.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_a_slow_app_pauses_the_group_and_a_fast_one_resumes_it(tmp_path: Path) -> None:
    latency = [500.0]
    with running_group(tmp_path) as (marker, _proc):
        watcher = Throttle(LocalHost(), str(marker), SLOW_APP, what="test",  # type: ignore[arg-type]
                           measure=lambda *_: latency[0])  # fmt: skip
        with watcher:
            assert wait_for(lambda: group_state(marker) == "T")
            latency[0] = 20.0
            assert wait_for(lambda: group_state(marker) == "S")
        assert watcher.pauses >= 1 and watcher.causes.get("latency", 0) >= 1
        assert watcher.resumed_for.get("back under the thresholds", 0) >= 1
        assert watcher.throttled_seconds > 0 and watcher.highest_latency_ms == 500.0


class SlowHost(LocalHost):
    """A loaded host: every command over its SSH takes `delay` seconds more (measured on the lab's machine under
    load: about a second per new session)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def run(self, command: str, **options: Any) -> CommandResult:
        time.sleep(self.delay)
        return super().run(command, **options)


def test_no_pause_outlasts_max_pause_on_a_slow_host_with_a_slow_probe(tmp_path: Path) -> None:
    """The app stays slow and each latency probe waits for its whole timeout; each command on the host costs a
    quarter of a second. The pauses still end by transfer.max_pause (the resume sent early by what a check and a
    signal take, the probe cut at the pause's end), and the copy runs between them."""
    thresholds = Thresholds(max_latency_ms=100.0, latency_url="http://app/", interval=0.1, max_pause=1.0)

    def slow_probe(_url: str, _host: str | None, timeout: float) -> float:
        time.sleep(timeout)  # no answer within the timeout: slow
        return timeout * 1000

    with running_group(tmp_path) as (marker, _proc):
        watcher = Throttle(SlowHost(0.25), str(marker), thresholds, what="test",  # type: ignore[arg-type]
                           measure=slow_probe)  # fmt: skip
        with watcher:
            assert wait_for(lambda: watcher.pauses >= 2, limit=30.0)
    assert watcher.resumed_for.get("longest pause (transfer.max_pause)", 0) >= 1
    # What a signal's own round trip may add past the bound when it takes longer than the one before: a tenth.
    assert 0 < watcher.longest_pause <= thresholds.max_pause + 0.1, watcher.figures()


def test_a_group_in_a_stage_that_must_not_wait_is_never_stopped(tmp_path: Path) -> None:
    """The seed's bound: once mariadb-backup logged its first locking stage, no pause (it would hold the lock)."""
    log = tmp_path / "backup.log"
    log.write_text(f"[00] 2026-11-24 23:34:44 {mysql_seed.LOCKING_STAGE}\n")
    with running_group(tmp_path) as (marker, _proc):
        watcher = Throttle(LocalHost(), str(marker), SLOW_APP, what="seed",  # type: ignore[arg-type]
                           may_not_stop=mysql_seed.seed_locking_command(str(log)),
                           measure=lambda *_: 500.0)  # fmt: skip
        with watcher:
            time.sleep(1.0)
            assert group_state(marker) == "S"
        assert watcher.pauses == 0 and watcher.throttled_seconds == 0


def test_the_callers_bound_ends_a_pause_the_thresholds_would_keep(tmp_path: Path) -> None:
    """The seed's redo bound: the app stays slow, yet the pause ends once the source wrote half its redo log."""
    lsn = [1_000_000]
    guard = RedoGuard(lambda: lsn[0], capacity=16 * 1024 * 1024)
    with running_group(tmp_path) as (marker, _proc):
        watcher = Throttle(LocalHost(), str(marker), SLOW_APP, what="seed", on_pause=guard.pause_began,  # type: ignore[arg-type]
                           must_resume=guard.must_resume, measure=lambda *_: 500.0)  # fmt: skip
        with watcher:
            assert wait_for(lambda: group_state(marker) == "T")
            time.sleep(0.3)
            assert group_state(marker) == "T"  # 0 bytes of redo since: it stays paused
            lsn[0] += 8 * 1024 * 1024  # the source writes half its redo log
            assert wait_for(lambda: group_state(marker) == "S", limit=5.0)
        ended = [why for why in watcher.resumed_for if why.startswith("the redo log")]
        assert ended and guard.most_written >= 8 * 1024 * 1024


def test_redo_guard_resumes_when_the_position_cannot_be_read() -> None:
    def unreadable() -> int:
        raise OSError("gone")

    guard = RedoGuard(unreadable, capacity=1000)
    guard.pause_began()
    assert guard.must_resume() == "the source's redo log position cannot be read"
    readings = iter([100, 399, 600])
    guard = RedoGuard(lambda: next(readings), capacity=1000)
    guard.pause_began()
    assert guard.must_resume() is None  # 299 bytes of 1000
    assert guard.must_resume() == "the redo log: 500 bytes written since the pause, of 1000"


# --- on the lab -------------------------------------------------------------------------------------------------


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


@pytest.fixture
def busy_source() -> Iterator[None]:
    """A process always runnable, so the machine's (the source's) load average is above zero. At nice 19 it takes
    a CPU only when nothing else wants it: the load average counts it all the same."""
    proc = subprocess.Popen([sys.executable, "-c", "import os\nos.nice(19)\nwhile True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.fixture
def throttled_plan(lab: LabState, monkeypatch: pytest.MonkeyPatch) -> Plan:
    for key, value in lab.secrets().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CLOUDFLARE_EMAIL", raising=False)
    monkeypatch.delenv("CLOUDFLARE_API_KEY", raising=False)
    plan = Plan.model_validate(YAML(typ="safe").load(lab.plan_file.read_text()))
    # A threshold no busy host stays under: the pause engages as soon as rsync runs.
    transfer = plan.transfer.model_copy(
        update={"max_load": 0.0, "load_check_interval": 0.3, "max_pause": 0.6, "bwlimit": "8M"}
    )
    return plan.model_copy(update={"transfer": transfer})


def empty(directory: Path) -> None:
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def left_behind(pattern: str, since: float) -> list[Path]:
    """Files matching `pattern` in /tmp (group markers and the seed's log beside its marker) that this test's copies
    left: made since it began and belonging to a process group with no process left. Another lab's copy running
    beside this one keeps its own; one caught between removing its marker and its log is let go by the second look."""

    def dead(path: Path) -> bool:
        try:
            if path.stat().st_mtime < since:
                return False
            marker = path.with_suffix("") if path.suffix == ".log" else path
            group = int(marker.read_text().strip() or 0)
        except FileNotFoundError:
            return path.exists()  # a log whose marker is gone
        except ValueError:
            return True
        if group <= 0:
            return True
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        return False

    first = {path for path in Path("/tmp").glob(pattern) if dead(path)}
    if first:
        time.sleep(1)
    return sorted(path for path in first if dead(path))


def stopped_processes(name: str, lab: LabState) -> list[str]:
    """Processes named `name` left stopped (state T) that work on this lab's files."""
    listing = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True, check=True).stdout
    return [line for line in listing.splitlines() if line.startswith("T") and name in line and str(lab.path) in line]


@pytest.mark.lab
def test_presyncs_pause_above_max_load_and_still_copy_everything(
    lab: LabState, throttled_plan: Plan, busy_source: None
) -> None:
    began = time.time()
    rt = Runtime(throttled_plan, lab.plan_file)
    try:
        assert not rt.db_answers("target"), "the lab's target database must be stopped"
        empty(lab.target.uploads)
        results = {}
        for step in (FilesPresync(), DbPresync()):
            ctx = StepContext(run_id="test", step=step.name, dry_run=False, rt=rt, log=structlog.get_logger())
            results[step.name] = step.run(ctx)
    finally:
        rt.close()
    files = FilesResult.of(results["files_presync"])
    assert files.throttled_seconds > 0
    assert all(tree.throttled_seconds > 0 for tree in files.trees.values())
    assert DbPresyncResult.of(results["db_presync"]).throttled_seconds > 0
    # The copy completed correctly all the same, and no process group was left stopped.
    assert tree_digest(lab.target.uploads) == tree_digest(lab.source.uploads)
    assert not stopped_processes("rsync", lab)
    assert not left_behind("migrate-rsync-*.pgid", began)


def throttled_by_latency(lab: LabState, **replication: object) -> Plan:
    """The lab's plan with a latency threshold no app answers under (0.001 ms): every probe of the source's app
    (its first http health check aimed at the source) is above it, and no load threshold."""
    plan = Plan.model_validate(YAML(typ="safe").load(lab.plan_file.read_text()))
    transfer = plan.transfer.model_copy(
        update={"max_load": None, "max_latency_ms": 0.001, "load_check_interval": 0.3, "max_pause": 0.6,
                "bwlimit": "2M"}
    )  # fmt: skip
    update: dict[str, object] = {"transfer": transfer}
    if replication:
        assert plan.replication is not None
        update["replication"] = plan.replication.model_copy(update=replication)
    return plan.model_copy(update=update)


@pytest.fixture
def lab_secrets(lab: LabState, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in lab.secrets().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CLOUDFLARE_EMAIL", raising=False)
    monkeypatch.delenv("CLOUDFLARE_API_KEY", raising=False)


@pytest.mark.lab
def test_presync_pauses_while_the_live_app_is_slower_than_max_latency_and_still_copies_everything(
    lab: LabState, lab_secrets: None
) -> None:
    plan = throttled_by_latency(lab)
    assert plan.latency_probe() == (f"http://{lab.source.address}:{lab.source.app_port}/healthz", None)
    began = time.time()
    rt = Runtime(plan, lab.plan_file)
    try:
        empty(lab.target.uploads)
        step = FilesPresync()
        ctx = StepContext(run_id="test", step=step.name, dry_run=False, rt=rt, log=structlog.get_logger())
        files = FilesResult.of(step.run(ctx))
    finally:
        rt.close()
    assert files.throttled_seconds > 0 and files.trees["uploads"].throttled_seconds > 0
    assert tree_digest(lab.target.uploads) == tree_digest(lab.source.uploads)
    assert not left_behind("migrate-rsync-*.pgid", began)


@pytest.mark.lab
def test_the_seed_pauses_on_the_same_thresholds_and_its_copy_still_prepares(lab: LabState, lab_secrets: None) -> None:
    """mariadb-backup paused and resumed (SIGSTOP/SIGCONT of its group) while the app is 'slow': the stream ends,
    the copy prepares (InnoDB's recovery finds every redo record it needs) and is installed with its GTID position;
    the throttled time is in the seed's result. Undone afterwards: the target's datadir as it was."""
    from orchestrator.results import SeedResult
    from orchestrator.steps.repl_seed import ReplSeed

    plan = throttled_by_latency(lab, seed_throttle=20)  # about 8 MB/s: a seed long enough to be paused
    began = time.time()
    rt = Runtime(plan, lab.plan_file)
    step = ReplSeed()
    ctx = StepContext(run_id="test", step=step.name, dry_run=False, rt=rt, log=structlog.get_logger())
    try:
        assert not rt.db_answers("target"), "the lab's target database must be stopped"
        seed = SeedResult.of(step.run(ctx))
        assert seed.throttled_seconds > 0 and seed.throttle["pauses"] >= 1, seed.throttle
        assert seed.throttle["causes"].get("latency", 0) >= 1
        assert seed.gtid and seed.prepare_seconds is not None and seed.bytes > 0
        assert "BLOCK_COMMIT" in seed.backup_stages
        print(f"\nseed: {seed.bytes / 2**20:.1f} MiB in {seed.stream_seconds} s, throttle {seed.throttle}")
    finally:
        step.undo(ctx)
        rt.close()
    assert (lab.target.datadir / "ibdata1").exists()
    assert not left_behind("migrate-seed-*", began)
    assert not stopped_processes("mariadb-backup", lab)


def cached_bytes(path: Path) -> int:
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return int(out.strip() or 0)


@pytest.mark.lab
def test_the_seed_leaves_the_sources_page_cache_as_it_found_it_under_nocache(lab: LabState, lab_secrets: None) -> None:
    """The redo log mariadb-backup reads (its data files it reads with O_DIRECT anyway): evicted first, then seeded;
    without nocache the backup leaves its pages in the source's page cache, under nocache (the default) none."""
    from orchestrator.steps.repl_seed import ReplSeed

    base = Plan.model_validate(YAML(typ="safe").load(lab.plan_file.read_text()))
    redo = lab.source.datadir / "ib_logfile0"
    left: dict[bool, int] = {}
    for nocache in (False, True):
        plan = base.model_copy(update={"transfer": base.transfer.model_copy(update={"nocache": nocache})})
        rt = Runtime(plan, lab.plan_file)
        step = ReplSeed()
        ctx = StepContext(run_id="test", step=step.name, dry_run=False, rt=rt, log=structlog.get_logger())
        try:
            assert not rt.db_answers("target"), "the lab's target database must be stopped"
            subprocess.run(["cachedel", str(redo)], check=True)
            assert cached_bytes(redo) == 0
            step.run(ctx)
            left[nocache] = cached_bytes(redo)
        finally:
            step.undo(ctx)
            rt.close()
    assert left[False] > 0 and left[True] == 0, left
