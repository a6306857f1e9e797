"""What the window's first command on the source runs after its fence, offline: the database's stop as a command on
the source's host (MariaDB through a local client whose login no command line shows; PostgreSQL's clean stop), and
the uploads' final pass started in the background there and collected by a later command. The shell is run for
real by sh; the lab proves them on real servers (test_replicate_e2e, the commit driven from the source)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.database.mysql import host_stop as mysql_stop
from orchestrator.database.mysql.gtid import GtidPosition
from orchestrator.database.pg.replication import PgHostStop
from orchestrator.database.protocol import LocalLogin, ReplicationError, ServerAccess
from orchestrator.services.detached import Detached, parse_collected
from orchestrator.transports.ssh import CommandResult


def sh(script: str, *, path: Path | None = None, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{path}:/usr/bin:/bin" if path else "/usr/bin:/bin"}
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, input=stdin, env=env, timeout=30)


# --- the uploads' pass started by one command, collected by another ---------------------------------------------


def test_a_command_started_in_the_background_is_collected_whole_with_its_status(tmp_path: Path) -> None:
    detached = Detached("sleep 0.3; echo listed; echo 'a message' >&2; exit 5", str(tmp_path / "pass.out"), 30)
    sh(detached.start())
    collected = parse_collected(sh(detached.collect()).stdout)
    assert collected is not None
    status, said = collected
    assert status == 5 and said.split() == ["listed", "a", "message"]
    assert list(tmp_path.iterdir()) == [], "collected, its files are gone"


def test_one_never_started_is_said_so_and_the_collector_does_not_wait(tmp_path: Path) -> None:
    detached = Detached("echo never", str(tmp_path / "pass.out"), 30)
    assert parse_collected(sh(detached.collect()).stdout) is None


# --- MariaDB: read_only and the final position by a client on the source's host ------------------------------------

LOGIN = LocalLogin("migrate", "s3cret-Pass word", None, "127.0.0.1", 3307)


def test_the_login_goes_into_an_option_file_and_one_it_cannot_carry_plainly_keeps_the_session() -> None:
    text = mysql_stop.option_file(LOGIN)
    assert text is not None
    assert text.splitlines() == ["[client]", 'user="migrate"', "connect-timeout=5", 'password="s3cret-Pass word"',
                                 'host="127.0.0.1"', "port=3307", "protocol=TCP"]  # fmt: skip
    by_socket = mysql_stop.option_file(LocalLogin("root", None, "/run/mysqld/mysqld.sock", "127.0.0.1", 3306))
    assert by_socket is not None and 'socket="/run/mysqld/mysqld.sock"' in by_socket and "password" not in by_socket
    for password in ('a"b', "a\\b", "a\nb"):
        assert mysql_stop.option_file(LocalLogin("migrate", password, None, "127.0.0.1", 3307)) is None


class KeptHost:
    """A host whose commands sh runs here, with a kept shell's private directory; its `mariadb` is `client`."""

    def __init__(self, tmp_path: Path, client: str) -> None:
        self.kept_dir = str(tmp_path / "kept")
        os.mkdir(self.kept_dir, 0o700)
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        (self.bin / "mariadb").write_text(client)
        (self.bin / "mariadb").chmod(0o755)
        self.commands: list[str] = []

    def run(self, command: str, *, input: str | None = None, **_: Any) -> CommandResult:
        self.commands.append(command)
        done = sh(command, path=self.bin, stdin=input or "")
        return CommandResult(done.returncode, done.stdout, done.stderr)


def test_made_ready_before_the_window_the_stop_runs_with_the_login_on_no_command_line(tmp_path: Path) -> None:
    """The option file is written from stdin (0600, in the kept shell's private directory), the client tried once;
    the stop's command names the file, never the password, sends read_only and the position's query in one
    compound statement, and its answer is the position."""
    seen = tmp_path / "seen"
    client = f'#!/bin/sh\necho "$@" >> {seen}; cat >> {seen}; echo "__migrate_final_position=0-1-42,1-2-7"\n'
    host = KeptHost(tmp_path, client)
    stop = mysql_stop.host_stop(ServerAccess(host, "/var/lib/mysql", "start", "stop"), LOGIN)
    assert stop is not None and stop.client.endswith("/bin/mariadb") and stop.local_cost >= 0
    options = Path(stop.options)
    assert options.parent == Path(host.kept_dir) and options.stat().st_mode & 0o777 == 0o600
    assert 'password="s3cret-Pass word"' in options.read_text()
    command = stop.command(lock_wait_timeout=2.5)
    assert "s3cret" not in command and all("s3cret" not in c for c in host.commands)
    done = sh(command, path=host.bin)
    assert stop.parse(done.returncode, done.stdout) == GtidPosition.parse("0-1-42,1-2-7")
    sent = seen.read_text()
    assert f"--defaults-file={options}" in sent and "DELIMITER //" in sent
    assert "SET SESSION lock_wait_timeout = 3; SET GLOBAL read_only = 1;" in sent


def test_a_stop_that_did_not_set_read_only_says_the_servers_words(tmp_path: Path) -> None:
    stop = mysql_stop.MariaDbHostStop("/usr/bin/mariadb", "/tmp/x/mariadb-login.cnf", 0.01)
    said = "ERROR 1205 (HY000) at line 2: Lock wait timeout exceeded; try restarting transaction"
    with pytest.raises(ReplicationError, match="Lock wait timeout exceeded"):
        stop.parse(1, said + "\n")
    with pytest.raises(ReplicationError, match="exit status None"):
        stop.parse(None, "")
    assert stop.parse(0, "__migrate_final_position=\n") == GtidPosition.parse(""), "a server with no GTID yet"


def test_no_kept_shell_or_no_client_that_logs_in_keeps_the_stop_on_the_session(tmp_path: Path) -> None:
    class NoShell:
        def run(self, *_: Any, **__: Any) -> CommandResult:
            raise AssertionError("nothing is written without a private directory")

    assert mysql_stop.host_stop(ServerAccess(NoShell(), "/d", "start", "stop"), LOGIN) is None
    host = KeptHost(tmp_path, "#!/bin/sh\necho 'ERROR 1045 (28000): Access denied' >&2; exit 1\n")
    assert mysql_stop.host_stop(ServerAccess(host, "/d", "start", "stop"), LOGIN) is None
    assert list(Path(host.kept_dir).iterdir()) == [], "the option file of a login that failed is removed"


# --- PostgreSQL: the clean stop is a command on its host already --------------------------------------------------

CONTROLDATA = """pg_control version number:            1300
Database system identifier:           7312345678901234567
Database cluster state:               shut down
Latest checkpoint location:           0/3000028
Latest checkpoint's REDO location:    0/3000028
Latest checkpoint's TimeLineID:       1
Data page checksum version:           0
"""


def test_postgresqls_stop_reads_the_position_just_past_its_shutdown_checkpoint() -> None:
    stop = PgHostStop("/var/lib/postgresql/15/main/")
    assert stop.local_cost == 0.0
    assert "pg_controldata" in stop.command(lock_wait_timeout=4)
    assert stop.parse(0, CONTROLDATA).value == 0x3000028 + 1
    with pytest.raises(ReplicationError, match="did not shut down cleanly"):
        stop.parse(0, CONTROLDATA.replace("shut down\n", "in production\n"))
    with pytest.raises(ReplicationError, match="still shutting down"):
        stop.parse(1, "postmaster still shutting down\n")
    with pytest.raises(ReplicationError, match="final position unread"):
        stop.parse(0, "pg_controldata: could not open file\n")
