"""The replicate switch's decisions, offline (the shared fakes, the two servers' replication as the switch reads it):
a resumed switch whose promotion is journaled or proven does nothing again, one whose target is not at the final
position is never promoted, and the undo's order (the target made read-only before the source takes writes, the
fence lifted last). What the switch does on real servers is proven on the lab (test_replicate_e2e)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from orchestrator.database.mysql import gtid, replica, switch
from orchestrator.engine.step import StepError
from orchestrator.results import SwitchResult
from orchestrator.steps.repl_switch import (
    FENCED,
    PROMOTED,
    PROMOTING,
    SOURCE_READ_ONLY,
    WRITES_BLOCKED_AT,
    ReplSwitch,
)
from tests.fakes import FakeSession, OfflineRuntime, context, plan

FINAL = "0-1-42"


def _status(*, sql_running: bool = True, error: str = "") -> replica.ReplicaStatus:
    return replica.ReplicaStatus(
        io_running="Yes", sql_running=sql_running, seconds_behind=0, gtid_io_pos=gtid.GtidPosition.parse(FINAL),
        last_io_errno=0, last_io_error="", last_sql_errno=1 if error else 0, last_sql_error=error,
        master_host="127.0.0.1", master_port=3307, using_gtid="Slave_Pos", until_condition="None",
    )  # fmt: skip


class Servers:
    """Both database servers as the switch reads and changes their replication; every call recorded as
    (what, side, argument). Promoting is refused: the resume paths below must not promote."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.read_only = {"source": True, "target": False}
        self.replica: dict[str, replica.ReplicaStatus | None] = {"source": None, "target": None}
        self.executed = FINAL
        # Each on the module that defines it: the step looks it up there.
        served = ((replica, "replica_status"), (switch, "is_read_only"), (switch, "set_read_only"),
                  (gtid, "gtid_slave_pos"), (replica, "start_replica"), (switch, "promote"))  # fmt: skip
        for module, name in served:
            monkeypatch.setattr(module, name, getattr(self, name))
        for module, name in ((gtid, "gtid_binlog_pos"), (replica, "wait_for_position"), (replica, "point_replica")):
            monkeypatch.setattr(module, name, self._refused(name))

    def _refused(self, name: str) -> Any:
        def refused(conn: FakeSession, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, conn.which, args))
            raise AssertionError(f"{name} on the {conn.which} was not expected here")

        return refused

    def replica_status(self, conn: FakeSession) -> replica.ReplicaStatus | None:
        self.calls.append(("replica_status", conn.which, None))
        return self.replica[conn.which]

    def is_read_only(self, conn: FakeSession) -> bool:
        self.calls.append(("is_read_only", conn.which, None))
        return self.read_only[conn.which]

    def set_read_only(self, conn: FakeSession, on: bool, *, lock_wait_timeout: float) -> None:
        self.calls.append(("set_read_only", conn.which, on))
        self.read_only[conn.which] = on

    def gtid_slave_pos(self, conn: FakeSession) -> gtid.GtidPosition:
        self.calls.append(("gtid_slave_pos", conn.which, None))
        return gtid.GtidPosition.parse(self.executed)

    def start_replica(self, conn: FakeSession) -> None:
        self.calls.append(("start_replica", conn.which, None))

    def promote(self, conn: FakeSession, expected: gtid.GtidPosition | None = None) -> gtid.GtidPosition:
        self.calls.append(("promote", conn.which, str(expected)))
        raise AssertionError("promoted again")

    def changes(self) -> list[tuple[str, str, Any]]:
        return [c for c in self.calls if c[0] in ("set_read_only", "start_replica", "promote", "point_replica")]


def _switched(rt: OfflineRuntime, saved: dict[str, Any]) -> SwitchResult:
    result = ReplSwitch().run(context(rt, "repl_switch", saved=saved))
    assert result is not None
    return SwitchResult.of(result)


def test_a_resumed_switch_whose_promotion_is_journaled_changes_nothing_and_reports_the_journaled_facts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    servers = Servers(monkeypatch)
    rt = OfflineRuntime(plan())
    blocked_at = time.time() - 3.0
    saved = {WRITES_BLOCKED_AT: blocked_at, FENCED: True, SOURCE_READ_ONLY: True, "final_gtid": FINAL}
    saved |= {PROMOTING: True, PROMOTED: FINAL}
    result = _switched(rt, saved)
    assert servers.calls == [] and rt.source.commands == [] and rt.target.commands == []
    assert result.final_gtid == FINAL and result.executed_gtid == FINAL and result.writes_blocked_at == blocked_at
    assert rt.window.blocked_at == blocked_at  # the window counts from the journaled moment, not from the resume
    assert len(rt.released) == 2  # both connections handed back


def test_a_crash_between_the_promotion_and_its_record_is_proven_promoted_and_not_promoted_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    servers = Servers(monkeypatch)  # the target: no replica, writable, at the final position
    rt = OfflineRuntime(plan())
    saved = {WRITES_BLOCKED_AT: time.time() - 3.0, SOURCE_READ_ONLY: True, "final_gtid": FINAL, PROMOTING: True}
    result = _switched(rt, saved)
    assert [c[:2] for c in servers.calls] == [
        ("replica_status", "target"),
        ("is_read_only", "target"),
        ("gtid_slave_pos", "target"),
    ]
    assert servers.changes() == [] and rt.source.commands == []
    assert result.final_gtid == FINAL and result.executed_gtid is None  # not journaled: the report says so


