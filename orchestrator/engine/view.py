"""The one reader of a run's journal: its typed events (engine/events.py) and the questions the rest asks of them.

A journal may hold several runs (a new run after a rollback appends to it): most questions are about the last one
(`last_run()`), some about one run by id (`run(run_id)`) or the whole history. Every module outside the engine reads
the journal through a `JournalView`, never by matching kinds in the records' dicts.

    view = JournalView.read(path)            # or JournalView.of(journal), of(ctx.history()), of(list of records)
    view.last_run().saved("cutover", "writes_blocked_at")
    view.last_run().started()                # the RunStarted record: run id, plan text, step names
    view.events_of(StepCompleted)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, Union

from orchestrator.engine.events import Event, RunStarted, StepCompleted, StepSaved, StepStarted, parse
from orchestrator.engine.journal import Journal, RunState, read_events, replay

E = TypeVar("E", bound=Event)
# What `JournalView.of` takes: a view, an open journal, or records (parsed or as read from disk).
Records = Union["JournalView", Journal, Iterable[Mapping[str, Any] | Event]]


class JournalView:
    """A journal's events, oldest first, and the questions asked of them. Immutable: a view is a snapshot."""

    __slots__ = ("_events",)

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self._events: tuple[Event, ...] = tuple(events)

    @classmethod
    def of(cls, records: Records) -> JournalView:
        if isinstance(records, JournalView):
            return records
        if isinstance(records, Journal):
            return cls(records.typed_events)
        return cls(r if isinstance(r, Event) else parse(r) for r in records)

    @classmethod
    def read(cls, path: Path) -> JournalView:
        """The journal at `path` (empty when there is none; a torn last line ignored)."""
        return cls(parse(r) for r in read_events(path))

    # --- the events

    @property
    def events(self) -> tuple[Event, ...]:
        return self._events

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def __bool__(self) -> bool:
        return bool(self._events)

    def last(self) -> Event | None:
        """The newest event (None: empty)."""
        return self._events[-1] if self._events else None

    def events_of(self, kind: type[E]) -> list[E]:
        """The events of one kind (a class of engine/events.py), oldest first."""
        return [ev for ev in self._events if isinstance(ev, kind)]

    # --- runs

    def runs(self) -> list[JournalView]:
        """One view per run, each from its `run_started` to the next one's (records before the first are left out)."""
        starts = [i for i, ev in enumerate(self._events) if isinstance(ev, RunStarted)]
        ends = [*starts[1:], len(self._events)] if starts else []
        return [JournalView(self._events[begin:end]) for begin, end in zip(starts, ends, strict=True)]

    def last_run(self) -> JournalView:
        """The last run's events: from its `run_started` on (the whole view when none is recorded, as in a history
        handed to a step without its start)."""
        starts = [i for i, ev in enumerate(self._events) if isinstance(ev, RunStarted)]
        return JournalView(self._events[starts[-1] :]) if starts else self

    def run(self, run_id: str | None = None) -> JournalView:
        """One run's events: the last run, or the last one with this id (empty when there is none)."""
        runs = [r for r in self.runs() if run_id is None or (r.started() or RunStarted()).run_id == run_id]
        return runs[-1] if runs else JournalView()

    def started(self) -> RunStarted | None:
        """The (last) `run_started` record in this view: run id, plan path and text, the run's step names."""
        found = self.events_of(RunStarted)
        return found[-1] if found else None

    def run_steps(self) -> list[str]:
        """The step names the last run began with ([] when no run is recorded)."""
        started = self.started()
        return list(started.steps) if started is not None else []

    def plan_text(self) -> str:
        """The plan's text as journaled when the last run began ("" when not recorded)."""
        started = self.started()
        return started.plan_text if started is not None else ""

    def state(self) -> RunState | None:
        """The state of the (last) run this view holds, replayed (None: no run)."""
        return replay(self._events)

    # --- what steps journaled

    def saves(self, step: str | None, key: str) -> list[StepSaved]:
        """Every `step_saved` of `key` by `step` (any step: None), oldest first."""
        return [ev for ev in self.events_of(StepSaved) if ev.key == key and step in (None, ev.step)]

    def saved_values(self, step: str | None, key: str) -> list[Any]:
        """The values saved under `key` by `step` (any step: None), oldest first."""
        return [ev.value for ev in self.saves(step, key)]

    def saved(self, step: str | None, key: str, default: Any = None) -> Any:
        """The last value saved under `key` by `step` (any step: None), or `default`."""
        found = self.saves(step, key)
        return found[-1].value if found else default

    def completions(self, step: str | None = None) -> list[StepCompleted]:
        """The `step_completed` records of `step` (every step: None), oldest first."""
        return [ev for ev in self.events_of(StepCompleted) if step in (None, ev.step)]

    def starts(self, step: str | None = None) -> list[StepStarted]:
        """The `step_started` records of `step` (every step: None), oldest first."""
        return [ev for ev in self.events_of(StepStarted) if step in (None, ev.step)]
