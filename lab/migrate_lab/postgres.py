"""Each lab host's PostgreSQL (`lab up --engine postgresql`): one cluster per host, started without systemd.

The server refuses to run as root, so a lab cluster runs as Debian's `postgres` account: its data directory (mode
0700) and its log directory are that account's; every command goes through `runuser -u postgres`. The lab
directory must be searchable by that account (a directory under a private 0700 parent is refused in one line).

Host-specific settings (address, port, socket directory) are given on the server's command line, never in
postgresql.conf: a standby's data directory is a copy of the source's, config files included, and must not come
up on the source's address. What both hosts share is in the config (replication-ready: wal_level=replica, WAL
senders and slots, hot standby) and in pg_hba.conf: the lab's addresses with passwords, and replication for the
`repl` account only from 127.0.0.1, where the SSH tunnel's end connects from.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from migrate_lab.state import HostState, LabState

if TYPE_CHECKING:
    from orchestrator.database.pg.primitives import Cluster

ENGINE = "postgresql"
OS_USER = "postgres"
SUPERUSER = "postgres"
PACKAGES = ("postgresql", "postgresql-client")
PG_ROOT = Path("/usr/lib/postgresql")

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS reviews (
    id VARCHAR(64) PRIMARY KEY,
    author VARCHAR(100),
    course VARCHAR(100),
    rating INT,
    body TEXT,
    created_at TIMESTAMPTZ DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS uploads (
    name VARCHAR(255) PRIMARY KEY,
    size BIGINT,
    sha256 CHAR(64),
    created_at TIMESTAMPTZ DEFAULT clock_timestamp()
);
"""

CONF = """
# --- the lab's settings (lab up --engine postgresql); address, port and socket are on the command line ---
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
hot_standby = on
wal_log_hints = on
shared_buffers = 32MB
max_connections = 100
# A standby whose primary went silent (a dropped tunnel) notices within seconds.
wal_receiver_timeout = 10s
wal_sender_timeout = 10s
log_line_prefix = '%m [%p] %q%u@%d '
"""

HBA = """# The lab's pg_hba.conf (lab up --engine postgresql)
local   all          postgres                 peer
local   all          all                      scram-sha-256
host    all          all        127.0.0.0/8   scram-sha-256
# Replication only through the SSH tunnel: its end connects from this host's 127.0.0.1.
host    replication  {repl}     127.0.0.1/32  scram-sha-256
"""


class LabPgError(RuntimeError):
    """The lab's PostgreSQL could not be made, started or reached; the message says where to look."""


def bin_dir() -> Path:
    """The newest installed major's programs (Debian keeps them off PATH, under /usr/lib/postgresql/N/bin)."""
    majors = (
        sorted((int(p.name) for p in PG_ROOT.glob("*") if p.name.isdigit()), reverse=True) if PG_ROOT.is_dir() else []
    )
    for major in majors:
        if (PG_ROOT / str(major) / "bin" / "initdb").exists():
            return PG_ROOT / str(major) / "bin"
    raise LabPgError(f"no PostgreSQL server under {PG_ROOT}: apt-get install {' '.join(PACKAGES)}")


def missing_packages() -> list[str]:
    try:
        bin_dir()
    except LabPgError:
        return list(PACKAGES)
    return []


def pg_dir(host: HostState) -> Path:
    return host.path / "pg"


def data_dir(host: HostState) -> Path:
    return pg_dir(host) / "data"


def socket_dir(host: HostState) -> Path:
    return pg_dir(host) / "run"


def log_file(host: HostState) -> Path:
    return pg_dir(host) / "log" / "postgresql.log"


def cluster(host: HostState) -> Cluster:
    """The host's cluster as the transport's commands see it."""
    from orchestrator.database.pg.primitives import Cluster  # psycopg is loaded only by a PostgreSQL lab's commands

    options = (
        "-c", f"listen_addresses={host.address}",
        "-c", f"unix_socket_directories={socket_dir(host)}",
    )  # fmt: skip
    return Cluster(
        data_dir=str(data_dir(host)),
        port=host.db_port,
        bin_dir=str(bin_dir()),
        os_user=OS_USER,
        log_file=str(log_file(host)),
        options=options,
    )


def _owner_ids() -> tuple[int, int]:
    import pwd

    try:
        entry = pwd.getpwnam(OS_USER)
    except KeyError:
        raise LabPgError(f"no {OS_USER} account on this machine (Debian's postgresql package makes it)") from None
    return entry.pw_uid, entry.pw_gid


def check_reachable(path: Path) -> None:
    """Every parent of `path` must be searchable by the server's account, or it cannot open its own files."""
    uid = _owner_ids()[0]
    for parent in [*reversed(path.parents), path]:
        if not parent.exists():
            break
        info = parent.stat()
        if not info.st_mode & 0o001 and info.st_uid != uid:
            raise LabPgError(
                f"{parent} is not searchable by others: the {OS_USER} account cannot reach the lab's clusters"
                " (choose a lab directory under a world-searchable path, e.g. /var/tmp)"
            )


