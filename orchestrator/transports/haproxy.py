"""The front door: a thin typed adapter to HAProxy's runtime API (its admin socket), usually reached through SSH.

What it does to the service's clients, as measured on HAProxy 2.6.12 (Debian 12) in front of the lab's app:

- `set maxconn frontend F 0` makes new connections wait in the kernel's accept queue, but raising it again while
  connections wait there makes HAProxy 2.6.12 deadlock in resume_listener() and its watchdog kills the process
  (haproxy/haproxy#2726, fixed upstream later): every waiting client gets "connection reset". Never used here.
- `disable frontend F` (pause) closes the listener on Linux: clients get "connection refused" at once.
- A server in `maint` or `drain` state (the only server of its backend) makes HAProxy answer 503 at once; server
  `maxconn 0` means "no limit" (nothing queues); queuing behind a server's maxconn needs a non-zero limit, so it
  cannot hold everything. None of these holds requests.
- What holds: a small Lua action (HOLD_LUA, loaded with `lua-load`, run by `http-request lua.frontdoor_hold`) that
  waits while the map entry `hold_until` (unix seconds, set at runtime with `set map`) is in the future. Measured:
  new requests wait, not fail, for as long as the hold lasts (6.5 s held with `timeout client 3s`: the client
  timeout does not cut a held request, nor does tune.lua.session-timeout, since the action sleeps); requests on
  keep-alive connections that are already open are held too (the action runs per request, not per connection);
  releasing (`hold_until 0`) lets every held request through within the poll interval (20 ms), none lost.
- `set server B/S addr A port P` while requests are held: the held requests are answered by the new address
  (they connect to the server only once released), which is how the source's front door forwards to the target.
- A client that gives up while held (its own timeout) does not cancel its request: HAProxy still forwards it once
  released (even with `option abortonclose`). Writes must therefore be idempotent (the app's are: a retried write
  with the same id answers 200).
- Holding writes only (`hold_writes_until`, for a window in which the source database still serves reads): the
  action lets GET, HEAD and OPTIONS through and holds every other method. The loaded action says it can
  (`frontdoor version` on the admin socket, a command it registers, answers `hold_writes`): an older action
  answers "Unknown command", and the caller holds everything instead.
- HAProxy itself adds no measurable latency in front of the lab app (healthz p50 77 ms through it, 74 ms direct,
  on a loaded 2-core machine). Emulating the wiring on the lab (hold when the journal records writes_blocked_at,
  repoint at the target's front door and release when dns_flip completes; 4 clients, 20 req/s, DNS cached 5 s,
  client timeout 30 s): 0 failed requests, 0 lost, longest write stall 7.84 s for a 7.49 s window. The same run
  with today's fence: 317 failed write attempts (315 "fenced"), longest write stall 10.53 s for a 6.97 s window.
  With the load's default 5 s client timeout, requests held longer than that fail at the client ("timeout").
- The hold is a deadline on the HAProxy host's clock, not a flag: if the process that set it dies (kill -9), the
  hold ends by itself at the deadline and held requests go on to the backend. The Lua also caps any single
  request's wait (max_hold_s) whatever the map says.

The runtime API answers every command with text: nothing (just an empty line) or a confirmation on success, an
error sentence otherwise. An answer of zero bytes means nobody answered (a tunnel whose far end could not open the
socket closes the connection without a byte).

One connection per door is kept open in the runtime API's interactive mode (`prompt`: the connection stays open and
each answer ends with an empty line and the prompt "> "), so a command (or a batch of them on one line) costs one
exchange, not a forwarded channel's opening and then the exchange. HAProxy closes an idle one after its `stats
timeout` (10 s by default): a kept connection found closed is opened again, and a command whose connection closed
before its answer is sent once more on a new one (every command the orchestrator sends is idempotent: a `set` to a
value, or a `show`). Measured on HAProxy 2.6.12: a batch in this mode answers each command with its text, an empty
line and the prompt.
"""

from __future__ import annotations

import csv
import io
import re
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.transports.meter import RoundTrips
from orchestrator.transports.ssh import TransportError

if TYPE_CHECKING:
    import asyncssh

    from orchestrator.transports.ssh import SshHost

