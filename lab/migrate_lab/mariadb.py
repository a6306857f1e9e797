"""Each lab host's MariaDB: datadir, start/stop scripts, the source's users, schema and seed data.

Both hosts share one filesystem, so everything is explicit: `--no-defaults` (no /etc/mysql config leaks in), a
socket and pid file under the host's run dir, and a RELATIVE `--log-bin` (an absolute one would be written into
binlog.index and a datadir copied to the target would point at the source's binlogs).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from migrate_lab.state import HostState, LabState

MARIADBD = "/usr/sbin/mariadbd"
INSTALL_DB = "mariadb-install-db"
CLIENT = "mariadb"
ADMIN = "mariadb-admin"

# The demo application's schema, shared with lab/migrate_lab/app.py (which may create it on an empty database).
SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS reviews (
    id VARCHAR(64) PRIMARY KEY,
    author VARCHAR(100),
    course VARCHAR(100),
    rating INT,
    body TEXT,
    created_at DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS uploads (
    name VARCHAR(255) PRIMARY KEY,
    size BIGINT,
    sha256 CHAR(64),
    created_at DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB;
"""

# Seed rows are about 1 KiB of text each; InnoDB pages, record headers and the primary key add the rest.
SEED_ROW_BYTES = 1300
SEED_BATCH_ROWS = 50_000
SEED_ID_PREFIX = "seed-"


class LabDbError(RuntimeError):
    """The lab's database could not be made or reached; the message says where to look."""


def tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if found is None:
        raise LabDbError(f"{name} not found")
    return found


def mariadbd_argv(host: HostState, datadir: Path | None = None) -> list[str]:
    """The server's command line; `datadir`: the path its configuration names (default the host's datadir; a
    test names the directory a symbolic link there points at, as a server configured by the real path would)."""
    return [
        MARIADBD,
        "--no-defaults",
        f"--datadir={datadir or host.datadir}",
        f"--socket={host.db_socket}",
        f"--tmpdir={host.db_tmp_dir}",
        f"--bind-address={host.address}",
        f"--port={host.db_port}",
        "--user=root",
        f"--pid-file={host.db_pid_file}",
        f"--log-error={host.log_dir / 'mysqld.err'}",
        "--log-bin=binlog",
        # Replication (the replicate cut-over): a distinct server id per host; row events, so a replica holds
        # exactly the source's rows (statement events re-evaluate NOW(6), UUID() and the like on the replica);
        # every applied event re-logged, so a promoted replica's binlog continues the chain the old source needs
        # to become its replica; a GTID out of order stops replication instead of diverging silently.
        f"--server-id={host.server_id}",
        "--binlog-format=ROW",
        "--log-slave-updates",
        "--gtid-strict-mode=ON",
        "--relay-log=relay-bin",
        # A replica whose source went silent (a dropped tunnel) reconnects after this many seconds, not 60.
        "--slave-net-timeout=10",
        "--skip-name-resolve",
        "--innodb-log-file-size=16M",
        "--innodb-buffer-pool-size=64M",
        "--max-connections=200",
    ]


def installed_marker(host: HostState) -> Path:
    return host.datadir.parent / ".installed"


def install_datadir(host: HostState) -> bool:
    """Create the host's system tables once; a datadir left half-made by an interrupted install is redone.

    Returns True when it installed (a fresh datadir), False when one was already there.
    """
    marker = installed_marker(host)
    if marker.exists():
        return False
    if host.datadir.exists():
        shutil.rmtree(host.datadir)
    host.datadir.mkdir(parents=True)
    host.db_tmp_dir.mkdir(parents=True, exist_ok=True)
    log = host.log_dir / "install-db.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        rc = subprocess.run(
            [
                tool(INSTALL_DB),
                "--no-defaults",
                f"--datadir={host.datadir}",
                f"--tmpdir={host.db_tmp_dir}",
                "--user=root",
                "--skip-test-db",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        ).returncode
    if rc != 0:
        raise LabDbError(f"mariadb-install-db failed for {host.name} (exit {rc}); see {log}")
    marker.write_text("installed by lab up\n")
    return True


def _running_check_sh(host: HostState, datadir: Path | None = None) -> str:
    """A bash function `running` that prints mariadbd's pid when the process in the pid file is ours."""
    marker = "--datadir=" + str(datadir or host.datadir)
    return f"""running() {{
  local pid
  pid=$(cat {q(host.db_pid_file)} 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- {q(marker)} || return 1
  echo "$pid"
}}
answers() {{ {q(tool(ADMIN))} --no-defaults --socket={q(host.db_socket)} -uroot --connect-timeout=2 ping \\
  >/dev/null 2>&1; }}
"""


def db_start_script(host: HostState, datadir: Path | None = None) -> str:
    argv = " ".join(q(a) for a in mariadbd_argv(host, datadir))
    err_log = host.log_dir / "mysqld.err"
    return f"""#!/bin/bash
# Starts {host.name}'s mariadbd unless it runs, and returns once it answers on its socket (crash recovery of a
# copied datadir may take a while, hence the long wait).
set -uo pipefail
{_running_check_sh(host, datadir)}
mkdir -p {q(host.run_dir)} {q(host.log_dir)} {q(host.db_tmp_dir)}
if pid=$(running); then
  :
else
  # Not running: a leftover socket or pid file would only confuse the new server.
  rm -f {q(host.db_socket)} {q(host.db_pid_file)}
  setsid nohup {argv} >>{q(host.log_dir / "mysqld.out")} 2>&1 </dev/null &
  pid=$!
fi
for _ in $(seq 1 1800); do
  if answers; then exit 0; fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "db-start: mariadbd of {host.name} exited during start-up; last lines of {err_log}:" >&2
    tail -n 15 {q(err_log)} >&2
    exit 1
  fi
  sleep 0.1
done
echo "db-start: mariadbd of {host.name} did not answer within 180 s; see {err_log}" >&2
exit 1
"""


