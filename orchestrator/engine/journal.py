"""The append-only journal of a run, and the run's state as the replay of that history.

Each transition is one JSON line, written, flushed and fsync'd before the engine takes the next action, so a process
killed at any instant (kill -9) leaves a journal that says exactly what was done and what was in flight. A torn last
line (killed mid-write) is ignored: the action it announced had not started yet.

The records' kinds are typed in engine/events.py (the engine appends those); everything else reads the journal
through engine/view.py's `JournalView`.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from orchestrator.engine.events import (
    Committed,
    Event,
    RollbackCompleted,
    RollbackStarted,
    RunCompleted,
    RunResumed,
    RunStarted,
    StepCompleted,
    StepEvent,
    StepFailed,
    StepSaved,
    StepStarted,
    UndoCompleted,
    UndoFailed,
    UndoStarted,
    parse,
)
from orchestrator.redaction import redact_obj


class StepState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    UNDOING = "undoing"
    UNDONE = "undone"
    UNDO_FAILED = "undo_failed"


class RunStatus(StrEnum):
    RUNNING = "running"  # forward, unfinished (resumable)
    ROLLING_BACK = "rolling_back"  # rollback started, unfinished (resumable)
    ROLLED_BACK = "rolled_back"  # terminal: the source serves as before
    ROLLBACK_FAILED = "rollback_failed"  # a compensation failed: `migrate rollback` retries it
    FAILED_AFTER_COMMIT = "failed_after_commit"  # past the DNS flip: resume forward with `migrate apply`
    COMPLETED = "completed"  # terminal


@dataclass
class StepRecord:
    name: str
    state: StepState = StepState.PENDING
    started_at: float | None = None
    ended_at: float | None = None
    result: dict[str, Any] = field(default_factory=dict)
    saved: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    attempts: int = 0
    undo_started_at: float | None = None
    undo_ended_at: float | None = None

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at


@dataclass
class RunState:
    run_id: str
    plan_sha256: str
    plan_path: str
    plan_text: str
    started_at: float
    status: RunStatus = RunStatus.RUNNING
    steps: dict[str, StepRecord] = field(default_factory=dict)
    committed: bool = False
    ended_at: float | None = None
    error: str | None = None
    rollback_reason: str | None = None
    resumes: int = 0

    def step(self, name: str) -> StepRecord:
        if name not in self.steps:
            self.steps[name] = StepRecord(name)
        return self.steps[name]

    @property
    def outputs(self) -> dict[str, dict[str, Any]]:
        return {name: rec.result for name, rec in self.steps.items() if rec.state == StepState.DONE}


def replay(events: Iterable[Mapping[str, Any] | Event]) -> RunState | None:
    """The state of the run recorded in `events` (None for an empty journal); records are typed as they come."""
    state: RunState | None = None
    for ev in events:
        ev = ev if isinstance(ev, Event) else parse(ev)
        if isinstance(ev, RunStarted):
            state = RunState(
                run_id=ev.run_id,
                plan_sha256=ev.plan_sha256,
                plan_path=ev.plan_path,
                plan_text=ev.plan_text,
                started_at=ev.ts,
            )
            for name in ev.steps:
                state.step(name)
            continue
        if state is None:
            continue
        rec = state.step(ev.step) if isinstance(ev, StepEvent) and ev.step else None
        if isinstance(ev, RunResumed):
            state.resumes += 1
            if state.status == RunStatus.FAILED_AFTER_COMMIT:
                state.status = RunStatus.RUNNING
        elif isinstance(ev, StepStarted) and rec:
            rec.state, rec.started_at, rec.ended_at, rec.error = StepState.RUNNING, ev.ts, None, None
            rec.attempts += 1
        elif isinstance(ev, StepSaved) and rec:
            rec.saved[ev.key] = ev.value
        elif isinstance(ev, StepCompleted) and rec:
            rec.state, rec.ended_at, rec.result = StepState.DONE, ev.ts, dict(ev.result)
            if ev.commit_point:
                state.committed = True
        elif isinstance(ev, Committed):
            state.committed = True
            if state.status in (RunStatus.ROLLING_BACK, RunStatus.ROLLBACK_FAILED):
                # Found committed while rolling back (a commit made elsewhere before the run stopped): forward.
                state.status = RunStatus.FAILED_AFTER_COMMIT
        elif isinstance(ev, StepFailed) and rec:
            rec.state, rec.ended_at, rec.error = StepState.FAILED, ev.ts, ev.error
            state.error = ev.error
            if state.committed:
                state.status = RunStatus.FAILED_AFTER_COMMIT
        elif isinstance(ev, RollbackStarted):
            state.status = RunStatus.ROLLING_BACK
            state.rollback_reason = ev.reason
        elif isinstance(ev, UndoStarted) and rec:
            rec.state, rec.undo_started_at = StepState.UNDOING, ev.ts
        elif isinstance(ev, UndoCompleted) and rec:
            rec.state, rec.undo_ended_at = StepState.UNDONE, ev.ts
        elif isinstance(ev, UndoFailed) and rec:
            rec.state, rec.undo_ended_at, rec.error = StepState.UNDO_FAILED, ev.ts, ev.error
            state.status = RunStatus.ROLLBACK_FAILED
        elif isinstance(ev, RollbackCompleted):
            state.status, state.ended_at = RunStatus.ROLLED_BACK, ev.ts
        elif isinstance(ev, RunCompleted):
            state.status, state.ended_at = RunStatus.COMPLETED, ev.ts
    return state


class Journal:
    """One run's history. `path=None` keeps it in memory (dry-run: a real run's journal is never touched)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._events: list[dict[str, Any]] = read_events(path) if path is not None else []
        self._typed: list[Event] = [parse(record) for record in self._events]  # the same records, typed
        self._seq = self._events[-1]["seq"] if self._events else 0
        # A step running beside another (engine/machine.py) journals from its own thread: one writer at a time.
        self._lock = threading.Lock()

    @property
    def events(self) -> list[dict[str, Any]]:
        return list(self._events)

    @property
    def typed_events(self) -> list[Event]:
        """The records as typed events (engine/events.py); readers use engine/view.py's `JournalView.of(journal)`."""
        return list(self._typed)

    def state(self) -> RunState | None:
        return replay(self._typed)

    def durable_state(self) -> RunState | None:
        """The state the file says (re-read and replayed): what a resume would see."""
        return replay(read_events(self.path)) if self.path is not None else self.state()

    def append(self, event: str | Event, *, sync: bool = True, **fields: Any) -> dict[str, Any]:
        """Journal one event: a typed one (engine/events.py), or a kind and its fields (the same record on disk).
        `sync=False`: written, not fsync'd: for a record that protects no action of its own (a step's completion),
        made durable by the next record's fsync (it flushes the whole file). A kill -9 keeps it either way (the
        kernel has it); a power loss before the next record may lose it, which is what a crash just before it leaves
        too (the step is re-entered)."""
        kind = event if isinstance(event, str) else event.kind
        if isinstance(event, Event):
            fields = {**event.on_disk(), **fields}
        with self._lock:
            self._seq += 1
            record: dict[str, Any] = {"seq": self._seq, "ts": time.time(), "event": kind}
            record.update(fields)
            record = redact_obj(record)
            self._persist(record, sync=sync)
            self._events.append(record)
            self._typed.append(parse(record))
            return record

    def _persist(self, record: dict[str, Any], *, sync: bool = True) -> None:
        """Write, flush and fsync one record (nothing for an in-memory journal)."""
        if self.path is not None:
            line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
            new_file = not self.path.exists()
            if not new_file:
                _drop_torn_tail(self.path)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                view = memoryview(line)
                while view:  # a short write (signal, full disk) must not leave half a record behind
                    written = os.write(fd, view)
                    view = view[written:]
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if new_file:
                _fsync_dir(self.path.parent)


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events: list[dict[str, Any]] = []
    for raw in path.read_bytes().splitlines():
        try:
            events.append(json.loads(raw))
        except ValueError:
            # Only the last line can be torn by a crash mid-write; what it announced never began.
            break
    return events


def _drop_torn_tail(path: Path) -> None:
    """Cut the file back to its last complete line, so a record appended after a crash is never glued to a torn one."""
    with path.open("rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        keep = f.read().rfind(b"\n") + 1
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
