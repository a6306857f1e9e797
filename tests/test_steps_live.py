"""The live, preparation and target steps on the lab: preflight, prepare_target, the pre-syncs, start_target (and
its undo) and verify_target. Each test leaves the lab as it found it: source live, target database stopped."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from ruamel.yaml import YAML

from migrate_lab import mariadb
from migrate_lab.state import HostState, LabState
from orchestrator.database.mysql import session as mysql
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.model import FileTree, Plan, PresyncRounds
from orchestrator.runtime import Runtime
from orchestrator.services import audit
from orchestrator.services.probes import innodb_files_visible, innodb_holders, real_datadir
from orchestrator.steps.audit import Audit
from orchestrator.steps.db_final import DbFinal
from orchestrator.steps.db_presync import DbPresync
from orchestrator.steps.files_final import FilesFinal
from orchestrator.steps.files_presync import FilesPresync
from orchestrator.steps.modes import mode_of
from orchestrator.steps.preflight import Preflight
from orchestrator.steps.prepare_target import PrepareTarget
from orchestrator.steps.start_target import StartTarget
from orchestrator.steps.verify_target import VerifyTarget

MY_STEPS: list[type[Step]] = [
    Preflight, PrepareTarget, FilesPresync, DbPresync, DbFinal, FilesFinal, StartTarget, VerifyTarget
]  # fmt: skip


def load_plan(path: Path) -> Plan:
    return Plan.model_validate(YAML(typ="safe").load(path.read_text()))


def context(rt: Runtime, step: Step, outputs: dict[str, dict[str, Any]] | None = None) -> StepContext:
    return StepContext(
        run_id="test", step=step.name, dry_run=rt.dry_run, rt=rt, log=structlog.get_logger(), _outputs=outputs or {}
    )


def run_bin(host: HostState, script: str) -> None:
    subprocess.run([str(host.bin_dir / script)], check=True, capture_output=True, timeout=120)


def test_describe_needs_no_connection(tmp_path: Path) -> None:
    """A dry-run describes every step from the plan alone: these hosts do not even exist."""
    plan = Plan.model_validate(
        {
            "name": "nowhere",
            "source": {"address": "192.0.2.1", "connect_timeout": 0.1},
            "target": {"address": "192.0.2.2", "connect_timeout": 0.1},
            "files": [{"name": "uploads", "source": "/srv/uploads", "target": "/srv/uploads"}],
            "database": {
                "source": {"datadir": "/var/lib/mysql", "start": "systemctl start mariadb", "stop": "systemctl stop m"},
                "target": {"datadir": "/var/lib/mysql", "start": "systemctl start mariadb", "stop": "systemctl stop m"},
            },
            "services": {
                "target": [{"name": "web", "start": "systemctl start nginx", "stop": "systemctl stop nginx"}],
                "fence": {"enable": "touch /srv/maintenance", "disable": "rm -f /srv/maintenance"},
            },
            "health": {"checks": [{"kind": "http", "url": "http://192.0.2.2/healthz"}]},
            "dns": {"api_token": {"env": "UNSET_TOKEN"}, "zone": "example.com", "records": ["www.example.com"]},
        }
    )
    rt = Runtime(plan, tmp_path / "plan.yaml", dry_run=True)
    described = {cls.name: cls().describe(context(rt, cls())) for cls in MY_STEPS}
    assert all(described.values())
    assert any("systemctl start nginx" in line for line in described["start_target"])
    assert any("/srv/uploads" in line for line in described["files_presync"])
    assert rt._hosts == {}  # nothing was connected
    rt.close()


# --- on the lab -------------------------------------------------------------------------------------------------


@pytest.fixture
def rt(lab: LabState, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    for key, value in lab.secrets().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("CLOUDFLARE_EMAIL", raising=False)
    monkeypatch.delenv("CLOUDFLARE_API_KEY", raising=False)
    runtime = Runtime(load_plan(lab.plan_file), lab.plan_file)
    try:
        yield runtime
    finally:
        runtime.close()


def with_plan(rt: Runtime, plan: Plan) -> Runtime:
    rt.close()
    return Runtime(plan, rt.plan_path)


@pytest.mark.lab
def test_preflight_passes_on_the_lab_and_reports_figures(rt: Runtime) -> None:
    step = Preflight()
    figures = step.run(context(rt, step))
    assert figures is not None
    assert mysql.major_version(figures["source_version"]) == figures["major_version"]
    assert figures["major_version"] in figures["target_version"]
    assert figures["source_bytes"] > 0 and all(free > 0 for free in figures["target_free"].values())


# Accounts of replication.app_users that write through read_only, each another way (made on the source, dropped after).
PREFIX = "preflight_"
ACCOUNTS = {
    f"{PREFIX}direct": "GRANT READ_ONLY ADMIN ON *.* TO {account}",
    f"{PREFIX}nested": "GRANT {PREFIX}outer TO {account}; SET DEFAULT ROLE {PREFIX}outer FOR {account}",
    f"{PREFIX}settable": "GRANT {PREFIX}super TO {account}",
    f"{PREFIX}super": "GRANT SUPER ON *.* TO {account}",
}
ROLES = f"""CREATE ROLE {PREFIX}inner; GRANT READ_ONLY ADMIN ON *.* TO {PREFIX}inner;
CREATE ROLE {PREFIX}outer; GRANT {PREFIX}inner TO {PREFIX}outer; GRANT SELECT ON coursereview.* TO {PREFIX}outer;
CREATE ROLE {PREFIX}super; GRANT SUPER ON *.* TO {PREFIX}super;"""


def drop_accounts(lab: LabState) -> None:
    drops = [f"DROP USER IF EXISTS {name}@'%'" for name in ACCOUNTS]
    drops += [f"DROP ROLE IF EXISTS {PREFIX}{role}" for role in ("inner", "outer", "super")]
    mariadb.run_sql(lab.source, "; ".join(drops) + ";", timeout=60)


@pytest.fixture
def app_accounts(lab: LabState) -> Iterator[list[str]]:
    drop_accounts(lab)
    sql = [ROLES] + [
        f"CREATE USER {name}@'%'; " + grant.format(account=f"{name}@'%'", PREFIX=PREFIX) + ";"
        for name, grant in ACCOUNTS.items()
    ]
    mariadb.run_sql(lab.source, "\n".join(sql), timeout=60)
    try:
        yield list(ACCOUNTS)
    finally:
        drop_accounts(lab)


@pytest.mark.lab
def test_preflight_lists_every_problem_with_what_to_fix(rt: Runtime, lab: LabState, app_accounts: list[str]) -> None:
    plan = rt.plan
    assert plan.replication is not None
    # A link in the lab's directory to /run passes validation (what it names is no protected path as written) but is
    # /run/... on the host: preflight resolves it there.
    link = lab.path / f"mt-{os.getpid()}"
    link.unlink(missing_ok=True)
    link.symlink_to(f"/run/mt-{os.getpid()}")
    pid_dir = str(link)
    real = str(Path(pid_dir).resolve())
    broken = plan.model_copy(
        update={
            # The records point at the source's real address, not this one.
            "source": plan.source.model_copy(update={"public_address": "198.51.100.7"}),
            "files": [
                *plan.files,
                FileTree(name="media", source=str(lab.source.path / "no-such-dir"), target="/x"),
                FileTree(name="pids", source=str(lab.source.uploads), target=f"{pid_dir}/app"),
            ],
            # The replicate mode's own checks: app accounts that write through read_only, by any way.
            "cutover": plan.cutover.model_copy(update={"mode": "replicate"}),
            "replication": plan.replication.model_copy(update={"app_users": [lab.app_user, *app_accounts]}),
        }
    )
    broken_rt = with_plan(rt, broken)
    try:
        step = Preflight(mode=mode_of(broken))  # the replicate mode the plan now asks for
        with pytest.raises(StepError) as failed:
            step.run(context(broken_rt, step))
    finally:
        broken_rt.close()
    message = str(failed.value)
    assert message.startswith(f"preflight: {len(lab.records) + 3} problems: "), message
    for record in lab.records:
        assert f"DNS record {record} points at {lab.source.address}, not the source's 198.51.100.7" in message
    assert f"tree media: {lab.source.path / 'no-such-dir'} does not exist on the source" in message
    assert f"tree pids: target {pid_dir}/app is {real}/app on the target (symbolic links followed): refusing to " \
        f"sync into {real}/app: inside /run, a protected system tree" in message  # fmt: skip
    # READ_ONLY ADMIN as MariaDB 10.11 spells it, direct, through a default role and the role nested in it; SUPER
    # direct and through a role the account may SET ROLE to. The lab's own app account holds neither.
    held = [
        f"'{PREFIX}direct'@'%' holds READ_ONLY ADMIN",
        f"'{PREFIX}nested'@'%' holds READ_ONLY ADMIN through role {PREFIX}outer → {PREFIX}inner (its default role)",
        f"'{PREFIX}settable'@'%' holds SUPER through role {PREFIX}super (a role it may SET ROLE to)",
        f"'{PREFIX}super'@'%' holds SUPER",
    ]
    accounts = "replicate mode: application accounts would write through read_only inside the window: "
    assert accounts + "; ".join(held) + ": REVOKE it" in message, message
    assert f"'{lab.app_user}'@" not in message
    assert "\n" not in message
    assert not Path(real).exists(), "preflight only reads"
    link.unlink()


@pytest.fixture
def target_stopped_after(lab: LabState) -> Iterator[None]:
    """Whatever happens, the target's app and database end stopped and the source database runs."""
    try:
        yield
    finally:
        run_bin(lab.target, "app-stop")
        run_bin(lab.target, "db-stop")
        run_bin(lab.source, "db-start")