@pytest.mark.parametrize(
    "target",
    [
        pytest.param({"executed": "0-1-41"}, id="behind the final position"),
        pytest.param({"read_only": True}, id="still read-only"),
    ],
)
def test_a_promotion_journaled_but_not_proven_is_never_taken_for_done(
    monkeypatch: pytest.MonkeyPatch, target: dict[str, Any]
) -> None:
    servers = Servers(monkeypatch)
    servers.executed = target.get("executed", FINAL)
    servers.read_only["target"] = target.get("read_only", False)
    rt = OfflineRuntime(plan())
    saved = {WRITES_BLOCKED_AT: time.time() - 3.0, SOURCE_READ_ONLY: True, "final_gtid": FINAL, PROMOTING: True}
    # Neither promoted nor a replica any more: the switch stops (the rollback follows), it does not promote.
    with pytest.raises(StepError, match="the replica is not healthy before the window: the target is not a replica"):
        ReplSwitch().run(context(rt, "repl_switch", saved=saved))
    assert ("promote", "target") not in [c[:2] for c in servers.calls]
    assert servers.changes() == [] and rt.source.commands == []


def test_the_undo_makes_the_target_read_only_before_the_source_takes_writes_and_lifts_the_fence_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    servers = Servers(monkeypatch)
    rt = OfflineRuntime(plan())
    saved = {WRITES_BLOCKED_AT: time.time() - 3.0, FENCED: True, SOURCE_READ_ONLY: True, PROMOTING: True}
    order: list[str] = []
    rt.source.effect = lambda command: order.append(f"source: {command}")
    real_set = servers.set_read_only

    def set_read_only(conn: FakeSession, on: bool, *, lock_wait_timeout: float) -> None:
        order.append(f"{conn.which} read_only={int(on)}")
        real_set(conn, on, lock_wait_timeout=lock_wait_timeout)

    monkeypatch.setattr(switch, "set_read_only", set_read_only)
    ReplSwitch().undo(context(rt, "repl_switch", saved=saved))
    assert order == [
        "target read_only=1",
        "source: true",  # what a stop cut short on the source is ended before read_only is lifted
        "source read_only=0",
        f"source: {rt.plan.services.fence.disable}",
    ]
    assert saved[SOURCE_READ_ONLY] is False and saved[FENCED] is False
    # Undone again (a retried rollback): the target stays read-only, the source is made writable again whatever it
    # is (idempotent), the fence is not lifted twice.
    order.clear()
    ReplSwitch().undo(context(rt, "repl_switch", saved=saved))
    assert order == ["target read_only=1", "source: true", "source read_only=0"]


def test_the_undo_lifts_read_only_whatever_a_read_says_once_what_was_cut_short_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signal inside the window's first command on the source: that command may still run there and set
    read_only after any read the undo makes. The undo ends it first (a command on the host: the transport ends what
    was cut short before it), then lifts read_only unconditionally; a read saying 'writable' is never trusted."""
    servers = Servers(monkeypatch)
    servers.read_only["source"] = False  # as a read made before the cut-short command set it would say
    rt = OfflineRuntime(plan())
    saved = {WRITES_BLOCKED_AT: time.time() - 3.0, FENCED: True, SOURCE_READ_ONLY: True}
    ReplSwitch().undo(context(rt, "repl_switch", saved=saved))
    # Not promoting: the target is left alone.
    assert [c[:2] for c in servers.calls] == [("set_read_only", "source")]
    assert rt.source.commands == ["true", rt.plan.services.fence.disable]


def test_verify_takes_the_positions_the_switch_read_as_it_promoted() -> None:
    """The switch starts verify_target's position reads once it promoted the target; verify_target takes their
    answer for the same final position (no read of its own), and reads again for another one, or when they failed."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from orchestrator.engine.step import StepContext
    from orchestrator.steps.verify_target import EARLY_POSITIONS, VerifyTarget
    from tests.test_frontdoor import QuietLog

    def ctx_with(early: tuple[str, Future[Any]] | None) -> StepContext:
        def no_db(*_a: Any, **_k: Any) -> Any:
            raise AssertionError("read again")

        from orchestrator.database.mysql.replication import MariaDbReplication

        rt = SimpleNamespace(
            db=no_db,
            plan=SimpleNamespace(database=SimpleNamespace(read_timeout=5.0)),
            database=SimpleNamespace(replication=MariaDbReplication),
        )
        setattr(rt, EARLY_POSITIONS, early)
        ctx = StepContext(run_id="r", step="verify_target", dry_run=False, rt=rt, log=QuietLog())
        ctx.window = SimpleNamespace(timeout=no_db, check=no_db)  # type: ignore[assignment]
        ctx.output = lambda step: {"final_gtid": "0-1-42"}  # type: ignore[method-assign]
        return ctx

    answered: Future[Any] = Future()
    answered.set_result(({"audit_snapshot_at": 1.0}, []))
    ctx = ctx_with(("0-1-42", answered))
    assert VerifyTarget().positions(ctx) == ({"audit_snapshot_at": 1.0}, [])
    assert getattr(ctx.rt, EARLY_POSITIONS) is None, "taken once"
    for early in (("0-1-41", answered), None):
        with pytest.raises(AssertionError, match="read again"):
            VerifyTarget().positions(ctx_with(early))