def db_stop_script(host: HostState, datadir: Path | None = None) -> str:
    return f"""#!/bin/bash
# Stops {host.name}'s mariadbd cleanly (InnoDB flushes everything and closes its logs) and returns once the
# process is gone. Never SIGKILL: a datadir is only safe to copy after a clean shutdown.
set -uo pipefail
{_running_check_sh(host, datadir)}
pid=$(running) || exit 0
# SIGTERM is mariadbd's normal shutdown, the same as `mariadb-admin shutdown`, whose wait polls once a second;
# polling here every 20 ms returns as soon as the server is gone (this runs inside the migration's downtime).
kill -TERM "$pid" 2>/dev/null || true
for _ in $(seq 1 30000); do
  # Gone, or a zombie: its shutdown is complete; only its parent's reaping (which can lag here) is left.
  state=$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null) || exit 0
  [ -z "$state" ] || [ "$state" = Z ] && exit 0
  sleep 0.02
done
echo "db-stop: mariadbd of {host.name} (pid $pid) still running after 600 s" >&2
exit 1
"""


def q(value: object) -> str:
    return shlex.quote(str(value))


def run_sql(host: HostState, sql: str, *, database: str | None = None, timeout: float = 3600.0) -> str:
    """Run SQL as root over the host's socket (unix_socket auth). SQL goes on stdin, so secrets in it never
    appear on a command line. Returns the tab-separated output."""
    argv = [tool(CLIENT), "--no-defaults", f"--socket={host.db_socket}", "-uroot", "--batch", "--skip-column-names"]
    if database:
        argv.append(database)
    proc = subprocess.run(argv, input=sql, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        # The client's error names the failing statement's position, not its text: no secret can leak from here.
        raise LabDbError(f"SQL on {host.name} failed: {proc.stderr.strip()}")
    return proc.stdout


def sql_str(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def provision_users(state: LabState, secrets: dict[str, str]) -> None:
    """The source's database and users; passwords are (re)set from lab.env, so a repair brings them back in line."""
    app_pw = sql_str(secrets[state.app_password_env])
    migrate_pw = sql_str(secrets[state.db_password_env])
    repl_pw = sql_str(secrets[state.repl_password_env])
    statements = [f"CREATE DATABASE IF NOT EXISTS `{state.db_name}`;"]
    for host in ("%", "localhost"):
        app = f"'{state.app_user}'@'{host}'"
        migrate = f"'{state.migrate_user}'@'{host}'"
        repl = f"'{state.repl_user}'@'{host}'"
        statements += [
            f"CREATE USER IF NOT EXISTS {app} IDENTIFIED BY {app_pw};",
            f"ALTER USER {app} IDENTIFIED BY {app_pw};",
            f"GRANT ALL ON `{state.db_name}`.* TO {app};",
            f"CREATE USER IF NOT EXISTS {migrate} IDENTIFIED BY {migrate_pw};",
            f"ALTER USER {migrate} IDENTIFIED BY {migrate_pw};",
            # RELOAD for FLUSH TABLES WITH READ LOCK, SELECT for the checks, SHUTDOWN for the cut-over.
            f"GRANT ALL PRIVILEGES ON *.* TO {migrate};",
            # The replica's account: it reads the binlog and nothing else.
            f"CREATE USER IF NOT EXISTS {repl} IDENTIFIED BY {repl_pw};",
            f"ALTER USER {repl} IDENTIFIED BY {repl_pw};",
            f"GRANT REPLICATION SLAVE ON *.* TO {repl};",
        ]
    statements.append("FLUSH PRIVILEGES;")
    run_sql(state.source, "\n".join(statements))
    run_sql(state.source, SCHEMA_SQL, database=state.db_name)


def seed_rows_for(db_size_mb: int) -> int:
    return max(100, db_size_mb * 1024 * 1024 // SEED_ROW_BYTES)


def fill_reviews(state: LabState, db_size_mb: int) -> int:
    """Fill `reviews` with seed rows up to about db_size_mb; returns how many rows it added.

    Bulk `INSERT ... SELECT` from MariaDB's SEQUENCE engine, in batches (one transaction each, so a crash leaves a
    contiguous prefix and a re-run continues where it stopped).
    """
    host = state.source
    wanted = seed_rows_for(db_size_mb)
    have = int(
        run_sql(
            host, f"SELECT COUNT(*) FROM reviews WHERE id LIKE '{SEED_ID_PREFIX}%';", database=state.db_name
        ).strip()
    )
    added = 0
    start = have + 1
    while start <= wanted:
        end = min(wanted, start + SEED_BATCH_ROWS - 1)
        run_sql(
            host,
            f"""INSERT IGNORE INTO reviews (id, author, course, rating, body, created_at)
SELECT CONCAT('{SEED_ID_PREFIX}', LPAD(seq, 10, '0')),
       CONCAT('student-', seq MOD 997),
       ELT(1 + seq MOD 6, 'Algorithms', 'Databases', 'Networks', 'Compilers', 'Statistics', 'Ethics'),
       1 + seq MOD 5,
       CONCAT(SHA2(seq, 256), ' ', REPEAT('Clear lectures, fair exams, weekly labs worth the effort. ', 16)),
       NOW(6) - INTERVAL seq SECOND
FROM seq_{start}_to_{end};
""",
            database=state.db_name,
        )
        added += end - start + 1
        start = end + 1
    return added


def data_size_bytes(state: LabState) -> int:
    out = run_sql(
        state.source,
        "SELECT COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables "
        f"WHERE table_schema = '{state.db_name}';",
    )
    return int(out.strip() or 0)
