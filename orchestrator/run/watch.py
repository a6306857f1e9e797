"""`migrate status --watch`: follow a run from another terminal, from its journal and its log, until it ends.

Reads only: the journal (the run's truth), the lock file (who runs it; never taken) and the run's JSON-lines log
(the latest transfer updates and replication lag). Each look is a `WatchView`; `watch` yields one per interval
until the run has ended, and the last one carries the exit code the run's own `migrate apply` gave (or would give).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import exit_codes
from orchestrator.engine.events import GateDeclined
from orchestrator.engine.journal import RunState, RunStatus
from orchestrator.engine.view import JournalView, Records
from orchestrator.output.progress import LAG_KEY, PROGRESS_KEY, TRANSFER_EVENT, Phase, TransferProgress, phase_of
from orchestrator.results import AuditResult
from orchestrator.run.commands import status
from orchestrator.run.policy import subject
from orchestrator.run.results import StatusReport
from orchestrator.services import dns_where

WATCH_INTERVAL = 1.0


@dataclass
class LogTail:
    """The new complete lines of a JSON-lines log since the last look (a torn last line waits for its end)."""

    path: Path | None = None
    offset: int = 0
    transfers: dict[str, TransferProgress] = field(default_factory=dict)
    lag: float | None = None
    events: list[str] = field(default_factory=list)  # warnings and errors seen in this look

    def follow(self, path: Path) -> None:
        if path != self.path:
            self.path, self.offset = path, 0
            self.transfers.clear()
        self.events = []
        try:
            with path.open("rb") as log:
                log.seek(self.offset)
                chunk = log.read()
        except FileNotFoundError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for raw in complete.splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                self._take(record)

    def _take(self, record: dict[str, Any]) -> None:
        if isinstance(record.get(LAG_KEY), int | float):
            self.lag = float(record[LAG_KEY])
        if record.get("event") == TRANSFER_EVENT and isinstance(record.get(PROGRESS_KEY), dict):
            item = TransferProgress.of(record[PROGRESS_KEY], step=record.get("step"))
            if item.state == "done":
                self.transfers.pop(item.id, None)
            else:
                self.transfers[item.id] = item
        elif record.get("level") in ("warning", "error"):
            self.events.append(f"{record.get('level', 'info')}: {record.get('step') or '-'}: {record.get('event')}")


@dataclass
class WatchView:
    report: StatusReport
    phase: Phase
    transfers: list[TransferProgress]
    log_lines: list[str]
    ended: bool
    exit_code: int | None = None
    waiting_for_start: bool = False


def outcome_code(state: RunState, events: Records) -> int:
    """The exit code of a run that is not running: what its `migrate apply` returned (or would have)."""
    if state.status in (RunStatus.COMPLETED, RunStatus.ROLLED_BACK) and dns_where.end_problem(events, state):
        return exit_codes.NEEDS_ATTENTION  # it did its part, but its end reading found DNS split or pointing away
    if state.status == RunStatus.COMPLETED:
        audit = state.steps.get("audit")
        if audit is not None and AuditResult.of(audit.result).needs_attention:
            return exit_codes.NEEDS_ATTENTION  # completed, but the after-commit audit found a difference
        return exit_codes.OK
    if state.status == RunStatus.ROLLED_BACK:
        return exit_codes.FAILED
    if isinstance(JournalView.of(events).last(), GateDeclined):
        return exit_codes.REFUSED
    return exit_codes.NEEDS_ATTENTION  # a failed compensation, a failure after the flip, or an interrupted run


def look(plan_path: Path, tail: LogTail, *, state_dir: Path | None = None, reverse: bool = False) -> WatchView:
    subj = subject(plan_path, reverse=reverse, state_dir=state_dir)
    # The journal's DNS reading: a live read at every look would query the API once a second.
    report = status(plan_path, state_dir=state_dir, reverse=reverse, live_dns=False)
    events = JournalView.read(subj.journal_path)
    state = report.state
    if state is not None:
        tail.follow(subj.state_dir / f"run-{state.run_id}.log.jsonl")
    order = [row.name for row in report.rows]
    phase = phase_of(state, events, order, subj.plan.cutover.max_write_block, tail.lag)
    running = report.holder is not None
    # Nobody holds the lock: the run has ended (completed, rolled back, declined, or stopped needing attention).
    ended = state is not None and (state.status in (RunStatus.COMPLETED, RunStatus.ROLLED_BACK) or not running)
    return WatchView(
        report=report,
        phase=phase,
        transfers=list(tail.transfers.values()) if running else [],
        log_lines=list(tail.events),
        ended=ended,
        exit_code=outcome_code(state, events) if ended and state is not None else None,
        waiting_for_start=state is None,
    )


def watch(
    plan_path: Path,
    *,
    state_dir: Path | None = None,
    reverse: bool = False,
    interval: float = WATCH_INTERVAL,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[WatchView]:
    """One view per `interval` until the run ends (a plan with no run yet: until one starts and ends)."""
    tail = LogTail()
    while True:
        view = look(plan_path, tail, state_dir=state_dir, reverse=reverse)
        yield view
        if view.ended:
            return
        sleep(interval)
