"""The shutdown mode's data checks out of the window: what verify_target does inside it (a snapshot, no row read),
and the after-commit audit's pieces (the isolated source's command line, the figures, the verdict)."""

from __future__ import annotations

import time
from typing import Any

import pymysql

from orchestrator import exit_codes
from orchestrator.database import mariadb
from orchestrator.database.mysql import audit as mysql_audit
from orchestrator.database.mysql import compare, gtid
from orchestrator.database.protocol import ChunkedAudit
from orchestrator.engine.journal import RunState, RunStatus, StepRecord, StepState
from orchestrator.results import AuditResult
from orchestrator.run.watch import outcome_code
from orchestrator.services import audit
from orchestrator.steps import step_class
from orchestrator.steps.audit import Audit
from orchestrator.steps.modes import REPLICATE, REVERSE_OVER_REPLICA, SHUTDOWN
from orchestrator.steps.verify_target import VerifyTarget
from tests.fakes import FakeSession, OfflineRuntime, context, plan


def _no_checks() -> Any:
    p = plan()
    return p.model_copy(
        update={
            "health": p.health.model_copy(update={"checks": []}),
            "database": p.database.model_copy(
                update={"verify": p.database.verify.model_copy(update={"checksum": True, "files": False})}
            ),
        }
    )


def test_verify_target_reads_no_row_inside_the_window_and_holds_a_snapshot_for_the_audit() -> None:
    rt = OfflineRuntime(_no_checks())
    rt.window.begin(time.time() - 1)
    ctx = context(rt, "verify_target", outputs={"cutover": {"tables": ["app.reviews", "app.users"]}})
    result = VerifyTarget().run(ctx)
    assert result is not None and result["audit_snapshot_at"] > 0
    statements = rt.session.statements
    assert statements[0] == "START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT"
    assert not [s for s in statements if "COUNT(" in s.upper() or "CHECKSUM" in s.upper()], statements
    held = audit.held(rt)
    assert held.snapshot is rt.session, "the session stays open until the audit, after the commit"
    assert audit.forget(rt) is held and audit.held(rt).snapshot is None, "handed over once, held by the run's runtime"


def test_the_isolated_source_keeps_its_own_options_and_cannot_take_a_write() -> None:
    out = "mysql\n/usr/sbin/mariadbd\n" + "\0".join(["mariadbd", "--no-defaults", "--port=3307", "--log-bin=binlog"])
    launch = audit.parse_launch(out + "\0")
    assert launch == audit.ServerLaunch("/usr/sbin/mariadbd", ["--no-defaults", "--port=3307", "--log-bin=binlog"],
                                        "mysql")  # fmt: skip
    argv = mysql_audit.isolated_argv(launch, "/tmp/migrate-audit.x")
    # Its own options first (--no-defaults must stay first), the isolation after them (later options win).
    assert argv[:4] == ["/usr/sbin/mariadbd", "--no-defaults", "--port=3307", "--log-bin=binlog"]
    for option in ("--skip-networking", "--read-only", "--innodb-read-only", "--skip-log-bin", "--skip-slave-start",
                   "--socket=/tmp/migrate-audit.x/mysqld.sock", "--user=mysql"):  # fmt: skip
        assert option in argv[4:], option
    # A binary replaced since it started: the name it was started by.
    assert audit.parse_launch("root\n/usr/sbin/mariadbd (deleted)\nmariadbd\0--x\0").binary == "mariadbd"  # type: ignore[union-attr]
    assert audit.parse_launch("root\n\n") is None


def test_figures_read_through_the_isolated_source_client_keep_each_table_in_its_place() -> None:
    tables = ["app.reviews", "app.we`ird", "app.gone"]
    sql = mysql_audit.figures_sql(tables, counts=True, checksums=True)
    assert "FROM `app`.`we``ird`;" in sql and sql.count("CHECKSUM TABLE") == 3
    # The missing table's statements failed (--force goes on): its figures are left out, nothing shifts.
    out = "count#0\t7\nchecksum#0\napp.reviews\t123\ncount#1\t2\nchecksum#1\napp.we`ird\tNULL\nchecksum#2\n"
    counts, sums = mysql_audit.parse_figures(out, tables)
    assert counts == {"app.reviews": 7, "app.we`ird": 2} and sums == {"app.reviews": 123, "app.we`ird": None}


def test_the_audit_names_each_differing_table_and_asks_for_attention() -> None:
    step = Audit()
    tables = ["app.reviews", "app.users", "app.log"]
    engines = {"app.reviews": "innodb", "app.users": "innodb", "app.log": "aria"}
    both = {"counts": True, "checksums": False}
    equal = step._compare(tables, engines, ({t: 5 for t in tables}, {}), ({t: 5 for t in tables}, {}), both)
    assert equal.status == "equal" and not equal.needs_attention and equal.summary() is None
    lost = step._compare(tables, engines, ({t: 5 for t in tables}, {}),
                         ({"app.reviews": 4, "app.log": 6}, {}), both)  # fmt: skip
    assert lost.status == "differs" and lost.needs_attention
    assert lost.differences == [
        "app.reviews: row count: source 5, target 4",
        "app.users: row count: missing on the target",
    ]
    # Outside the snapshot (not transactional, read live after the commit): reported, not counted as a loss.
    assert lost.live_differences == ["app.log: row count: source 5, target 6"]
    assert "app.reviews" in (lost.summary() or "")
    unread = step._compare(tables, engines, ({"app.reviews": 5}, {}), ({t: 5 for t in tables}, {}), both)
    assert unread.status == "incomplete" and unread.needs_attention and "app.users" in (unread.reason or "")
    assert not AuditResult(status="not_run", reason="x").needs_attention


