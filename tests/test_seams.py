"""The seams steps depend on, offline: the DNS provider chosen by `dns.provider` through one factory and its
provider-neutral error, the engine's optional hooks declared on `Step`, the front doors kept on the run's runtime,
and the shared fakes standing in for each protocol."""

from __future__ import annotations

import ast
import typing
from pathlib import Path
from typing import Any

import pytest
import structlog

from orchestrator.engine.hooks import HookRunner
from orchestrator.engine.journal import Journal
from orchestrator.engine.machine import Engine, EngineConfig, Outcome
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.loader import load_plan
from orchestrator.plan.model import Dns, Plan
from orchestrator.runtime import Runtime
from orchestrator.services import dns_ttl, frontdoor
from orchestrator.steps.preflight import Preflight, Problems
from orchestrator.transports import cloudflare, dns_providers
from orchestrator.transports.dns import DnsError, DnsProvider, DnsRecord
from orchestrator.transports.meter import RoundTrips
from tests.fakes import FakeDns, LocalHost, OfflineRuntime, RecordingHost, context, plan
from tests.test_frontdoor import plan_file

ENGINE = Path(__file__).parents[1] / "orchestrator" / "engine"
SOURCE_ADDRESS = plan().source.dns_content


# --- the DNS provider ---------------------------------------------------------------------------------------------


def test_every_provider_the_plan_accepts_opens_through_the_factory_as_a_dns_provider() -> None:
    accepted = typing.get_args(Dns.model_fields["provider"].annotation)
    assert accepted == ("cloudflare",)
    meter = RoundTrips()
    settings = plan().dns.model_copy(update={"base_url": "http://127.0.0.1:9/client/v4", "timeout": 7.0})
    for name in accepted:
        provider = dns_providers.open_provider(settings.model_copy(update={"provider": name}), "t0ken", meter=meter)
        try:
            assert isinstance(provider, DnsProvider)
        finally:
            provider.close()
    # Cloudflare's: the plan's base URL and per-call timeout, no retries of its own (the steps' policies retry).
    client = dns_providers.open_provider(settings, "t0ken", meter=meter)
    assert isinstance(client, cloudflare.DnsClient)
    assert client.base_url == "http://127.0.0.1:9/client/v4" and client.timeout == 7.0
    assert client._client.max_retries == 0
    client.close()
    # A status reading bounds its calls tighter than the plan does.
    quick = dns_providers.open_provider(settings, "t0ken", timeout=2.0)
    assert isinstance(quick, cloudflare.DnsClient) and quick.timeout == 2.0
    quick.close()


def test_the_runtime_opens_the_plans_provider_once_and_closes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[FakeDns] = []

    def fake_provider(settings: Dns, token: str, **_: Any) -> FakeDns:
        assert settings.provider == "cloudflare" and token == "from-the-environment"
        opened.append(FakeDns())
        return opened[-1]

    monkeypatch.setenv("CLOUDFLARE_API_TOKEN", "from-the-environment")
    monkeypatch.setattr(dns_providers, "open_provider", fake_provider)
    rt = Runtime(plan(), Path("plans/course-review.yaml"), dry_run=True)
    assert rt.dns is rt.dns and len(opened) == 1
    rt.close()
    assert opened[0].closed


def test_cloudflares_errors_are_the_provider_neutral_dns_error() -> None:
    assert cloudflare.DnsError is DnsError and cloudflare.DnsRecord is DnsRecord
    with pytest.raises(DnsError, match="token is empty"):
        dns_providers.open_provider(plan().dns, "")


def _records(*contents: str) -> list[DnsRecord]:
    names = plan().dns.records
    return [
        DnsRecord(f"id{i}", name, "A", content, 300, False)
        for i, (name, content) in enumerate(zip(names, contents, strict=True))
    ]


def test_preflight_says_in_one_line_what_the_dns_provider_refused_and_where_a_record_points() -> None:
    dns = FakeDns({"example.com": "zone-1"}, _records(SOURCE_ADDRESS, "198.51.100.9"))
    rt = OfflineRuntime(plan(), dns=dns)
    problems = Problems()
    Preflight()._dns(context(rt, "preflight"), problems)
    assert problems.items == [
        f"DNS record www.example.com points at 198.51.100.9, not the source's {SOURCE_ADDRESS}: fix "
        "source.public_address or the record"
    ]
    # Per record: its A records, then (once) the edit check, then the other family's records beside them.
    assert [c[0] for c in dns.calls] == [
        "verify_token", "zone_id", "find_records", "check_can_edit", "find_records", "find_records", "find_records"
    ]  # fmt: skip
    # The provider's error, whatever the provider: its own line, no traceback.
    dns.failures["zone_id"] = [
        DnsError("fake DNS: HTTP 403: 9109 Unauthorized to access requested resource", transient=False)
    ]
    problems = Problems()
    Preflight()._dns(context(rt, "preflight"), problems)
    assert problems.items == ["fake DNS: HTTP 403: 9109 Unauthorized to access requested resource"]