def run(argv: list[str], *, input: str | None = None, timeout: float = 600.0, what: str = "") -> str:
    proc = subprocess.run(
        ["runuser", "-u", OS_USER, "--", *argv],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()] or ["no message"]
        raise LabPgError(f"{what or argv[0]} failed (exit {proc.returncode}): {lines[-1].strip()}")
    return proc.stdout


def prepare_dirs(host: HostState) -> None:
    """The cluster's directories, the server account's; the data directory itself only when missing."""
    uid, gid = _owner_ids()
    for sub in (pg_dir(host), socket_dir(host), log_file(host).parent):
        sub.mkdir(parents=True, exist_ok=True)
        os.chown(sub, uid, gid)
    pg_dir(host).chmod(0o755)
    check_reachable(pg_dir(host))


def initialized(host: HostState) -> bool:
    return (data_dir(host) / "PG_VERSION").exists()


def init_cluster(state: LabState, host: HostState) -> bool:
    """initdb once (data checksums on, so pg_rewind stays possible), the lab's config and pg_hba.conf.
    Returns True when it made the cluster."""
    prepare_dirs(host)
    if initialized(host):
        return False
    data = data_dir(host)
    if data.exists():
        shutil.rmtree(data)  # half made by an interrupted initdb
    # -k: data checksums (pg_rewind possible); -N: no fsync of initdb's files (a lab cluster is disposable, and
    # syncing them took most of `lab up` on a busy machine).
    run(
        [str(bin_dir() / "initdb"), "-D", str(data), "-U", SUPERUSER, "-k", "-N", "-E", "UTF8", "--locale=C.UTF-8",
         "--auth-local=peer", "--auth-host=scram-sha-256"],
        what=f"initdb of {host.name}",
    )  # fmt: skip
    with open(data / "postgresql.conf", "a") as conf:
        conf.write(CONF)
    (data / "pg_hba.conf").write_text(HBA.format(repl=state.repl_user))
    return True


def pid(host: HostState) -> int | None:
    """The postmaster's pid when it runs on this host's data directory."""
    from migrate_lab import procs

    pid_file = data_dir(host) / "postmaster.pid"
    try:
        first = pid_file.read_text().splitlines()[0].strip()
    except (OSError, IndexError):
        return None
    if not first.isdigit():
        return None
    found = int(first)
    if not procs.is_alive(found) or f"-D {data_dir(host)}" not in procs.cmdline(found):
        return None
    return found


def start(host: HostState) -> int:
    from orchestrator.database.pg.primitives import pg_ctl_command

    if pid(host) is None:
        proc = subprocess.run(["bash", "-c", pg_ctl_command(cluster(host), "start")], capture_output=True, text=True,
                              timeout=180, check=False)  # fmt: skip
        if proc.returncode != 0:
            raise LabPgError(f"postgres of {host.name} did not start (exit {proc.returncode}); see {log_file(host)}")
    found = pid(host)
    if found is None:
        raise LabPgError(f"postgres of {host.name} is not running after its start; see {log_file(host)}")
    return found


