"""Copies the live site does not feel: a long command on the source paused (SIGSTOP of its process group) while the
source is loaded or the live app answers slowly, and resumed (SIGCONT) once it is not, like gh-ost's --max-load.

The command runs in a process group of its own (setsid), whose id it writes to a marker file first, so a watcher
can pause and resume it, and its ssh child to the target with it, as a whole. With a load threshold it also checks
the load itself before it starts and, above it, stops itself at once: a short copy cannot slip through before the
watcher's first look. Used by the pre-syncs (rsync) and the seed (mariadb-backup).

A pause lasts until every reading is back under its threshold, or `max_pause` has passed, or the caller's own bound
says it must end (the seed: the source's redo log); after a pause cut short the command runs for at least one check
interval, so a copy on a host that is always busy still progresses. `max_pause` is a bound, not a wish: on a loaded
host one load check or one signal over SSH takes a second, and a latency probe up to MAX_PROBE_SECONDS, so the resume
is sent early by what the last check and signal took, and a probe never waits past the pause's end.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from orchestrator.plan.model import Plan
from orchestrator.transports.ssh import TransportError

if TYPE_CHECKING:
    from orchestrator.contracts import Host

_NOCACHE = 'if command -v nocache >/dev/null 2>&1; then exec nocache sh -c "$2"; else exec sh -c "$2"; fi'
_PLAIN = 'exec sh -c "$2"'
_STOP_IF_LOADED = (
    'read load _ < /proc/loadavg; if awk -v l="$load" -v m="$3" \'BEGIN { exit !(l > m) }\'; then kill -STOP $$; fi; '
)
MAX_PAUSE_REASON = "longest pause (transfer.max_pause)"
# The longest one latency probe may wait, whatever the threshold (a probe that times out counts as slow).
MAX_PROBE_SECONDS = 10.0


def live_command(command: str, *, nocache: bool, group_marker: str | None, max_load: float | None = None) -> str:
    """A command wrapped for the live source: in `nocache` when asked and the source has it (its reads then leave
    the service's page cache alone; rsync has no such option itself), and, with `group_marker`, in a process group
    of its own whose id is written to that file (setsid -w waits for it and returns its exit status), stopped
    from the start when the load is above `max_load`."""
    run = _NOCACHE if nocache else _PLAIN
    if group_marker is None:
        return f"sh -c {shlex.quote(run)} sh - {shlex.quote(command)}" if nocache else command
    script = 'echo $$ > "$1"; ' + (_STOP_IF_LOADED if max_load is not None else "") + run
    limit = repr(float(max_load)) if max_load is not None else "-"
    return f"setsid -w sh -c {shlex.quote(script)} sh {shlex.quote(group_marker)} {shlex.quote(command)} {limit}"


def parse_load_check(output: str) -> tuple[float, int | None, str]:
    """A load check's output: /proc/loadavg's line, then the group id from the marker file (once written) and the
    state of the group's leader (T: stopped)."""
    lines = output.splitlines()
    if not lines:
        raise TransportError("no answer from the source's load check", True)
    fields = lines[0].split()
    try:
        load = float(fields[0])
    except (IndexError, ValueError):
        raise TransportError(f"unexpected /proc/loadavg: {lines[0][:80]}", True) from None
    group = lines[1].strip() if len(lines) > 1 else ""
    state = lines[2].strip() if len(lines) > 2 else ""
    return load, int(group) if group.isdigit() and int(group) > 1 else None, state


@dataclass(frozen=True)
class Thresholds:
    """When a live copy pauses (from the plan's `transfer` section)."""

    max_load: float | None = None
    max_latency_ms: float | None = None
    latency_url: str | None = None
    latency_host_header: str | None = None
    interval: float = 2.0
    max_pause: float = 30.0

    @classmethod
    def of(cls, plan: Plan) -> Thresholds | None:
        """The plan's thresholds, None when it sets neither (the copy is never paused)."""
        transfer = plan.transfer
        if transfer.max_load is None and transfer.max_latency_ms is None:
            return None
        probe = plan.latency_probe() if transfer.max_latency_ms is not None else None
        return cls(
            max_load=transfer.max_load,
            max_latency_ms=transfer.max_latency_ms if probe is not None else None,
            latency_url=probe[0] if probe else None,
            latency_host_header=probe[1] if probe else None,
            interval=transfer.load_check_interval,
            max_pause=transfer.max_pause,
        )

    @property
    def probe_timeout(self) -> float:
        """A probe waits twice the threshold (at least 1 s, at most MAX_PROBE_SECONDS): slower is slow enough."""
        limit = (self.max_latency_ms or 0.0) / 1000 * 2
        return min(MAX_PROBE_SECONDS, max(1.0, limit))


def pause_reason(load: float | None, latency_ms: float | None, thresholds: Thresholds) -> str | None:
    """Why the copy should be paused now, or None: the first reading above its threshold."""
    if thresholds.max_load is not None and load is not None and load > thresholds.max_load:
        return f"load {load:g} > max_load {thresholds.max_load:g}"
    if thresholds.max_latency_ms is not None and latency_ms is not None and latency_ms > thresholds.max_latency_ms:
        return f"app latency {latency_ms:.0f} ms > max_latency_ms {thresholds.max_latency_ms:g}"
    return None


def measure_latency(url: str, host_header: str | None, timeout: float) -> float:
    """Milliseconds until the live app answered one GET (any HTTP status is an answer: a fenced app's 503 too); a
    request that fails or times out counts as `timeout` (slow). No proxy: the app's own latency is measured."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers={"Host": host_header} if host_header else {})
    started = time.monotonic()
    try:
        with opener.open(request, timeout=timeout) as answer:
            answer.read(65536)
    except urllib.error.HTTPError as exc:
        exc.close()
    except (urllib.error.URLError, OSError, ValueError):
        return timeout * 1000
    return (time.monotonic() - started) * 1000


class Throttle:
    """Watches the source (load, the group's state) and the live app (latency) while a command runs in the group
    named by `marker`, pausing and resuming it; counts the time it spent paused.

    `may_not_stop`: a shell condition, run on the source, true while the command must not be stopped (the seed: once
    mariadb-backup begins the stages that lock the live server). `on_pause` is called as each pause begins and
    `must_resume`, asked during a pause, says why it must end now (the seed: the redo log the source wrote since the
    pause began), or None.
    """

    def __init__(
        self,
        host: Host,
        marker: str,
        thresholds: Thresholds,
        *,
        what: str,
        may_not_stop: str | None = None,
        on_pause: Callable[[], None] | None = None,
        must_resume: Callable[[], str | None] | None = None,
        paused_check_interval: float | None = None,
        measure: Callable[[str, str | None, float], float] = measure_latency,
    ) -> None:
        self.host, self.marker, self.thresholds, self.what = host, marker, thresholds, what
        self.may_not_stop, self.on_pause, self.must_resume = may_not_stop, on_pause, must_resume
        self.measure = measure
        self.paused_check_interval = min(thresholds.interval, paused_check_interval or thresholds.interval)
        self.throttled_seconds = 0.0
        self.pauses = 0
        self.highest_load = 0.0
        self.highest_latency_ms = 0.0
        self.longest_pause = 0.0
        self.causes: dict[str, int] = {}  # "load" / "latency" / "at start": pauses by what caused them
        self.resumed_for: dict[str, int] = {}  # why pauses ended
        self._group: int | None = None
        self._paused_at: float | None = None
        # What the last load check and the last signal took (SSH round trips on the source): a pause's end is
        # planned that much ahead, so the resume lands by `max_pause`.
        self._check_seconds = 0.0
        self._signal_seconds = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="throttle", daemon=True)
        self._log = structlog.get_logger()

    def __enter__(self) -> Throttle:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=60)
        if self._paused_at is not None:
            self._resume("copy ended")
        with contextlib.suppress(TransportError):
            self.host.run(f"rm -f {shlex.quote(self.marker)}", timeout=30, check=False)

    def figures(self) -> dict[str, object]:
        return {
            "throttled_seconds": round(self.throttled_seconds, 3),
            "pauses": self.pauses,
            "causes": dict(self.causes),
            "resumed_for": dict(self.resumed_for),
            "highest_load": self.highest_load,
            "highest_latency_ms": round(self.highest_latency_ms, 1),
            "longest_pause_seconds": round(self.longest_pause, 3),
        }

    def _signal(self, signal: str, group: int) -> bool:
        """Signal every process of the group; True once delivered. The external kill: dash's builtin refuses a
        negative process-group id. A stop is refused while `may_not_stop` holds (checked in the same command)."""
        command = f"env kill -{signal} -- -{group} 2>/dev/null && echo delivered; true"
        if signal == "STOP" and self.may_not_stop:
            command = f"if {self.may_not_stop}; then echo refused; else {command}; fi"
        started = time.monotonic()
        try:
            return self.host.run(command, timeout=30, check=False).stdout.strip() == "delivered"
        finally:
            self._signal_seconds = time.monotonic() - started

    def _forbidden_now(self) -> bool:
        if not self.may_not_stop:
            return False
        answer = self.host.run(f"if {self.may_not_stop}; then echo yes; fi; true", timeout=30, check=False)
        return answer.stdout.strip() == "yes"

    def _resume(self, why: str) -> None:
        assert self._paused_at is not None and self._group is not None
        with contextlib.suppress(TransportError):
            self._signal("CONT", self._group)
        paused = time.monotonic() - self._paused_at
        self.throttled_seconds += paused
        self.longest_pause = max(self.longest_pause, paused)
        self._paused_at = None
        self.resumed_for[why] = self.resumed_for.get(why, 0) + 1
        self._log.info("throttle_resumed", what=self.what, why=why, paused_seconds=round(paused, 3))

    def _left(self) -> float:
        """Seconds the current pause may still last before its resume must be sent."""
        assert self._paused_at is not None
        return self.thresholds.max_pause - (time.monotonic() - self._paused_at) - self._signal_seconds

    def _latency(self, limit: float | None = None) -> float | None:
        """The app's latency; `limit`: the longest the probe may wait (during a pause, what is left of it: a probe
        that cannot answer in time counts as slow, and the pause ends at its bound)."""
        t = self.thresholds
        if t.max_latency_ms is None or t.latency_url is None:
            return None
        timeout = t.probe_timeout if limit is None else max(0.01, min(t.probe_timeout, limit))
        latency = self.measure(t.latency_url, t.latency_host_header, timeout)
        self.highest_latency_ms = max(self.highest_latency_ms, latency)
        return latency

    def _paused(self, load: float, group: int | None) -> None:
        """One look during a pause: resume, or wait for the next look."""
        assert self._paused_at is not None
        paused_for = time.monotonic() - self._paused_at
        why: str | None = None
        if group != self._group:
            why = "copy ended"
        elif self.must_resume is not None and (bound := self.must_resume()) is not None:
            why = bound
        elif paused_for >= self.thresholds.max_pause or self._left() <= 0:
            why = MAX_PAUSE_REASON
        elif pause_reason(load, self._latency(limit=self._left()), self.thresholds) is None:
            why = "back under the thresholds"
        if why is not None:
            self._resume(why)
            self._done.wait(self.thresholds.interval)  # it runs at least one interval before the next pause
            return
        self._wait_paused()

    def _wait_paused(self) -> None:
        """Until the next look during a pause: a check interval, or less when the pause's bound comes first (the
        next look's own round trip counted)."""
        self._done.wait(max(0.0, min(self.paused_check_interval, self._left() - self._check_seconds)))

    def _watch(self) -> None:
        marker = shlex.quote(self.marker)
        check = (
            f'cat /proc/loadavg; g=$(cat {marker} 2>/dev/null); echo "$g"; '
            "[ -n \"$g\" ] && sed 's/.*) //' /proc/$g/stat 2>/dev/null | cut -d' ' -f1; true"
        )
        t = self.thresholds
        while not self._done.is_set():
            try:
                if self._paused_at is not None and self._left() <= self._check_seconds:
                    # Another look would end past the pause's bound: resume now.
                    self._resume(MAX_PAUSE_REASON)
                    self._done.wait(t.interval)
                    continue
                started = time.monotonic()
                output = self.host.run(check, timeout=30, check=False).stdout
                self._check_seconds = time.monotonic() - started
                load, group, state = parse_load_check(output)
                self.highest_load = max(self.highest_load, load)
                if self._paused_at is not None:
                    self._paused(load, group)
                    continue
                if group is None:
                    self._done.wait(min(t.interval, 0.1))  # the command has not started yet
                    continue
                if state == "T":  # it stopped itself at the start, the load being above the threshold
                    self._group, self._paused_at = group, time.monotonic()
                    self._count("at start", f"load {load:g} > max_load {t.max_load}")
                    if self._forbidden_now():
                        self._resume("the copy may not be paused now")
                    else:
                        self._wait_paused()
                    continue
                reason = pause_reason(load, self._latency(), t)
                if reason is None:
                    self._done.wait(t.interval)
                    continue
                self._group = group
                if self._signal("STOP", group):  # counted only when it reached the group (it may have just ended)
                    self._paused_at = time.monotonic()
                    self._count("load" if reason.startswith("load") else "latency", reason)
                    if self._forbidden_now():  # it entered a stage that must not wait just before the stop
                        self._resume("the copy may not be paused now")
                    else:
                        self._wait_paused()
                    continue
                self._done.wait(min(self.paused_check_interval, t.max_pause))
            except TransportError as exc:
                self._log.warning("throttle_check_failed", what=self.what, error=str(exc))
                self._done.wait(t.interval)

    def _count(self, cause: str, reason: str) -> None:
        if self.on_pause is not None:
            self.on_pause()
        self.pauses += 1
        self.causes[cause] = self.causes.get(cause, 0) + 1
        self._log.info("throttle_paused", what=self.what, reason=reason, cause=cause)


def group_marker(private_dir: str, kind: str = "rsync") -> str:
    """A fresh marker file path on the source for one throttled command's process group, in the run's private
    directory there (plan `run_dir`): nobody else can create or replace it."""
    return f"{private_dir.rstrip('/')}/migrate-{kind}-{uuid.uuid4().hex}.pgid"