def test_preflight_refuses_a_name_whose_other_address_family_the_plan_does_not_move() -> None:
    """An AAAA record beside the A record the plan flips would keep IPv6 clients on the old server after the
    commit: refused in one line naming the record, the family and its content; nothing else is said of it."""
    names = plan().dns.records
    six = DnsRecord("id-six", names[0], "AAAA", "2001:db8::5", 300, False)
    dns = FakeDns({"example.com": "zone-1"}, [*_records(SOURCE_ADDRESS, SOURCE_ADDRESS), six])
    problems = Problems()
    Preflight()._dns(context(OfflineRuntime(plan(), dns=dns), "preflight"), problems)
    (line,) = problems.items
    assert line.startswith(f"DNS record {names[0]} also has AAAA records (2001:db8::5) the plan does not move"), line
    assert "IPv6" in line


def test_a_secret_that_does_not_resolve_is_a_preflight_problem_naming_the_provider() -> None:
    class NoToken(OfflineRuntime):
        @property
        def dns(self) -> FakeDns:  # type: ignore[override]  # the real runtime resolves the token here
            raise StepError("secret: environment variable CLOUDFLARE_API_TOKEN is not set")

        @dns.setter
        def dns(self, value: FakeDns) -> None:
            pass

    problems = Problems()
    Preflight()._dns(context(NoToken(plan()), "preflight"), problems)
    assert problems.items == ["DNS (cloudflare): secret: environment variable CLOUDFLARE_API_TOKEN is not set"]


def test_the_original_ttls_are_put_back_through_the_provider_and_every_record_is_tried() -> None:
    lowered = _records(SOURCE_ADDRESS, SOURCE_ADDRESS)
    lowered = [DnsRecord(r.id, r.name, r.type, r.content, 60, r.proxied) for r in lowered]
    dns = FakeDns({"example.com": "zone-1"}, lowered)
    originals = {r.id: {"id": r.id, "name": r.name, "type": "A", "ttl": 3600, "proxied": False} for r in lowered}
    rt = OfflineRuntime(plan(), dns=dns)
    dns.failures["set_ttl"] = [DnsError("fake DNS: HTTP 400: TTL refused", transient=False)]
    outputs = {dns_ttl.LOWER_TTL_STEP: {dns_ttl.ORIGINAL_TTLS: originals}}
    saved: dict[str, Any] = {}
    with pytest.raises(StepError, match=r"example.com: fake DNS: HTTP 400: TTL refused") as caught:
        dns_ttl.restore_original_ttls(context(rt, "finish", saved=saved, outputs=outputs))
    assert "www.example.com" not in str(caught.value)  # the second record was tried, and put back
    assert dns.records["id1"].ttl == 3600 and dns.records["id0"].ttl == 60
    assert dns_ttl.RESTORED not in saved
    # Again: only what is not back yet is edited, then the step remembers it is done.
    dns.calls.clear()
    assert dns_ttl.restore_original_ttls(context(rt, "finish", saved=saved, outputs=outputs)) == sorted(
        r.name for r in lowered
    )
    assert dns.edits() == [("set_ttl", "example.com 3600")]
    assert saved[dns_ttl.RESTORED] is True


# --- the engine's optional hooks ----------------------------------------------------------------------------------


class Plain(Step):
    name = "plain"
    title = "plain"

    def describe(self, ctx: StepContext) -> list[str]:
        return []

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        return {}


class Settling(Step):
    def __init__(self, name: str, actions: list[str], *, fail: bool = False) -> None:
        self.name = name
        self.title = name
        self.actions = actions
        self.fail = fail

    def describe(self, ctx: StepContext) -> list[str]:
        return []

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        if self.fail:
            raise StepError(f"{self.name} failed on purpose")
        return {}

    def undo(self, ctx: StepContext) -> None:
        self.actions.append(f"undo {self.name}")

    def settle_after_rollback(self, ctx: StepContext) -> None:
        self.actions.append(f"settle {self.name}")


def test_the_hooks_are_declared_on_step_as_no_ops_and_the_engine_looks_none_up_by_name() -> None:
    ctx = context(None, "plain")
    for hook in ("reattach", "settle_after_rollback", "observe_at_end"):
        assert callable(getattr(Step, hook)) and getattr(Plain(), hook)(ctx) is None
    engine = ast.parse((ENGINE / "machine.py").read_text())
    looked_up = [
        node.args[1].value
        for node in ast.walk(engine)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) in ("getattr", "hasattr")
        and len(node.args) > 1
        and isinstance(node.args[1], ast.Constant)
    ]
    assert looked_up == [], f"the engine finds hooks by name: {looked_up}"