def stop(host: HostState) -> int | None:
    """A clean fast shutdown (a shutdown checkpoint); returns the pid it stopped."""
    from orchestrator.database.pg.primitives import pg_ctl_command

    found = pid(host)
    if found is None:
        return None
    proc = subprocess.run(["bash", "-c", pg_ctl_command(cluster(host), "stop")], capture_output=True, text=True,
                          timeout=180, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise LabPgError(f"postgres of {host.name} (pid {found}) did not stop: {proc.stderr.strip()[-200:]}")
    return found


def psql(host: HostState, sql_text: str, *, database: str = "postgres", timeout: float = 3600.0) -> str:
    """SQL as the superuser over the host's socket (peer auth); SQL on stdin, so passwords in it stay off every
    command line. Returns unaligned, tuples-only output."""
    argv = [str(bin_dir() / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", str(socket_dir(host))]
    argv += ["-p", str(host.db_port), "-U", SUPERUSER, "-d", database]
    return run(argv, input=sql_text, timeout=timeout, what=f"SQL on {host.name}")


def literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def provision(state: LabState, secrets: dict[str, str]) -> None:
    """The source's roles, database and schema; passwords (re)set from lab.env, so a repair brings them in line.
    `app` owns its database and tables (as real apps do: the fence cannot rely on revoking privileges)."""
    host = state.source
    roles = {
        state.app_user: ("LOGIN", secrets[state.app_password_env]),
        state.migrate_user: ("LOGIN SUPERUSER", secrets[state.db_password_env]),
        state.repl_user: ("LOGIN REPLICATION", secrets[state.repl_password_env]),
    }
    statements = []
    for role, (attributes, password) in roles.items():
        statements.append(
            f"SELECT 'CREATE ROLE {role}' WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {literal(role)})"
            r" \gexec"
        )
        statements.append(f"ALTER ROLE {role} {attributes} PASSWORD {literal(password)};")
    statements.append(
        f"SELECT 'CREATE DATABASE {state.db_name} OWNER {state.app_user}' WHERE NOT EXISTS "
        f"(SELECT 1 FROM pg_database WHERE datname = {literal(state.db_name)})"
        r" \gexec"
    )
    psql(host, "\n".join(statements) + "\n")
    psql(host, f"SET ROLE {state.app_user};\n" + SCHEMA_SQL, database=state.db_name)


def fill_reviews(state: LabState, db_size_mb: int) -> int:
    """Seed rows up to about db_size_mb, in batches (one transaction each: a crash leaves a prefix)."""
    from migrate_lab.mariadb import SEED_BATCH_ROWS, SEED_ID_PREFIX, seed_rows_for

    host = state.source
    wanted = seed_rows_for(db_size_mb)
    have = int(psql(host, f"SELECT count(*) FROM reviews WHERE id LIKE '{SEED_ID_PREFIX}%';", database=state.db_name))
    start_at, added = have + 1, 0
    while start_at <= wanted:
        end = min(wanted, start_at + SEED_BATCH_ROWS - 1)
        psql(
            host,
            f"""SET ROLE {state.app_user};
INSERT INTO reviews (id, author, course, rating, body, created_at)
SELECT '{SEED_ID_PREFIX}' || lpad(seq::text, 10, '0'),
       'student-' || (seq % 997),
       (ARRAY['Algorithms','Databases','Networks','Compilers','Statistics','Ethics'])[1 + seq % 6],
       1 + seq % 5,
       encode(sha256(seq::text::bytea), 'hex') || ' ' ||
         repeat('Clear lectures, fair exams, weekly labs worth the effort. ', 16),
       now() - seq * interval '1 second'
FROM generate_series({start_at}, {end}) AS seq
ON CONFLICT (id) DO NOTHING;
""",
            database=state.db_name,
        )
        added += end - start_at + 1
        start_at = end + 1
    return added


def record_uploads(state: LabState, rows: list[tuple[str, int, str]]) -> None:
    """The seeded uploads' rows (name, size, sha256), inserted or brought in line."""
    if not rows:
        return
    values = ",\n".join(f"({literal(n)}, {size}, {literal(digest)})" for n, size, digest in rows)
    psql(
        state.source,
        f"SET ROLE {state.app_user};\nINSERT INTO uploads (name, size, sha256) VALUES {values}\n"
        "ON CONFLICT (name) DO UPDATE SET size = EXCLUDED.size, sha256 = EXCLUDED.sha256;\n",
        database=state.db_name,
    )


def remove_cluster(host: HostState) -> None:
    """The host's cluster files (its server stopped): a re-seed or `lab down --purge`."""
    shutil.rmtree(data_dir(host), ignore_errors=True)
    Path(cluster(host).passfile).unlink(missing_ok=True)


def db_start_script(host: HostState) -> str:
    from orchestrator.database.pg.primitives import pg_ctl_command

    c = cluster(host)
    return f"""#!/bin/bash
# Starts {host.name}'s PostgreSQL unless it runs (pg_ctl -w returns once it accepts connections).
set -uo pipefail
if [ ! -e {shlex.quote(c.data_dir)}/PG_VERSION ]; then
  echo "db-start: {host.name} has no PostgreSQL cluster in {c.data_dir}" >&2
  exit 1
fi
if {c.as_owner([c.program("pg_ctl"), "-D", c.data_dir, "status"])} >/dev/null 2>&1; then exit 0; fi
{pg_ctl_command(c, "start")} >/dev/null || {{
  echo "db-start: postgres of {host.name} did not start; last lines of {c.log_file}:" >&2
  tail -n 15 {shlex.quote(c.log_file)} >&2
  exit 1
}}
"""


def db_stop_script(host: HostState) -> str:
    from orchestrator.database.pg.primitives import pg_ctl_command

    c = cluster(host)
    return f"""#!/bin/bash
# Stops {host.name}'s PostgreSQL cleanly (fast mode: a shutdown checkpoint) and returns once it is gone.
set -uo pipefail
[ -e {shlex.quote(c.data_dir)}/postmaster.pid ] || exit 0
{c.as_owner([c.program("pg_ctl"), "-D", c.data_dir, "status"])} >/dev/null 2>&1 || exit 0
{pg_ctl_command(c, "stop")} >/dev/null
"""
