"""The commit at the front door driven from the source host: one command there instead of four round trips.

The commit's chain (steps/switch_traffic.py) is: the source's door still holds → the guard told → the commit recorded
→ the target's fence lifted → the source's door forwards to the target. Driven from here each link is a round trip
to a host; driven from the source host itself, the door is its local admin socket (socat) and the target is one hop
away (the hosts' own SSH connection, the one rsync's `-e` reuses), so the whole chain is one command
(`commit_script`):

1. the door's pid and hold read on the local socket; only when they are the ones the window set:
2. the guard's `committed` marker, then the commit's **record** (`commit_record`: a file beside the guard's
   directory, which the guard deletes once it reads its marker) — from here the run is committed;
3. the target's fence lifted over the hop, and only if it was, the door repointed at the target and its holds
   cleared in one batch on the local socket, read back.

The run's journal says committed once the answer is back. The record is what makes that safe: a run that dies
between the two (its command goes on without it: it runs detached from the SSH session, its answer in a file) has
left a service that serves (the target takes writes, the source's door forwards every client to it, DNS untouched),
and a resumed run, or a rollback, reads the record before anything else and finishes forward instead of rolling a
committed service back.

The window's first command can run there too (`hold_and_fence_script`): the hold set on the local socket, the writes
in flight waited for there (no round trip per look), then the source's fence: one round trip instead of two or three.

Each answer is framed by markers and parsed by the pure functions below. A source without socat, or whose socket
cannot be reached by it, is found before the window (`probe_command`): the commit then runs from here as before.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from orchestrator.services import guard, owned
from orchestrator.transports.haproxy import (
    HOLD_KEY,
    HOLD_WRITES_KEY,
    MISSING_ENTRY,
    HaproxyRefused,
    check_answer,
    parse_info,
    parse_map,
    parse_servers_state,
    requests_of,
)

# socat's wait for the rest of HAProxy's answer after our end is closed (HAProxy closes its end once it has answered).
SOCAT_TIMEOUT = 5
DOOR_BEGIN, DOOR_END = "__migrate_door_begin__", "__migrate_door_end__"
MARKED = "__migrate_guard_marked__"
# Printed once the commit's record is written (after the guard's marker): the run is committed from there.
RECORDED = "__migrate_commit_recorded__"
# What a run that must decide about a commit it sent writes in the record's place when the commit has not claimed it:
# the commit, arriving late, then finds the name taken and does nothing.
CANCELLED = "cancelled"
CANCEL_REFUSED = "__migrate_commit_unknown__"
RECORD_PREFIX = owned.COMMIT_RECORD_PREFIX
HOLD_OK = "__migrate_hold_ok__"
FENCE_EXIT = "__migrate_fence_exit="
THEN_BEGIN = "__migrate_then_begin__"
THEN_EXIT = "__migrate_then_exit="
DOOR_EXIT = "__migrate_door_exit="
HOLD_EXIT = "__migrate_hold_exit="
IN_FLIGHT = "__migrate_in_flight="
LEFT = "__migrate_in_flight_left="
SET_OK = "__migrate_hold_set__"
DRAIN_POLL = 0.002  # seconds between two looks at the writes in flight, on the source host
# The hold's deadline read back may differ from the journaled one by its rounding only.
DEADLINE_TOLERANCE = 0.01


def probe_command(socket_path: str) -> str:
    """Before the window: whether the source host can drive its own door (socat, and the socket answering it)."""
    sock = shlex.quote(socket_path)
    return (
        f"command -v socat >/dev/null 2>&1 && [ -S {sock} ] && "
        f"printf 'show info\\n' | socat -t {SOCAT_TIMEOUT} - UNIX-CONNECT:{sock} 2>/dev/null | grep -q '^Pid: ' "
        "&& echo local-door-ok || true"
    )


def probe_ok(stdout: str) -> bool:
    return "local-door-ok" in stdout.split()


LOCAL_COST = "__migrate_local_cost_ns="


def cost_probe_command(socket_path: str, hop: str | None) -> str:
    """Shell, run after `probe_command` found the door drivable (and the hop's connection opened): what the commit's
    own work costs on the source host, in nanoseconds: the two door exchanges through socat and, when the target has a
    fence, one command over the hop, done once for real with answers thrown away (`show info` changes nothing; `hop`
    runs `true`)."""
    door = f"printf 'show info\\n' | socat -t {SOCAT_TIMEOUT} - UNIX-CONNECT:{shlex.quote(socket_path)} >/dev/null 2>&1"
    hop_part = f"{hop} >/dev/null 2>&1; " if hop else ""
    return f't0=$(date +%s%N); {door}; {hop_part}{door}; t1=$(date +%s%N); echo "{LOCAL_COST}$((t1 - t0))"'


def parse_local_cost(stdout: str) -> float | None:
    """The seconds `cost_probe_command` measured, or None when its answer is not there."""
    for word in stdout.split():
        if word.startswith(LOCAL_COST):
            try:
                return int(word[len(LOCAL_COST) :]) / 1e9
            except ValueError:
                return None
    return None


def worth_driving_from_source(round_trip: float, local_cost: float | None) -> bool:
    """Driven from the source, the commit saves two round trips from here (four → two) and pays the source host's own
    work (processes it starts: socat, the hop's command); near hosts, that work costs more than the round trips it
    saves, so the commit stays driven from here."""
    return local_cost is not None and 2 * round_trip > local_cost


def _door(socket_path: str, commands: list[str]) -> str:
    """Shell: one line of commands on the local admin socket (non-interactive: HAProxy answers each, an empty line
    after each, then closes), the answer framed, socat's exit status after it."""
    if any(";" in c or "\n" in c or "'" in c for c in commands):
        raise ValueError(f"a door command holds ';', a quote or a newline: {commands}")
    line = "; ".join(commands)
    return (
        f"echo {DOOR_BEGIN}; printf '%s\\n' '{line}' | socat -t {SOCAT_TIMEOUT} - "
        f'UNIX-CONNECT:{shlex.quote(socket_path)} 2>&1; echo "{DOOR_EXIT}$?"; echo {DOOR_END}'
    )


@dataclass(frozen=True)
class HoldToCheck:
    """The hold the window set, as journaled (frontdoor.SOURCE_HOLD)."""

    pid: str
    deadline: float
    writes_only: bool

    @property
    def key(self) -> str:
        return HOLD_WRITES_KEY if self.writes_only else HOLD_KEY


def check_commands(hold_map: str) -> list[str]:
    return ["show info", f"show map {hold_map}"]


_COUNT = (
    'function val(key,   s) { if (match($0, "(^|[^A-Za-z0-9_.])" key "=[^ ]+")) { '
    's = substr($0, RSTART, RLENGTH); sub(/^[^=]*=/, "", s); return s } return "" } '
    'function flush() { if (blk && f == fe && b != "" && b != "<NONE>" && !(wo && (m == "0" || m == "1" || '
    'm == "2"))) n++ } '
    '/^0x/ { flush(); blk = 1; f = ""; b = ""; m = "" } '
    'blk { if (f == "") f = val("frontend"); if (b == "") b = val("backend"); if (m == "") m = val("meth") } '
)


def in_flight_awk(frontend: str, *, writes_only: bool, hold_answer: bool = False) -> str:
    """An awk program counting, in a `show sess all` answer, the streams the drain waits for: those of `frontend`
    already past its rules (their backend set: a held request has none) and, holding writes alone, not a read
    (HAProxy's method numbers 0-2; a stream whose method is not shown yet counts as a write), as
    haproxy.parse_sessions_all and FrontDoor.hold_and_in_flight tell them apart. It prints the count alone, or, with
    `hold_answer` (the answer to `set map …; show sess all`), the set map's answer framed, SET_OK when it is empty
    (set), then the count after IN_FLIGHT: one process for the whole first answer."""
    if hold_answer:
        program = (
            f'BEGIN {{ print "{DOOR_BEGIN}" }} '
            f'!set && /^$/ {{ set = 1; print "{DOOR_END}"; if (!said) print "{SET_OK}"; next }} '
            "!set { print; said = 1; next } "
            + _COUNT
            + f'END {{ if (!set) print "{DOOR_END}"; flush(); print "{IN_FLIGHT}" n + 0 }}'
        )
    else:
        program = _COUNT + "END { flush(); print n + 0 }"
    return f"awk -v fe={shlex.quote(frontend)} -v wo={int(writes_only)} {shlex.quote(program)}"


def hold_and_fence_script(
    socket_path: str,
    hold_map: str,
    *,
    key: str,
    deadline: float,
    frontend: str,
    writes_only: bool,
    drain_seconds: float,
    fence: str,
    then: str | None = None,
) -> str:
    """The window's first command on the source: the hold set on the door's local socket and, in the same exchange,
    the streams listed (HAProxy lists them after the `set map`: a request it does not list reads the new deadline
    and is held); then, while a write it let through is still in flight, a look again every DRAIN_POLL s for at most
    `drain_seconds`; then the source's fence; then, only once the fence is up, `then` (what else the window needs
    done on the source once nothing writes there: its output after THEN_BEGIN, its status after THEN_EXIT). Nothing
    is fenced when the hold was not set. Few processes (socat, one awk, the fence), each costing the window
    milliseconds on a busy host."""
    sock = shlex.quote(socket_path)
    line = f"set map {hold_map} {key} {deadline!r}; show sess all"
    if any(c in line for c in "'\n"):
        raise ValueError(f"a door command holds a quote or a newline: {line}")
    first = in_flight_awk(frontend, writes_only=writes_only, hold_answer=True)
    count = in_flight_awk(frontend, writes_only=writes_only)
    return (
        f"ans=$(printf '%s\\n' '{line}' | socat -t {SOCAT_TIMEOUT} - UNIX-CONNECT:{sock} 2>&1); rc=$?; "
        f'echo "{HOLD_EXIT}$rc"; res=$(printf \'%s\\n\' "$ans" | {first}); printf \'%s\\n\' "$res"; '
        f"n=${{res##*{IN_FLIGHT}}}; "
        f'case "$rc $res" in "0 "*{SET_OK}*) '
        f'if [ "$n" -gt 0 ]; then end=$(( $(date +%s%N) + {int(max(drain_seconds, 0.0) * 1e9)} )); '
        f'while [ "$n" -gt 0 ] && [ "$(date +%s%N)" -lt "$end" ]; do sleep {DRAIN_POLL}; '
        f"n=$(printf 'show sess all\\n' | socat -t {SOCAT_TIMEOUT} - UNIX-CONNECT:{sock} 2>/dev/null | {count}); "
        f'done; fi; echo "{LEFT}$n"; '
        f'( {fence}\n) </dev/null 2>&1; fx=$?; echo "{FENCE_EXIT}$fx"; {_then(then)};; esac'
    )


def _then(then: str | None) -> str:
    if then is None:
        return ":"
    return f'if [ "$fx" -eq 0 ]; then echo {THEN_BEGIN}; ( {then}\n) </dev/null 2>&1; echo "{THEN_EXIT}$?"; fi'


@dataclass(frozen=True)
class HoldAndFence:
    """What hold_and_fence_script did."""

    held: bool
    door_said: str  # socat's or HAProxy's words when the hold was not set
    in_flight: int | None = None  # writes in flight when the hold began (None: not held)
    drained: bool = False
    fenced: bool = False
    fence_said: str = ""
    then_status: int | None = None  # the `then` part's exit status (None: it did not run, or did not end)
    then_said: str = ""  # what it printed (stdout and stderr)


def parse_hold_and_fence(stdout: str) -> HoldAndFence:
    def value(marker: str) -> str | None:
        for found in stdout.splitlines():
            if found.startswith(marker):
                return found[len(marker) :].strip()
        return None

    status = value(HOLD_EXIT)
    begin, end = stdout.find(DOOR_BEGIN + "\n"), stdout.find(DOOR_END)
    said = stdout[begin + len(DOOR_BEGIN) + 1 : end].strip() if 0 <= begin < end else ""
    counted = value(IN_FLIGHT)
    if status != "0" or SET_OK not in stdout.split() or counted is None:
        return HoldAndFence(False, said or f"socat on the source exited {status or 'without a status'}")
    left = value(LEFT)
    head, found, tail = stdout.partition(FENCE_EXIT)
    if not found:
        return HoldAndFence(True, "", int(counted), left == "0", False, "the fence command's status did not come back")
    fence_status = tail.split("\n", 1)[0].strip()
    fence_out = head.split(f"{LEFT}{left}\n", 1)[-1].strip()
    fence_said = fence_out.splitlines()[-1] if fence_out else ""
    then_status, then_said = _then_part(tail)
    return HoldAndFence(True, "", int(counted), left == "0", fence_status == "0", fence_said or f"exit {fence_status}",
                        then_status, then_said)  # fmt: skip


def _then_part(after_fence: str) -> tuple[int | None, str]:
    """The `then` part's status and output, from what followed the fence's status."""
    _, begun, rest = after_fence.partition(f"{THEN_BEGIN}\n")
    if not begun:
        return None, ""
    said, ended, status = rest.rpartition(THEN_EXIT)
    if not ended:
        return None, rest
    code = status.split("\n", 1)[0].strip()
    return (int(code) if code.isdigit() else None), said


@dataclass(frozen=True)
class Forward:
    """Where the source's door sends its requests from the commit on, and the names it has them under."""

    backend: str
    server: str
    hold_map: str
    address: str
    port: int


def commit_record(run_dir: str, owner: str) -> str:
    """The commit's record on the source (`owner`: the run's, services/owned.py), left by the commit before the
    target takes writes; the sweep of leftovers passes over this run's own (it keeps this run's tag)."""
    return f"{run_dir.rstrip('/')}/{RECORD_PREFIX}{owner}"


def record_probe(record: str) -> str:
    """Shell: whether the commit recorded itself (a resumed run asks before anything else), and when (the record's
    time on the source: when the clients were served again). A record a settle cancelled is no commit."""
    rec = shlex.quote(record)
    return (
        f'if [ -e {rec} ] && [ "$(cat {rec} 2>/dev/null)" != {CANCELLED} ]; '
        f"then echo {RECORDED} $(date -r {rec} +%s.%N); fi"
    )


def settle_probe(record: str) -> str:
    """Shell: the commit sent to the source decided once and for all, before a run that failed or was interrupted
    at its commit decides anything (a rollback would lose what a target that took writes was told). The record's
    name is claimed for a cancellation, atomically (a hard link fails where the name exists): a commit still on its
    way then finds it taken and does nothing. Where the commit claimed it first, it is recorded (its time printed),
    whatever it is still doing: the run is committed. Prints CANCEL_REFUSED when the name can be neither claimed nor
    read."""
    rec = shlex.quote(record)
    claim = shlex.quote(record + ".cancel")
    return (
        f"if [ ! -e {rec} ]; then t={claim}.$$; echo {CANCELLED} >$t && ln $t {rec} 2>/dev/null; rm -f $t; fi; "
        f"if [ ! -e {rec} ]; then echo {CANCEL_REFUSED}; "
        f'elif [ "$(cat {rec} 2>/dev/null)" = {CANCELLED} ]; then echo {CANCELLED}; '
        f"else echo {RECORDED} $(date -r {rec} +%s.%N); fi"
    )


def recorded(stdout: str) -> bool:
    return RECORDED in stdout.split()


def recorded_at(stdout: str) -> float | None:
    """The record's time on the source from a probe's answer (None: not recorded, or no time said)."""
    words = stdout.split()
    if RECORDED not in words:
        return None
    at = words.index(RECORDED) + 1
    try:
        return float(words[at]) if at < len(words) else None
    except ValueError:
        return None


def commit_script(
    socket_path: str,
    hold_map: str,
    hold: HoldToCheck | None,
    guard_dir: str | None,
    record: str,
    *,
    fence_on_target: str | None,
    forward: Forward,
) -> str:
    """The whole commit in one command on the source: the hold checked on the local socket (None: nothing held to
    check); only if it stands, the guard's `committed` marker (None: no guard), the commit's record, then the target's
    fence lifted over the hop (`fence_on_target`: the whole ssh command line; None: no fence) and, only once it is,
    the door repointed and released in one batch, read back.

    It runs in a session of its own (setsid), its output in a file beside the record that is printed once it ends:
    should the SSH connection drop (the orchestrator killed), the commit it began still ends, and leaves a service
    that serves."""
    mark = f"{guard.marker_command(guard_dir, guard.COMMITTED)} && " if guard_dir else ""
    rec = shlex.quote(record)
    door = _door(socket_path, forward_commands(forward))
    if fence_on_target is None:
        lift = door
    else:
        lift = f'{fence_on_target} </dev/null 2>&1; rc=$?; echo "{FENCE_EXIT}$rc"; if [ "$rc" -eq 0 ]; then {door}; fi'
    # The record's name is claimed (noclobber: O_EXCL): a run that cancelled this commit (settle_probe) took it first.
    commit = (
        f"{mark}{{ set -C; : > {rec}; }} 2>/dev/null && set +C && echo {MARKED} && echo {RECORDED} && {{ {lift}; }}"
    )
    if hold is None:
        inner = commit
    else:
        # One awk reads the pid and the hold's deadline from the answer and compares both (one process, not three).
        check = (
            f"awk -v pid={shlex.quote(hold.pid)} -v key={hold.key} -v d={hold.deadline!r} "
            '\'$1 == "Pid:" { p = $2 } $2 == key && u == "" { u = $3 } '
            'END { x = u - d; if (x < 0) x = -x; exit !(p == pid && u != "" && x <= '
            f"{DEADLINE_TOLERANCE}) }}'"
        )
        inner = (
            f"ans=$({_door(socket_path, check_commands(hold_map))}); printf '%s\\n' \"$ans\"; "
            f"if printf '%s\\n' \"$ans\" | {check}; then echo {HOLD_OK} && {commit}; fi"
        )
    out = shlex.quote(record + ".out")
    return f"setsid -w sh -c {shlex.quote(inner)} >{out} 2>&1 </dev/null; cat {out}; rm -f {out}"


def forward_commands(to: Forward) -> list[str]:
    """What FrontDoor.forward sends: the request count, the repoint, both holds cleared, the server read back."""
    return ["show stat", f"set server {to.backend}/{to.server} addr {to.address} port {int(to.port)}",
            f"set map {to.hold_map} {HOLD_KEY} 0", f"set map {to.hold_map} {HOLD_WRITES_KEY} 0",
            f"show servers state {to.backend}"]  # fmt: skip


def fence_command_on_target(hop_ssh: str, login: str, command: str, *, sudo: bool) -> str:
    """The target's fence command as the source runs it over the hop (through sudo when the target's plan says)."""
    remote = shlex.join(["sudo", "-n", "--", "sh", "-c", command]) if sudo else command
    return f"{hop_ssh} {shlex.quote(login)} {shlex.quote(remote)}"


# --- parsing ---------------------------------------------------------------------------------------------------


class DoorUnanswered(Exception):
    """socat could not reach the door, or its answer is cut short."""


def split_answers(text: str, count: int) -> list[str]:
    """A non-interactive answer to `count` commands: each answer ends with an empty line (an answer of nothing is
    the empty line alone)."""
    answers: list[str] = []
    rest = text
    for _ in range(count):
        if rest.startswith("\n"):
            answers.append("")
            rest = rest[1:]
            continue
        end = rest.find("\n\n")
        if end < 0:
            raise DoorUnanswered(f"the door answered {len(answers)} of {count} commands")
        answers.append(rest[: end + 1])
        rest = rest[end + 2 :]
    return answers


def door_answers(stdout: str, count: int) -> list[str]:
    """The framed answer in a script's output, split per command."""
    begin = stdout.find(DOOR_BEGIN + "\n")
    end = stdout.find(DOOR_EXIT, begin)
    if begin < 0 or end < 0:
        raise DoorUnanswered("no answer from the door on the source")
    body = stdout[begin + len(DOOR_BEGIN) + 1 : end]
    status = stdout[end + len(DOOR_EXIT) :].split("\n", 1)[0].strip()
    if status != "0":
        said = body.strip().splitlines()[-1] if body.strip() else "no message"
        raise DoorUnanswered(f"socat on the source exited {status}: {said}")
    return split_answers(body, count)


@dataclass(frozen=True)
class CheckOutcome:
    marked: bool  # the guard was told (the hold stood, or there was none to check)
    pid: str | None = None  # what the door answered (None: not asked)
    until: float | None = None


def parse_check(stdout: str, hold: HoldToCheck | None) -> CheckOutcome:
    """What the hold's check did (and whether the commit was recorded after it). Raises DoorUnanswered when the door
    could not be read (nothing was marked then)."""
    marked = MARKED in stdout.split()
    if hold is None:
        return CheckOutcome(marked)
    info, held = door_answers(stdout, 2)
    entries = parse_map(held)
    if hold.key not in entries:
        raise HaproxyRefused(f"show map (the {hold.key} entry)", held.strip() or f"no {hold.key} entry")
    try:
        until = float(entries[hold.key])
    except ValueError:
        raise HaproxyRefused("show map", f"{hold.key} is {entries[hold.key]!r}") from None
    return CheckOutcome(marked, parse_info(info).get("Pid", ""), until)


@dataclass(frozen=True)
class ForwardOutcome:
    fence_lifted: bool | None  # None: no fence to lift
    fence_said: str = ""
    requests: int | None = None  # the frontend's request count just before the repoint (None: not forwarded)
    door_error: str | None = None  # why the door did not forward (None: it did, read back)


def parse_forward(stdout: str, *, fenced: bool, frontend: str, forward: Forward) -> ForwardOutcome:
    """What command 3 did: the fence's exit, then the door's answers checked as FrontDoor.forward checks them."""
    lifted: bool | None = None
    said = ""
    if fenced:
        head, found, tail = stdout.partition(FENCE_EXIT)
        if not found:
            return ForwardOutcome(False, "the fence command's status did not come back")
        status = tail.split("\n", 1)[0].strip()
        lifted = status == "0"
        said = head.strip().splitlines()[-1] if head.strip() else ""
        if not lifted:
            return ForwardOutcome(False, said or f"exit {status}")
    commands = forward_commands(forward)
    server, address, port = forward.server, forward.address, int(forward.port)
    try:
        answers = door_answers(stdout, len(commands))
        requests = requests_of(answers[0], frontend)
        check_answer(commands[1], answers[1])
        check_answer(commands[2], answers[2])
        if answers[3].strip() and answers[3].strip() != MISSING_ENTRY:
            raise HaproxyRefused(commands[3], answers[3])
        state = next((s for s in parse_servers_state(answers[4]) if s.server == server), None)
        if state is None or (state.address, state.port) != (address, port):
            where = "no such server" if state is None else f"the server still points at {state.address}:{state.port}"
            raise HaproxyRefused(commands[1], where)
    except (DoorUnanswered, HaproxyRefused, ValueError) as exc:
        return ForwardOutcome(lifted, said, None, str(exc))
    return ForwardOutcome(lifted, said, requests, None)


def parse_commit(
    stdout: str, hold: HoldToCheck | None, *, fenced: bool, frontend: str, forward: Forward
) -> tuple[CheckOutcome, ForwardOutcome | None]:
    """What `commit_script` did: the hold's check (and whether the commit was recorded), then, when it was, the fence
    and the door (None: not committed, nothing lifted). Raises as parse_check does when the door could not be read."""
    head, marked, tail = stdout.partition(f"{MARKED}\n")
    if not marked:
        return parse_check(head, hold), None
    # Recorded: the source found the hold standing, whatever we make of its answer here.
    try:
        check = parse_check(head + marked, hold)
    except (DoorUnanswered, HaproxyRefused, ValueError):
        check = CheckOutcome(True, None if hold is None else hold.pid, None if hold is None else hold.deadline)
    return check, parse_forward(tail.removeprefix(f"{RECORDED}\n"), fenced=fenced, frontend=frontend, forward=forward)
