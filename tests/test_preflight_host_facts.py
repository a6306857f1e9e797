"""Preflight judges what the hosts say, not only the plan's text, in one `migrate apply` on the lab:

- a tree target written /var/run/... passes validation (/var is protected only itself) but resolves to /run/...
  on the host, a protected system tree: refused;
- accounts of `replication.app_users` that write through read_only — READ_ONLY ADMIN as MariaDB 10.11 spells it,
  held directly or through a role (a default role and the role nested in it, or a role only SET ROLE activates),
  and SUPER — are each refused, named with the privilege and the roles it comes through.

All in one line (the preflight's), exit 1, nothing changed on either host: the run stops at its first step.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from orchestrator import exit_codes
from orchestrator.lab import mariadb
from orchestrator.lab.state import LabState
from tests.test_e2e import PLAN_NAMES, migrate_apply, outcome, restore_source_live
from tests.test_replicate_e2e import journal_events

pytestmark = pytest.mark.lab

PREFIX = "hostfacts_"
ACCOUNTS = {  # name → what makes it write through read_only
    f"{PREFIX}direct": "GRANT READ_ONLY ADMIN ON *.* TO {account}",
    f"{PREFIX}nested": "GRANT {PREFIX}outer TO {account}; SET DEFAULT ROLE {PREFIX}outer FOR {account}",
    f"{PREFIX}settable": "GRANT {PREFIX}super TO {account}",
    f"{PREFIX}super": "GRANT SUPER ON *.* TO {account}",
}
ROLES = f"""CREATE ROLE {PREFIX}inner; GRANT READ_ONLY ADMIN ON *.* TO {PREFIX}inner;
CREATE ROLE {PREFIX}outer; GRANT {PREFIX}inner TO {PREFIX}outer; GRANT SELECT ON coursereview.* TO {PREFIX}outer;
CREATE ROLE {PREFIX}super; GRANT SUPER ON *.* TO {PREFIX}super;"""


def drop_all(state: LabState) -> None:
    drops = [f"DROP USER IF EXISTS {name}@'%'" for name in [*ACCOUNTS, f"{PREFIX}super"]]
    drops += [f"DROP ROLE IF EXISTS {PREFIX}{role}" for role in ("inner", "outer", "super")]
    mariadb.run_sql(state.source, "; ".join(drops) + ";", timeout=60)


@pytest.fixture
def accounts(lab: LabState) -> Iterator[LabState]:
    restore_source_live(lab)
    drop_all(lab)
    sql = [ROLES]
    for name, grant in ACCOUNTS.items():
        account = f"{name}@'%'"
        sql.append(f"CREATE USER {account}; " + grant.format(account=account, PREFIX=PREFIX) + ";")
    mariadb.run_sql(lab.source, "\n".join(sql), timeout=60)
    try:
        yield lab
    finally:
        drop_all(lab)


def test_preflight_refuses_what_the_hosts_resolve_and_grant_in_one_line(accounts: LabState) -> None:
    state = accounts
    pid_dir = f"/var/run/mt-{uuid.uuid4().hex[:6]}"
    yaml = YAML()
    data = yaml.load(state.plan_file.read_text())
    data["name"] = f"{data['name']}-hostfacts"
    data["cutover"]["mode"] = "replicate"
    data["replication"]["app_users"] = [state.app_user, *ACCOUNTS]
    data["files"].append({"name": "pids", "source": str(state.source.uploads), "target": f"{pid_dir}/app"})
    PLAN_NAMES.add(str(data["name"]))
    plan = state.path / "plan-hostfacts.yaml"
    with plan.open("w") as out:
        yaml.dump(data, out)
    try:
        result = migrate_apply(state, plan)
    finally:
        assert not Path(pid_dir.replace("/var/run", "/run", 1)).exists(), "something was written under /run"

    assert result.returncode == exit_codes.FAILED, outcome(result)
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "preflight: " in line]
    problem = next((line for line in lines if "problems: " in line), "")
    assert problem, outcome(result)
    real = pid_dir.replace("/var/run", "/run", 1)
    assert (
        f"tree pids: target {pid_dir}/app is {real}/app on the target (symbolic links followed): refusing to sync "
        f"into {real}/app: inside /run, a protected system tree"
    ) in problem
    held = [
        f"'{PREFIX}direct'@'%' holds READ_ONLY ADMIN",
        f"'{PREFIX}nested'@'%' holds READ_ONLY ADMIN through role {PREFIX}outer → {PREFIX}inner (its default role)",
        f"'{PREFIX}settable'@'%' holds SUPER through role {PREFIX}super (a role it may SET ROLE to)",
        f"'{PREFIX}super'@'%' holds SUPER",
    ]
    accounts_problem = "application accounts would write through read_only inside the window: " + "; ".join(held)
    assert accounts_problem + ": REVOKE it" in problem, problem
    assert f"'{state.app_user}'@" not in problem  # the lab's app account holds neither
    assert "Traceback" not in result.stdout + result.stderr
    # The run stopped at its first step: nothing was done on either host.
    started = [ev["step"] for ev in journal_events(state, plan) if ev.get("event") == "step_started"]
    assert started == ["preflight"], started