def test_the_audit_without_the_snapshot_says_it_did_not_run_and_why() -> None:
    rt = OfflineRuntime(plan())
    result = Audit().run(context(rt, "audit", outputs={"cutover": {"tables": ["app.reviews"]}}))
    assert result is not None and result["status"] == "not_run" and "resumed" in result["reason"]


def test_a_completed_run_whose_audit_found_a_difference_exits_needs_attention() -> None:
    def _run(audit_result: dict[str, Any]) -> RunState:
        record = StepRecord("audit", state=StepState.DONE, result=audit_result)
        return RunState("r", "sha", "plan.yaml", "", 0.0, status=RunStatus.COMPLETED, steps={"audit": record})

    differs = {"status": "differs", "differences": ["app.reviews: row count: source 5, target 4"]}
    assert outcome_code(_run(differs), []) == exit_codes.NEEDS_ATTENTION
    assert outcome_code(_run({"status": "incomplete", "reason": "x"}), []) == exit_codes.NEEDS_ATTENTION
    assert outcome_code(_run({"status": "equal", "tables": 2}), []) == exit_codes.OK
    assert outcome_code(_run({"status": "not_run", "reason": "resumed"}), []) == exit_codes.OK


# --- the replicate mode's audit ---------------------------------------------------------------------------------

REPLICATE_STEPS = [{"event": "run_started", "steps": ["repl_switch", "verify_target", "dns_flip", "audit"]}]


class GtidSession(FakeSession):
    """A database session at the final GTID position."""

    def answer(self, sql: str) -> list[tuple[Any, ...]]:
        return [("0-1-42",)] if "gtid_current_pos" in sql or "gtid_binlog_pos" in sql else []


class PositionsRuntime(OfflineRuntime):
    """One session per side (the positions are read side by side), and what was released."""

    def __init__(self, plan: Any) -> None:
        super().__init__(plan)
        self.sessions: dict[str, GtidSession] = {}
        self.released: list[object] = []

    def db(self, which: str, **_: Any) -> GtidSession:
        self.sessions[which] = GtidSession()
        return self.sessions[which]

    def release(self, conn: object) -> None:
        self.released.append(conn)


def test_replicate_verify_opens_the_audit_snapshot_with_one_statement_and_holds_it_on_the_runtime() -> None:
    rt = PositionsRuntime(_no_checks())
    rt.window.begin(time.time() - 1)
    ctx = context(rt, "verify_target", history=REPLICATE_STEPS, outputs={"repl_switch": {"final_gtid": "0-1-42"}})
    figures, problems = VerifyTarget(mode=REPLICATE).positions(ctx)
    assert not problems and figures["audit_snapshot_at"] > 0
    # Inside the window: the statement that reads the target's position opens the snapshot (one round trip, on that
    # connection: none of its own, no ping); the tables are read on the frozen source after the commit.
    target, source = rt.sessions["target"], rt.sessions["source"]
    assert target.statements == [mysql_audit.SNAPSHOT_AND_POSITION]
    assert mysql_audit.SNAPSHOT_STATEMENT in mysql_audit.SNAPSHOT_AND_POSITION
    assert source.statements == ["SELECT @@GLOBAL.gtid_binlog_pos"]
    assert audit.held(rt).snapshot is target and rt.released == [source], "the target's session is kept"
    described = " ".join(VerifyTarget(mode=REPLICATE).describe(ctx))
    assert "consistent snapshot on the promoted, still fenced target" in described
    # A run that rolls back (the flip failed) closes it at once: nothing keeps the target's purge back meanwhile.
    VerifyTarget(mode=REPLICATE).undo(ctx)
    assert rt.released == [source, target] and audit.held(rt).snapshot is None
    # With the audit off (database.verify asks for neither), the target's session is released as before.
    off = _no_checks()
    off = off.model_copy(update={"database": off.database.model_copy(update={"verify": off.database.verify.model_copy(
        update={"row_counts": False, "checksum": False})})})  # fmt: skip
    quiet = PositionsRuntime(off)
    quiet.window.begin(time.time() - 1)
    switched = {"repl_switch": {"final_gtid": "0-1-42"}}
    figures, problems = VerifyTarget(mode=REPLICATE).positions(
        context(quiet, "verify_target", history=REPLICATE_STEPS, outputs=switched)
    )
    assert not problems and not figures and audit.held(quiet).snapshot is None
    assert quiet.sessions["target"].statements == ["SELECT @@GLOBAL.gtid_current_pos"]


