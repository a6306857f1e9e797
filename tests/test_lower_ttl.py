"""The lower_ttl step through the real engine and journal, against the lab's Cloudflare API double (official SDK over
HTTP on loopback).

Waiting (at the gate before the downtime, `wait_out_old_ttl`, as `migrate apply` does) is done on a clock the test
advances, so nothing here depends on wall-clock time: the assertions are on the journaled facts and on the records'
state in the double.
"""

from __future__ import annotations

import json
import secrets as pysecrets
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudflare
import pytest
import structlog

from migrate_lab import cfapi
from migrate_lab.state import HostState, LabState
from orchestrator.engine.hooks import HookRunner
from orchestrator.engine.journal import Journal, StepState
from orchestrator.engine.machine import Engine, EngineConfig, Outcome
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.loader import load_plan
from orchestrator.plan.model import Plan, Retry
from orchestrator.runtime import Runtime
from orchestrator.services.dns_ttl import ORIGINAL_TTLS, restore_original_ttls, wait_out_old_ttl
from orchestrator.steps.lower_ttl import LOWERED_AT, WAIT_UNTIL, LowerTtl

EXAMPLE_PLAN = Path(__file__).parent.parent / "plans" / "course-review.yaml"
LOWER_TO = 30  # the double's smallest TTL, as Cloudflare's for enterprise zones


@dataclass
class Api:
    state: LabState
    token: str

    def client(self) -> cloudflare.Cloudflare:
        return cloudflare.Cloudflare(api_token=self.token, base_url=self.state.cf_base_url, max_retries=0)

    def control(self, path: str, method: str = "GET") -> Any:
        url = f"http://{self.state.cf_address}:{self.state.cf_port}/__lab/{path}"
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=5) as answer:
            return json.loads(answer.read())


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    root = tmp_path_factory.mktemp("cf-ttl")
    token = "lab-" + pysecrets.token_hex(16)

    def host(name: str, address: str, server_id: int) -> HostState:
        return HostState(name, address, 0, 0, 0, server_id, str(root / name))

    state = LabState(dir=str(root), source=host("source", "127.0.0.2", 1), target=host("target", "127.0.0.3", 2))
    state.env_file.write_text(f"CLOUDFLARE_API_TOKEN={token}\n")
    cfapi.start(state)
    try:
        yield Api(state, token)
    finally:
        cfapi.stop(state)


@pytest.fixture
def env(api: Api, monkeypatch: pytest.MonkeyPatch) -> Api:
    for name in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY", "CLOUDFLARE_BASE_URL", "CLOUDFLARE_API_USER_SERVICE_KEY",
                 "CLOUDFLARE_CUSTOM_HEADERS"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", api.token)
    api.control("requests", "DELETE")
    return api


@dataclass
class Records:
    zone_id: str
    ids: dict[str, str]  # name → id

    @property
    def names(self) -> list[str]:
        return list(self.ids)


def make_records(api: Api, specs: dict[str, dict[str, Any]]) -> Records:
    """Fresh records (unique names) in the lab zone: short name → fields."""
    ids: dict[str, str] = {}
    with api.client() as client:
        zone_id = client.zones.list(name=api.state.zone).result[0].id
        for short, fields in specs.items():
            name = f"{short}-{uuid.uuid4().hex[:8]}.{api.state.zone}"
            created = client.dns.records.create(zone_id=zone_id, name=name, type="A", **fields)
            ids[name] = created.id
    return Records(zone_id, ids)


def ttls(api: Api, records: Records) -> dict[str, tuple[int, bool, str]]:
    """name → (ttl, proxied, content) as the API holds it now."""
    with api.client() as client:
        found = {}
        for name, record_id in records.ids.items():
            record = client.dns.records.get(record_id, zone_id=records.zone_id)
            found[name] = (int(record.ttl), bool(record.proxied), str(record.content))
        return found


def plan_for(api: Api, records: Records, **dns: Any) -> Plan:
    """The example plan, aimed at the double and these records, with the (proposed) dns.lower_ttl_* fields."""
    plan = load_plan(EXAMPLE_PLAN).plan
    dns_section = plan.dns.model_copy(
        update={"zone": api.state.zone, "records": records.names, "base_url": api.state.cf_base_url, **dns}
    )
    return plan.model_copy(update={"dns": dns_section, "retry": Retry(attempts=2, max_seconds=5, max_wait=0.2)})


class Clock:
    """Time for the step: advances only when the step sleeps (or the test says time passed)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class CutoverProbe(Step):
    """Stands where the cut-over would: notes the records' TTLs and the time when it is allowed to begin."""

    name = "cutover"
    title = "probe at the cut-over"
    begins_downtime = True

    def __init__(self, clock: Clock, api: Api, records: Records) -> None:
        self.clock, self.api, self.records = clock, api, records

    def describe(self, ctx: StepContext) -> list[str]:
        return []

    def run(self, ctx: StepContext) -> dict[str, Any]:
        return {"at": self.clock(), "ttls": {n: t[0] for n, t in ttls(self.api, self.records).items()}}


