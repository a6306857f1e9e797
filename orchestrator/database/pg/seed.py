"""The seed of a PostgreSQL standby, as host commands and their parsers (the seam's `SeedKit`).

`pg_basebackup -X stream -C -S <slot> -R` runs on the target, into a staging directory beside its data directory,
and reaches the source's server through an `ssh -R` forward that lives exactly as long as the command: the stream
command runs on the source, over its host-key-verified hop to the target (the one rsync uses). The replication
account's password is the first line of the command's stdin: the source's script keeps it in a shell variable and
hands it on through ssh's stdin, and the target's script writes it into a 0600 password file beside the data
directory (`<datadir>.pgpass`, the owner's), which the standby's `primary_conninfo` names: no command line, no
config file and no log holds it. The slot (created by pg_basebackup, dropped first when a previous seed left one)
keeps on the source every WAL segment the standby still needs.

The copy is consistent once pg_basebackup returns (its WAL streamed beside it): nothing to prepare. The install swaps
it in (the previous data directory kept as `<datadir>.before-seed`, or none when the target had no cluster); undo
swaps back. A base backup locks nothing on the source: no commit waits for it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from orchestrator.database.pg import primitives as pg
from orchestrator.database.protocol import ReplicationError, Session

SEED_SUFFIX = ".seed"
BEFORE_SEED_SUFFIX = ".before-seed"
# The newest installed major's programs (Debian keeps them under /usr/lib/postgresql/N/bin, off PATH).
BIN_DIR = "$(ls -1d /usr/lib/postgresql/[0-9]*/bin 2>/dev/null | sort -V | tail -n 1)"
# Tries of a random port for the command's own forward on the target's loopback (ssh says 255 when it is taken).
PORT_TRIES = 5


@dataclass(frozen=True)
class PgSeedSpec:
    source_datadir: str
    target_datadir: str
    ssh_to_target: tuple[str, ...]
    source_host: str  # the source's server as its own host reaches it (the forward's far end)
    source_port: int
    repl_user: str
    slot: str
    password_env: str | None = "MIGRATE_REPL_PASSWORD"  # the password comes on stdin (the step sends it)
    os_user: str = "postgres"
    max_rate: str = ""

    @property
    def staging_dir(self) -> str:
        return self.target_datadir.rstrip("/") + SEED_SUFFIX

    @property
    def previous_dir(self) -> str:
        return self.target_datadir.rstrip("/") + BEFORE_SEED_SUFFIX

    @property
    def passfile(self) -> str:
        return pg.Cluster(self.target_datadir, 0).passfile


@dataclass(frozen=True)
class PgBackupPosition:
    gtid: pg.Lsn  # where the copy starts (the name the seam's step reads: the seed's position)
    file: str
    position: int = 0


@dataclass(frozen=True)
class NoLocks:
    """A base backup blocks no commit and no DDL on the source."""

    commits_blocked: float = 0.0
    ddl_blocked: float = 0.0
    commits_blocked_from: str | None = None


def _bash(script: str) -> str:
    return "bash -c " + shlex.quote(script)


def _as_owner(spec: PgSeedSpec, program: str, *args: str) -> str:
    return f'runuser -u {shlex.quote(spec.os_user)} -- "$B/{program}" ' + " ".join(args)


class PgSeed:
    secret = "replication"  # pg_basebackup connects as the replication account

    def seed_size_command(self, spec: PgSeedSpec) -> str:
        return _bash(f"du -sb {shlex.quote(spec.source_datadir)} | cut -f1")

    def parse_size(self, stdout: str) -> int:
        return int(stdout.strip().split()[0])

    def _remote(self, spec: PgSeedSpec) -> str:
        """The target's part ($1: the forward's port on its loopback): the password file, the staging directory,
        pg_basebackup through the forward."""
        staging, passfile = shlex.quote(spec.staging_dir), shlex.quote(spec.passfile)
        owner = shlex.quote(spec.os_user)
        user = spec.repl_user.replace("\\", "\\\\").replace(":", "\\:")
        conninfo = (f"host='127.0.0.1' port='$1' user='{spec.repl_user}' passfile='{spec.passfile}' "
                    "application_name='migrate_standby'")  # fmt: skip
        rate = f"-r {shlex.quote(spec.max_rate)}" if spec.max_rate else ""
        return f"""set -euo pipefail
IFS= read -r PW
B={BIN_DIR}
[ -n "$B" ] || {{ echo 'seed: no PostgreSQL programs under /usr/lib/postgresql on the target' >&2; exit 3; }}
umask 077
e=$(printf '%s' "$PW" | sed -e 's/\\\\/\\\\\\\\/g' -e 's/:/\\\\:/g')
printf '127.0.0.1:*:*:%s:%s\\n' {shlex.quote(user)} "$e" > {passfile}.tmp
chown {owner} {passfile}.tmp && mv {passfile}.tmp {passfile}
rm -rf {staging}; mkdir -p {staging}; chown {owner} {staging}; chmod 700 {staging}
CI="{conninfo}"
{_as_owner(spec, "pg_receivewal", '-d "$CI"', "--drop-slot", "-S", shlex.quote(spec.slot))} >/dev/null 2>&1 || true
{
            _as_owner(
                spec,
                "pg_basebackup",
                '-d "$CI"',
                "-D",
                staging,
                "-X stream -C -S",
                shlex.quote(spec.slot),
                "-R -c fast -P --no-password",
                rate,
            )
        } 2>&1 | tr '\\r' '\\n'
