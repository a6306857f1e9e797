"""The downtime window: how long writes have been blocked, against `cutover.max_write_block`.

One object per run (`Runtime.window`), handed to every step as `ctx.window`. It is started by the step that blocks
writes (`begin`, at the moment it journals as `writes_blocked_at`); a run resumed in another process recalls that
moment from the journal (`bind`), so the budget keeps counting from the first fence, not from the resume.

Every action inside the window asks it for its bound:
- `remaining()`: seconds left of the budget (None while writes flow);
- `timeout(cap)`: the timeout of the next action: what is left, at most `cap`, never below one floor (`FLOOR`);
- `bounded(policy)`: a retry policy whose tries end when the budget does;
- `check(what)`: the StepError that fails the step once the budget is spent (naming cutover.max_write_block).

Made to grow into a hard budget: `reserve` keeps seconds back for the rollback's own work, and the budget counts
only time actually blocked (`lift` closes an interval, `begin` opens the next one: a fence lifted between lock
attempts does not count while writes flow).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from orchestrator.engine.events import StepCompleted, StepSaved
from orchestrator.engine.step import StepError
from orchestrator.engine.view import JournalView, Records
from orchestrator.plan.model import Retry

# The shortest timeout given to an action inside the window: even an action started with a few milliseconds of
# budget left gets a real deadline (and fails on it) rather than a zero timeout that would mean "no wait".
FLOOR = 0.1
# The journal keys the step that blocks writes saves (step_saved events), and its result carries: the first
# moment writes were blocked, each moment they flowed again (a fence lifted between lock attempts, or by the
# rollback), each moment they were blocked again, and the seconds kept back for the rollback's own work.
BLOCKED_AT_KEY = "writes_blocked_at"
LIFTED_AT_KEY = "writes_lifted_at"
BLOCKED_AGAIN_AT_KEY = "writes_blocked_again_at"
RESERVE_KEY = "rollback_reserve"

# The rollback's reserve: this share of the budget, at least RESERVE_MIN s (a database start and two commands),
# at most RESERVE_MAX s.
RESERVE_SHARE = 0.25
RESERVE_MIN = 8.0
RESERVE_MAX = 30.0

History = Callable[[], JournalView]
P = TypeVar("P", bound=Retry)


def journaled_blocked_at(events: Records) -> float | None:
    """The first moment writes were blocked in the journal's last run, or None."""
    for ev in JournalView.of(events).last_run():
        if isinstance(ev, StepSaved) and ev.key == BLOCKED_AT_KEY and ev.value:
            return float(ev.value)
        if isinstance(ev, StepCompleted) and ev.result.get(BLOCKED_AT_KEY):
            return float(ev.result[BLOCKED_AT_KEY])
    return None


def journaled_intervals(events: Records) -> list[list[float | None]]:
    """The intervals writes were blocked in the journal's last run, [start, end] (end None: blocked still)."""
    intervals: list[list[float | None]] = []
    for ev in JournalView.of(events).last_run():
        if isinstance(ev, StepCompleted) and not intervals and ev.result.get(BLOCKED_AT_KEY):
            intervals.append([float(ev.result[BLOCKED_AT_KEY]), None])
        if not isinstance(ev, StepSaved) or ev.value in (None, False):
            continue
        open_now = bool(intervals) and intervals[-1][1] is None
        if (ev.key == BLOCKED_AT_KEY and not intervals) or (ev.key == BLOCKED_AGAIN_AT_KEY and not open_now):
            intervals.append([float(ev.value), None])
        elif ev.key == LIFTED_AT_KEY and open_now:
            intervals[-1][1] = float(ev.value)
    return intervals


def journaled_reserve(events: Records) -> float | None:
    """The seconds the run kept back for its rollback's own work, as journaled (None: not yet)."""
    found = None
    for value in JournalView.of(events).last_run().saved_values(None, RESERVE_KEY):
        if value is not None:
            found = float(value.get("seconds", 0.0) or 0.0) if isinstance(value, dict) else None
    return found


def blocked_seconds(intervals: list[list[float | None]], now: float) -> float:
    """Seconds writes were blocked over these intervals (an open one counts until `now`)."""
    return sum(max(0.0, (end if end is not None else now) - start) for start, end in intervals)  # type: ignore[operator,misc]  # an interval always has its start; only its end may be open


# The rollback's measured work is multiplied by this (a loaded host, a slow API answer) before it is kept back.
RESERVE_SAFETY = 1.5
# What the rollback does, in round trips: on the source, the stop's finish, the start, the fence lifted, the guard
# told and its trace read; on the target, its fence again and its services and database stopped; on the source
# database, the answer awaited and read_only turned off; on the DNS API, a read and an edit of every record.
ROLLBACK_SOURCE_COMMANDS = 5
ROLLBACK_TARGET_COMMANDS = 4
ROLLBACK_DB_ROUND_TRIPS = 4
# A database start that could not be measured (no error log to read): this allowance is counted instead.
DB_START_ALLOWANCE = 5.0


