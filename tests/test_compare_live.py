"""The comparison before the window and the tables outside its snapshot (MyISAM, Aria), on the lab.

An application's installer commonly creates such tables (search indexes, statistics). A read of one on the live
source is a read of now, not of the snapshot's position: every write during the read used to be reported as "the
replica differs", and the default mode refused the application. Here, with a MyISAM table written throughout the
run by a client of its own: the run completes (the table compared at a moment nothing wrote to it, or left to the
after-commit audit, said so), and a difference planted in an Aria table on the replica (its binary log off) is
still found, named, and rolls the run back before the window.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator

import pymysql
import pytest

from migrate_lab.state import LabState
from orchestrator import exit_codes
from tests.test_e2e import migrate_apply, outcome, plan_name
from tests.test_replicate_e2e import TIMEOUT, connect, live, on_step, replicate_plan, sql_on

pytestmark = pytest.mark.lab
__all__ = ["live"]

WRITTEN, IDLE = "hits_myisam", "words_aria"


@pytest.fixture
def tables(live: LabState) -> Iterator[LabState]:
    state = live
    conn = connect(state, state.source, state.db_name)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {WRITTEN}, {IDLE}")
            cur.execute(f"CREATE TABLE {WRITTEN} (id INT AUTO_INCREMENT PRIMARY KEY, n INT) ENGINE=MyISAM")
            cur.execute(f"CREATE TABLE {IDLE} (id INT PRIMARY KEY, w VARCHAR(20)) ENGINE=Aria")
            cur.executemany(f"INSERT INTO {WRITTEN} (n) VALUES (%s)", [(i,) for i in range(300)])
            cur.executemany(f"INSERT INTO {IDLE} VALUES (%s, %s)", [(i, f"w{i}") for i in range(120)])
        yield state
    finally:
        with contextlib.suppress(pymysql.MySQLError), conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {WRITTEN}, {IDLE}")
        conn.close()


@contextlib.contextmanager
def writing(state: LabState) -> Iterator[list[int]]:
    """A client inserting into the MyISAM table back to back (paced) for as long as the block lasts; refused once
    the source is read-only (its writes then go nowhere: the run moves on without them)."""
    written: list[int] = []
    stop = threading.Event()

    def _run() -> None:
        # As the application writes (its account: read_only stops it at the switch, as it stops the app).
        conn = pymysql.connect(
            host=state.source.address, port=state.source.db_port, user=state.app_user,
            password=state.secrets()[state.app_password_env], database=state.db_name, autocommit=True,
            connect_timeout=10, read_timeout=30,
        )  # fmt: skip
        try:
            while not stop.wait(0.005):
                with contextlib.suppress(pymysql.MySQLError), conn.cursor() as cur:
                    cur.execute(f"INSERT INTO {WRITTEN} (n) VALUES (%s)", (len(written),))
                    written.append(len(written))
        finally:
            conn.close()

    thread = threading.Thread(target=_run, daemon=True)
    thread.start()
    try:
        yield written
    finally:
        stop.set()
        thread.join(timeout=30)


def test_a_non_transactional_table_written_throughout_is_no_false_difference(tables: LabState) -> None:
    state = tables
    plan = replicate_plan(state, "livecmp", mode="replicate", chunk_rows=50)
    with writing(state) as written:
        result = migrate_apply(state, plan, timeout=TIMEOUT)
    assert result.returncode == exit_codes.OK, outcome(result)
    assert len(written) > 50, "the table was not written during the run"
    assert "differs" not in result.stdout + result.stderr
    # Preflight said which tables are outside the snapshot, and what the comparison does with them.
    logs = (state.path / ".migrate" / plan_name(plan)).glob("run-*.log.jsonl")
    said = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    (listed,) = [r for r in said if r.get("event") == "preflight.non_transactional_tables"]
    assert [t.split(" ")[0] for t in listed["tables"]] == [f"{state.db_name}.{WRITTEN}", f"{state.db_name}.{IDLE}"]
    assert "MyISAM" in listed["tables"][0] and "Aria" in listed["tables"][1]


def test_a_difference_planted_in_an_idle_non_transactional_table_is_found(tables: LabState) -> None:
    state = tables
    plant = sql_on(state, state.target, f"SET sql_log_bin = 0; UPDATE {IDLE} SET w = 'planted' WHERE id = 7")
    plan = replicate_plan(state, "livediff", {"before-step": on_step("repl_catchup", plant)}, mode="replicate",
                          chunk_rows=50)  # fmt: skip
    with writing(state):
        result = migrate_apply(state, plan, timeout=TIMEOUT)
    text = result.stdout + result.stderr
    assert result.returncode == exit_codes.FAILED, outcome(result)
    assert f"{state.db_name}.{IDLE} chunk 0 " in text and "contents differ" in text, outcome(result)