class FinishProbe(Step):
    name = "finish"
    title = "finish: put the TTLs back after the commit"

    def describe(self, ctx: StepContext) -> list[str]:
        return []

    def run(self, ctx: StepContext) -> dict[str, Any]:
        return {"restored": restore_original_ttls(ctx)}


class Fails(Step):
    name = "files_final"
    title = "fails inside the window"
    begins_downtime = True

    def describe(self, ctx: StepContext) -> list[str]:
        return []

    def run(self, ctx: StepContext) -> dict[str, Any]:
        raise StepError("failed on purpose")


class Killed(BaseException):
    """The process dying in the middle of the wait (as kill -9 would: nothing runs after it)."""


def make_engine(
    tmp_path: Path, plan: Plan, steps: list[Step], clock: Clock | None = None, sleep: Any = None
) -> tuple[Engine, Runtime]:
    """An engine whose gate before the downtime waits out the old TTL the way `migrate apply`'s does, on `clock`."""
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(EXAMPLE_PLAN.read_text())
    rt = Runtime(plan, plan_path)
    log = structlog.get_logger("test")
    journal = Journal(tmp_path / "journal.jsonl")
    clock = clock or Clock()

    def gate(step: Step) -> bool:
        wait_out_old_ttl(journal.events, log, clock=clock, sleep=sleep or clock.sleep)
        return True

    engine = Engine(
        steps,
        journal,
        config=EngineConfig(str(plan_path), plan.name, "0" * 64, "name: test\n"),
        rt=rt,
        hooks=HookRunner(None, timeout=10, base_env={}, log=log),
        confirm=gate,
        log=log,
    )
    return engine, rt


def saved(engine: Engine, key: str) -> list[Any]:
    return [e["value"] for e in engine.journal.events if e["event"] == "step_saved" and e["key"] == key]


def patched_ids(api: Api) -> list[str]:
    return [r["path"].rsplit("/", 1)[-1] for r in api.control("state")["requests"] if r["method"] == "PATCH"]


SPECS = {
    "www": {"content": "10.0.0.1", "ttl": 300},
    "api": {"content": "10.0.0.1", "ttl": 120},
    "cdn": {"content": "10.0.0.1", "ttl": 1, "proxied": True},
}


def test_ttl_lowered_waited_out_before_the_cutover_and_restored_after_the_commit(env: Api, tmp_path: Path) -> None:
    records = make_records(env, SPECS)
    www, api_name, cdn = records.names
    before = ttls(env, records)
    clock = Clock()
    plan = plan_for(env, records, lower_ttl_to=LOWER_TO)
    steps: list[Step] = [LowerTtl(clock=clock), CutoverProbe(clock, env, records), FinishProbe()]
    engine, rt = make_engine(tmp_path, plan, steps, clock)
    try:
        engine.start_run()
        assert engine.forward() == Outcome.COMPLETED
    finally:
        rt.close()

    # The originals were journaled (the proxied record with them, marked as such).
    [originals] = saved(engine, ORIGINAL_TTLS)
    assert {o["name"]: (o["ttl"], o["proxied"]) for o in originals.values()} == {
        www: (300, False),
        api_name: (120, False),
        cdn: (1, True),
    }
    # The cut-over began only once the longest old TTL had run out since the last record was lowered, with the
    # records at the low TTL; the proxied one never touched.
    [lowered_at], [wait_until] = saved(engine, LOWERED_AT), saved(engine, WAIT_UNTIL)
    assert wait_until - lowered_at == 300
    probe = engine.state().step("cutover").result  # type: ignore[union-attr]
    assert probe["at"] >= wait_until and sum(clock.slept) == 300
    assert probe["ttls"] == {www: LOWER_TO, api_name: LOWER_TO, cdn: 1}
    result = engine.state().step("lower_ttl").result  # type: ignore[union-attr]
    assert result["proxied_skipped"] == [cdn]
    assert records.ids[cdn] not in patched_ids(env)
    # After the commit: every TTL back as it was, the content and proxying untouched.
    assert engine.state().step("finish").result["restored"] == sorted([www, api_name])  # type: ignore[union-attr]
    assert ttls(env, records) == before


