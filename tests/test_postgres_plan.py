"""The PostgreSQL lab's plan (`lab up --engine postgresql`) without a lab: it describes the PostgreSQL service, with
the replication section `auto` needs to choose the replicate mode."""

from __future__ import annotations

from pathlib import Path

from migrate_lab import hosts, planfile
from migrate_lab import postgres as pglab
from orchestrator.plan.loader import load_plan
from orchestrator.plan.model import static_mode


def test_the_postgresql_lab_plan_describes_the_service_and_its_replication(tmp_path: Path) -> None:
    state = hosts.new_state(tmp_path, hosts.SOURCE_ADDRESS, hosts.TARGET_ADDRESS, default_ports=False)
    state.engine = pglab.ENGINE
    state.cf_port = 8443
    state.save()
    plan = load_plan(planfile.write_plan(state)).plan
    # `auto` (the lab's default) stays auto: the servers' facts decide when a run starts.
    assert plan.database.engine == "postgresql" and plan.cutover.mode == "auto" == static_mode(plan)
    assert plan.replication is not None and plan.replication.user == state.repl_user
    assert (plan.replication.source and plan.replication.source.port) == state.source.db_port
    assert plan.database.schemas == [state.db_name]
    for endpoint, host in ((plan.database.source, state.source), (plan.database.target, state.target)):
        assert (endpoint.host, endpoint.port) == (host.address, host.db_port)
        assert endpoint.datadir == str(pglab.data_dir(host))
        assert endpoint.start.endswith("/db-start") and endpoint.stop.endswith("/db-stop")
    queries = [check.query for check in plan.health.checks if check.kind == "sql"]
    assert queries == ["SELECT EXISTS(SELECT 1 FROM reviews)::int"]  # connected to the database itself
    assert plan.services.target_fence.enable  # the app's fence holds the target's writes until the commit
