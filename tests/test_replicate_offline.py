"""The replicate steps' decisions on the shared fakes, through the `Replication` protocol (tests/fakes.FakeReplication:
both servers' replication as the steps see it, any engine): the promotion's proof (journaled before the action that
may promote, never taken for done without it, a replica that did not reach the final position never promoted), the
rollback's order (the target made read-only before the source takes writes, a reverse run's old source following the
target again from the final position, a stopped source started before it is asked, the fence lifted last; the
replica's services stopped before its replication is forgotten and its database stopped last).

The MariaDB-specific resume paths of the switch are in test_repl_switch_offline.py; what the steps do on real servers
is proven on the labs (test_replicate_e2e, test_postgres_replicate)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from orchestrator.engine.step import StepError
from orchestrator.plan.model import Plan, Replication
from orchestrator.results import SwitchResult
from orchestrator.steps.repl_common import FINAL_GTID, REPLICA_PORT
from orchestrator.steps.repl_replica import SERVICES_STARTED, TARGET_DB_STARTED, ReplReplica
from orchestrator.steps.repl_switch import FENCED, PROMOTING, SOURCE_READ_ONLY, WRITES_BLOCKED_AT, ReplSwitch
from tests.fakes import FakeReplication, FakeWait, OfflineRuntime, context, plan

FINAL = "0-1-42"


def replicate_plan() -> Plan:
    settings = Replication.model_validate({"user": "repl", "password": {"env": "MIGRATE_REPL_PASSWORD"}})
    return plan().model_copy(update={"replication": settings})


def offline(fake: FakeReplication, the_plan: Plan | None = None) -> OfflineRuntime:
    """A runtime whose engine's replica control is `fake`; every host command lands in `fake.calls` too, in order."""
    rt = OfflineRuntime(the_plan or replicate_plan())
    rt.database.replica_control = fake
    rt.source.effect = lambda command: fake.calls.append(("command", "source", command))
    rt.target.effect = lambda command: fake.calls.append(("command", "target", command))
    rt.window.begin(time.time() - 1)
    return rt


def promote(rt: OfflineRuntime, saved: dict[str, Any]) -> tuple[Any, SwitchResult]:
    result = SwitchResult()
    ctx = context(rt, "repl_switch", saved=saved)
    return ReplSwitch()._wait_and_promote(ctx, rt.db("target"), FINAL, result), result


# --- the promotion's proof ------------------------------------------------------------------------------------------


def test_a_replica_at_the_final_position_is_promoted_in_one_call_journaled_before_it() -> None:
    fake = FakeReplication()
    rt = offline(fake)
    saved: dict[str, Any] = {}
    executed, result = promote(rt, saved)
    assert executed == FINAL and saved[PROMOTING] is True
    assert fake.changes() == [("wait_and_promote", "target", FINAL)]
    assert result.wait_seconds is not None and fake.replica["target"] is None and fake.read_only["target"] is False


def test_a_promotion_whose_proof_fails_is_refused_and_stays_journaled_for_the_undo() -> None:
    fake = FakeReplication(mismatch="the replica executed 0-1-41, not the final position 0-1-42")
    rt = offline(fake)
    saved: dict[str, Any] = {}
    with pytest.raises(StepError, match="not promoted: the replica executed 0-1-41"):
        promote(rt, saved)
    # `promoting` stays: the undo makes the target read-only again, whatever the engine did before its proof failed.
    assert saved[PROMOTING] is True
    assert [call[0] for call in fake.changes()] == ["wait_and_promote"]
    assert fake.read_only["target"] is True and fake.replica["target"] is not None


@pytest.mark.parametrize(
    ("later", "why"),
    [
        pytest.param(
            FakeWait(outcome="timed_out"), "did not reach the source's final position 0-1-42 in time", id="timed out"
        ),
        pytest.param(
            FakeWait(outcome="replica_failed", error="Duplicate entry 'r-1' (1062)"),
            "the replica stopped inside the window: Duplicate entry",
            id="replica failed",
        ),
    ],
)
def test_a_replica_that_does_not_reach_the_final_position_is_never_promoted(later: FakeWait, why: str) -> None:
    fake = FakeReplication(first_slice=FakeWait(outcome="timed_out", waited=0.5), waits=[later])
    rt = offline(fake)
    saved: dict[str, Any] = {}
    with pytest.raises(StepError, match=why):
        promote(rt, saved)
    # The first slice changed nothing: the journal says so again (the undo leaves a never-promoted target alone).
    assert saved[PROMOTING] is False
    assert [call[0] for call in fake.calls] == ["wait_and_promote", "wait_for_position"]
    assert fake.replica["target"] is not None and fake.read_only["target"] is True


