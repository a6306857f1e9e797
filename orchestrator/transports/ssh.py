"""A synchronous facade over asyncssh: one event loop thread for the process, one connection per host.

Steps are plain synchronous code; asyncssh is asynchronous. All SshHosts share a single asyncio loop
running in a daemon thread, and every public method submits a coroutine to it and waits for the answer in
the caller's thread. Keeping callers off the loop thread matters: a blocking pymysql call through an asyncssh
tunnel made on the loop thread would wait forever for data only that loop can deliver.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import queue
import re
import shlex
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog

from orchestrator.plan.model import Host, JumpHost, Retry
from orchestrator.retry import call_with_retry
from orchestrator.secrets import redact
from orchestrator.transports.meter import RoundTrips
from orchestrator.transports.sshlib import asyncssh

T = TypeVar("T")

# OpenSSH's MaxSessions defaults to 10 per connection; stay below it.
MAX_SESSIONS_PER_CONNECTION = 8
SHELL_READY_TIMEOUT = 30.0
KEEPALIVE_INTERVAL = 15.0
KEEPALIVE_COUNT_MAX = 3
# Ending the commands cut short on a host: each gets TERM, then KILL if its group is still there this much later.
CUT_SHORT_GRACE = 5.0
CUT_SHORT_TIMEOUT = 30.0  # the session that ends them, plus CUT_SHORT_GRACE + 5 s per command
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TransportError(Exception):
    """A failure reaching or talking to a host. `transient` says whether trying again may help."""

    def __init__(self, message: str, transient: bool) -> None:
        super().__init__(redact(message))
        self.transient = transient


class CommandFailed(TransportError):
    """A remote command exited non-zero (with check=True)."""

    def __init__(self, command: str, exit_status: int | None, stderr: str) -> None:
        self.command = redact(command)
        self.exit_status = exit_status
        self.stderr = redact(stderr)
        last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
        short = self.command if len(self.command) <= 160 else self.command[:157] + "..."
        super().__init__(f"`{short}` exited with status {exit_status}" + (f": {last}" if last else ""), False)


@dataclass(frozen=True)
class CommandResult:
    exit_status: int | None
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


# --- the shared event loop ---

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def _serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=_serve, name="ssh-loop", daemon=True).start()
            ready.wait()
            _loop = loop
        return _loop


def _submit(coro: Coroutine[Any, Any, T]) -> Future[T]:
    return asyncio.run_coroutine_threadsafe(coro, _event_loop())


def _call(coro: Coroutine[Any, Any, T]) -> T:
    return _submit(coro).result()


# --- errors ---

_TRANSIENT = (OSError, asyncio.TimeoutError, asyncssh.ConnectionLost, asyncssh.ChannelOpenError, EOFError)


# How a host whose plan says `become: sudo` runs every command of the migration: as root, never asking for a password.
SUDO = ("sudo", "-n", "--")


def as_root(host: Host, command: str) -> str:
    """The command as the host runs it: unchanged, or through passwordless sudo (`become: sudo`) in a shell of its
    own, so pipes, redirections and `cd` of the command all happen as root."""
    if host.become != "sudo":
        return command
    return shlex.join([*SUDO, "sh", "-c", command])


def _connect_error(name: str, host: Host | JumpHost, known_hosts: Path, exc: BaseException) -> TransportError:
    where = f"ssh {host.user}@{host.address}:{host.ssh_port} ({name})"
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return TransportError(
            f"{where}: host key not verifiable against {known_hosts}: add the host's key there", False
        )
    if isinstance(exc, asyncssh.PermissionDenied):
        return TransportError(f"{where}: permission denied: check the user and key/agent", False)
    if isinstance(exc, asyncssh.KeyImportError):
        return TransportError(f"{where}: cannot load the private key: {exc}", False)
    if isinstance(exc, asyncio.TimeoutError):
        return TransportError(f"{where}: connection timed out after {host.connect_timeout:g} s", True)
    if isinstance(exc, ConnectionRefusedError):
        return TransportError(f"{where}: connection refused", True)
    if isinstance(exc, _TRANSIENT):
        return TransportError(f"{where}: {exc.__class__.__name__}: {exc}", True)
    if isinstance(exc, asyncssh.DisconnectError):
        return TransportError(f"{where}: disconnected: {exc.reason}", True)
    return TransportError(f"{where}: {exc.__class__.__name__}: {exc}", False)


def _env_prefix(env: dict[str, str] | None, data: str | None) -> tuple[str, str | None]:
    """Environment for a remote command, sent on stdin so values never appear on any command line.

    sshd only accepts the variables its AcceptEnv lists, so the SSH 'env' request cannot be relied on.
    Instead a small sh prologue reads NAME=value lines until an empty line, exports them, and execs the
    command with the rest of stdin untouched.
    """
    if not env:
        return "", data
    lines = []
    for name, value in env.items():
        if not _ENV_NAME.match(name) or "\n" in value or "\r" in value:
            raise TransportError(f"environment variable {name!r} cannot be passed (name or newline)", False)
        lines.append(f"{name}={value}\n")
    prologue = 'while IFS= read -r kv && [ -n "$kv" ]; do export "$kv"; done; unset kv; exec sh -c "$1"'
    return "sh -c " + shlex.quote(prologue) + " sh ", "".join(lines) + "\n" + (data or "")


def _stopped_at_deadline(command: str, timeout: float | None, record: str | None = None) -> str:
    """The command, stopped on the host itself shortly after our deadline.

    Closing the channel does not stop a remote command that is not writing (sshd's signal requests are not reliable
    either): coreutils `timeout` signals the command's whole process group on the host, and KILLs it 5 s later.

    `record` (a shell word naming a file on the host, see SshHost._record_file): before the command starts, its
    process group (the `timeout` process, the parent of the `sh` that runs it) is written there, created
    exclusively: when the file is already there (`_END_CUT_SHORT` claimed it: we gave up on the command before it
    started), the command never starts (status 125). No process more than before: `echo` is the shell's own.
    """
    if timeout is None:
        return command
    if record is not None:
        # The record's directory (the run's private one) made on first use, 0700; the shell's own test when it exists.
        made = f'r={record}; [ -d "${{r%/*}}" ] || (umask 077; mkdir -p -m 0700 "${{r%/*}}"); '
        command = f"{made}set -C; {{ echo $PPID >{record}; }} 2>/dev/null || exit 125; set +C; {command}"
    return f"timeout -k 5 {math.ceil(timeout) + 1} sh -c {shlex.quote(command)}"


def _in_session(wrapped: str, record: str | None) -> str:
    """A recorded command run in a session of its own: its record removed once it ended (a command that ended is
    not ended again)."""
    if record is None:
        return wrapped
    return "sh -c " + shlex.quote(f"{wrapped}; s=$?; rm -f {record}; exit $s")


# Run by `sh` through a new session: one line per record, in order: `never` (claimed before the command started:
# it never will), `finished` (it had ended by itself), `ended` (signalled, its group gone), `running` (still there
# after KILL: a process we may not signal). The record is kept only when a claim must stay or the group remains.
_END_CUT_SHORT = """
set -C
alive() { kill -0 "$1" 2>/dev/null || kill -0 -"$1" 2>/dev/null; }
wait_gone() { i=0; while alive "$1" && [ $i -lt "$2" ]; do sleep 0.05; i=$((i+1)); done; ! alive "$1"; }
end() {
  [ -d "${1%/*}" ] || { echo finished; return; }
  { echo cut >"$1"; } 2>/dev/null && { echo never; return; }
  i=0; p=$(cat "$1" 2>/dev/null)
  while [ -z "$p" ] && [ $i -lt 20 ]; do sleep 0.05; i=$((i+1)); p=$(cat "$1" 2>/dev/null); done
  case $p in ''|*[!0-9]*) echo never; return ;; esac
  if ! kill -0 "$p" 2>/dev/null; then echo finished; rm -f "$1"; return; fi
  kill -TERM -"$p" 2>/dev/null
  if ! wait_gone "$p" GRACE; then kill -KILL -"$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; wait_gone "$p" 100; fi
  if alive "$p"; then echo running; else echo ended; rm -f "$1"; fi
}
"""


def _end_cut_short_script(records: list[str]) -> str:
    steps = "".join(f"end {record}\n" for record in records)
    return "sh -c " + shlex.quote(_END_CUT_SHORT.replace("GRACE", str(int(CUT_SHORT_GRACE / 0.05))) + steps)


@dataclass(frozen=True)
class _CutShort:
    """A command we stopped waiting for (its deadline, a lost connection) that may still be running on the host."""

    command: str
    record: str


# --- a shell kept open for short commands ---


class _KeptShell:
    """One `sh` kept open on the host, opened before the downtime window: a short command inside the window runs in
    it instead of a new SSH session. sshd forks a session, the user's shell and the command for every exec: a few
    ms on a quiet host, hundreds on a loaded one (measured on the lab's 2-core machine under load: 0.7-1.0 s per
    `true` through a new session, 2-10 ms through a kept shell).

    Each command runs in a subshell with stdin from /dev/null (it never reads the shell's own input, the next
    commands) and its stdout and stderr in files of its own in a private directory (a process it leaves in the
    background cannot write into the protocol); then one `cat` sends both, split by a marker file, and a last line
    gives the exit status. Markers carry a random token. One command at a time (`busy`); anything unexpected closes
    the shell for good (the caller then gets a TransportError, as for a lost connection)."""

    def __init__(self, proc: Any, token: str) -> None:
        self.proc = proc
        self.token = token
        self.mid = f"\n{token}-mid\n".encode()
        self.end = f"\n{token}-end ".encode()
        self.busy = threading.Lock()
        self.sessions: asyncio.Semaphore | None = None
        self.dir = ""  # the shell's directory on the host, known once it is ready

    def setup(self) -> bytes:
        """The shell's own set-up: its directory (removed when it exits), the marker file, a ready line naming the
        directory (the records of its commands go there, see _stopped_at_deadline)."""
        return (
            f'd=$(mktemp -d) && printf "\\n{self.token}-mid\\n" > "$d/mid" && trap \'rm -rf "$d"\' EXIT && n=0 '
            f'&& echo {self.token}-ready "$d"\n'
        ).encode()

    async def ready(self) -> None:
        self.proc.stdin.write(self.setup())
        await self.proc.stdout.readuntil(f"{self.token}-ready ".encode())
        self.dir = (await self.proc.stdout.readuntil(b"\n"))[:-1].decode()

    async def run(self, command: str) -> CommandResult:
        self.proc.stdin.write(
            (
                f'n=$((n+1)); ( {command}\n) </dev/null >"$d/$n.o" 2>"$d/$n.e"; s=$?; '
                f'cat "$d/$n.o" "$d/mid" "$d/$n.e"; printf "\\n{self.token}-end %s\\n" "$s"\n'
            ).encode()
        )
        out = (await self.proc.stdout.readuntil(self.mid))[: -len(self.mid)]
        err = (await self.proc.stdout.readuntil(self.end))[: -len(self.end)]
        status = int((await self.proc.stdout.readuntil(b"\n")).strip())
        return CommandResult(status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.stdin.write_eof()
        with contextlib.suppress(Exception):
            self.proc.close()


class Tethered:
    """A process started by SshHost.start_tethered: it ends at the end of file on its stdin."""

    def __init__(self, proc: Any, sessions: asyncio.Semaphore, ready_line: str) -> None:
        self._proc = proc
        self._sessions: asyncio.Semaphore | None = sessions
        self.ready_line = ready_line

    def stop(self, timeout: float = 10.0) -> None:
        """End of file on its stdin, then wait for it to end (best effort: the host may be gone)."""
        sessions, self._sessions = self._sessions, None
        if sessions is None:
            return
        proc = self._proc

        async def _stop() -> None:
            try:
                proc.stdin.write_eof()
                await proc.wait(check=False, timeout=timeout)
            finally:
                proc.close()
                sessions.release()

        with contextlib.suppress(Exception):
            _call(_stop())


class SshHost:
    """One server reached over SSH: commands, streamed commands and local port forwards (for MySQL)."""

    def __init__(
        self,
        host: Host,
        *,
        name: str,
        base_dir: Path,
        retry: Retry,
        forward_agent: bool = False,
        meter: RoundTrips | None = None,
    ) -> None:
        self.host = host
        # Round trips made to this host (and through it: front-door commands), counted by step.
        self.meter = meter if meter is not None else RoundTrips()
        self.name = name
        self.base_dir = base_dir
        self.retry = retry
        self.forward_agent = forward_agent
        self._conn: asyncssh.SSHClientConnection | None = None
        self._sessions: asyncio.Semaphore | None = None
        self._listeners: list[asyncssh.SSHListener] = []
        self._lock = threading.Lock()
        self._shell: _KeptShell | None = None
        # Commands cut short that may still be running on the host: ended before the next command starts there.
        self._cut_short: list[_CutShort] = []
        self._cut_short_lock = threading.Lock()
        self._ending = threading.Lock()  # one thread ends them; the others wait for it
        self._records = itertools.count(1)
        self._token = os.urandom(8).hex()
        self._bastions: list[asyncssh.SSHClientConnection] = []  # connections to the jump host (plan `jump:`)
        self._sudo_checked = False

    def __repr__(self) -> str:
        return f"SshHost({self.name}: {self.host.user}@{self.host.address}:{self.host.ssh_port})"

    def _path(self, raw: str) -> Path:
        path = Path(os.path.expanduser(raw))
        return path if path.is_absolute() else self.base_dir / path

    @property
    def known_hosts(self) -> Path:
        return self._path(self.host.known_hosts)

    # --- connection ---

    def _options(self, host: Host | JumpHost, known_hosts: Path) -> dict[str, Any]:
        options: dict[str, Any] = {
            "port": host.ssh_port,
            "username": host.user,
            "known_hosts": str(known_hosts),
            "keepalive_interval": KEEPALIVE_INTERVAL,
            "keepalive_count_max": KEEPALIVE_COUNT_MAX,
            "connect_timeout": host.connect_timeout,
            # Only what the plan says: no surprise from ~/.ssh/config.
            "config": [],
        }
        if host.key is not None:
            options["client_keys"] = [str(self._path(host.key))]
            if not host.agent:
                options["agent_path"] = None
        return options

    async def _open(self) -> asyncssh.SSHClientConnection:
        options = self._options(self.host, self.known_hosts)
        options["agent_forwarding"] = self.forward_agent
        jump = self.host.jump
        if jump is None:
            return await asyncssh.connect(self.host.address, **options)
        # Through the bastion: its own key verified against its own known_hosts first, then the host's through it.
        jump_known_hosts = self._path(jump.known_hosts)
        try:
            bastion = await asyncssh.connect(jump.address, **self._options(jump, jump_known_hosts))
        except Exception as exc:
            raise _connect_error(f"jump host of {self.name}", jump, jump_known_hosts, exc) from None
        try:
            conn = await asyncssh.connect(self.host.address, tunnel=bastion, **options)
        except BaseException:
            bastion.close()
            raise
        self._bastions.append(bastion)
        return conn

    def _connect_once(self) -> asyncssh.SSHClientConnection:
        if not self.known_hosts.is_file():
            raise TransportError(f"ssh {self.name}: known_hosts file {self.known_hosts} is missing", False)
        jump = self.host.jump
        if jump is not None and not self._path(jump.known_hosts).is_file():
            missing = self._path(jump.known_hosts)
            raise TransportError(f"ssh {self.name}: the jump host's known_hosts file {missing} is missing", False)
        try:
            return _call(self._open())
        except TransportError:
            raise
        except Exception as exc:
            raise _connect_error(self.name, self.host, self.known_hosts, exc) from None

    def connection(self) -> asyncssh.SSHClientConnection:
        """The host's connection, opened (with retries of transient failures) on first use or after a loss."""
        with self._lock:
            if self._conn is None or self._conn.is_closed():
                conn = call_with_retry(self._connect_once, self.retry, what=f"ssh {self.name}")
                if not self._sudo_checked:
                    self._check_sudo(conn)
                self._conn = conn
                self._sessions = asyncio.Semaphore(MAX_SESSIONS_PER_CONNECTION)
            return self._conn

    def _check_sudo(self, conn: asyncssh.SSHClientConnection) -> None:
        """With `become: sudo`, the very command every other one goes through, once: a refusal (a password asked,
        the command not allowed) is one line naming it and the account, before anything is changed."""
        if self.host.become != "sudo":
            return
        probe = as_root(self.host, "true")

        async def _probe() -> asyncssh.SSHCompletedProcess:
            return await conn.run(probe, check=False, timeout=self.host.connect_timeout + 20)

        try:
            done = _call(_probe())
        except (asyncssh.Error, *_TRANSIENT) as exc:
            conn.close()
            raise TransportError(f"ssh {self.name}: checking sudo: {exc.__class__.__name__}: {exc}", True) from None
        if done.exit_status != 0:
            conn.close()
            said = " ".join(str(done.stderr or "").split())[:300] or f"exit {done.exit_status}"
            raise TransportError(
                f"ssh {self.name}: sudo refused `{shlex.join([*SUDO, 'sh', '-c', '…'])}` for {self.host.user}@"
                f"{self.host.address} (become: sudo needs it passwordless): {said}",
                False,
            )
        self._sudo_checked = True

    def _lost(self, exc: BaseException, what: str) -> TransportError:
        if isinstance(exc, asyncssh.TimeoutError | asyncio.TimeoutError):
            return TransportError(f"ssh {self.name}: {what}: timed out", True)
        with self._lock:
            self._conn = None
        reason = f"{exc.__class__.__name__}: {exc}"
        return TransportError(f"ssh {self.name}: {what}: connection lost ({reason})", True)

    # --- commands cut short ---

    def _record_file(self, shell: _KeptShell | None) -> str:
        """Where a command with a deadline records its process group on the host (a shell word): the kept shell's
        own directory, or the run's private directory on the host (plan `run_dir`: no other account can take or
        replace a name there), created exclusively."""
        number = next(self._records)
        if shell is not None:
            return f"{shlex.quote(shell.dir)}/{number}.pid"
        return shlex.quote(f"{self.host.private_dir}/.pid-{self._token}-{number}")

    def _gave_up(self, command: str, record: str | None) -> None:
        """We stopped waiting for a recorded command: it may still be running on the host."""
        if record is not None:
            with self._cut_short_lock:
                self._cut_short.append(_CutShort(command, record))

    def _end_cut_short(self, conn: asyncssh.SSHClientConnection) -> None:
        """No command of ours starts on the host while one cut short there may still be running (a fence landing
        after the rollback lifted it, a stop after the start): each is ended first, its whole process group signalled
        and waited for, through a session of its own (the kept shell it ran in was dropped). Nothing cut short: no
        round trip."""
        if not self._cut_short:
            return
        with self._ending:
            with self._cut_short_lock:
                pending = list(self._cut_short)
            if not pending:
                return
            sessions = self._sessions
            script = _end_cut_short_script([cut.record for cut in pending])

            async def _end() -> asyncssh.SSHCompletedProcess:
                assert sessions is not None
                async with sessions:
                    return await conn.run(
                        as_root(self.host, script),
                        check=False,
                        timeout=CUT_SHORT_TIMEOUT + (CUT_SHORT_GRACE + 5) * len(pending),
                    )

            what = f"ending {len(pending)} command(s) cut short"
            try:
                done = _call(_end())
            except (asyncssh.Error, *_TRANSIENT) as exc:
                raise self._lost(exc, what) from None
            outcomes = str(done.stdout or "").split()
            if done.exit_status != 0 or len(outcomes) != len(pending):
                raise TransportError(f"ssh {self.name}: {what}: status {done.exit_status}: {done.stderr!s}", True)
            log = structlog.get_logger("migrate")
            still: list[_CutShort] = []
            for cut, outcome in zip(pending, outcomes, strict=True):
                said = redact(cut.command)[:80]
                if outcome == "running":
                    still.append(cut)
                    log.error("ssh.cut_short.still_running", host=self.name, command=said)
                elif outcome == "ended":
                    log.warning("ssh.cut_short.ended", host=self.name, command=said)
                else:
                    log.info("ssh.cut_short.settled", host=self.name, command=said, outcome=outcome)
            with self._cut_short_lock:
                self._cut_short = [cut for cut in self._cut_short if cut not in pending or cut in still]
            if still:
                names = ", ".join(f"`{redact(cut.command)[:80]}`" for cut in still)
                raise TransportError(f"ssh {self.name}: cut short, still running after KILL: {names}", True)

    # --- commands ---

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        check: bool = True,
        env: dict[str, str] | None = None,
        input: str | None = None,
    ) -> CommandResult:
        """Run a shell command on the host and wait for it. Secrets go in `env` or `input`, not `command`.

        With a `timeout`, a command cut short is ended on the host before the next command starts there."""
        conn = self.connection()
        self._end_cut_short(conn)
        prefix, data = _env_prefix(env, input)
        shell = self._shell
        # Secrets (env, input) never go through the kept shell; a busy shell (another thread's command) is not
        # waited for: this command takes a session of its own.
        if shell is not None and not prefix and data is None and shell.busy.acquire(blocking=False):
            try:
                self.meter.add("ssh")
                record = self._record_file(shell) if timeout is not None else None
                full = _stopped_at_deadline(command, timeout, record)
                # Quoted whole: a command the shell cannot parse fails alone instead of swallowing the protocol.
                quoted = full if timeout is not None else "sh -c " + shlex.quote(full)
                return self._run_in_shell(shell, command, quoted, timeout, check, record)
            finally:
                shell.busy.release()
        self.meter.add("ssh_session")
        record = self._record_file(None) if timeout is not None else None
        full = _in_session(
            _stopped_at_deadline(prefix + shlex.quote(command) if prefix else command, timeout, record), record
        )

        async def _run() -> asyncssh.SSHCompletedProcess:
            assert self._sessions is not None
            async with self._sessions:
                # An empty input is an empty stdin (asyncssh sends no EOF for "": a reader would wait forever).
                stdin = asyncssh.DEVNULL if data == "" else asyncssh.PIPE
                proc = await conn.create_process(as_root(self.host, full), input=data or None, stdin=stdin,
                                                 errors="replace")  # fmt: skip
                try:
                    return await proc.wait(check=False, timeout=timeout)
                except asyncssh.TimeoutError:
                    # A command past its deadline must not keep running on the host (an rsync inside the
                    # downtime window, a stop command): ask sshd to signal it, then close the channel.
                    with contextlib.suppress(Exception):
                        proc.terminate()
                    raise
                finally:
                    proc.close()

        try:
            done = _call(_run())
        except (asyncssh.Error, *_TRANSIENT) as exc:
            self._gave_up(command, record)
            raise self._lost(exc, f"running `{command[:80]}`") from None
        result = CommandResult(done.exit_status, str(done.stdout or ""), str(done.stderr or ""))
        if check and result.exit_status != 0:
            raise CommandFailed(command, result.exit_status, result.stderr)
        return result

    def keep_shell(self) -> None:
        """Open the kept shell (before the window: opening it is one exec); later short commands run in it."""
        if self._shell is not None:
            return
        conn = self.connection()

        sessions = self._sessions

        async def _open() -> Any:
            assert sessions is not None
            await sessions.acquire()  # held while the shell lives: it is one of the connection's sessions
            try:
                proc = await conn.create_process(as_root(self.host, "sh"), encoding=None)
                shell = _KeptShell(proc, f"__migrate_{os.urandom(8).hex()}")
                shell.sessions = sessions
                await asyncio.wait_for(shell.ready(), SHELL_READY_TIMEOUT)
                return shell
            except BaseException:
                sessions.release()
                raise

        try:
            self._shell = _call(_open())
        except (asyncssh.Error, ValueError, asyncio.IncompleteReadError, *_TRANSIENT) as exc:
            raise self._lost(exc, "opening a shell") from None

    @property
    def kept_dir(self) -> str | None:
        """The kept shell's private directory on the host (mktemp -d: mode 0700; removed when the shell ends, its
        connection lost included): where a file a window command reads (a local client's login) waits for it.
        None without a kept shell."""
        shell = self._shell
        return shell.dir if shell is not None and shell.dir else None

    def _drop_shell(self, shell: _KeptShell) -> None:
        if self._shell is shell:
            self._shell = None
            shell.close()
            if shell.sessions is not None:  # the permit goes back to the connection it was taken from
                with contextlib.suppress(Exception):
                    _event_loop().call_soon_threadsafe(shell.sessions.release)

    def _run_in_shell(
        self, shell: _KeptShell, command: str, full: str, timeout: float | None, check: bool, record: str | None
    ) -> CommandResult:
        async def _run() -> CommandResult:
            return await asyncio.wait_for(shell.run(full), timeout=timeout)

        try:
            result = _call(_run())
        except (asyncssh.Error, ValueError, asyncio.IncompleteReadError, *_TRANSIENT) as exc:
            # The command may still be running in it: the shell is never reused, the command is ended before the
            # next one starts on the host.
            self._drop_shell(shell)
            self._gave_up(command, record)
            raise self._lost(exc, f"running `{command[:80]}`") from None
        except BaseException:
            # Interrupted (a signal) while it ran: its answer is still to come in the shell, which must not serve
            # the next command (that one would read this one's answer, or wait for its own until its deadline).
            self._drop_shell(shell)
            self._gave_up(command, record)
            raise
        if check and result.exit_status != 0:
            raise CommandFailed(command, result.exit_status, result.stderr)
        return result

    def stream(
        self,
        command: str,
        on_line: Callable[[str], None],
        *,
        timeout: float | None = None,
        check: bool = True,
        env: dict[str, str] | None = None,
        keep: Callable[[str], bool] | None = None,
        short: bool = False,
        input: str | None = None,
    ) -> CommandResult:
        """Run a command, calling `on_line` (in this thread) for each stdout line split on \\r or \\n.

        The full stdout is also returned (without empty lines), e.g. for rsync's --stats block; `keep` limits it to
        the lines worth keeping (rsync prints a progress line per file: a million of them must not pile up here).
        `short`: the caller knows the output is small (O(changes)): with a kept shell the command runs there and its
        lines are handed over once it ended, instead of a new session streaming them. `input`: the command's stdin
        (a secret goes there, or in `env`, never in `command`).
        """
        conn = self.connection()
        self._end_cut_short(conn)
        prefix, data = _env_prefix(env, input)
        shell = self._shell
        if short and shell is not None and data is None and shell.busy.acquire(blocking=False):
            try:
                self.meter.add("ssh")
                record = self._record_file(shell) if timeout is not None else None
                full = _stopped_at_deadline(command, timeout, record)
                quoted = full if timeout is not None else "sh -c " + shlex.quote(full)
                done = self._run_in_shell(shell, command, quoted, timeout, False, record)
            finally:
                shell.busy.release()
            kept: list[str] = []
            for line in re.split(r"[\r\n]", done.stdout):
                if line:
                    if keep is None or keep(line):
                        kept.append(line)
                    on_line(line)
            if check and done.exit_status != 0:
                raise CommandFailed(command, done.exit_status, done.stderr)
            return CommandResult(done.exit_status, "\n".join(kept), done.stderr)
        self.meter.add("ssh_session")
        record = self._record_file(None) if timeout is not None else None
        full = _in_session(
            _stopped_at_deadline(prefix + shlex.quote(command) if prefix else command, timeout, record), record
        )
        lines: queue.Queue[str | None] = queue.Queue()

        async def _stream() -> tuple[int | None, str]:
            assert self._sessions is not None
            async with self._sessions:
                proc = await conn.create_process(as_root(self.host, full), errors="replace")
                try:
                    if data is not None:
                        proc.stdin.write(data)
                    proc.stdin.write_eof()
                    stderr_task = asyncio.ensure_future(proc.stderr.read())
                    while True:
                        try:
                            piece = await proc.stdout.readuntil(["\r", "\n"])
                        except asyncio.IncompleteReadError as partial:
                            if partial.partial:
                                lines.put(str(partial.partial))
                            break
                        lines.put(str(piece)[:-1])
                    stderr = await stderr_task
                    await proc.wait_closed()
                    return proc.exit_status, str(stderr)
                finally:
                    proc.close()

        async def _bounded() -> tuple[int | None, str]:
            try:
                return await asyncio.wait_for(_stream(), timeout)
            finally:
                lines.put(None)

        future = _submit(_bounded())
        out: list[str] = []
        try:
            while True:
                line = lines.get()
                if line is None:
                    break
                if line:
                    if keep is None or keep(line):
                        out.append(line)
                    on_line(line)
        except BaseException:
            # The caller gave up (its callback failed, or an interrupt): do not leave the command running.
            future.cancel()
            self._gave_up(command, record)
            raise
        try:
            status, stderr = future.result()
        except (asyncssh.Error, *_TRANSIENT) as exc:
            self._gave_up(command, record)
            raise self._lost(exc, f"streaming `{command[:80]}`") from None
        result = CommandResult(status, "\n".join(out), stderr)
        if check and status != 0:
            raise CommandFailed(command, status, stderr)
        return result

    # --- tunnels ---

    def _forward(self, opener: Callable[[asyncssh.SSHClientConnection], Awaitable[Any]]) -> tuple[str, int]:
        conn = self.connection()

        async def _open() -> Any:
            # asyncssh returns an awaitable context manager here, not a coroutine.
            return await opener(conn)

        try:
            listener = _call(_open())
        except (asyncssh.Error, *_TRANSIENT) as exc:
            raise self._lost(exc, "opening a tunnel") from None
        self._listeners.append(listener)
        return "127.0.0.1", listener.get_port()

    def forward_to_path(self, remote_socket: str) -> tuple[str, int]:
        """A local TCP listener on 127.0.0.1 (free port) tunnelled to a unix socket on the host."""
        return self._forward(lambda conn: conn.forward_local_port_to_path("127.0.0.1", 0, remote_socket))

    def forward_to_port(self, remote_host: str, remote_port: int) -> tuple[str, int]:
        """A local listener on 127.0.0.1 (free port) tunnelled to remote_host:remote_port on the host."""
        return self._forward(lambda conn: conn.forward_local_port("127.0.0.1", 0, remote_host, remote_port))

    # --- a process tied to our connection ---

    def start_tethered(self, command: str, *, input: str, ready: str, timeout: float) -> Tethered:
        """Start `command` in a session of its own, write it `input` (a secret may go there: never the command line)
        and keep its stdin open: the command must end when it reads end of file, which it does when we stop it or
        when our connection is lost (a kill -9 of this process included). Returns once a line it prints starts
        with `ready` (the handle keeps that line); raises TransportError if it ends or says nothing in `timeout`."""
        conn = self.connection()
        self._end_cut_short(conn)
        sessions = self._sessions

        async def _start() -> Tethered:
            assert sessions is not None
            await sessions.acquire()  # held while the process lives: it is one of the connection's sessions
            proc = None
            try:
                proc = await conn.create_process(as_root(self.host, command), encoding="utf-8", errors="replace")
                proc.stdin.write(input)
                async with asyncio.timeout(timeout):
                    while True:
                        line = await proc.stdout.readline()
                        if not line:
                            stderr = await proc.stderr.read()
                            last = (stderr.strip().splitlines() or ["no message"])[-1]
                            raise CommandFailed(command, proc.exit_status, last)
                        if line.startswith(ready):
                            return Tethered(proc, sessions, line.strip())
            except BaseException:
                if proc is not None:
                    proc.close()
                sessions.release()
                raise

        try:
            return _call(_start())
        except TimeoutError:
            raise TransportError(f"{self.name}: `{command[:80]}` said nothing in {timeout:g} s", False) from None
        except (asyncssh.Error, *_TRANSIENT) as exc:
            raise self._lost(exc, f"starting `{command[:80]}`") from None

    def close(self) -> None:
        shell, self._shell = self._shell, None
        if shell is not None:
            shell.close()
        with self._lock:
            conn, self._conn = self._conn, None
            listeners, self._listeners = self._listeners, []
            bastions, self._bastions = self._bastions, []

        async def _close() -> None:
            for listener in listeners:
                listener.close()
            if conn is not None:
                conn.close()
                await conn.wait_closed()
            for bastion in bastions:
                bastion.close()
                await bastion.wait_closed()

        if conn is not None or listeners or bastions:
            # Closing is best effort: the peer may already be gone.
            with contextlib.suppress(Exception):
                _submit(_close()).result(timeout=10)