def test_settling_comes_after_every_compensation_newest_first_and_only_for_steps_that_began(tmp_path: Path) -> None:
    actions: list[str] = []
    steps: list[Step] = [
        Settling("cutover", actions),
        Settling("dns_flip", actions, fail=True),
        Settling("finish", actions),  # never began
    ]
    log = structlog.get_logger("test")
    engine = Engine(
        steps,
        Journal(tmp_path / "journal.jsonl"),
        config=EngineConfig(plan_path="p", plan_name="p", plan_sha256="h", plan_text=""),
        rt=None,
        hooks=HookRunner(None, timeout=10, base_env={}, log=log),
        confirm=lambda step: True,
        log=log,
    )
    engine.start_run()
    assert engine.forward() == Outcome.ROLLED_BACK
    assert actions == ["undo dns_flip", "undo cutover", "settle dns_flip", "settle cutover"]


# --- per-run state on the runtime ---------------------------------------------------------------------------------


def test_each_runtime_keeps_its_own_front_doors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[tuple[object, str]] = []

    def over_ssh(host: object, socket: str, **_: Any) -> object:
        opened.append((host, socket))
        return object()

    monkeypatch.setattr(frontdoor, "over_ssh", over_ssh)
    with_doors: Plan = load_plan(plan_file(tmp_path)).plan
    first, second = OfflineRuntime(with_doors), OfflineRuntime(with_doors)
    door = frontdoor.door(context(first, "cutover"), "source")
    assert frontdoor.door(context(first, "dns_flip"), "source") is door  # one route per door and run
    assert first.front_doors == {"source": door}
    other = frontdoor.door(context(second, "cutover"), "source")
    assert other is not door and second.front_doors == {"source": other}
    assert opened == [(first.source, "/run/haproxy/admin.sock"), (second.source, "/run/haproxy/admin.sock")]
    assert not hasattr(frontdoor, "_doors")


def test_the_real_runtime_forgets_its_front_doors_when_it_closes() -> None:
    rt = Runtime(plan(), Path("plans/course-review.yaml"), dry_run=True)
    rt.front_doors["source"] = object()  # type: ignore[assignment]  # what frontdoor.door keeps there
    rt.close()
    assert rt.front_doors == {}


# --- the shared fakes ---------------------------------------------------------------------------------------------


def test_the_fakes_stand_in_for_their_protocols() -> None:
    assert isinstance(FakeDns(), DnsProvider)
    # LocalHost fails a command as SshHost does (CommandFailed, a TransportError), unless asked not to check.
    from orchestrator.transports.ssh import CommandFailed

    with pytest.raises(CommandFailed):
        LocalHost().run("exit 3")
    assert LocalHost().run("echo out; exit 3", check=False).stdout == "out\n"
    lines: list[str] = []
    assert LocalHost().stream("printf 'a\\nb\\n'", lines.append, keep=lambda line: line == "b").stdout == "b"
    assert lines == ["a", "b"]
    host = RecordingHost([("^uname", "Linux")])
    assert host.run("uname -s", timeout=3).stdout == "Linux" and host.timeouts == [3]


# --- the DNS flip after a commit at the front door -----------------------------------------------------------------


def test_after_the_door_commit_the_dns_flip_is_no_commit_point_and_retries_until_its_own_bound() -> None:
    """DnsFlip(commits=False): re-entered on resume (its result carries when DNS was seen converged), the whole flip
    tried again with backoff, the write budget never asked; past dns.converge_timeout the run stays committed with
    one line saying DNS is pending."""
    from orchestrator.steps.dns_flip import DnsFlip

    target = plan().dns_content
    step = DnsFlip(commits=False)
    assert step.commit_point is False and "after the commit" in step.title
    dns = FakeDns({"example.com": "zone-1"}, _records(SOURCE_ADDRESS, SOURCE_ADDRESS))
    rt = OfflineRuntime(plan(), dns=dns)
    # The budget is long spent (writes flow since the door's switch): it must not bound the flip.
    rt.window.begin(0.0)
    dns.failures["set_content"] = [DnsError("fake DNS: HTTP 503: try again", transient=True)] * 3
    saved: dict[str, Any] = {}
    result = step.run(context(rt, "dns_flip", saved=saved))
    assert result is not None and result["flipped_at"] and {r.content for r in dns.records.values()} == {target}
    assert set(saved["old_records"]) == {"id0", "id1"}  # journaled before the edits
    # Every record at the target now: a resumed run still re-enters the step (one read), for its result.
    assert step.check(context(rt, "dns_flip", saved=saved)) is False
    # An API refusing every edit: one line, the run committed (the engine finishes it forward), DNS pending.
    refusing = FakeDns({"example.com": "zone-1"}, _records(SOURCE_ADDRESS, SOURCE_ADDRESS))
    refusing.failures["set_content"] = [DnsError("fake DNS: HTTP 403: refused", transient=False)] * 1000
    base = plan()
    pending = base.model_copy(
        update={
            "dns": base.dns.model_copy(update={"converge_timeout": 0.5}),
            "retry": base.retry.model_copy(update={"attempts": 1}),
        }
    )
    with pytest.raises(StepError, match=r"^committed, DNS pending: .*dns\.converge_timeout 0\.5 s") as caught:
        step.run(context(OfflineRuntime(pending, dns=refusing), "dns_flip"))
    assert "\n" not in str(caught.value) and "forwards every client" in str(caught.value)