"""

    def seed_stream_command(self, spec: PgSeedSpec, *, log_path: str | None = None) -> str:
        """Run on the source: the password read from stdin, then the target's part over ssh with a forward of a
        random free port on the target's loopback to the source's server (the port is the remote script's $1);
        another port when ssh says it is taken (exit 255)."""
        ssh = list(spec.ssh_to_target)
        forward = f"127.0.0.1:$port:{spec.source_host}:{spec.source_port}"
        head = shlex.join([ssh[0], "-o", "ExitOnForwardFailure=yes"])
        rest = shlex.join(ssh[1:])
        remote = shlex.quote("bash -c " + shlex.quote(self._remote(spec)) + " seed")
        return _bash(f"""set -uo pipefail
IFS= read -r PW || true
for try in $(seq {PORT_TRIES}); do
  port=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
  printf '%s\\n' "$PW" | {head} -R "{forward}" {rest} {remote} "$port"
  rc=$?
  [ "$rc" -ne 255 ] && exit "$rc"
done
echo "seed: ssh to the target failed {PORT_TRIES} times" >&2
exit 255""")

    def parse_seed_progress(self, line: str) -> int | None:
        match = re.search(r"(\d+)/\d+ kB", line)
        return int(match.group(1)) * 1024 if match else None

    def seed_locking_command(self, log_path: str) -> str:
        return "false"  # a base backup never locks the source: a throttle may always pause it

    def prepare_command(self, spec: PgSeedSpec) -> str:
        return "true"  # consistent as it comes: its WAL was streamed beside it

    def install_command(self, spec: PgSeedSpec) -> str:
        """The staged copy becomes the data directory, the previous one (if any) kept beside it; re-run after a
        crash, it finishes what was begun."""
        d, s, p = (shlex.quote(x) for x in (spec.target_datadir.rstrip("/"), spec.staging_dir, spec.previous_dir))
        return _bash(
            f"set -e; if [ -d {s} ]; then if [ -e {d} ]; then rm -rf {p}; mv {d} {p}; fi; mv {s} {d}; fi; "
            f"[ -e {d}/PG_VERSION ] || {{ echo 'seed: no copy installed in {spec.target_datadir}' >&2; exit 1; }}"
        )

    def finish_install_command(self, spec: PgSeedSpec) -> str:
        return self.install_command(spec)

    def restore_previous_command(self, spec: PgSeedSpec) -> str:
        """The previous data directory back; when the copy was never swapped in, nothing is touched."""
        d, s, p = (shlex.quote(x) for x in (spec.target_datadir.rstrip("/"), spec.staging_dir, spec.previous_dir))
        return _bash(
            f"set -e; if [ -d {s} ]; then if [ ! -e {d} ] && [ -e {p} ]; then mv {p} {d}; fi; "
            f"else rm -rf {d}; if [ -e {p} ]; then mv {p} {d}; fi; fi"
        )

    def discard_staging_command(self, spec: PgSeedSpec) -> str:
        return _bash(f"rm -rf {shlex.quote(spec.staging_dir)}")

    def backup_position_command(self, backup_dir: str) -> str:
        d = shlex.quote(backup_dir.rstrip("/"))
        return _bash(f"cat {d}/backup_label 2>/dev/null || cat {d}/backup_label.old")

    def parse_backup_position(self, text: str) -> PgBackupPosition:
        match = re.search(r"START WAL LOCATION:\s*([0-9A-Fa-f]+/[0-9A-Fa-f]+)(?:\s*\(file\s+(\w+)\))?", text)
        if match is None:
            raise ReplicationError("the copy has no backup_label: pg_basebackup did not finish")
        return PgBackupPosition(pg.Lsn.parse(match.group(1)), match.group(2) or "")

    def parse_backup_stages(self, stdout: str) -> list[Any]:
        return []

    def parse_backup_locks(self, stdout: str) -> NoLocks:
        return NoLocks()

    def redo_lsn(self, conn: Session) -> int:
        return pg.current_wal_lsn(conn).value  # type: ignore[arg-type]  # an engine session is a psycopg one

    def redo_capacity(self, conn: Session) -> int:
        """max_wal_size: WAL the source writes before a checkpoint recycles it (the slot keeps it anyway)."""
        with conn.cursor() as cur:
            cur.execute("SELECT pg_size_bytes(current_setting('max_wal_size'))")
            row = cur.fetchone()
        return int(row[0]) if row else 1 << 30