@pytest.mark.lab
@pytest.mark.usefixtures("target_stopped_after")
def test_prepare_then_db_presync_logs_each_round(rt: Runtime) -> None:
    prepare = PrepareTarget()
    prepare.run(context(rt, prepare))
    assert prepare.check(context(rt, prepare)) is True  # the target database no longer answers

    plan = rt.plan
    database = plan.database.model_copy(update={"presync": PresyncRounds(max_rounds=3, converged_bytes=0)})
    rounds_rt = with_plan(rt, plan.model_copy(update={"database": database}))
    try:
        step = DbPresync()
        with structlog.testing.capture_logs() as logs:
            result = step.run(context(rounds_rt, step))
    finally:
        rounds_rt.close()
    assert result is not None
    rounds = result["rounds"]
    assert [r["round"] for r in rounds] == list(range(1, len(rounds) + 1)) and 1 <= len(rounds) <= 3
    # Stopped early only because a round moved nothing (converged_bytes=0).
    assert len(rounds) == 3 or rounds[-1]["bytes"] == 0
    assert result["converged"] == (rounds[-1]["bytes"] == 0)
    assert result["predicted_final_seconds"] == rounds[-1]["seconds"]
    logged = [(e["round"], e["bytes"], e["seconds"]) for e in logs if e["event"] == "db_presync_round"]
    assert logged == [(r["round"], r["bytes"], r["seconds"]) for r in rounds]