def reserve_from(measured: dict[str, float | None], records: int, max_seconds: float) -> tuple[float, str] | None:
    """The rollback's reserve from what this run measured before the window, and how it was derived; None when the
    round trips could not be measured (then `estimate_reserve` stands, saying so).

    measured: `ssh_source_s`, `ssh_target_s`, `db_round_trip_s`, `dns_read_s` (a read of every record),
    `db_start_s` (the source database's last start, from its error log; None: not known). The work is the sum of
    each round trip times how often the rollback makes it, plus the database's start; the reserve is that times
    RESERVE_SAFETY, at least the old estimate's floor (min(RESERVE_MIN, budget/2): a start nothing measured may be
    slower than the last), at most min(RESERVE_MAX, budget/2)."""
    ssh_source, ssh_target = measured.get("ssh_source_s"), measured.get("ssh_target_s")
    if ssh_source is None or ssh_target is None:
        return None
    db_rtt = measured.get("db_round_trip_s") or 0.0
    dns = measured.get("dns_read_s") or 0.0
    start = measured.get("db_start_s")
    if start is None:
        start, start_said = DB_START_ALLOWANCE, f"database start not measurable, {DB_START_ALLOWANCE:g} s allowed"
    else:
        start_said = f"database start {start:g} s (its last, from the error log)"
    work = (
        ssh_source * ROLLBACK_SOURCE_COMMANDS
        + ssh_target * ROLLBACK_TARGET_COMMANDS
        + db_rtt * ROLLBACK_DB_ROUND_TRIPS
        + dns * 2
        + start
    )
    floor, cap = min(RESERVE_MIN, max_seconds / 2), min(RESERVE_MAX, max_seconds / 2)
    seconds = round(min(max(work * RESERVE_SAFETY, floor), cap), 3)
    basis = (
        f"measured: the rollback's work {work:.2f} s (SSH source {ssh_source * 1000:.0f} ms x "
        f"{ROLLBACK_SOURCE_COMMANDS}, SSH target {ssh_target * 1000:.0f} ms x {ROLLBACK_TARGET_COMMANDS}, database "
        f"{db_rtt * 1000:.0f} ms x {ROLLBACK_DB_ROUND_TRIPS}, DNS read of {records} record(s) {dns * 1000:.0f} ms x 2, "
        f"{start_said}) x {RESERVE_SAFETY:g}, kept within [{floor:g}, {cap:g}] s"
    )
    return seconds, basis


def estimate_reserve(max_seconds: float) -> float:
    """Seconds to keep back for the rollback's own work (start the source database, lift the fence, restore DNS):
    a share of the budget, at least RESERVE_MIN (never more than half the budget), at most RESERVE_MAX."""
    return round(min(max(max_seconds * RESERVE_SHARE, min(RESERVE_MIN, max_seconds / 2)), RESERVE_MAX), 3)


class DowntimeWindow:
    def __init__(self, max_seconds: float, *, reserve: float = 0.0, clock: Callable[[], float] = time.time) -> None:
        self.max_seconds = max_seconds
        # Seconds kept back for the rollback's own work: the actions inside the window may use the rest.
        self.reserve = reserve
        self._clock = clock
        # Intervals during which writes were blocked: [start, end]; end None while blocked now.
        self._intervals: list[list[float | None]] = []
        self._history: History | None = None

    # --- opening and closing

    def begin(self, at: float | None = None) -> float:
        """Writes are blocked from `at` (now by default); a no-op returning the start while already blocked."""
        self._recall()
        if self._intervals and self._intervals[-1][1] is None:
            return float(self._intervals[-1][0])  # type: ignore[arg-type]  # an interval always has its start
        start = self._clock() if at is None else at
        self._intervals.append([start, None])
        return start

    def lift(self, at: float | None = None) -> None:
        """Writes flow again from `at`: the time until the next `begin` does not count against the budget."""
        self._recall()
        if self._intervals and self._intervals[-1][1] is None:
            self._intervals[-1][1] = self._clock() if at is None else at

    def bind(self, history: History) -> DowntimeWindow:
        """Recall, from the run's journal, a window begun in an earlier process (read lazily, once)."""
        if not self._intervals:
            self._history = history
        return self

    def _recall(self) -> None:
        history, self._history = self._history, None
        if history is not None and not self._intervals:
            events = history()
            self._intervals = journaled_intervals(events)
            reserve = journaled_reserve(events)
            if reserve is not None:
                self.reserve = reserve

    @property
    def blocked_now(self) -> bool:
        self._recall()
        return bool(self._intervals) and self._intervals[-1][1] is None

    def intervals(self) -> list[list[float | None]]:
        self._recall()
        return [list(i) for i in self._intervals]

    # --- what steps ask

    @property
    def blocked_at(self) -> float | None:
        """When writes were first blocked in this run (None: they never were)."""
        self._recall()
        return float(self._intervals[0][0]) if self._intervals else None  # type: ignore[arg-type]  # as above

    def elapsed(self) -> float | None:
        """Seconds writes have been blocked so far (None: never)."""
        self._recall()
        if not self._intervals:
            return None
        return blocked_seconds(self._intervals, self._clock())

    def remaining(self) -> float | None:
        """Seconds the actions inside the window may still take (None while writes were never blocked)."""
        elapsed = self.elapsed()
        return None if elapsed is None else self.max_seconds - self.reserve - elapsed

    def timeout(self, cap: float | None = None) -> float | None:
        """The timeout of the next action: what is left (at least FLOOR), at most `cap`; `cap` outside the window."""
        remaining = self.remaining()
        if remaining is None:
            return cap
        bounded = max(remaining, FLOOR)
        return bounded if cap is None else min(cap, bounded)

    def bounded(self, policy: P) -> P:
        """The retry policy with its tries ending when the budget does (retries count against the budget)."""
        left = self.timeout()
        return policy if left is None else policy.model_copy(update={"max_seconds": left})

    def check(self, what: str) -> None:
        """StepError once writes have been blocked longer than allowed; a no-op while writes flow."""
        elapsed = self.elapsed()
        if elapsed is not None and elapsed > self.max_seconds - self.reserve:
            kept = f" less the {self.reserve:g} s kept for the rollback" if self.reserve else ""
            raise StepError(
                f"writes blocked for {elapsed:.1f} s, more than cutover.max_write_block"
                f" {self.max_seconds:g} s{kept} (while {what})"
            )
