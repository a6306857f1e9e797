"""The typed journal events and the one reader (`JournalView`): what they read from records on disk, old and
hand-written ones included, and that the engine still writes the records it always wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.engine.events import (
    KINDS,
    Committed,
    Event,
    GateConfirmed,
    GateDeclined,
    OtherEvent,
    RollbackCompleted,
    RollbackStarted,
    RunCompleted,
    RunResumed,
    RunStarted,
    StepCompleted,
    StepFailed,
    StepSaved,
    StepStarted,
    UndoCompleted,
    UndoFailed,
    UndoStarted,
    parse,
)
from orchestrator.engine.journal import Journal, RunStatus, StepState
from orchestrator.engine.view import JournalView

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "report_html"


def run(run_id: str, seq: int, *, steps: tuple[str, ...] = ("a", "b"), text: str = "") -> dict[str, Any]:
    head = {"seq": seq, "ts": float(seq), "event": "run_started", "run_id": run_id, "plan_path": "p.yaml"}
    return {**head, "plan_name": "p", "plan_sha256": "h", "plan_text": text, "steps": list(steps), "dry_run": False}


def saved(seq: int, step: str, key: str, value: Any) -> dict[str, Any]:
    return {"seq": seq, "ts": float(seq), "event": "step_saved", "step": step, "key": key, "value": value}


TWO_RUNS = [
    {"seq": 1, "ts": 1.0, "event": "step_saved", "step": "a", "key": "k", "value": "before any run"},
    run("r1", 2, text="name: first\n"),
    {"seq": 3, "ts": 3.0, "event": "step_started", "step": "a", "title": "A"},
    saved(4, "a", "k", 1),
    saved(5, "b", "k", 2),
    saved(6, "a", "k", 3),
    {"seq": 7, "ts": 7.0, "event": "step_failed", "step": "a", "error": "boom", "kind": "StepError"},
    {"seq": 8, "ts": 8.0, "event": "rollback_started", "reason": "a failed: boom"},
    {"seq": 9, "ts": 9.0, "event": "rollback_completed"},
    run("r2", 10, steps=("a", "b", "c"), text="name: second\n"),
    {"seq": 11, "ts": 11.0, "event": "step_started", "step": "a", "title": "A"},
    saved(12, "a", "k", 4),
    {"seq": 13, "ts": 13.0, "event": "step_completed", "step": "a", "result": {"n": 1}, "duration": 2.0,
     "commit_point": False},
]  # fmt: skip


def test_each_record_reads_as_its_kind_and_writes_back_the_same_record() -> None:
    events = [parse(r) for r in TWO_RUNS]
    assert [type(e) for e in events[1:4]] == [RunStarted, StepStarted, StepSaved]
    failed = events[6]
    assert isinstance(failed, StepFailed) and failed.error_type == "StepError" and failed.kind == "step_failed"
    for record, event in zip(TWO_RUNS, events, strict=True):
        assert {"seq": event.seq, "ts": event.ts, "event": event.kind, **event.on_disk()} == record


# Each kind the engine writes, and the record's fields as the engine wrote them before the events were typed.
WRITTEN = [
    (RunStarted(run_id="r", plan_path="p", plan_name="n", plan_sha256="h", plan_text="t", steps=("a",)),
     {"run_id": "r", "plan_path": "p", "plan_name": "n", "plan_sha256": "h", "plan_text": "t", "steps": ["a"],
      "dry_run": False}),
    (RunResumed(status="running"), {"status": "running"}),
    (GateConfirmed(step="a"), {"step": "a"}),
    (GateDeclined(step="a"), {"step": "a"}),
    (StepStarted(step="a", title="A"), {"step": "a", "title": "A"}),
    (StepStarted(step="b", title="B", beside="a"), {"step": "b", "title": "B", "beside": "a"}),
    (StepSaved(step="a", key="k", value=[1]), {"step": "a", "key": "k", "value": [1]}),
    (StepCompleted(step="a", result={"x": 1}, duration=0.5, commit_point=True),
     {"step": "a", "result": {"x": 1}, "duration": 0.5, "commit_point": True}),
    (StepFailed(step="a", error="e", error_type="StepError"), {"step": "a", "error": "e", "kind": "StepError"}),
    (Committed(step="a", reason="r"), {"step": "a", "reason": "r"}),
    (RollbackStarted(reason="r"), {"reason": "r"}),
    (UndoStarted(step="a"), {"step": "a"}),
    (UndoCompleted(step="a", duration=0.1), {"step": "a", "duration": 0.1}),
    (UndoFailed(step="a", error="e"), {"step": "a", "error": "e"}),
    (RollbackCompleted(), {}),
    (RunCompleted(), {}),
]  # fmt: skip


def test_every_kind_writes_the_fields_it_always_wrote(tmp_path: Path) -> None:
    assert {type(event) for event, _ in WRITTEN} == set(KINDS.values())
    journal = Journal(tmp_path / "journal.jsonl")
    for event, fields in WRITTEN:
        record = journal.append(event)
        assert record == {"seq": record["seq"], "ts": record["ts"], "event": event.kind, **fields}
    for (event, _), read in zip(WRITTEN, JournalView.read(tmp_path / "journal.jsonl"), strict=True):
        assert isinstance(read, Event) and read.on_disk() == event.on_disk() and type(read) is type(event)


def test_records_written_by_hand_or_by_an_older_version_still_read() -> None:
    # No seq, no ts, no plan_text (journals from before it was recorded), numbers as strings, an unknown kind.
    bare = parse({"event": "run_started", "run_id": "old", "steps": ["a"]})
    assert bare == RunStarted(run_id="old", steps=("a",))
    assert bare.plan_text == "" and bare.seq == 0 and bare.ts == 0.0
    done = parse({"event": "step_completed", "ts": "5.5", "step": "a", "result": None})
    assert isinstance(done, StepCompleted) and done.ts == 5.5 and done.result == {} and done.duration is None
    other = parse({"seq": 3, "ts": 1.0, "event": "plan_ended", "plan": "shop"})
    assert isinstance(other, OtherEvent) and other.kind == "plan_ended" and other.on_disk() == {"plan": "shop"}
    assert isinstance(parse({"ts": 1.0}), OtherEvent)  # not even a kind: kept, matched by nothing


def test_runs_and_the_last_run() -> None:
    view = JournalView.of(TWO_RUNS)
    runs = view.runs()
    assert [(r.started() or RunStarted()).run_id for r in runs] == ["r1", "r2"]
    assert [len(r) for r in runs] == [8, 4]  # the record before the first run belongs to none
    last = view.last_run()
    assert last.events == runs[-1].events and view.run().events == last.events
    assert len(view.run("r1")) == 8 and not view.run("r3")
    assert view.run_steps() == ["a", "b", "c"] and view.plan_text() == "name: second\n"
    assert runs[0].plan_text() == "name: first\n"
    # A history without its run_started (as a test hands a step): the whole of it is the last run.
    tail = JournalView.of(TWO_RUNS[10:])
    assert tail.last_run() is tail and tail.started() is None and tail.run_steps() == [] and tail.plan_text() == ""
    assert not JournalView().runs() and JournalView().last() is None


def test_saved_facts_by_step_and_key() -> None:
    view = JournalView.of(TWO_RUNS)
    first = view.run("r1")
    assert first.saved("a", "k") == 3 and first.saved("b", "k") == 2 and first.saved(None, "k") == 3
    assert first.saved_values(None, "k") == [1, 2, 3] and first.saved_values("a", "k") == [1, 3]
    assert first.saved("c", "k", "none") == "none" and first.saved("a", "other") is None
    assert view.last_run().saved("a", "k") == 4
    assert view.saved_values("a", "k") == ["before any run", 1, 3, 4]  # the whole journal
    assert [s.seq for s in view.saves("a", "k")] == [1, 4, 6, 12]


def test_events_of_a_kind_and_the_step_records() -> None:
    view = JournalView.of(TWO_RUNS)
    assert [e.seq for e in view.events_of(StepStarted)] == [3, 11]
    assert [e.run_id for e in view.events_of(RunStarted)] == ["r1", "r2"]
    assert [e.step for e in view.starts("a")] == ["a", "a"] and view.starts("b") == []
    [done] = view.completions()
    assert done.result == {"n": 1} and done.duration == 2.0 and view.completions("b") == []
    assert view.last() == done and not view.events_of(UndoFailed)


def test_the_state_of_the_last_run() -> None:
    view = JournalView.of(TWO_RUNS)
    state = view.state()
    assert state is not None and state.run_id == "r2" and state.status == RunStatus.RUNNING
    assert list(state.steps) == ["a", "b", "c"] and state.steps["a"].state == StepState.DONE
    first = view.run("r1").state()
    assert first is not None and first.status == RunStatus.ROLLED_BACK and first.steps["a"].saved == {"k": 3}
    assert JournalView().state() is None


def test_a_view_of_a_journal_file_is_what_the_journal_wrote(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    assert not JournalView.read(path)  # no file yet: empty
    journal = Journal(path)
    journal.append(RunStarted(run_id="r", steps=("a",), plan_text="name: x\n"))
    journal.append(StepStarted(step="a", title="A"))
    journal.append("step_saved", step="a", key="k", value={"x": 1})  # the untyped spelling writes the same record
    journal.append(Committed(step="a", reason="half"))
    with path.open("ab") as f:
        f.write(b'{"seq":5,"ts":1.0,"event":"step_comp')  # killed mid-write
    view = JournalView.read(path)
    assert [e.kind for e in view] == ["run_started", "step_started", "step_saved", "committed"]
    assert view.events == JournalView.of(journal).events == JournalView.of(Journal(path)).events
    assert view.last_run().saved("a", "k") == {"x": 1}
    state = view.state()
    assert state is not None and state.committed and state.plan_text == "name: x\n"
    lines = [json.loads(line) for line in path.read_bytes().splitlines()[:4]]
    assert lines[1] == {"seq": 2, "ts": lines[1]["ts"], "event": "step_started", "step": "a", "title": "A"}
    assert lines[3] == {"seq": 4, "ts": lines[3]["ts"], "event": "committed", "step": "a", "reason": "half"}


@pytest.mark.parametrize("name", ["completed", "rolled_back"])
def test_a_journal_of_a_real_run_reads_and_writes_back_unchanged(name: str) -> None:
    """Journals a lab run wrote before the events were typed: every record reads as a known kind, and writing it
    back gives the same record (the on-disk format did not change)."""
    path = FIXTURES / name / "journal.jsonl"
    records = [json.loads(line) for line in path.read_bytes().splitlines()]
    view = JournalView.read(path)
    assert len(view) == len(records) and not view.events_of(OtherEvent)
    for record, event in zip(records, view, strict=True):
        assert {"seq": event.seq, "ts": event.ts, "event": event.kind, **event.on_disk()} == record
    assert view.state() == Journal(path).state()