class RefusingCompound(GtidSession):
    """A server that refuses the compound statement (an SQL error, the connection fine), as the MariaDB engine's
    sessions raise it (the driver's error wrapped as a DatabaseError)."""

    def answer(self, sql: str) -> list[tuple[Any, ...]]:
        if sql.startswith("BEGIN NOT ATOMIC"):
            raise mariadb.wrapped(pymysql.ProgrammingError(1064, "You have an error in your SQL syntax"))
        return super().answer(sql)


def test_a_server_refusing_the_one_statement_gets_the_position_then_the_snapshot_apart() -> None:
    rt = PositionsRuntime(_no_checks())
    rt.db = lambda which, **_: rt.sessions.setdefault(which, RefusingCompound())  # type: ignore[method-assign]
    rt.window.begin(time.time() - 1)
    ctx = context(rt, "verify_target", history=REPLICATE_STEPS, outputs={"repl_switch": {"final_gtid": "0-1-42"}})
    figures, problems = VerifyTarget(mode=REPLICATE).positions(ctx)
    assert not problems and figures["audit_snapshot_at"] > 0
    target = rt.sessions["target"]
    assert target.statements[1:] == ["SELECT @@GLOBAL.gtid_current_pos", mysql_audit.SNAPSHOT_STATEMENT]
    assert audit.held(rt).snapshot is target


def test_a_resumed_replicate_run_does_not_audit_a_target_that_took_writes_and_says_why() -> None:
    # The process that held the snapshot died (kill -9 between verify_target and the audit): the resumed run's
    # runtime holds nothing, and the target has taken writes since the commit.
    rt = OfflineRuntime(plan())
    ctx = context(rt, "audit", history=REPLICATE_STEPS, outputs={"repl_switch": {"final_gtid": "0-1-42"}})
    result = AuditResult.of(Audit(mode=REPLICATE).run(ctx))
    assert result.status == "not_run" and result.method == "chunks"
    assert "resumed" in (result.reason or "") and "not compared" in (result.reason or "")
    assert not hasattr(rt, "session"), "no connection opened to either side"
    assert not result.needs_attention and "audit not run" in (result.summary() or "")


def test_the_replicate_audit_names_the_table_and_the_chunk_and_its_cost() -> None:
    chunk = compare.Chunk(0, None, ("r-000051",))
    differing = compare.ChunkDiff("app.reviews", chunk, ("id",), compare.ChunkSum(50, 1), compare.ChunkSum(50, 2))
    log_diff = compare.ChunkDiff(
        "app.log", compare.Chunk(0, None, None), (), compare.ChunkSum(3, 1), compare.ChunkSum(4, 1)
    )
    engines = {"app.reviews": "innodb", "app.users": "innodb", "app.log": "aria"}
    found = ChunkedAudit(differences=[differing, log_diff], missing=["app.users"], engines=engines, tables=3,
                         chunks=4, rows=153, seconds=0.5)  # fmt: skip
    result = Audit._compare_chunks(found, gtid.GtidPosition.parse("0-1-42"))
    assert result.status == "differs" and result.needs_attention
    assert result.differences == [
        "app.reviews chunk 0 (id from the start to before 'r-000051'): 50 rows on both, contents differ",
        "app.users: missing on the target",
    ]
    assert result.live_differences and result.live_differences[0].startswith("app.log chunk 0")
    assert "app.reviews chunk 0" in (result.summary() or "") and "datadir" not in (result.summary() or "")
    cost = result.model_copy(update={"seconds": 0.5}).cost()
    assert cost == "3 table(s), 153 row(s) in 4 chunk(s) in 0.5 s, after the commit (outside the window)"
    unread = ChunkedAudit(unread={"app.x": "on the target: error 1412"}, tables=1)
    verdict = Audit._compare_chunks(unread, gtid.GtidPosition.parse("0-1-42"))
    assert verdict.status == "incomplete" and "app.x" in (verdict.reason or "")
    equal = Audit._compare_chunks(ChunkedAudit(tables=2, chunks=2, rows=9), gtid.GtidPosition.parse("0-1-42"))
    assert equal.status == "equal"


def test_the_audit_snapshot_is_opened_after_the_promotion_and_before_the_commit_in_every_mode() -> None:
    # verify_target opens the snapshot: it must run after the step that promotes (repl_switch) or starts the target,
    # and before the commit point (the step that lifts the target's fence), or the snapshot could hold the
    # application's writes (a false difference) or miss the promotion.
    modes = (SHUTDOWN, REPLICATE, REVERSE_OVER_REPLICA)
    for steps in [mode.steps(door_commits=door) for mode in modes for door in (False, True)]:
        commit = next(i for i, name in enumerate(steps) if step_class(name).commit_point)
        assert steps.index("verify_target") < commit < steps.index("audit"), steps
        before = "repl_switch" if "repl_switch" in steps else "start_target"
        assert steps.index(before) < steps.index("verify_target"), steps
        assert "start_target" not in steps or steps.index("start_target") < steps.index("verify_target"), steps
