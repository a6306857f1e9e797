"""The window's rsync route: an rsync daemon on the target, started before the window, reached from the source through
its shared SSH connection to the target.

Inside the window the uploads' final pass and its check each ran `rsync -e ssh`. Every such run opens an SSH session
on the target, where sshd starts the user's login shell (which reads its startup files) to exec `rsync --server`;
at its end rsync polls its ssh child every 20 ms until it is gone. Measured on the lab: 60 ms a run on a quiet host
whose account has no startup files, 140 ms when ~/.bashrc runs a version manager's `init`. Through a daemon started
before the window, a run is a fork on the target and a socket: 10 ms.

- The daemon listens on the target's loopback only (a free port), one module per file tree, and admits one user
  whose password is made for this run: it never appears in a command line, a log or the journal, and lives in
  0600 files on both hosts that are deleted at the end.
- It runs under an SSH session of ours and ends with it: its wrapper reads the session's stdin and, at the end of
  file (our stop, or our connection lost, a kill -9 of the orchestrator included), stops the daemon and deletes its
  directory.
- The source reaches it through the shared SSH connection to the target that rsync's `-e` already uses: a local
  forward on the source's loopback. Between the hosts, the traffic is that SSH connection's.
- TCP_NODELAY on both ends: rsync's small protocol messages would otherwise wait for delayed ACKs, 40 ms each.

Where the route cannot be made (a tree path the daemon's configuration cannot express, no free port, rsync refusing
to run as a daemon, ...) the window's passes run over `-e ssh` as before, and the log says why.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import shlex
from dataclasses import dataclass, field

from orchestrator.plan.model import FileTree, Plan
from orchestrator.transports import rsync
from orchestrator.transports.ssh import SshHost, Tethered, TransportError

USER = "migrate"
START_TIMEOUT = 30.0
PORT_TRIES = 8
# A value of rsyncd.conf is the rest of its line, trimmed, with %VAR% expanded: a path outside this set is not
# written there (the window's passes then run over ssh).
_CONF_SAFE_PATH = re.compile(r"/[^\x00-\x1f%#;\\]*[^\x00-\x20%#;\\/]|/")


class RouteUnavailable(Exception):
    """The daemon route cannot be made here; the message says why."""


def module_name(index: int) -> str:
    return f"tree{index}"


def config_text(trees: list[FileTree]) -> tuple[str, str]:
    """The daemon's configuration: its global lines and its modules (the target's shell adds, between the two, the
    lines only it knows: uid, gid and the files in its private directory)."""
    globals_ = [
        "use chroot = no",
        # Without chroot rsyncd rewrites every symlink it receives unless told not to: the trees' links must land as
        # they are.
        "munge symlinks = no",
        "numeric ids = yes",
        "reverse lookup = no",
        "hosts allow = 127.0.0.1",
        "socket options = TCP_NODELAY",
        "transfer logging = no",
        "read only = no",
        "list = no",
        f"auth users = {USER}",
    ]
    modules: list[str] = []
    for index, tree in enumerate(trees):
        if not _CONF_SAFE_PATH.fullmatch(tree.target):
            raise RouteUnavailable(f"tree {tree.name}: its target path cannot be written in rsyncd.conf")
        modules += [f"[{module_name(index)}]", f"path = {tree.target}"]
    return "\n".join(globals_) + "\n", "\n".join(modules) + "\n"


def target_script(globals_: str, modules: str, private_dir: str, owner: str = "run") -> str:
    """Run on the target in a session of ours: reads the password from its first stdin line, starts the daemon on a
    free loopback port, prints `port=N pid=P dir=D`, then waits for the end of its stdin and cleans up. Its directory
    is named after `owner` (orchestrator/services/owned.py: the plan and the run), so a later run finds it should it
    stay."""
    port_check = (
        # LISTEN (0A) on 127.0.0.1 (0100007F) and our port, in /proc/net/tcp: no `ss` needed. Another's listener on
        # that port cannot pass for ours: the route is proven with our password before it is used.
        'hex=$(printf "0100007F:%04X" "$port"); n=0; '
        'while [ $n -lt 250 ]; do kill -0 "$pid" 2>/dev/null || break; '
        'if grep -q " $hex 00000000:0000 0A " /proc/net/tcp; then '
        'echo "port=$port pid=$pid dir=$d"; ready=1; break; fi; '
        "sleep 0.02; n=$((n + 1)); done"
    )
    return (
        "set -u; umask 077; "
        f"mkdir -p -m 0700 {shlex.quote(private_dir)}; "
        f'd=$(mktemp -d {shlex.quote(private_dir)}/"migrate-rsyncd.{owner}.XXXXXX") || exit 3; pid=; '
        "trap 'exit 0' HUP INT TERM PIPE; "
        'trap \'[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid"; rm -rf "$d"\' EXIT; '
        "IFS= read -r secret || exit 3; "
        f'printf "%s:%s\\n" {USER} "$secret" > "$d/secrets"; unset secret; '
        f"{{ printf %s {shlex.quote(globals_)}; "
        'printf "uid = %s\\ngid = %s\\nsecrets file = %s/secrets\\npid file = %s/pid\\n" '
        '"$(id -u)" "$(id -g)" "$d" "$d"; '
        f'printf %s {shlex.quote(modules)}; }} > "$d/rsyncd.conf"; '
        "ready=; try=0; "
        f'while [ -z "$ready" ] && [ $try -lt {PORT_TRIES} ]; do try=$((try + 1)); '
        "port=$((20000 + $(od -An -N2 -tu2 /dev/urandom | tr -d ' ') % 40000)); "
        'rsync --daemon --no-detach --config="$d/rsyncd.conf" --address=127.0.0.1 --port="$port" '
        '--log-file="$d/log" </dev/null >/dev/null 2>&1 & pid=$!; '
        f"{port_check}; "
        '[ -n "$ready" ] || { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=; }; done; '
        '[ -n "$ready" ] || { echo "the rsync daemon did not start on a free port:" >&2; '
        'tail -n 3 "$d/log" >&2 2>/dev/null; exit 4; }; '
        "cat >/dev/null"
    )


def ready_fields(line: str) -> dict[str, str]:
    """`port=N pid=P dir=D` (what the target's script prints once the daemon listens) as a dict."""
    return dict(part.partition("=")[::2] for part in line.split())


@dataclass
class DaemonRoute:
    """A running route: where the source's rsync finds each tree's module, and how it authenticates."""

    local_port: int
    remote_port: int
    password_file: str
    modules: dict[str, str]  # tree name → module
    daemon: Tethered | None = field(default=None, repr=False)
    client_dir: str = ""

    def url(self, tree: FileTree) -> str:
        return f"rsync://{USER}@127.0.0.1:{self.local_port}/{self.modules[tree.name]}/"

    def options(self) -> list[str]:
        """What the source's rsync adds to reach the daemon (instead of `-e ssh`)."""
        return [f"--password-file={self.password_file}", "--sockopts=TCP_NODELAY"]


def _forward_command(plan: Plan, local_port: int, remote_port: int, *, cancel: bool = False) -> str:
    login = f"{plan.target.user}@{plan.target.address}"
    spec = f"127.0.0.1:{local_port}:127.0.0.1:{remote_port}"
    return f"{rsync.target_ssh_command(plan)} -O {'cancel' if cancel else 'forward'} -L {spec} {shlex.quote(login)}"


def open_route(plan: Plan, source: SshHost, target: SshHost, owner: str = "run") -> DaemonRoute:
    """Start the daemon on the target, forward a source port to it, and prove the route end to end (one module
    answers our password). Raises RouteUnavailable (and leaves nothing running) when it cannot. `owner` names the
    directories on both hosts (orchestrator/services/owned.py): a run killed before it closed the route leaves them
    where the next run, or the rollback, finds and ends them."""
    trees = list(plan.files)
    if not trees:
        raise RouteUnavailable("no file trees")
    globals_, modules_conf = config_text(trees)
    secret = secrets.token_urlsafe(24)
    try:
        script = target_script(globals_, modules_conf, plan.target.private_dir, owner)
        daemon = target.start_tethered(script, input=secret + "\n", ready="port=", timeout=START_TIMEOUT)
    except TransportError as exc:
        raise RouteUnavailable(f"starting the rsync daemon on the target: {exc}") from None
    route: DaemonRoute | None = None
    try:
        said = ready_fields(daemon.ready_line)
        remote_port = int(said["port"])
        client = source.run(
            f"umask 077; mkdir -p -m 0700 {shlex.quote(plan.source.private_dir)}; "
            f'd=$(mktemp -d {shlex.quote(plan.source.private_dir)}/"migrate-rsync.{owner}.XXXXXX") && '
            'cat > "$d/password" && '
            'echo "$d"',
            input=secret + "\n", timeout=START_TIMEOUT,
        )  # fmt: skip
        client_dir = client.stdout.strip()
        modules = {tree.name: module_name(index) for index, tree in enumerate(trees)}
        route = DaemonRoute(0, remote_port, f"{client_dir}/password", modules, daemon, client_dir)
        source.run(rsync.open_master_command(plan), timeout=START_TIMEOUT)
        route.local_port = _forward_free_port(plan, source, remote_port)
        _prove(route, source, trees[0])
        return route
    except (TransportError, ValueError) as exc:
        close_route(plan, source, route) if route is not None else daemon.stop()
        raise RouteUnavailable(f"the route to the rsync daemon: {exc}") from None


def _forward_free_port(plan: Plan, source: SshHost, remote_port: int) -> int:
    """A free port on the source's loopback forwarded to the daemon (ssh -O forward takes no port 0: tried at
    random, a taken one fails)."""
    last = ""
    for _ in range(PORT_TRIES):
        port = 20000 + secrets.randbelow(40000)
        result = source.run(_forward_command(plan, port, remote_port), timeout=START_TIMEOUT, check=False)
        if result.exit_status == 0:
            return port
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
    raise RouteUnavailable(f"no free port on the source's loopback for the forward ({last})")


def _prove(route: DaemonRoute, source: SshHost, tree: FileTree) -> None:
    """One listing of a module's top directory itself (not its content): the daemon is ours and takes our password."""
    argv = ["rsync", "--list-only", "--dirs", *route.options(), route.url(tree) + "."]
    result = source.run(shlex.join(argv) + " >/dev/null", timeout=START_TIMEOUT, check=False)
    if result.exit_status != 0:
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise RouteUnavailable(f"the daemon did not answer through the forward: {last}")


def close_route(plan: Plan, source: SshHost, route: DaemonRoute) -> None:
    """Best effort, each part even if another fails: the forward cancelled, the password file deleted, the daemon
    stopped (its wrapper deletes its directory)."""
    if route.daemon is not None:
        route.daemon.stop()
        route.daemon = None
    commands = []
    if route.local_port:
        commands.append(_forward_command(plan, route.local_port, route.remote_port, cancel=True) + " 2>/dev/null")
    if route.client_dir:
        commands.append(f"rm -rf {shlex.quote(route.client_dir)}")
    if commands:
        with contextlib.suppress(TransportError):
            source.run("; ".join(commands) + "; true", timeout=30, check=False)