@pytest.mark.parametrize("how", ["a later step fails", "Ctrl-C during the wait"])
def test_rollback_restores_the_original_ttls(env: Api, tmp_path: Path, how: str) -> None:
    records = make_records(env, {k: v for k, v in SPECS.items() if k != "cdn"})
    before = ttls(env, records)
    clock = Clock()
    sleep = clock.sleep
    if how == "Ctrl-C during the wait":

        def sleep(seconds: float) -> None:
            assert {t[0] for t in ttls(env, records).values()} == {LOWER_TO}  # lowered before the wait
            raise KeyboardInterrupt

    steps: list[Step] = [LowerTtl(clock=clock), Fails()]
    engine, rt = make_engine(tmp_path, plan_for(env, records, lower_ttl_to=LOWER_TO), steps, clock, sleep)
    try:
        engine.start_run()
        assert engine.forward() == Outcome.ROLLED_BACK
    finally:
        rt.close()
    assert engine.state().step("lower_ttl").state == StepState.UNDONE  # type: ignore[union-attr]
    assert ttls(env, records) == before


def test_a_run_killed_during_the_wait_resumes_with_only_what_is_left(env: Api, tmp_path: Path) -> None:
    records = make_records(env, {k: v for k, v in SPECS.items() if k != "cdn"})
    before = ttls(env, records)
    clock = Clock()

    def dies(seconds: float) -> None:
        raise Killed

    plan = plan_for(env, records, lower_ttl_to=LOWER_TO)
    steps: list[Step] = [LowerTtl(clock=clock), CutoverProbe(clock, env, records), FinishProbe()]
    engine, rt = make_engine(tmp_path, plan, steps, clock, dies)
    try:
        engine.start_run()
        with pytest.raises(Killed):
            engine.forward()
    finally:
        rt.close()
    # Died at the gate before the downtime: the TTLs lowered, the cut-over not begun.
    assert engine.state().step("lower_ttl").state == StepState.DONE  # type: ignore[union-attr]
    assert engine.state().step("cutover").state == StepState.PENDING  # type: ignore[union-attr]
    [lowered_at] = saved(engine, LOWERED_AT)

    clock.now += 100  # the operator comes back 100 s later and runs `migrate apply` again
    steps = [LowerTtl(clock=clock), CutoverProbe(clock, env, records), FinishProbe()]
    engine, rt = make_engine(tmp_path, plan, steps, clock)
    try:
        engine.resume_run()
        assert engine.forward() == Outcome.COMPLETED
    finally:
        rt.close()
    assert sum(clock.slept) == 300 - 100 and clock.now == lowered_at + 300
    # The originals were not read again (they would now say 30): one journaled copy, the true one.
    assert len(saved(engine, ORIGINAL_TTLS)) == 1 and len(saved(engine, LOWERED_AT)) == 1
    assert ttls(env, records) == before


def test_without_lower_ttl_to_nothing_changes(env: Api, tmp_path: Path) -> None:
    records = make_records(env, {"www": SPECS["www"]})
    before = ttls(env, records)
    clock = Clock()
    plan = plan_for(env, records, lower_ttl_to=None)  # the example plan sets one
    step = LowerTtl(clock=clock)
    engine, rt = make_engine(tmp_path, plan, [step, FinishProbe()])
    try:
        engine.start_run()
        assert engine.forward() == Outcome.COMPLETED
        context = StepContext(run_id="x", step=step.name, dry_run=True, rt=rt, log=structlog.get_logger())
        assert "dns.lower_ttl_to" in step.describe(context)[0]
    finally:
        rt.close()
    assert ttls(env, records) == before and patched_ids(env) == [] and clock.slept == []


def test_set_ttl_edits_only_the_ttl_and_notices_a_refused_edit(env: Api) -> None:
    from orchestrator.transports.cloudflare import DnsClient, DnsError

    records = make_records(env, {"www": SPECS["www"]})
    [name] = records.names
    with DnsClient(env.token, base_url=env.state.cf_base_url, timeout=5) as dns:
        [record] = dns.find_records(records.zone_id, name, "A")
        with env.client() as client:  # the content changes after the record was read
            client.dns.records.edit(record.id, zone_id=records.zone_id, name=name, type="A", ttl=300,
                                    content="10.0.0.9")  # fmt: skip
        assert dns.set_ttl(records.zone_id, record, LOWER_TO).ttl == LOWER_TO
        assert ttls(env, records)[name] == (LOWER_TO, False, "10.0.0.9")  # the newer content was kept
        body = json.dumps({"mode": "success_false", "count": 1, "methods": ["PATCH"]}).encode()
        url = f"http://{env.state.cf_address}:{env.state.cf_port}/__lab/faults"
        urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=5).close()
        with pytest.raises(DnsError) as refused:
            dns.set_ttl(records.zone_id, record, 300)
        assert not refused.value.transient and "success: false" in str(refused.value)
    assert ttls(env, records)[name][0] == LOWER_TO