def test_a_replica_reaching_the_final_position_after_the_first_slice_is_promoted_apart_with_proof() -> None:
    fake = FakeReplication(first_slice=FakeWait(outcome="timed_out", waited=0.5), waits=[FakeWait()])
    rt = offline(fake)
    journal: list[tuple[str, Any]] = []
    saved: dict[str, Any] = {}
    ctx = context(rt, "repl_switch", saved=saved)
    ctx._save = lambda _step, key, value: journal.append((key, value))  # type: ignore[method-assign]
    executed = ReplSwitch()._wait_and_promote(ctx, rt.db("target"), FINAL, SwitchResult())
    assert executed == FINAL
    assert journal == [(PROMOTING, True), (PROMOTING, False), (PROMOTING, True)]
    assert [call[0] for call in fake.calls] == ["wait_and_promote", "wait_for_position", "promote"]


# --- the rollback's order -------------------------------------------------------------------------------------------


def test_a_rolled_back_reverse_switch_makes_the_old_source_follow_the_target_again_before_the_source_takes_writes() -> (
    None
):
    # A reverse run (the plan reversed): its target is the old source, promoted (its replication forgotten) when
    # the rollback began; its source (the forward run's target) is read-only.
    fake = FakeReplication(read_only={"source": True, "target": False}, replica={"source": None, "target": None})
    reverse = replicate_plan().reversed()
    rt = offline(fake, reverse)
    saved = {WRITES_BLOCKED_AT: time.time() - 3.0, FENCED: True, SOURCE_READ_ONLY: True, PROMOTING: True,
             REPLICA_PORT: 4406, FINAL_GTID: FINAL}  # fmt: skip
    ReplSwitch().undo(context(rt, "repl_switch", saved=saved))
    fence = reverse.services.fence.disable
    assert fake.changes() == [
        ("set_read_only", "target", True),  # first: the old source takes no write any more
        ("follow", "target", (4406, FINAL, False)),  # from the final position, through the journaled port
        ("start_replica", "target", None),
        ("set_read_only", "source", False),  # only then the source takes writes again
    ]
    assert fake.replica["target"] is not None and fake.replica["target"].replicating
    assert fence and fake.calls[-1] == ("command", "source", fence), "the fence lifted last"
    assert saved[SOURCE_READ_ONLY] is False


def test_the_undo_starts_a_source_the_switch_stopped_before_asking_it_anything() -> None:
    # An engine whose switch stops the source (PostgreSQL's clean shutdown): the undo starts it, then asks.
    fake = FakeReplication(source_stops=True, read_only={"source": False, "target": False})
    rt = offline(fake)
    rt.answers["source"] = False
    saved = {WRITES_BLOCKED_AT: time.time() - 3.0, SOURCE_READ_ONLY: True}
    ReplSwitch().undo(context(rt, "repl_switch", saved=saved))
    start = rt.plan.database.source.start
    assert fake.calls[:2] == [("command", "source", "true"), ("command", "source", start)]
    assert fake.changes() == [("set_read_only", "source", False)], "never promoting, the target is left alone"


def test_the_replica_undo_stops_its_services_then_forgets_replication_then_stops_the_database() -> None:
    fake = FakeReplication()
    rt = offline(fake)
    rt.answers["target"] = True
    services = rt.plan.services.target
    saved = {TARGET_DB_STARTED: True, SERVICES_STARTED: [service.name for service in services]}
    ReplReplica().undo(context(rt, "repl_replica", saved=saved))
    stops = [("command", "target", service.stop) for service in reversed(services)]
    assert [c for c in fake.calls if c[0] in ("command", "forget_replication")] == [
        *stops,
        ("forget_replication", "target", None),  # its replication password deleted before the server stops
        ("command", "target", rt.plan.database.target.stop),
    ]
    assert fake.replica["target"] is None