COMMAND_TIMEOUT = 5.0
HOLD_KEY = "hold_until"
# Holds only the requests that may write (every method but READ_METHODS), while reads go on.
HOLD_WRITES_KEY = "hold_writes_until"
READ_METHODS = ("GET", "HEAD", "OPTIONS")
# What the action answers to the `frontdoor version` command it registers on the admin socket.
WRITES_ONLY_CAPABILITY = "hold_writes"
HOLD_ACTION = "frontdoor_hold"
POLL_MS = 20
# Answers of commands that succeeded although they say something (everything else non-empty is a refusal).
# What `set map` answers for a key the map does not hold.
MISSING_ENTRY = "entry not found."
SUCCESS_PREFIXES = ("IP changed from", "no need to change", "port changed from", "IP and port changed")

# Where the runtime API is: a unix socket path, or (host, port) of a TCP listener that reaches it (an SSH tunnel).
Endpoint = str | tuple[str, int]


def hold_lua(map_path: str, *, max_hold_s: float, poll_ms: int = POLL_MS) -> str:
    """The Lua action HAProxy loads (`lua-load FILE` in global, `http-request lua.frontdoor_hold` in the frontend)
    to hold requests while `hold_until` in `map_path` is in the future, and the requests that may write (every
    method but GET, HEAD and OPTIONS) while `hold_writes_until` is. The map file must exist with the lines
    `hold_until 0` and `hold_writes_until 0` when HAProxy starts; `set map` changes them at runtime."""
    reads = ", ".join(f"{method} = true" for method in READ_METHODS)
    return f"""-- The front door's hold: requests wait (not fail) while {HOLD_KEY} (unix seconds) is in the future;
-- requests that may write (every method but {", ".join(READ_METHODS)}) also while {HOLD_WRITES_KEY} is.
-- Set and cleared at runtime: set map {map_path} {HOLD_KEY} <unix seconds>  /  ... {HOLD_KEY} 0
local doors = Map.new("{map_path}", Map._str)
local max_hold_s = {float(max_hold_s)}
local reads = {{ {reads} }}

local function now_s()
  local t = core.now()
  return t.sec + t.usec / 1e6
end

local function held_until(key)
  return tonumber(doors:lookup(key) or "0") or 0
end

-- `frontdoor version` on the admin socket: what this action can hold (the orchestrator asks before it relies on it).
core.register_cli({{ "frontdoor", "version" }}, "frontdoor version : what the front door's hold supports",
  function(applet)
    applet:send("{WRITES_ONLY_CAPABILITY}\\n")
  end)

core.register_action("{HOLD_ACTION}", {{ "http-req" }}, function(txn)
  local started = now_s()
  local read = reads[txn.sf:method()] == true
  while now_s() - started < max_hold_s do
    local until_s = held_until("{HOLD_KEY}")
    if not read then
      until_s = math.max(until_s, held_until("{HOLD_WRITES_KEY}"))
    end
    if now_s() >= until_s then
      break
    end
    core.msleep({int(poll_ms)})
  end
end)
"""


# --- errors ----------------------------------------------------------------------------------------------------


class HaproxyError(TransportError):
    """The front door could not do what was asked."""


