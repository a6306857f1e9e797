"""Live progress as data: transfers (bytes, files, rate, an honest ETA) and the run's phase (step, writes blocked).

Transfers report themselves as log records carrying a `progress` payload (`TransferProgress.payload()`, event
`TRANSFER_EVENT`): the console draws them as bars on a terminal and as plain lines otherwise, the run's JSON log
keeps them as records, and `migrate status --watch` reads the latest ones back from that log. A step that knows the
replication lag logs it as a `replication_lag` field (seconds) on any record; the phase line shows the latest.

The ETA says "estimating" until it can tell (too little time or progress seen, or no total yet) and "stalled" when
no byte moved for a while: it never shows a number computed from a stalled start, which would only climb.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.engine.journal import RunState, RunStatus, StepState
from orchestrator.engine.view import Records
from orchestrator.window import journaled_blocked_at

TRANSFER_EVENT = "transfer_progress"
PROGRESS_KEY = "progress"
LAG_KEY = "replication_lag"
# Records the console leaves out because the bars (or the plain progress lines) already say it.
SUPERSEDED_EVENTS = frozenset({"rsync_progress"})
# The wait of the lower_ttl step (its saved key), shown on the phase line and by `migrate status`.
TTL_STEP, TTL_WAIT_KEY = "lower_ttl", "wait_until"


@dataclass(frozen=True)
class TransferProgress:
    """One update of one transfer (`id` names it across updates, e.g. 'tree uploads', 'datadir round 2')."""

    id: str
    bytes: int
    total: int | None  # estimated total bytes (None until a percentage is known)
    pct: int
    files_done: int | None
    files_total: int | None
    rate: float | None  # bytes per second over the recent window, None while estimating
    eta: float | None  # seconds, None while estimating or stalled
    state: str  # "estimating" | "running" | "stalled" | "done"
    elapsed: float
    throttle: str | None = None  # the bandwidth limit the transfer runs under (e.g. rsync --bwlimit '50M')
    step: str | None = None

    def payload(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def of(cls, payload: dict[str, Any], step: str | None = None) -> TransferProgress:
        fields: dict[str, Any] = {k: payload.get(k) for k in cls.__dataclass_fields__}
        fields["step"] = fields.get("step") or step
        fields["bytes"] = int(fields.get("bytes") or 0)
        fields["pct"] = int(fields.get("pct") or 0)
        fields["state"] = str(fields.get("state") or "estimating")
        fields["elapsed"] = float(fields.get("elapsed") or 0.0)
        fields["id"] = str(fields.get("id") or "transfer")
        return cls(**fields)

    def eta_text(self) -> str:
        if self.state == "done":
            return "done"
        if self.state == "stalled":
            return "stalled"
        if self.eta is None:
            return "estimating"
        return clock_text(self.eta)

    def line(self) -> str:
        """The plain-text form, for a console that is not a terminal."""
        parts = [
            f"{self.id}: {self.pct}%",
            size_text(self.bytes) + (f" of ~{size_text(self.total)}" if self.total else ""),
        ]
        if self.files_done is not None:
            parts.append(f"{self.files_done}" + (f"/{self.files_total}" if self.files_total else "") + " files")
        if self.rate is not None:
            parts.append(f"{size_text(int(self.rate))}/s")
        parts.append(f"ETA {self.eta_text()}")
        if self.throttle:
            parts.append(f"limited to {self.throttle}/s")
        return ", ".join(parts)


class EtaEstimator:
    """Rate and ETA from (time, bytes done, percentage) samples.

    The rate is measured over the last `window` seconds of samples (never from the start, so an early stall does
    not drag it down for the rest of the transfer). No ETA before `min_seconds` of samples with bytes moving, nor
    before a percentage gives a total; `stalled` once no byte moved for `stall_after` seconds.
    """

    def __init__(self, *, window: float = 10.0, min_seconds: float = 2.0, stall_after: float = 5.0) -> None:
        self.window = window
        self.min_seconds = min_seconds
        self.stall_after = stall_after
        self._samples: deque[tuple[float, int]] = deque()
        self._started: float | None = None
        self._last_move: float | None = None
        self._eta_at_move: float | None = None

    def update(self, now: float, done: int, pct: int) -> tuple[float | None, float | None, int | None, str]:
        """Returns (rate, eta, estimated total, state)."""
        if self._started is None:
            self._started = now
        moved = not self._samples or done > self._samples[-1][1]
        if moved:
            self._last_move = now
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window:
            self._samples.popleft()
        total = int(done * 100 / pct) if pct > 0 and done > 0 else None
        first_t, first_b = self._samples[0]
        span = now - first_t
        rate = (done - first_b) / span if span >= self.min_seconds else None
        if self._last_move is not None and now - self._last_move >= self.stall_after:
            self._eta_at_move = None
            return 0.0, None, total, "stalled"
        if not moved and self._eta_at_move is not None:
            # Nothing moved since the last estimate: count that one down rather than let a falling rate raise it.
            return rate, max(self._eta_at_move - (now - (self._last_move or now)), 0.0), total, "running"
        if rate is None or rate <= 0 or total is None:
            return rate, None, total, "estimating"
        self._eta_at_move = max(total - done, 0) / rate
        return rate, self._eta_at_move, total, "running"


@dataclass(frozen=True)
class Phase:
    """Where a run stands, for the phase line: the step, writes blocked against the budget, waits, lag."""

    step: str | None
    index: int | None
    count: int
    status: str
    blocked_since: float | None = None
    budget: float | None = None
    ttl_wait_until: float | None = None
    lag: float | None = None

    def line(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        where = "no step running" if self.step is None else f"step {self.index}/{self.count} {self.step}"
        parts = [f"{where} ({self.status})"]
        if self.blocked_since is not None:
            blocked = now - self.blocked_since
            budget = f" of {self.budget:g} s budget" if self.budget else ""
            parts.append(f"writes blocked {blocked:.1f} s{budget}")
        else:
            parts.append("writes flow")
        if self.ttl_wait_until is not None and self.ttl_wait_until > now:
            parts.append(f"waiting out the old DNS TTL: {clock_text(self.ttl_wait_until - now)} left")
        if self.lag is not None:
            parts.append(f"replication lag {self.lag:.1f} s")
        return " · ".join(parts)


def phase_of(
    state: RunState | None, events: Records, order: list[str], budget: float | None, lag: float | None
) -> Phase:
    """The phase of the run a journal describes (`order`: the plan's step names in run order)."""
    if state is None:
        return Phase(None, None, len(order), "not started", budget=budget, lag=lag)
    current = next(
        (n for n in order if state.steps.get(n) and state.steps[n].state in (StepState.RUNNING, StepState.UNDOING)),
        None,
    )
    return Phase(
        step=current,
        index=order.index(current) + 1 if current else None,
        count=len(order),
        status=state.status.value,
        blocked_since=blocked_since(state, events),
        budget=budget,
        ttl_wait_until=ttl_wait_until(state),
        lag=lag,
    )


def blocked_since(state: RunState, events: Records) -> float | None:
    """When writes were blocked, if they are blocked now (until the DNS flip, the commit or the cut-over's undo)."""
    since = journaled_blocked_at(events)
    if since is None or state.committed or state.status in (RunStatus.COMPLETED, RunStatus.ROLLED_BACK):
        return None
    flip = state.steps.get("dns_flip")
    if flip is not None and flip.state == StepState.DONE:
        return None
    undone = [r for r in state.steps.values() if r.state == StepState.UNDONE and r.saved.get("writes_blocked_at")]
    return None if undone else since


def ttl_wait_until(state: RunState) -> float | None:
    """When the cut-over may begin after the lower_ttl step lowered the TTLs (None when it did not, or the run is
    not going forward); it is in the past once the wait is over."""
    rec = state.steps.get(TTL_STEP)
    if rec is None or state.status != RunStatus.RUNNING:
        return None
    value = rec.saved.get(TTL_WAIT_KEY)
    return float(value) if isinstance(value, int | float) else None


def size_text(n: int | None) -> str:
    value = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def clock_text(seconds: float) -> str:
    whole = max(round(seconds), 0)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"