def source_tables(rt: Runtime) -> list[str]:
    conn = rt.db("source")
    try:
        return [f"{s}.{t}" for s, t in mysql.list_tables(conn, rt.plan.database.schemas)]
    finally:
        rt.release(conn)


def target_sql(rt: Runtime, sql: str) -> None:
    conn = rt.db("target")
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        rt.release(conn)


def healthz(host: HostState) -> int:
    with urllib.request.urlopen(f"http://{host.address}:{host.app_port}/healthz", timeout=5) as answer:
        return int(answer.status)


@pytest.mark.lab
@pytest.mark.usefixtures("target_stopped_after")
def test_start_target_verify_then_the_audit_finds_a_planted_difference_then_undo(rt: Runtime, lab: LabState) -> None:
    for cls in (PrepareTarget, FilesPresync):
        cls().run(context(rt, cls()))
    # What the cut-over does: before the window, how the source's server runs (for the audit); the tables under the
    # lock; then a final pass of its cleanly stopped datadir. The source stays stopped, as after a cut-over.
    datadir = real_datadir(rt.source, rt.plan.database.source.datadir)
    audit.held(rt).source = audit.read_launch(
        rt.source, innodb_files_visible(rt.source, datadir)[0], rt.database.server_programs
    )
    tables = source_tables(rt)
    run_bin(lab.source, "db-stop")
    DbPresync().run(context(rt, DbPresync()))
    outputs = {"cutover": {"tables": tables, "writes_blocked_at": rt.window.begin()}}

    start = StartTarget()
    result = start.run(context(rt, start, outputs))
    assert result is not None and result["services"] == ["app"]
    assert rt.db_answers("target") and healthz(lab.target) == 200

    # A row lost on the way (planted): the in-window verification reads no rows, it cannot see it.
    reviews = f"{lab.db_name}.reviews"
    target_sql(rt, f"DELETE FROM {reviews} LIMIT 1")
    verify = VerifyTarget()
    verified = verify.run(context(rt, verify, outputs))
    assert verified is not None and verified["trees_differing_items"] == {"uploads": 0}
    assert verified["audit_snapshot_at"] and "row_counts" not in verified
    # After the commit the target takes writes: one more row would hide the lost one from a live count.
    target_sql(rt, f"INSERT INTO {reviews} (id, author) VALUES ('after-commit', 'audit test')")

    with structlog.testing.capture_logs() as logs:
        audited = Audit().run(context(rt, Audit(), outputs))
    assert audited is not None and audited["status"] == "differs", audited
    assert len(audited["differences"]) == 1
    assert re.fullmatch(rf"{reviews}: row count: source (\d+), target (\d+)", audited["differences"][0])
    source_n, target_n = map(int, re.findall(r"\d+", audited["differences"][0].split(": ", 2)[2]))
    assert target_n == source_n - 1 and audited["row_counts"][reviews] == source_n
    assert any(e["event"] == "audit" and e["log_level"] == "warning" for e in logs)
    # The source's server started for the audit is gone again; nothing holds the source's InnoDB files.
    assert innodb_holders(rt.source, datadir) == {}
    assert not rt.db_answers("source"), "the source takes no connection: it stays stopped after the audit"

    start.undo(context(rt, start, outputs))
    assert not rt.db_answers("target")
    start.undo(context(rt, start, outputs))  # idempotent: stopping what is stopped is fine
    assert not rt.db_answers("target")


@pytest.mark.lab
def test_steps_in_the_window_fail_once_the_write_budget_is_spent(rt: Runtime) -> None:
    outputs = {"cutover": {"writes_blocked_at": rt.window.begin(time.time() - rt.plan.cutover.max_write_block - 1)}}
    for cls in (DbFinal, FilesFinal, StartTarget, VerifyTarget):
        step = cls()
        with pytest.raises(StepError, match=r"more than cutover\.max_write_block"):
            step.run(context(rt, step, outputs))
    assert not rt.db_answers("target")  # nothing was started


@pytest.mark.lab
def test_preflight_refuses_a_bad_cloudflare_token_without_showing_it(
    rt: Runtime, lab: LabState, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad_token = "bad-token-0123456789abcdef"
    monkeypatch.setenv(lab.token_env, bad_token)
    step = Preflight()
    with pytest.raises(StepError, match=r"^preflight: 1 problem: Cloudflare.*token") as failed:
        step.run(context(rt, step))
    assert bad_token not in str(failed.value)