class AdminSocketUnreachable(HaproxyError):
    """Nothing answered on the admin socket (HAProxy stopped, wrong path, tunnel down)."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"HAProxy admin socket {where} unreachable: {reason}", True)


class HaproxyRefused(HaproxyError):
    """HAProxy answered the command with an error."""

    def __init__(self, command: str, answer: str) -> None:
        self.command = command
        self.answer = answer
        first = next((line.strip() for line in answer.splitlines() if line.strip()), "no message")
        super().__init__(f"HAProxy refused `{command}`: {first}", False)


# --- parsers (pure) --------------------------------------------------------------------------------------------


PROMPT = "> "


def split_prompted(text: str, count: int) -> list[str] | None:
    """The answers of `count` commands in the interactive mode, or None while some are still to come: each answer
    is its lines, an empty line, then the prompt (an answer of nothing is the empty line alone). An answer never
    holds an empty line of its own (the empty line is the protocol's end of an answer)."""
    answers: list[str] = []
    start = 0
    while len(answers) < count:
        if text.startswith("\n" + PROMPT, start):
            answers.append("")
            start += 1 + len(PROMPT)
            continue
        end = text.find("\n\n" + PROMPT, start)
        if end < 0:
            return None
        answers.append(text[start : end + 1])
        start = end + 2 + len(PROMPT)
    return answers


def requests_of(stat: str, frontend: str) -> int:
    """HTTP requests the frontend received since HAProxy started (`show stat` req_tot)."""
    lines = [line for line in stat.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        raise ValueError("not a `show stat` answer")
    for row in csv.DictReader(io.StringIO("\n".join([lines[0][2:], *lines[1:]]))):
        if row.get("pxname") == frontend and row.get("svname") == "FRONTEND":
            return int(row.get("req_tot") or 0)
    raise ValueError(f"no frontend {frontend} in `show stat`")


def check_answer(command: str, answer: str) -> str:
    """The answer of a command that changes something, or HaproxyRefused when it is an error."""
    text = answer.strip()
    if text and not text.startswith(SUCCESS_PREFIXES):
        raise HaproxyRefused(command, text)
    return text


@dataclass(frozen=True)
class StatRow:
    """One line of `show stat`: a frontend, a backend or a server."""

    proxy: str
    name: str  # FRONTEND, BACKEND or the server's name
    queue: int  # qcur: requests waiting for a server slot
    sessions: int  # scur
    total: int  # stot
    status: str  # OPEN, UP, DOWN, MAINT, no check, ...
    address: str  # servers only: "address:port"


def _int(value: str | None) -> int:
    return int(value) if value and value.strip().lstrip("-").isdigit() else 0


def parse_stat(text: str) -> list[StatRow]:
    """`show stat` CSV (its header line starts with "# ")."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        raise ValueError(f"not a `show stat` answer: {text.strip()[:80]!r}")
    reader = csv.DictReader(io.StringIO("\n".join([lines[0][2:], *lines[1:]])))
    return [
        StatRow(
            proxy=row["pxname"],
            name=row["svname"],
            queue=_int(row.get("qcur")),
            sessions=_int(row.get("scur")),
            total=_int(row.get("stot")),
            status=row.get("status") or "",
            address=row.get("addr") or "",
        )
        for row in reader
    ]


@dataclass(frozen=True)
class ServerState:
    """One server of `show servers state`."""

    backend: str
    server: str
    address: str
    port: int
    operational: int  # srv_op_state: 0 stopped, 1 starting, 2 running, 3 stopping
    admin: int  # srv_admin_state bits: 0x01 forced maint, 0x08 forced drain, ...

    @property
    def in_maintenance(self) -> bool:
        return bool(self.admin & 0x01)


def parse_servers_state(text: str) -> list[ServerState]:
    """`show servers state`: a version line, a "# field ..." header, then one space-separated line per server."""
    header: list[str] | None = None
    servers: list[ServerState] = []
    for line in text.splitlines():
        if line.startswith("# "):
            header = line[2:].split()
            continue
        if header is None or not line.strip() or line.strip().isdigit():
            continue
        row = dict(zip(header, line.split(), strict=False))
        servers.append(
            ServerState(
                backend=row["be_name"],
                server=row["srv_name"],
                address=row["srv_addr"],
                port=_int(row.get("srv_port")),
                operational=_int(row.get("srv_op_state")),
                admin=_int(row.get("srv_admin_state")),
            )
        )
    if header is None:
        raise ValueError(f"not a `show servers state` answer: {text.strip()[:80]!r}")
    return servers


@dataclass(frozen=True)
class Stream:
    """One request being handled (`show sess`): an idle keep-alive connection has none."""

    frontend: str
    backend: str  # "<NONE>" until the request is past the frontend's rules (a held request stays there)
    server: str
    age: str
    # The stream's address and the `show sess` epoch it was created in: each `show sess` starts a new epoch, so
    # (id, epoch) names one stream even when a later one reuses the address.
    id: str = ""
    epoch: str = ""


def parse_sessions(text: str) -> list[Stream]:
    """`show sess`: one line per stream, "0x...: proto=... fe=F be=B srv=S ... age=1s ..."."""
    streams: list[Stream] = []
    for line in text.splitlines():
        if not line.startswith("0x"):
            continue
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part and "[" not in part.split("=", 1)[0])
        if "fe" in fields:
            streams.append(
                Stream(
                    fields["fe"],
                    fields.get("be", ""),
                    fields.get("srv", ""),
                    fields.get("age", ""),
                    id=line.split(":", 1)[0],
                    epoch=fields.get("epoch", ""),
                ),
            )
    return streams


# HAProxy's numbers for the read methods (its enum http_meth_t: OPTIONS 0, GET 1, HEAD 2), as `show sess all`
# prints them (`meth=`).
READ_METHOD_CODES = frozenset({"0", "1", "2"})


def parse_sessions_all(text: str) -> list[tuple[Stream, str | None]]:
    """`show sess all`: a block per stream, its first line "0x...: [date] id=...", then lines of fields; each stream
    with its request's method number (None: not shown, e.g. no request parsed yet)."""
    found: list[tuple[Stream, str | None]] = []
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("0x"):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    for block in blocks:
        body = "\n".join(block)
        fields = {key: match.group(1) for key in ("frontend", "backend", "server", "epoch", "meth", "age")
                  if (match := re.search(rf"(?<![\w.]){key}=(\S+)", body))}  # fmt: skip
        if "frontend" not in fields:
            continue
        stream = Stream(fields["frontend"], fields.get("backend", ""), fields.get("server", ""),
                        fields.get("age", ""), id=block[0].split(":", 1)[0], epoch=fields.get("epoch", ""))  # fmt: skip
        found.append((stream, fields.get("meth")))
    return found


def parse_map(text: str) -> dict[str, str]:
    """`show map FILE`: lines "<ref> <key> <value>"."""
    entries: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[0].startswith("0x"):
            entries[parts[1]] = parts[2].strip()
    return entries


def parse_info(text: str) -> dict[str, str]:
    """`show info`: "Name: value" lines."""
    info: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            info[key.strip()] = value.strip()
    return info


def host_clock(activity: str) -> float:
    """The HAProxy host's unix time (microseconds) from `show activity` ("date_now: 1795437171.012060"): the
    clock the hold's Lua action compares its deadline with."""
    for line in activity.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "date_now":
            try:
                return float(value.strip())
            except ValueError:
                break
    raise ValueError(f"`show activity` has no date_now: {activity.strip()[:80]!r}")


@dataclass(frozen=True)
class DoorState:
    """What the front door is doing now."""

    held_until: float  # unix seconds on the HAProxy host; 0 when not holding
    host_now: float  # the HAProxy host's clock when read
    held: int  # requests waiting in the frontend (the hold), not yet sent to a server
    frontend_sessions: int  # client connections open on the frontend (held, in flight, idle keep-alive)
    backend_sessions: int  # requests at a server now
    queued: int  # requests waiting in the backend's queue for a server slot
    server: ServerState

    @property
    def holding(self) -> bool:
        return self.held_until > self.host_now


# --- the adapter -----------------------------------------------------------------------------------------------


class _Closed(Exception):
    """The connection ended before the whole answer came."""


class AdminSession:
    """One kept connection to the runtime API in its interactive mode (see the module's docstring): each exchange,
    one command or a batch on one line, costs one round trip; opening it (again) one more (the forwarded channel)."""

    def __init__(self, endpoint: Callable[[], Endpoint], *, timeout: float, meter: RoundTrips) -> None:
        self._endpoint = endpoint
        self._timeout = timeout
        self._meter = meter
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._at: Endpoint | None = None

    def exchange(self, line: str, count: int) -> tuple[str, list[str]]:
        """Send one line of `count` commands; (where, their answers). Raises AdminSocketUnreachable."""
        with self._lock:
            endpoint = self._endpoint()
            where = endpoint if isinstance(endpoint, str) else f"{endpoint[0]}:{endpoint[1]}"
            for _ in range(2):
                fresh = self._sock is None or self._at != endpoint or self._closed_by_peer()
                try:
                    if fresh:
                        self.close()
                        self._open(endpoint)
                    assert self._sock is not None
                    self._meter.add("haproxy")
                    # A new connection enters the interactive mode with the same line: `prompt` answers nothing.
                    self._sock.sendall(("prompt\n" if fresh else "").encode() + line.encode() + b"\n")
                    answers = self._read(count + (1 if fresh else 0))
                    return where, answers[1:] if fresh else answers
                except _Closed:
                    self.close()
                    if fresh:
                        # HAProxy ends every answer with a newline: nothing means no HAProxy behind the socket.
                        raise AdminSocketUnreachable(
                            where, "the connection closed without an answer (no HAProxy behind it)"
                        ) from None
                    # A kept connection HAProxy closed (its idle `stats timeout`) just as we sent: once more.
                except TimeoutError:
                    self.close()
                    raise AdminSocketUnreachable(where, f"no answer to `{line}` within {self._timeout:g} s") from None
                except OSError as exc:
                    self.close()
                    if not fresh and isinstance(exc, BrokenPipeError | ConnectionResetError):
                        continue  # as above: closed by HAProxy while idle
                    raise AdminSocketUnreachable(where, exc.strerror or type(exc).__name__) from None
            raise AssertionError("unreachable")

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _open(self, endpoint: Endpoint) -> None:
        family = socket.AF_UNIX if isinstance(endpoint, str) else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(self._timeout)
            sock.connect(endpoint)
        except BaseException:
            sock.close()
            raise
        self._meter.add("haproxy")  # the forwarded channel's opening (through SSH), before the first exchange
        self._sock, self._at = sock, endpoint

    def _closed_by_peer(self) -> bool:
        """Whether the kept connection has been closed by HAProxy (or holds bytes no command asked for)."""
        assert self._sock is not None
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def _read(self, count: int) -> list[str]:
        assert self._sock is not None
        deadline = time.monotonic() + self._timeout
        data = b""
        while True:
            self._sock.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = self._sock.recv(65536)
            if not chunk:
                raise _Closed()
            data += chunk
            if data.endswith(PROMPT.encode()):
                answers = split_prompted(data.decode(errors="replace"), count)
                if answers is not None:
                    return answers


class FrontDoor:
    """One HAProxy front door: its frontend, the backend/server it sends requests to, and its hold map."""

    def __init__(
        self,
        endpoint: Callable[[], Endpoint],
        *,
        frontend: str,
        backend: str,
        server: str,
        hold_map: str,
        name: str = "front door",
        timeout: float = COMMAND_TIMEOUT,
        meter: RoundTrips | None = None,
    ) -> None:
        self._meter = meter if meter is not None else RoundTrips()
        self._session = AdminSession(endpoint, timeout=timeout, meter=self._meter)
        self.frontend = frontend
        self.backend = backend
        self.server = server
        self.hold_map = hold_map
        self.name = name
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"FrontDoor({self.name}: {self.frontend} → {self.backend}/{self.server})"

    def ask(self, command: str) -> str:
        """One command's answer, on the door's kept connection (one round trip)."""
        return self._exchange(command, 1)[0]

    def _exchange(self, line: str, count: int) -> list[str]:
        try:
            return self._session.exchange(line, count)[1]
        except AdminSocketUnreachable as exc:
            raise AdminSocketUnreachable(f"{exc.where} ({self.name})", exc.reason) from None

    def connect(self) -> None:
        """Open the kept connection now (before the window), so the window's first command costs one round trip."""
        self.ask("show info")

    def close(self) -> None:
        self._session.close()

    def change(self, command: str) -> str:
        """A command that changes something: its answer, or HaproxyRefused."""
        return check_answer(command, self.ask(command))

    def batch(self, commands: list[str]) -> list[str]:
        """Several commands in one connection (one round trip through the tunnel), their answers in order. The
        callers check each answer (a `set` that failed answers an error sentence; the commands after it still
        run, in order)."""
        if any(";" in command or "\n" in command for command in commands):
            raise ValueError(f"a command of a batch holds ';' or a newline: {commands}")
        return self._exchange("; ".join(commands), len(commands))

    # --- readers ---

    def stat(self) -> list[StatRow]:
        return parse_stat(self.ask("show stat"))

    def servers_state(self) -> list[ServerState]:
        return parse_servers_state(self.ask(f"show servers state {self.backend}"))

    def server_state(self) -> ServerState:
        for server in self.servers_state():
            if server.server == self.server:
                return server
        raise HaproxyRefused(f"show servers state {self.backend}", f"no server {self.server} in {self.backend}")

    def streams(self) -> list[Stream]:
        return parse_sessions(self.ask("show sess"))

    def held_requests(self) -> int:
        """Requests of this frontend not yet past its rules: the ones the hold keeps waiting."""
        return sum(1 for s in self.streams() if s.frontend == self.frontend and s.backend == "<NONE>")

    def host_now(self) -> float:
        return host_clock(self.ask("show activity"))

    def held_until(self, key: str = HOLD_KEY) -> float:
        """The deadline of the hold (of everything, or with HOLD_WRITES_KEY of the writes); 0: not holding."""
        answer = self.ask(f"show map {self.hold_map}")
        entries = parse_map(answer)
        if key not in entries:
            # `show map` of a map HAProxy does not know answers an error sentence (no entries).
            raise HaproxyRefused(f"show map {self.hold_map}", answer.strip() or f"no {key} entry")
        try:
            return float(entries[key])
        except ValueError:
            raise HaproxyRefused(f"show map {self.hold_map}", f"{key} is {entries[key]!r}") from None

    def holds_writes_only(self) -> bool:
        """Whether this door can hold the writes alone: its action says so, and its map has the entry."""
        answer = self.ask("frontdoor version")
        if WRITES_ONLY_CAPABILITY not in answer.split():
            return False  # an older action: "Unknown command ..."
        return HOLD_WRITES_KEY in parse_map(self.ask(f"show map {self.hold_map}"))

    def state(self) -> DoorState:
        rows = {(row.proxy, row.name): row for row in self.stat()}
        frontend = rows.get((self.frontend, "FRONTEND"))
        backend = rows.get((self.backend, "BACKEND"))
        if frontend is None or backend is None:
            missing = self.frontend if frontend is None else self.backend
            raise HaproxyRefused("show stat", f"no proxy named {missing}")
        return DoorState(
            held_until=self.held_until(),
            host_now=self.host_now(),
            held=self.held_requests(),
            frontend_sessions=frontend.sessions,
            backend_sessions=backend.sessions,
            queued=backend.queue,
            server=self.server_state(),
        )

    # --- actions ---

    def hold(self, seconds: float, *, writes_only: bool = False, host_now: float | None = None) -> float:
        """Hold new requests (they wait in HAProxy, none fails) for at most `seconds` from now on the HAProxy
        host's clock, or until release(); `writes_only`: only those that may write (see holds_writes_only()).
        `host_now`: that clock's time now, when the caller knows it (else it is asked: one round trip).
        Returns the deadline (host unix seconds). Calling it again moves the deadline."""
        if seconds <= 0:
            raise ValueError("a hold lasts a positive number of seconds")
        deadline = round((self.host_now() if host_now is None else host_now) + seconds, 3)
        self.change(f"set map {self.hold_map} {HOLD_WRITES_KEY if writes_only else HOLD_KEY} {deadline}")
        return deadline

    def hold_and_in_flight(
        self, seconds: float, *, writes_only: bool = False, host_now: float
    ) -> tuple[float, set[tuple[str, str]]]:
        """hold(), and in the same round trip the requests already past the rules (at a server or queued for one;
        with `writes_only` only the writes among them): those the drain waits for. Returns (deadline, those).

        `show sess` runs with HAProxy's threads isolated (no stream is between the hold's check and its backend
        while it lists them), after the `set map` of the same line: a request it does not list as past the rules
        reads the new deadline at its next check and is held."""
        if seconds <= 0:
            raise ValueError("a hold lasts a positive number of seconds")
        deadline = round(host_now + seconds, 3)
        commands = [f"set map {self.hold_map} {HOLD_WRITES_KEY if writes_only else HOLD_KEY} {deadline}",
                    "show sess all"]  # fmt: skip
        answers = self.batch(commands)
        check_answer(commands[0], answers[0])
        in_flight = {
            (s.id, s.epoch) for s, method in parse_sessions_all(answers[1])
            if s.frontend == self.frontend and s.backend != "<NONE>"
            and not (writes_only and method in READ_METHOD_CODES)
        }  # fmt: skip
        return deadline, in_flight

    def _release_commands(self) -> list[str]:
        return [f"set map {self.hold_map} {HOLD_KEY} 0", f"set map {self.hold_map} {HOLD_WRITES_KEY} 0"]

    def _check_released(self, commands: list[str], answers: list[str]) -> None:
        check_answer(commands[0], answers[0])
        # A map without the writes' entry belongs to an action that cannot hold writes alone: nothing to clear.
        if answers[1].strip() and answers[1].strip() != MISSING_ENTRY:
            raise HaproxyRefused(commands[1], answers[1])

    def release(self) -> None:
        """Let every held request (and every later one) through, to wherever the server points now (one round
        trip: both holds cleared in one batch)."""
        commands = self._release_commands()
        self._check_released(commands, self.batch(commands))

    def pid_and_hold(self, key: str = HOLD_KEY) -> tuple[str, float]:
        """HAProxy's pid and the hold's deadline (see held_until), in one round trip."""
        commands = ["show info", f"show map {self.hold_map}"]
        info, answer = self.batch(commands)
        entries = parse_map(answer)
        if key not in entries:
            raise HaproxyRefused(commands[1], answer.strip() or f"no {key} entry")
        try:
            return parse_info(info).get("Pid", ""), float(entries[key])
        except ValueError:
            raise HaproxyRefused(commands[1], f"{key} is {entries[key]!r}") from None

    def forward(self, address: str, port: int) -> int:
        """Point the server at address:port and release every hold, in one round trip; read back, the server
        points there. Returns the frontend's request count just before (`show stat` req_tot)."""
        target = f"{self.backend}/{self.server}"
        release = self._release_commands()
        commands = ["show stat", f"set server {target} addr {address} port {int(port)}", *release,
                    f"show servers state {self.backend}"]  # fmt: skip
        answers = self.batch(commands)
        requests = requests_of(answers[0], self.frontend)
        check_answer(commands[1], answers[1])
        self._check_released(release, answers[2:4])
        state = next((s for s in parse_servers_state(answers[4]) if s.server == self.server), None)
        if state is None or (state.address, state.port) != (address, int(port)):
            where = "no such server" if state is None else f"the server still points at {state.address}:{state.port}"
            raise HaproxyRefused(commands[1], where)
        return requests

    def repoint(self, address: str, port: int) -> ServerState:
        """Send the server's requests (held ones included) to address:port; returns the state read back."""
        self.change(f"set server {self.backend}/{self.server} addr {address} port {int(port)}")
        state = self.server_state()
        if (state.address, state.port) != (address, int(port)):
            raise HaproxyRefused(
                f"set server {self.backend}/{self.server} addr {address} port {port}",
                f"the server still points at {state.address}:{state.port}",
            )
        return state

    def set_server_state(self, state: str) -> None:
        """ready, drain or maint (maint and drain answer 503 at once when this is the only server)."""
        if state not in ("ready", "drain", "maint"):
            raise ValueError(f"unknown server state {state!r}")
        self.change(f"set server {self.backend}/{self.server} state {state}")

    def at_server(self) -> set[tuple[str, str]]:
        """The requests of this frontend past its rules (at a server or queued for one), as (id, epoch)."""
        return {(s.id, s.epoch) for s in self.streams() if s.frontend == self.frontend and s.backend != "<NONE>"}

    def writes_at_server(self) -> set[tuple[str, str]]:
        """at_server(), less the requests HAProxy parsed as reads (GET, HEAD, OPTIONS): those a hold of the writes
        alone need not wait for. A stream whose method is not shown counts as a write."""
        return {
            (s.id, s.epoch) for s, method in parse_sessions_all(self.ask("show sess all"))
            if s.frontend == self.frontend and s.backend != "<NONE>" and method not in READ_METHOD_CODES
        }  # fmt: skip

    def wait_finished(self, requests: set[tuple[str, str]], timeout: float, poll: float = 0.05) -> bool:
        """Wait until these requests (from at_server()) are answered, whatever came after; True if they were."""
        deadline = time.monotonic() + timeout
        left = set(requests)
        while left:
            left &= {(s.id, s.epoch) for s in self.streams()}
            if not left:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)
        return True  # none in flight: nothing to ask

    def wait_drained(self, timeout: float, poll: float = 0.05) -> bool:
        """Wait until no request is at a server or in the queue (in-flight requests finished); True if drained."""
        deadline = time.monotonic() + timeout
        while True:
            rows = {(row.proxy, row.name): row for row in self.stat()}
            backend = rows.get((self.backend, "BACKEND"))
            if backend is not None and backend.sessions == 0 and backend.queue == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)


def unix_socket(path: str) -> Callable[[], Endpoint]:
    """The admin socket on this machine."""
    return lambda: path


def through_ssh(host: SshHost, socket_path: str) -> Callable[[], Endpoint]:
    """The admin socket on a host reached over SSH: a local TCP port forwarded to the remote unix socket, opened
    on first use and again after the SSH connection was re-established."""
    lock = threading.Lock()
    cached: list[tuple[asyncssh.SSHClientConnection, Endpoint]] = []

    def endpoint() -> Endpoint:
        with lock:
            connection = host.connection()
            if not cached or cached[0][0] is not connection:
                cached.clear()
                cached.append((connection, host.forward_to_path(socket_path)))
            return cached[0][1]

    return endpoint


def over_ssh(host: SshHost, socket_path: str, *, frontend: str, backend: str, server: str, hold_map: str) -> FrontDoor:
    return FrontDoor(
        through_ssh(host, socket_path),
        frontend=frontend,
        backend=backend,
        server=server,
        hold_map=hold_map,
        name=f"front door of {host.name}",
        meter=host.meter,
    )
