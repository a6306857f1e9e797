"""The journal's records as typed events: one small frozen dataclass per kind the engine writes.

On disk a record is one JSON object, `{"seq": n, "ts": t, "event": kind, ...fields}` (engine/journal.py). The engine
writes through these classes (`Event.on_disk()`), and `parse` reads any record back into its class: the on-disk format
is the same as before they existed. Reading is lenient on purpose: a record from an older version, or one a test or
a lab fixture wrote by hand, lacks fields (then their defaults stand), and a kind this version does not know reads
as `OtherEvent` (nothing is dropped).

Readers do not match kinds by name: they ask engine/view.py (`JournalView`), which filters by class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

# Attributes spelled differently on disk (the record's "kind" would read as the event's kind in Python).
_DISK_NAMES = {"error_type": "kind"}


@dataclass(frozen=True, slots=True)
class Event:
    """What every record has: its sequence number and its time (orchestrator clock); 0 when a record lacks them."""

    KIND: ClassVar[str] = ""
    # Fields written only when set (a record without them reads the same).
    OPTIONAL: ClassVar[tuple[str, ...]] = ()

    seq: int = field(default=0, kw_only=True)
    ts: float = field(default=0.0, kw_only=True)

    @property
    def kind(self) -> str:
        return self.KIND

    def on_disk(self) -> dict[str, Any]:
        """The record's own fields as written on disk (seq, ts and the kind are the journal's)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("seq", "ts"):
                continue
            value = getattr(self, f.name)
            if f.name in self.OPTIONAL and value is None:
                continue
            out[_DISK_NAMES.get(f.name, f.name)] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True, slots=True)
class StepEvent(Event):
    """An event about one step."""

    step: str = ""


@dataclass(frozen=True, slots=True)
class RunStarted(Event):
    KIND = "run_started"
    run_id: str = ""
    plan_path: str = ""
    plan_name: str = ""
    plan_sha256: str = ""
    plan_text: str = ""  # the plan as it was when the run began (older journals: "")
    steps: tuple[str, ...] = ()
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class RunResumed(Event):
    KIND = "run_resumed"
    status: str = ""  # the run's status when it was taken up


@dataclass(frozen=True, slots=True)
class GateConfirmed(StepEvent):
    KIND = "gate_confirmed"


@dataclass(frozen=True, slots=True)
class GateDeclined(StepEvent):
    KIND = "gate_declined"


@dataclass(frozen=True, slots=True)
class StepStarted(StepEvent):
    KIND = "step_started"
    OPTIONAL = ("beside",)
    title: str = ""
    beside: str | None = None  # started beside this step, before it ended


@dataclass(frozen=True, slots=True)
class StepSaved(StepEvent):
    """A fact a step journaled before acting on it (`ctx.save`): its key and its JSON value."""

    KIND = "step_saved"
    key: str = ""
    value: Any = None


@dataclass(frozen=True, slots=True)
class StepCompleted(StepEvent):
    KIND = "step_completed"
    result: Mapping[str, Any] = field(default_factory=dict)
    duration: float | None = None
    commit_point: bool = False


@dataclass(frozen=True, slots=True)
class StepFailed(StepEvent):
    KIND = "step_failed"
    error: str | None = None
    error_type: str | None = None  # the exception's class name ("kind" on disk)


@dataclass(frozen=True, slots=True)
class Committed(StepEvent):
    """The run is committed from here on, declared by a step before it completes (`ctx.commit`)."""

    KIND = "committed"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RollbackStarted(Event):
    KIND = "rollback_started"
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class UndoStarted(StepEvent):
    KIND = "undo_started"


@dataclass(frozen=True, slots=True)
class UndoCompleted(StepEvent):
    KIND = "undo_completed"
    duration: float | None = None


@dataclass(frozen=True, slots=True)
class UndoFailed(StepEvent):
    KIND = "undo_failed"
    error: str | None = None


@dataclass(frozen=True, slots=True)
class RollbackCompleted(Event):
    KIND = "rollback_completed"


@dataclass(frozen=True, slots=True)
class RunCompleted(Event):
    KIND = "run_completed"


@dataclass(frozen=True, slots=True)
class OtherEvent(Event):
    """A record of a kind this version does not write, kept as read."""

    name: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.name

    def on_disk(self) -> dict[str, Any]:
        return {k: v for k, v in self.data.items() if k not in ("seq", "ts", "event")}


KINDS: dict[str, type[Event]] = {
    cls.KIND: cls
    for cls in (
        RunStarted,
        RunResumed,
        GateConfirmed,
        GateDeclined,
        StepStarted,
        StepSaved,
        StepCompleted,
        StepFailed,
        Committed,
        RollbackStarted,
        UndoStarted,
        UndoCompleted,
        UndoFailed,
        RollbackCompleted,
        RunCompleted,
    )
}


def parse(record: Mapping[str, Any]) -> Event:
    """The typed event of one journal record (lenient: missing fields take their defaults, see the module)."""
    seq, ts = _int(record.get("seq")), _float(record.get("ts"))
    kind = str(record.get("event") or "")
    cls = KINDS.get(kind)
    if cls is None:
        return OtherEvent(seq=seq, ts=ts, name=kind, data=dict(record))
    values: dict[str, Any] = {}
    for f in fields(cls):
        disk = _DISK_NAMES.get(f.name, f.name)
        if f.name in ("seq", "ts") or record.get(disk) is None:
            continue
        values[f.name] = _coerce(f.name, record[disk])
    return cls(seq=seq, ts=ts, **values)


def _coerce(name: str, value: Any) -> Any:
    """A field's value as its class declares it (JSON gives lists for tuples; hand-written records may give
    numbers as strings)."""
    if name == "steps":
        return tuple(str(s) for s in value) if isinstance(value, list | tuple) else ()
    if name == "result":
        return value if isinstance(value, dict) else {}
    if name in ("duration",):
        return _float(value)
    if name in ("commit_point", "dry_run"):
        return bool(value)
    if name == "value":
        return value
    return str(value)


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _float(value: Any) -> float:
    try:
        return float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0
