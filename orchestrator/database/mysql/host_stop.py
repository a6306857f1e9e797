"""read_only and the final position by a client on the source's own host, for the window's first command there.

Over the session, read_only with the final position is one round trip after that command (its answer back, then
the statement out and back). Run by the `mariadb` client on the source host right after the fence, it costs that
client's start instead: worth it when the round trip costs more (measured before the window, as the commit's
`proxy.commit_from: auto` is).

The client logs in with the plan's account from an option file in the kept shell's private directory (mode 0700,
removed when that shell ends, the run's connection lost included): the password travels on stdin once, before the
window, and appears on no command line, in no log and in no answer. A password the option file cannot carry as
written (a quote, a backslash, a newline) keeps the switch on its session.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from orchestrator.database.mysql.gtid import GtidPosition, ReplicationError
from orchestrator.database.protocol import LocalLogin, ServerAccess

OPTION_FILE = "mariadb-login.cnf"
CLIENT = "__migrate_client="
COST = "__migrate_client_cost_ns="
POSITION = "__migrate_final_position="
PREPARE_TIMEOUT = 30.0
CONNECT_TIMEOUT = 5
# What an option file's value cannot hold as written here (it would need the client's own escapes).
UNSAFE = ('"', "\\", "\n", "\r")


def option_file(login: LocalLogin) -> str | None:
    """The `[client]` group for `--defaults-file` (None: a value it cannot carry plainly)."""
    values = [login.user, login.password or "", login.socket or "", login.address]
    if any(c in v for v in values for c in UNSAFE):
        return None
    lines = ["[client]", f'user="{login.user}"', f"connect-timeout={CONNECT_TIMEOUT}"]
    if login.password:
        lines.append(f'password="{login.password}"')
    if login.socket:
        lines.append(f'socket="{login.socket}"')
    else:
        lines += [f'host="{login.address}"', f"port={int(login.port)}", "protocol=TCP"]
    return "\n".join(lines) + "\n"


def prepare_command(path: str) -> str:
    """Shell (its stdin: the option file): the file written (0600), the client found, one query through it, timed."""
    f = shlex.quote(path)
    return (
        f"umask 077 && cat > {f} && c=$(command -v mariadb || command -v mysql) && t0=$(date +%s%N) && "
        f'"$c" --defaults-file={f} -N -B -e "SELECT 1" >/dev/null && t1=$(date +%s%N) && '
        f'echo "{CLIENT}$c" && echo "{COST}$((t1 - t0))" || {{ s=$?; rm -f {f}; exit $s; }}'
    )


def parse_prepared(stdout: str) -> tuple[str, float] | None:
    """The client's path and its cost in seconds, or None when the preparation did not finish."""
    client = cost = None
    for line in stdout.splitlines():
        if line.startswith(CLIENT):
            client = line[len(CLIENT) :].strip()
        elif line.startswith(COST) and line[len(COST) :].strip().isdigit():
            cost = int(line[len(COST) :].strip()) / 1e9
    return (client, cost) if client and cost is not None else None


@dataclass(frozen=True)
class MariaDbHostStop:
    """read_only with the final position, by the client on the source's host (protocol.HostStop)."""

    client: str
    options: str
    local_cost: float

    def command(self, *, lock_wait_timeout: float) -> str:
        seconds = max(1, int(lock_wait_timeout + 0.999))
        statement = (
            f"BEGIN NOT ATOMIC SET SESSION lock_wait_timeout = {seconds}; SET GLOBAL read_only = 1; "
            f"SELECT CONCAT('{POSITION}', @@GLOBAL.gtid_binlog_pos); END//"
        )
        return (
            f"printf '%s\\n' 'DELIMITER //' {shlex.quote(statement)} | "
            f"{shlex.quote(self.client)} --defaults-file={shlex.quote(self.options)} -N -B 2>&1"
        )

    def parse(self, status: int | None, output: str) -> GtidPosition:
        lines = [line for line in output.splitlines() if line.strip()]
        found = [line for line in lines if line.startswith(POSITION)]
        if status != 0 or not found:
            said = lines[-1] if lines else f"exit status {status}"
            raise ReplicationError(f"SET GLOBAL read_only = 1 on the source's host: {said}")
        return GtidPosition.parse(found[-1][len(POSITION) :].strip())


def host_stop(server: ServerAccess, login: LocalLogin) -> MariaDbHostStop | None:
    """Before the window: the option file written in the source's kept shell's private directory and the client
    tried once (its cost measured); None when there is no such directory, the password cannot be written plainly,
    or the host has no client that logs in."""
    private = getattr(server.host, "kept_dir", None)
    options = option_file(login)
    if not private or options is None:
        return None
    path = f"{private}/{OPTION_FILE}"
    result = server.host.run(prepare_command(path), input=options, timeout=PREPARE_TIMEOUT, check=False)
    prepared = parse_prepared(result.stdout) if result.ok else None
    if prepared is None:
        return None
    client, cost = prepared
    return MariaDbHostStop(client, path, cost)
