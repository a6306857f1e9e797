"""Transports: rsync command lines and parsers, retry policy, write budget (pure), then ssh, tunnels, MySQL and a
real source → target rsync on the lab."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from ruamel.yaml import YAML

from migrate_lab.state import LabState
from orchestrator.database.mysql import session as mysql
from orchestrator.plan.model import Host, Plan, Retry
from orchestrator.retry import call_with_retry
from orchestrator.runtime import Runtime
from orchestrator.transports import rsync
from orchestrator.transports.ssh import (
    CommandFailed,
    SshHost,
    TransportError,
    _end_cut_short_script,
    _in_session,
    _stopped_at_deadline,
)

FAST_RETRY = Retry(attempts=3, max_seconds=30, max_wait=0.05)


def load_plan(path: Path) -> Plan:
    return Plan.model_validate(YAML(typ="safe").load(path.read_text()))


def minimal_plan(**transfer: object) -> Plan:
    return Plan.model_validate(
        {
            "name": "unit",
            "source": {"address": "10.0.0.1", "key": "k"},
            "target": {"address": "10.0.0.2", "ssh_port": 2222, "user": "deploy"},
            "database": {
                "source": {"datadir": "/var/lib/mysql", "start": "s", "stop": "t"},
                "target": {"datadir": "/var/lib/mysql", "start": "s", "stop": "t"},
            },
            "dns": {"api_token": {"env": "T"}, "zone": "example.com", "records": ["www.example.com"]},
            "transfer": transfer,
        }
    )


# --- rsync command lines and parsers (pure) ---------------------------------------------------------------------


def test_live_push_is_niced_on_both_ends_and_bandwidth_limited() -> None:
    plan = minimal_plan(bwlimit="50M", source_to_target_key="/root/.ssh/migrate", nice=True)
    argv = shlex.split(rsync.push_command(plan, "/srv/up loads", "/srv/it's here", exclude=["*.tmp"]))
    assert argv[:5] == ["nice", "-n19", "ionice", "-c3", "rsync"]
    assert "--rsync-path=nice -n19 ionice -c3 rsync" in argv
    assert "--bwlimit=50M" in argv and "--exclude=*.tmp" in argv and "--delete" in argv
    assert {"--info=progress2", "--stats", "--whole-file"} <= set(argv)
    assert "--no-inc-recursive" not in argv  # incremental recursion keeps memory flat on huge trees
    # Paths with spaces and quotes reach rsync intact, with the trailing slash that copies contents.
    assert argv[-2:] == ["/srv/up loads/", "deploy@10.0.0.2:/srv/it's here/"]
    assert "-s" in argv, "paths travel in rsync's protocol, never through the target's shell"
    ssh = shlex.split(argv[argv.index("-e") + 1])
    assert ssh[0] == "ssh" and 'IdentityFile="/root/.ssh/migrate"' in ssh
    assert "StrictHostKeyChecking=yes" in ssh and "BatchMode=yes" in ssh
    assert "ControlMaster=auto" in ssh and f"ControlPersist={rsync.CONTROL_PERSIST}" in ssh
    assert ssh[ssh.index("-p") + 1] == "2222"


def test_push_in_the_downtime_window_has_no_limit_and_no_nice() -> None:
    plan = minimal_plan(bwlimit="50M", nice=True)
    argv = shlex.split(rsync.push_command(plan, "/a", "/b", live=False, inplace=True))
    assert argv[0] == "rsync"
    assert not [a for a in argv if a.startswith(("--bwlimit", "--rsync-path"))]
    assert "--inplace" in argv
    # No key on the source: the agent is forwarded instead, so no identity file.
    assert not [a for a in shlex.split(argv[argv.index("-e") + 1]) if a.startswith("IdentityFile")]


def test_compare_is_a_dry_run_with_checksums_listing_items() -> None:
    argv = shlex.split(rsync.compare_command(minimal_plan(), "/a", "/b", exclude=["cache/"]))
    assert {"--dry-run", "--checksum", "--itemize-changes", "--delete", "--exclude=cache/"} <= set(argv)
    assert "--info=progress2" not in argv


def test_progress2_and_stats_are_parsed() -> None:
    progress = rsync.parse_progress("     12,345,678  45%   12.34MB/s    0:00:05 (xfr#3, to-chk=7/10)")
    assert progress == rsync.Progress(12_345_678, 45, "12.34MB/s", "0:00:05", 3, 10)
    assert rsync.parse_progress("sending incremental file list") is None
    stats = rsync.parse_stats(
        "Number of files: 20 (reg: 16, dir: 4)\n"
        "Number of regular files transferred: 16\n"
        "Total file size: 4,194,304 bytes\n"
        "Total transferred file size: 4,000,000 bytes\n"
        "Literal data: 3,999,999 bytes\n"
        "Matched data: 0 bytes\n"
    )
    assert stats == rsync.Stats(16, 4_194_304, 4_000_000, 3_999_999, files_total=20)


@pytest.mark.parametrize(
    ("code", "kind"),
    [(0, "ok"), (24, "vanished"), (10, "transient"), (12, "transient"), (30, "transient"), (255, "transient"),
     (1, "permanent"), (23, "permanent"), (20, "permanent")],
)  # fmt: skip
def test_rsync_exit_codes_are_classified(code: int, kind: str) -> None:
    assert rsync.exit_kind(code) == kind


# --- retry policy, write budget, grants (pure) ------------------------------------------------------------------


def test_transient_failures_are_retried_and_permanent_ones_are_not() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TransportError("connection refused", True)
        return "ok"

    with structlog.testing.capture_logs() as logs:
        assert call_with_retry(flaky, FAST_RETRY, what="flaky") == "ok"
    assert len(calls) == 3 and [e["event"] for e in logs] == ["retrying", "retrying"]

    def denied() -> None:
        calls.append(1)
        raise TransportError("permission denied", False)

    calls.clear()
    with pytest.raises(TransportError, match="permission denied"):
        call_with_retry(denied, FAST_RETRY, what="denied")
    assert len(calls) == 1


def test_privileges_come_from_global_grants_only() -> None:
    grants = [
        "GRANT RELOAD, PROCESS ON *.* TO `migrate`@`%` IDENTIFIED BY PASSWORD '*ABC'",
        "GRANT SELECT, SHUTDOWN ON `app`.* TO `migrate`@`%`",
    ]
    assert mysql.missing_from_grants(grants, ["RELOAD", "SELECT", "SHUTDOWN"]) == {"SELECT", "SHUTDOWN"}
    assert mysql.missing_from_grants(["GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost`"], ["SHUTDOWN"]) == set()
    assert mysql.major_version("mariadbd  Ver 10.11.6-MariaDB-0+deb12u1 for debian") == "10.11"


# --- a command cut short, ended before the next one (the remote side of it, run here by sh) ----------------------


def _recorded(command: str, record: Path, timeout: float = 30) -> str:
    word = shlex.quote(str(record))
    return _in_session(_stopped_at_deadline(command, timeout, word), word)


def _end(*records: Path) -> list[str]:
    script = _end_cut_short_script([shlex.quote(str(record)) for record in records])
    done = subprocess.run(script, shell=True, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _started(record: Path) -> int:
    deadline = time.monotonic() + 30
    while not (record.exists() and record.read_text().strip()):
        assert time.monotonic() < deadline, "the command did not start"
        time.sleep(0.01)
    return int(record.read_text())


def test_a_recorded_command_runs_as_before_with_its_process_group_recorded_then_removed(tmp_path: Path) -> None:
    record = tmp_path / "1.pid"
    # Its stdin (input, environment) reaches it; the record names the command's own process group; status kept.
    command = f'cat; [ "$(cat {record})" = "$(ps -o pgid= -p $$ | tr -d " ")" ] && echo group; exit 3'
    done = subprocess.run(["sh", "-c", _recorded(command, record)], input="in\n", capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (3, "in\ngroup\n", "")
    assert not record.exists(), "a command that ended leaves no record to end"
    # Noclobber is the record's only: the command itself may overwrite files.
    target = tmp_path / "overwritten"
    target.write_text("old")
    subprocess.run(["sh", "-c", _recorded(f"echo new > {target}", tmp_path / "2.pid")], check=True)
    assert target.read_text() == "new\n"


def test_a_command_ended_before_it_started_never_starts(tmp_path: Path) -> None:
    record, marker = tmp_path / "1.pid", tmp_path / "ran"
    assert _end(record) == ["never"]
    assert record.exists(), "the claim stays: the command may still be on its way"
    done = subprocess.run(["sh", "-c", _recorded(f"touch {marker}", record)], capture_output=True, text=True)
    assert done.returncode == 125 and not marker.exists()


def test_a_command_cut_short_is_ended_with_its_whole_group_before_the_ending_returns(tmp_path: Path) -> None:
    record, marker = tmp_path / "1.pid", tmp_path / "landed"
    # A child left in the background and the command itself: both would land after the ending, were they left.
    command = f"(sleep 20; touch {marker}) & sleep 20; touch {marker}"
    run = subprocess.Popen(["sh", "-c", _recorded(command, record)])
    try:
        pgid = _started(record)
        assert _group_alive(pgid)
        assert _end(record) == ["ended"]
        assert not _group_alive(pgid), "the ending returned while the command's group was still there"
        assert run.wait(timeout=30) != 0 and not record.exists()
    finally:
        if run.poll() is None:
            run.kill()
    assert _end(record) == ["never"]  # ended once: nothing left to end, and no later start


def test_a_command_that_ignores_term_is_killed_and_one_that_finished_is_left_alone(tmp_path: Path) -> None:
    stubborn, finished = tmp_path / "1.pid", tmp_path / "2.pid"
    subprocess.run(["sh", "-c", _stopped_at_deadline("true", 30, shlex.quote(str(finished)))], check=True)
    run = subprocess.Popen(["sh", "-c", _recorded("trap '' TERM; sleep 60", stubborn)])
    try:
        pgid = _started(stubborn)
        assert _end(stubborn, finished) == ["ended", "finished"]
        assert not _group_alive(pgid) and not finished.exists()
        run.wait(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()


# --- on the lab -------------------------------------------------------------------------------------------------


@pytest.fixture
def lab_env(lab: LabState, monkeypatch: pytest.MonkeyPatch) -> LabState:
    for key, value in lab.secrets().items():
        monkeypatch.setenv(key, value)
    return lab


@pytest.fixture
def rt(lab_env: LabState) -> Iterator[Runtime]:
    runtime = Runtime(load_plan(lab_env.plan_file), lab_env.plan_file)
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.mark.lab
def test_ssh_runs_commands_with_verified_keys(rt: Runtime) -> None:
    result = rt.source.run("echo out; echo err >&2; exit 3", check=False)
    assert (result.exit_status, result.stdout, result.stderr) == (3, "out\n", "err\n")
    with pytest.raises(CommandFailed, match="exited with status 3: err") as failed:
        rt.target.run("echo err >&2; exit 3")
    assert failed.value.transient is False
    assert rt.target.run("cat", input="line one\nline two\n").stdout == "line one\nline two\n"
    # An empty input is an empty stdin: a reader ends at once instead of waiting out its timeout.
    assert rt.target.run("cat; echo read", input="", timeout=20).stdout == "read\n"


@pytest.mark.lab
def test_secrets_reach_remote_commands_through_the_environment_not_the_command_line(rt: Runtime) -> None:
    secret = f"s3cret-{uuid.uuid4().hex}"
    # While the command runs, no process on the host shows the secret in its arguments.
    result = rt.source.run('echo "$TOKEN"; ps -eo args', env={"TOKEN": secret}, input=None)
    first, _, processes = result.stdout.partition("\n")
    assert first == secret
    assert "ps -eo args" in processes and secret not in processes


@pytest.mark.lab
def test_stream_splits_progress_lines_on_carriage_returns(rt: Runtime) -> None:
    lines: list[str] = []
    result = rt.source.stream(r"printf '10%%\r50%%\r100%%\ndone\n'; echo warn >&2", lines.append)
    assert lines == ["10%", "50%", "100%", "done"]
    assert result.exit_status == 0 and result.stderr == "warn\n"


@pytest.mark.lab
def test_a_command_that_outlives_its_timeout_is_a_transient_error(rt: Runtime) -> None:
    with pytest.raises(TransportError, match="timed out") as exc:
        rt.target.run("sleep 10", timeout=0.5)
    assert exc.value.transient is True
    assert rt.target.run("echo still usable").stdout == "still usable\n"


@pytest.mark.lab
def test_wrong_known_hosts_is_refused_permanently_without_retries(lab: LabState, tmp_path: Path) -> None:
    # A known_hosts that names the host with some other key: a man in the middle, as far as we can tell.
    other_key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    public = (tmp_path / "other.pub").read_text().split()
    src = lab.source
    (tmp_path / "known_hosts").write_text(f"[{src.address}]:{src.ssh_port} {public[0]} {public[1]}\n")
    host = Host(address=src.address, ssh_port=src.ssh_port, key=str(lab.ssh_key), known_hosts="known_hosts")
    ssh = SshHost(host, name="source", base_dir=tmp_path, retry=Retry(attempts=5, max_wait=0.05))
    with structlog.testing.capture_logs() as logs, pytest.raises(TransportError, match="host key not verifiable"):
        ssh.run("true")
    ssh.close()
    assert not [e for e in logs if e["event"] == "retrying"]


@pytest.mark.lab
def test_connection_refused_is_transient_and_retried(lab: LabState) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind((lab.source.address, 0))
        port = probe.getsockname()[1]
    host = Host(address=lab.source.address, ssh_port=port, key=str(lab.ssh_key), known_hosts=str(lab.known_hosts))
    ssh = SshHost(host, name="source", base_dir=lab.path, retry=Retry(attempts=2, max_wait=0.05))
    with structlog.testing.capture_logs() as logs, pytest.raises(TransportError, match="refused") as exc:
        ssh.run("true")
    assert exc.value.transient is True
    assert [e["event"] for e in logs] == ["retrying"]


@pytest.mark.lab
def test_mysql_through_the_tunnel(rt: Runtime, lab: LabState) -> None:
    conn = rt.db("source")
    assert mysql.major_version(mysql.server_version(conn))
    tables = mysql.list_tables(conn, None)
    assert (lab.db_name, "reviews") in tables
    assert not [t for t in tables if t[0] in mysql.SYSTEM_SCHEMAS]
    counts = mysql.row_counts(conn, tables)
    assert counts[f"{lab.db_name}.reviews"] > 0
    sums = mysql.checksums(conn, tables)
    assert set(sums) == set(counts)
    # The same server through a TCP forward to its port (as the source sees it).
    host, port = rt.source.forward_to_port(lab.source.address, lab.source.db_port)
    password = rt.db_password()
    tcp = mysql.connect(host, port, user=lab.migrate_user, password=password, connect_timeout=5, read_timeout=10,
                        write_timeout=10)  # fmt: skip
    try:
        assert mysql.row_counts(tcp, tables) == counts
    finally:
        tcp.close()


@pytest.mark.lab
def test_wrong_database_password_is_a_permanent_error_without_the_password(
    rt: Runtime, lab: LabState, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(lab.db_password_env, "definitely-not-the-password")
    with pytest.raises(mysql.DbError, match="Access denied") as exc:
        rt.db("source")
    assert exc.value.transient is False and exc.value.server_answered
    assert "definitely-not-the-password" not in str(exc.value)


@pytest.fixture
def scratch(lab: LabState) -> Iterator[str]:
    """A scratch directory on the target for rsync to write into."""
    path = lab.target.path / f"scratch-{uuid.uuid4().hex[:8]}"
    try:
        yield str(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.lab
def test_real_rsync_of_the_uploads_source_to_target(rt: Runtime, lab: LabState, scratch: str) -> None:
    plan = rt.plan
    uploads = [p for p in lab.source.uploads.rglob("*") if p.is_file()]
    progress: list[rsync.Progress] = []
    command = rsync.push_command(plan, str(lab.source.uploads), scratch, live=True)
    stats = rsync.push(rt.source, command, what="uploads", retry=plan.retry, on_progress=progress.append)
    assert stats.files_transferred == len(uploads)
    assert stats.total_size == stats.transferred_bytes == sum(p.stat().st_size for p in uploads)
    assert progress and progress[-1].pct == 100 and progress[-1].bytes == stats.total_size
    # Equal trees: the checksum dry-run lists nothing; a stray file and a changed file are both listed.
    compare = rsync.compare_command(plan, str(lab.source.uploads), scratch)
    assert rsync.changed_items(rt.source, compare, what="uploads") == []
    Path(scratch, "stray.txt").write_text("only on the target")
    victim = Path(scratch) / uploads[0].relative_to(lab.source.uploads)
    data = bytearray(victim.read_bytes())
    data[0] ^= 0xFF
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(uploads[0].stat().st_atime_ns, uploads[0].stat().st_mtime_ns))  # same size, same time
    items = rsync.changed_items(rt.source, compare, what="uploads")
    assert any(i.startswith("*deleting") and i.endswith("stray.txt") for i in items)
    assert any(i.startswith("<fc") and i.endswith(victim.name) for i in items), items
    # Another push deletes what the source does not have.
    rsync.push(rt.source, command, what="uploads", retry=plan.retry)
    assert not Path(scratch, "stray.txt").exists()


@pytest.mark.lab
def test_rsync_hops_share_one_ssh_connection_that_the_runtime_closes(lab_env: LabState, scratch: str) -> None:
    runtime = Runtime(load_plan(lab_env.plan_file), lab_env.plan_file)
    plan = runtime.plan
    check = f"{rsync.target_ssh_command(plan, control='no')} -O check {plan.target.user}@{plan.target.address}"
    try:
        command = rsync.push_command(plan, str(lab_env.source.uploads), scratch, live=True)
        rsync.push(runtime.source, command, what="uploads", retry=plan.retry)
        assert runtime.source.run(check, check=False).exit_status == 0, "a master connection serves later hops"
    finally:
        runtime.close()
    # The master lives on the source (this machine in the lab): after close it is gone.
    assert subprocess.run(["sh", "-c", check], capture_output=True, timeout=30).returncode != 0


@pytest.mark.lab
def test_a_command_past_its_timeout_is_stopped_on_the_host(rt: Runtime, tmp_path: Path) -> None:
    marker = tmp_path / "still-ran"
    with pytest.raises(TransportError):
        rt.source.run(f"sleep 5 && touch {marker}", timeout=1)
    time.sleep(5.5)
    assert not marker.exists(), "the timed-out command went on running on the host"


class _Interrupted(Exception):
    pass


@pytest.mark.lab
def test_a_command_interrupted_by_a_signal_neither_answers_for_the_next_nor_outlives_it(
    rt: Runtime, tmp_path: Path
) -> None:
    """SIGTERM lands while a command runs in the kept shell (the engine's handler raises there, and the rollback
    runs the next command at once): that next command gets its own answer, promptly, and the interrupted one was
    ended on the host before it ran."""
    import signal

    host = rt.source
    host.keep_shell()
    marker = tmp_path / "landed-late"

    def _raise(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, _raise)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(_Interrupted):
            host.run(f"sleep 3 && touch {marker} && echo first", timeout=30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert host.run("echo second", timeout=10).stdout == "second\n"
    time.sleep(3.5)
    assert not marker.exists(), "the interrupted command went on running on the host"


@pytest.mark.lab
def test_a_kept_shell_runs_commands_as_a_session_would_and_is_dropped_after_a_timeout(rt: Runtime) -> None:
    host = rt.source
    host.keep_shell()
    # The same answers as a session of its own: exit status, stdout and stderr apart, bytes untouched.
    result = host.run("echo out; echo err >&2; exit 3", check=False)
    assert (result.exit_status, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert host.run("printf 'no newline\\0end'").stdout == "no newline\0end"
    with pytest.raises(CommandFailed, match="exited with status 1"):
        host.run("false")
    # It never reads the shell's own input (the next commands), and what it leaves running cannot answer for it.
    assert host.run("cat; echo after").stdout == "after\n"
    assert host.run("(sleep 3; echo late) & echo now").stdout == "now\n"
    assert host.run("echo next", timeout=10).stdout == "next\n"
    assert host.run("echo 'unterminated", check=False).exit_status != 0  # the shell itself is not confused
    assert host.run("echo fine").stdout == "fine\n"
    # The commands did run in the kept shell: the same shell process answers each time.
    first, second = host.run("echo $PPID").stdout, host.run("echo $PPID").stdout
    assert first == second
    # A short stream (a pass over changed paths) runs there too; its lines are handed over once it ended.
    lines: list[str] = []
    streamed = host.stream(r"printf '10%%\r100%%\ndone\n'; echo $PPID; echo warn >&2", lines.append, short=True)
    assert lines == ["10%", "100%", "done", first.strip()] and streamed.stderr == "warn\n"
    # Secrets never travel through it: a command with an environment gets a session of its own.
    assert host.run('echo "$X"', env={"X": "via-env"}).stdout == "via-env\n"
    # Past its timeout the command is abandoned, and the shell with it: the next command opens a session.
    with pytest.raises(TransportError, match="timed out"):
        host.run("sleep 10", timeout=0.5)
    assert host.run("echo $PPID").stdout != first
    assert host.run("echo still usable").stdout == "still usable\n"


@pytest.mark.lab
@pytest.mark.parametrize("way", ["kept shell", "session", "stream"])
def test_a_command_cut_short_is_ended_before_the_next_command_on_the_host(
    rt: Runtime, tmp_path: Path, way: str
) -> None:
    # A fence cut short by the budget must not land after the rollback lifted it: the next command on the host
    # starts only once the one cut short is gone. Here the late command would append to the host's log after the
    # next command did.
    host, events = rt.source, tmp_path / "events"
    late = f"sleep 1.5; echo late >> {events}"  # its `timeout` on the host ends it only at 2 s
    if way == "kept shell":
        host.keep_shell()
    with pytest.raises(TransportError, match="timed out"):
        if way == "stream":
            host.stream(late, lambda _line: None, timeout=0.5)
        else:
            host.run(late, timeout=0.5)
    # The next command (its input on stdin, through the same wrapper) runs once the other was ended.
    with structlog.testing.capture_logs() as logs:
        host.run(f"cat >> {events}", input="next\n", timeout=10)
    time.sleep(2.5)  # past the late command's own end, had it gone on running
    assert events.read_text().splitlines()[-1] == "next", "a command cut short landed after the next command"
    ended = [e for e in logs if e["event"].startswith("ssh.cut_short")]
    assert [e["command"] for e in ended] == [late[:80]] and ended[0]["host"] == "source"
    assert host.run("echo still usable", timeout=10).stdout == "still usable\n"


DIES_WITH_THE_RUN = """
import sys, time
from pathlib import Path
from orchestrator.plan.loader import load_plan
from orchestrator.runtime import Runtime
plan_file, marker, ready = sys.argv[1:]
rt = Runtime(load_plan(Path(plan_file)).plan, Path(plan_file))
rt.source.run("true", timeout=30)
Path(ready).touch()
rt.source.run(f"sleep 8 && touch {marker}", timeout=2)  # killed -9 while this waits
"""


@pytest.mark.lab
def test_a_remote_command_of_a_killed_run_ends_by_its_own_deadline(lab_env: LabState, tmp_path: Path) -> None:
    # The orchestrator dies (kill -9) while a command it started on the host runs: the command does not go on
    # unknown, it ends at the deadline it was given (a command inside the window gets what is left of the budget).
    marker, ready = tmp_path / "still-ran", tmp_path / "ready"
    run = subprocess.Popen(
        [sys.executable, "-c", DIES_WITH_THE_RUN, str(lab_env.plan_file), str(marker), str(ready)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the runtime did not connect"
            time.sleep(0.05)
        time.sleep(0.5)  # the command is running on the host
        run.kill()
        run.wait(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
    time.sleep(9.5)  # past the command's own end (8 s), had it gone on running
    assert not marker.exists(), "a command of a killed run went on running on the host past its deadline"


def test_asyncssh_loads_without_searching_for_an_absent_liboqs_and_the_search_is_kept_where_it_exists(
    tmp_path: Path,
) -> None:
    import ctypes.util

    from orchestrator.transports import sshlib

    assert ctypes.util.find_library is sshlib._find_library  # put back after asyncssh's import
    assert not sshlib.liboqs_installed(str(tmp_path))
    (tmp_path / "liboqs.so.5").write_bytes(b"")
    assert sshlib.liboqs_installed(str(tmp_path))
    skipping = sshlib._without_liboqs(lambda name: f"lib{name}.so")
    assert skipping("oqs") is None and skipping("liboqs") is None and skipping("nettle") == "libnettle.so"
