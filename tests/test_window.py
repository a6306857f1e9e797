"""The downtime window's guarantees: every action after the fence is bounded by the write-block budget, the source
database is proven stopped before its datadir is copied, the database lives entirely in the datadir, in-window
copies compare nanosecond mtimes, and blocker queries never show a password.

Pure logic first, then the steps on the lab (real sshd, mariadbd, rsync).
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from migrate_lab.state import LabState
from orchestrator.database.mysql import session as mysql
from orchestrator.database.mysql.session import FILE_VARIABLES, mask_query
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.loader import load_plan
from orchestrator.plan.model import CommandCheck, FileTree, HealthChecks, Plan
from orchestrator.runtime import Runtime
from orchestrator.services.probes import (
    describe_holders,
    glob_escape,
    innodb_holders,
    innodb_holders_command,
    parse_holders,
    real_datadir,
)
from orchestrator.steps.audit import Audit
from orchestrator.steps.common import tree_push_command
from orchestrator.steps.cutover import Cutover
from orchestrator.steps.db_final import DbFinal
from orchestrator.steps.files_final import FilesFinal
from orchestrator.steps.preflight import Preflight, database_directories, is_within, outside_datadir
from orchestrator.steps.start_target import StartTarget
from orchestrator.steps.verify_target import VerifyTarget
from orchestrator.transports import rsync
from orchestrator.transports.ssh import TransportError
from orchestrator.window import DowntimeWindow
from tests.test_e2e import assert_source_serves_and_dns_unchanged, live_lab  # noqa: F401 - a fixture

# --- pure logic -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "SET PASSWORD FOR u = 'plain-secret'",
        "SET PASSWORD FOR 'u'@'%' = \"plain-secret\"",
        "CREATE USER u IDENTIFIED BY PASSWORD '*plain-secret'",
        "ALTER USER u IDENTIFIED WITH mysql_native_password AS '*plain-secret'",
        "CREATE USER u IDENTIFIED VIA ed25519 USING 'plain-secret'",
        "ALTER USER u IDENTIFIED VIA mysql_native_password USING PASSWORD('plain-secret')",
        "SET PASSWORD = PASSWORD('plain-secret')",
        "GRANT ALL ON *.* TO u IDENTIFIED BY 'it''s plain-secret'",
        "CREATE USER u IDENTIFIED BY 'a\\'plain-secret'",
        "CHANGE MASTER TO MASTER_HOST='h', MASTER_PASSWORD='plain-secret'",
        "CREATE USER u IDENTIFIED BY 'plain-secret",  # a query cut off inside its literal
    ],
)
def test_blocker_queries_never_show_a_password(statement: str) -> None:
    masked = mask_query(statement, limit=500)
    assert "plain" not in masked and "secret" not in masked
    assert "'***'" in masked


def test_queries_without_passwords_keep_their_literals() -> None:
    assert mask_query("SELECT * FROM reviews WHERE author = 'ann'") == "SELECT * FROM reviews WHERE author = 'ann'"


def test_the_in_window_tree_copy_compares_nanosecond_mtimes() -> None:
    plan = Plan.model_validate(
        {
            "name": "unit",
            "source": {"address": "10.0.0.1"},
            "target": {"address": "10.0.0.2"},
            "database": {
                "source": {"datadir": "/var/lib/mysql", "start": "s", "stop": "t"},
                "target": {"datadir": "/var/lib/mysql", "start": "s", "stop": "t"},
            },
            "dns": {"api_token": {"env": "T"}, "zone": "example.com", "records": ["www.example.com"]},
        }
    )
    tree = FileTree(name="uploads", source="/srv/uploads", target="/srv/uploads")
    in_window = shlex.split(tree_push_command(plan, tree, live=False))
    assert "--modify-window=-1" in in_window
    assert in_window[-2:] == ["/srv/uploads/", "root@10.0.0.2:/srv/uploads/"]


def test_database_directories_outside_the_datadir_are_named() -> None:
    values = {
        "innodb_log_group_home_dir": "./",
        "innodb_undo_directory": "/srv/undo",
        "innodb_data_home_dir": "",
        "aria_log_dir_path": "/var/lib/mysql/",
        "log_bin_basename": "/var/lib/mysql/binlog",
        "log_bin_index": "/var/lib/mysql-logs/binlog.index",
    }
    directories = database_directories("/var/lib/mysql/", values, FILE_VARIABLES)
    assert directories == {
        "innodb_log_group_home_dir": "/var/lib/mysql",
        "innodb_undo_directory": "/srv/undo",
        "innodb_data_home_dir": "/var/lib/mysql",
        "aria_log_dir_path": "/var/lib/mysql",
        "log_bin_basename": "/var/lib/mysql",
        "log_bin_index": "/var/lib/mysql-logs",
    }
    problems = outside_datadir("/var/lib/mysql", directories, values)
    assert len(problems) == 2
    assert problems[0].startswith("the source database keeps files outside its datadir: innodb_undo_directory = ")
    assert "log_bin_index = /var/lib/mysql-logs/binlog.index" in problems[1]  # a shared prefix is not inside
    # Binary logging off: no basename, nothing to check; relative paths are relative to the datadir.
    assert database_directories("/d", {"log_bin_basename": "", "innodb_undo_directory": "../undo"}, FILE_VARIABLES) == {
        "innodb_undo_directory": "/undo"
    }
    assert is_within("/d/sub", "/d/") and is_within("/d", "/d") and not is_within("/dx", "/d")


def test_open_innodb_files_are_found_by_their_real_path() -> None:
    command = innodb_holders_command("/data/my[sql]")
    assert "-lname '/data/my\\[sql]/ib*'" in command and "/proc/[0-9]*/fd" in command
    assert glob_escape("/a*b?c") == "/a\\*b\\?c"
    output = "/proc/41/fd /data/mysql/ibdata1\n/proc/41/fd /data/mysql/ib_logfile0\n/proc/7/fd /data/mysql/ibtmp1\n"
    assert parse_holders(output) == {41: {"/data/mysql/ibdata1", "/data/mysql/ib_logfile0"}, 7: {"/data/mysql/ibtmp1"}}
    assert parse_holders("") == {}
    # The server's own processes, seen before the stop, count until they have exited (a zombie has).
    with_pids = innodb_holders_command("/data/mysql", pids=[41])
    assert "/proc/41/stat" in with_pids and "!= Z" in with_pids
    assert describe_holders(parse_holders("/proc/41/fd (running)\n/proc/7/fd /d/ibdata1\n")) == (
        "pid 7 holds /d/ibdata1 open; pid 41 still runs"
    )


def test_window_bounds_each_action_by_what_is_left_of_the_budget() -> None:
    unbounded = DowntimeWindow(30)
    assert unbounded.timeout() is None and unbounded.timeout(5.0) == 5.0
    window = DowntimeWindow(30)
    window.begin(time.time() - 28)
    left = window.timeout()
    assert left is not None and 0 < left <= 2
    assert window.timeout(0.5) == 0.5
    spent = DowntimeWindow(30)
    spent.begin(time.time() - 31)
    assert spent.timeout() == pytest.approx(0.1)  # still a real deadline, never "no timeout"
    with pytest.raises(StepError, match=r"more than cutover.max_write_block 30 s \(while comparing tree x\)"):
        spent.check("comparing tree x")


# --- on the lab -------------------------------------------------------------------------------------------------


class Recorder:
    """What the engine would journal for one step: values it saved, kept across calls."""

    def __init__(self) -> None:
        self.saved: dict[str, Any] = {}

    def context(
        self,
        rt: Runtime,
        step: Step,
        outputs: dict[str, dict[str, Any]] | None = None,
        window: DowntimeWindow | None = None,
    ) -> StepContext:
        def _save(_step: str, key: str, value: Any) -> None:
            self.saved[key] = value

        return StepContext(
            run_id="test",
            step=step.name,
            dry_run=False,
            rt=rt,
            log=structlog.get_logger("test"),
            _saved=dict(self.saved),
            _outputs=outputs or {},
            _save=_save,
            window=window,  # type: ignore[arg-type]  # None: the runtime's
        )


class StandsStillUntilTheStop:
    """A clock that stands still until the cut-over journals that it stops the source database, then runs.

    However slow the machine is before the stop (the lock, the row counts), the budget is spent waiting for the
    server to stop, never before: what fails the step is the server that does not stop, as the test means.
    """

    def __init__(self, journal: Recorder) -> None:
        self.journal = journal
        self.still = time.time()
        self.offset: float | None = None

    def __call__(self) -> float:
        now = time.time()
        if self.offset is None:
            if not self.journal.saved.get("source_db_stopped"):
                return self.still
            self.offset = now - self.still
        return now - self.offset


@pytest.fixture
def lab_plan(lab: LabState, monkeypatch: pytest.MonkeyPatch) -> Plan:
    for key, value in lab.secrets().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CLOUDFLARE_EMAIL", raising=False)
    monkeypatch.delenv("CLOUDFLARE_API_KEY", raising=False)
    return load_plan(lab.plan_file).plan


@pytest.fixture
def runtimes(lab: LabState) -> Iterator[list[Runtime]]:
    """Runtimes a test builds from changed plans, all closed at the end."""
    made: list[Runtime] = []
    try:
        yield made
    finally:
        for rt in made:
            rt.close()


def runtime(lab: LabState, plan: Plan, runtimes: list[Runtime]) -> Runtime:
    rt = Runtime(plan, lab.plan_file)
    runtimes.append(rt)
    return rt


@pytest.mark.lab
def test_a_health_check_that_would_outlast_the_budget_fails_on_the_budget(
    lab: LabState, lab_plan: Plan, runtimes: list[Runtime]
) -> None:
    slow = CommandCheck(name="slow", run="sleep 4", timeout=30)
    database = lab_plan.database.model_copy(
        update={"verify": lab_plan.database.verify.model_copy(update={"row_counts": False, "files": False})}
    )
    plan = lab_plan.model_copy(update={"health": HealthChecks(checks=[slow], attempts=3), "database": database})
    rt = runtime(lab, plan, runtimes)
    # One second of budget left: the check would pass after 4 s, so finishing it would overrun the budget.
    outputs = {"cutover": {"writes_blocked_at": rt.window.begin(time.time() - plan.cutover.max_write_block + 1.0)}}
    step = VerifyTarget()
    with pytest.raises(
        StepError, match=r"more than cutover\.max_write_block .*\(while health check slow, try 1 of 3\)"
    ):
        step.run(Recorder().context(rt, step, outputs))


@pytest.mark.lab
def test_per_table_figures_stop_when_the_limit_says_so(lab_plan: Plan, lab: LabState, runtimes: list[Runtime]) -> None:
    rt = runtime(lab, lab_plan, runtimes)
    conn = rt.db("source")
    tables = mysql.list_tables(conn, lab_plan.database.schemas)
    assert len(tables) >= 2
    asked: list[str] = []

    def _limit(table: str) -> float:
        asked.append(table)
        if len(asked) == 2:
            raise StepError("budget spent")
        return 5.0

    with pytest.raises(StepError, match="budget spent"):
        mysql.row_counts(conn, tables, limit=_limit)
    assert asked == [f"{s}.{t}" for s, t in tables[:2]]
    # The connection's own read timeout is back once the bounded queries are done.
    assert conn._read_timeout == lab_plan.database.read_timeout


@pytest.mark.lab
def test_a_tree_comparison_is_bounded_by_its_timeout(lab_plan: Plan, lab: LabState, runtimes: list[Runtime]) -> None:
    rt = runtime(lab, lab_plan, runtimes)
    with pytest.raises(TransportError, match="timed out"):
        rsync.changed_items(rt.source, "sleep 5", what="compare", timeout=0.5)


# --- the cut-over on the lab ------------------------------------------------------------------------------------


@pytest.fixture
def live(live_lab: LabState) -> Iterator[LabState]:  # noqa: F811
    """The source serves before and after (live_lab restores it), the target ends stopped."""
    yield live_lab


@pytest.mark.lab
def test_a_cutover_resumed_past_the_budget_stops_before_the_shutdown_and_undo_restores(
    live: LabState, lab_plan: Plan, runtimes: list[Runtime]
) -> None:
    rt = runtime(live, lab_plan, runtimes)
    journal = Recorder()
    # A resumed cut-over whose writes were blocked longer ago than the budget allows.
    blocked_at = time.time() - lab_plan.cutover.max_write_block - 1
    journal.saved["writes_blocked_at"] = blocked_at
    # The window a resumed run recalls from its journal (DowntimeWindow.bind): begun when writes were first blocked.
    window = DowntimeWindow(lab_plan.cutover.max_write_block)
    window.begin(blocked_at)
    step = Cutover()
    # The budget is checked before every action under the lock (the lock try, the row counts): the first one fails.
    over_budget = r"more than cutover\.max_write_block \d+ s (less the [\d.]+ s kept for the rollback )?\(while "
    with pytest.raises(StepError, match=over_budget):
        step.run(journal.context(rt, step, window=window))
    assert not journal.saved.get("source_db_stopped"), "the source database must not be stopped"
    assert rt.db_answers("source")
    Cutover().undo(journal.context(rt, step))
    assert_source_serves_and_dns_unchanged(live)


@pytest.mark.lab
def test_a_stop_command_that_returns_at_once_still_gives_a_consistent_copy(
    live: LabState, lab_plan: Plan, runtimes: list[Runtime]
) -> None:
    pid_file = live.source.db_pid_file
    # Signals the shutdown and returns at once; the server is held frozen for two more seconds before it starts
    # shutting down (as a busy server would still be flushing): the copy must wait for it all the same.
    early = (
        f"pid=$(cat {shlex.quote(str(pid_file))}); kill -STOP $pid; kill -TERM $pid;"
        " (sleep 2; kill -CONT $pid) </dev/null >/dev/null 2>&1 &"
    )
    plan = lab_plan.model_copy(
        update={"database": lab_plan.database.model_copy(update={"source": lab_plan.database.source.model_copy(
            update={"stop": early})})}
    )  # fmt: skip
    rt = runtime(live, plan, runtimes)
    server_pid = int(pid_file.read_text().split()[0])
    journal = Recorder()
    cutover = Cutover()
    with structlog.testing.capture_logs() as logs:
        result = cutover.run(journal.context(rt, cutover))
    assert result is not None
    released = [e for e in logs if e["event"] == "cutover.innodb_released"]
    # The frozen server still held its files when first asked: the step waited for it instead of copying.
    assert len(released) == 1 and released[0]["polls"] > 1
    # When the final pass ran, the server had gone: nothing holds its InnoDB files, its process has exited.
    assert innodb_holders(rt.source, real_datadir(rt.source, plan.database.source.datadir)) == {}
    assert not Path(f"/proc/{server_pid}").exists() or _zombie(server_pid)

    outputs = {"cutover": result}
    start = StartTarget()
    try:
        DbFinal().run(journal.context(rt, DbFinal(), outputs))
        FilesFinal().run(journal.context(rt, FilesFinal(), outputs))
        start.run(journal.context(rt, start, outputs))
        verified = VerifyTarget().run(journal.context(rt, VerifyTarget(), outputs))
        assert verified is not None and verified["audit_snapshot_at"]
        # The target starts on the copy and holds exactly the source's final figures: the audit (after the window)
        # compares its snapshot with the stopped source, started read-only and isolated.
        audited = Audit().run(journal.context(rt, Audit(), outputs))
        assert audited is not None and audited["status"] == "equal", audited
        assert audited["tables"] == len(result["tables"]) > 0 and sum(audited["row_counts"].values()) > 0
    finally:
        start.undo(journal.context(rt, start, outputs))
        cutover.undo(journal.context(rt, cutover))
    assert_source_serves_and_dns_unchanged(live)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@pytest.mark.lab
def test_a_stop_command_that_does_nothing_fails_the_cutover_and_undo_restores(
    live: LabState, lab_plan: Plan, runtimes: list[Runtime]
) -> None:
    plan = lab_plan.model_copy(
        update={
            "database": lab_plan.database.model_copy(
                update={"source": lab_plan.database.source.model_copy(update={"stop": "true"})}
            ),
            "cutover": lab_plan.cutover.model_copy(update={"max_write_block": 8.0}),
        }
    )
    rt = runtime(live, plan, runtimes)
    journal = Recorder()
    step = Cutover()
    window = DowntimeWindow(plan.cutover.max_write_block, clock=StandsStillUntilTheStop(journal))
    # Named by the open-files check (the server's pid and an InnoDB file it holds), within the budget.
    still = r"the source database is still running after its stop command \(true\): pid \d+ holds \S+/ib"
    with pytest.raises(StepError, match=still):
        step.run(journal.context(rt, step, window=window))
    assert rt.db_answers("source")
    Cutover().undo(journal.context(rt, step))
    assert not live.source.fence_file.exists()
    assert_source_serves_and_dns_unchanged(live)


@pytest.mark.lab
def test_preflight_refuses_a_symbolic_link_in_the_datadir(
    lab: LabState, lab_plan: Plan, runtimes: list[Runtime]
) -> None:
    rt = runtime(lab, lab_plan, runtimes)
    link = lab.source.datadir / "zz-preflight-probe"
    os.symlink("/nonexistent/elsewhere", link)
    try:
        step = Preflight()
        with pytest.raises(StepError) as failed:
            step.run(Recorder().context(rt, step))
    finally:
        link.unlink()
    message = str(failed.value)
    assert message.startswith("preflight: 1 problem: the source datadir holds symbolic links or .isl files")
    assert str(link) in message
