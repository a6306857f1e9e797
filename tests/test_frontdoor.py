"""The plan's `proxy` section (the front doors): what it accepts, every mistake one `file:line:col` line, the JSON
Schema, the reverse plan swapping the doors, and the example plan's commented section being a valid one; what
finish reports of the forwarding, waiting for it when the plan asks."""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.engine.step import StepContext
from orchestrator.plan.loader import PlanError, load_plan, plan_json_schema
from orchestrator.services import frontdoor
from orchestrator.services.frontdoor import FORWARDED, SOURCE_HOLD
from tests.test_plan import EXAMPLE, SMALL_PLAN

DOOR = """\
proxy:
  source:
    admin_socket: /run/haproxy/admin.sock
    frontend: shop_front
    backend: shop_app
    server: app
    hold_map: /etc/haproxy/frontdoor.map
    app: {address: 127.0.0.1, port: 8080}
    forward_to: {address: 203.0.113.20, port: 80}
  target:
    admin_socket: /run/haproxy/admin.sock
    frontend: shop_front
    backend: shop_app
    server: app
    hold_map: /etc/haproxy/frontdoor.map
    app: {address: 127.0.0.1, port: 8080}
    forward_to: {address: 203.0.113.10, port: 80}
    drain_timeout: 2.5
"""
# Line of DOOR's first line in the plan file (SMALL_PLAN's lines, then DOOR).
FIRST = SMALL_PLAN.count("\n") + 1


def plan_file(tmp_path: Path, door: str = DOOR) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(SMALL_PLAN + door)
    return path


def problem(tmp_path: Path, old: str, new: str) -> str:
    assert old in DOOR
    with pytest.raises(PlanError) as caught:
        load_plan(plan_file(tmp_path, DOOR.replace(old, new, 1)))
    text = str(caught.value)
    assert "\n" not in text
    return text


def test_a_plan_without_proxy_keeps_the_fence(tmp_path: Path) -> None:
    assert load_plan(plan_file(tmp_path, "")).plan.proxy is None


def test_front_doors_load_with_their_defaults(tmp_path: Path) -> None:
    proxy = load_plan(plan_file(tmp_path)).plan.proxy
    assert proxy is not None and proxy.source is not None and proxy.target is not None
    assert proxy.source.kind == "haproxy"
    assert (proxy.source.forward_to.address, proxy.source.forward_to.port) == ("203.0.113.20", 80)
    assert proxy.source.drain_timeout == 5.0 and proxy.target.drain_timeout == 2.5
    assert proxy.source.forward_margin == 30.0


def test_one_door_is_enough_but_not_none(tmp_path: Path) -> None:
    source_only = DOOR[: DOOR.index("  target:")]
    assert load_plan(plan_file(tmp_path, source_only)).plan.proxy.target is None  # type: ignore[union-attr]
    with pytest.raises(PlanError, match="give 'source', 'target' or both"):
        load_plan(plan_file(tmp_path, "proxy: {}\n"))


@pytest.mark.parametrize(
    ("old", "new", "field", "says"),
    [
        ("admin_socket: /run/haproxy/admin.sock", "admin_socket: run/admin.sock", "admin_socket", "absolute"),
        ("admin_socket: /run/haproxy/admin.sock", "admin_socket: /run/ha proxy.sock", "admin_socket", "spaces"),
        ("admin_socket: /run/haproxy/admin.sock", 'admin_socket: "/run/\\x01.sock"', "admin_socket", "control"),
        ("admin_socket: /run/haproxy/admin.sock", f"admin_socket: /{'s' * 120}", "admin_socket", "too long"),
        ("hold_map: /etc/haproxy/frontdoor.map", "hold_map: /etc/haproxy/door's.map", "hold_map", "quotes"),
        ("frontend: shop_front", "frontend: shop front", "frontend", "HAProxy name"),
        ("server: app", "server: ''", "server", "HAProxy name"),
        ("address: 203.0.113.20", "address: new.example.com", "address", "IP address"),
        ("port: 80}", "port: 0}", "port", "at least 1"),
        ("port: 80}", "port: '80'}", "port", "whole number"),
        ("kind: haproxy", "kind: nginx", "kind", "haproxy"),
        ("drain_timeout: 2.5", "drain_timeout: 301", "drain_timeout", "300"),
        ("drain_timeout: 2.5", "drain_timeout: -1", "drain_timeout", "0"),
        ("drain_timeout: 2.5", "drain_timout: 2.5", "drain_timout", "unknown key"),
    ],
)
def test_each_mistake_is_one_line_naming_the_field(tmp_path: Path, old: str, new: str, field: str, says: str) -> None:
    door = DOOR if "kind" not in old else DOOR.replace("  source:\n", "  source:\n    kind: haproxy\n", 1)
    assert old in door
    with pytest.raises(PlanError) as caught:
        load_plan(plan_file(tmp_path, door.replace(old, new, 1)))
    text = str(caught.value)
    assert "\n" not in text and "Traceback" not in text
    assert re.match(r"^.+plan\.yaml:\d+:\d+: ", text), text
    line = int(text.split("plan.yaml:")[1].split(":")[0])
    assert line >= FIRST, text  # blamed inside the proxy section
    assert field in text and says.lower() in text.lower(), text


def test_json_schema_describes_the_proxy_section() -> None:
    schema = plan_json_schema()
    text = str(schema)
    assert "proxy" in schema["properties"]
    for word in ("admin_socket", "hold_map", "forward_to", "drain_timeout", "forward_margin"):
        assert word in text


def test_reverse_plan_swaps_the_front_doors(tmp_path: Path) -> None:
    target_fence = "  target_fence: {enable: touch /srv/maintenance, disable: rm -f /srv/maintenance}\n"
    plan = load_plan(plan_file(tmp_path, target_fence + DOOR)).plan
    back = plan.reversed()
    assert back.proxy is not None and plan.proxy is not None
    assert back.proxy.source == plan.proxy.target and back.proxy.target == plan.proxy.source
    # The reversed source forwards to the forward run's source: the service goes home.
    assert back.proxy.source is not None and back.proxy.source.forward_to.address == "203.0.113.10"


def test_the_example_plans_commented_front_doors_are_valid(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    start = text.index("#proxy:\n")
    end = text.index("\n\n", start)
    enabled = text[:start] + "\n".join(line[1:] for line in text[start:end].splitlines()) + text[end:]
    path = tmp_path / "course-review.yaml"
    path.write_text(enabled)
    proxy = load_plan(path).plan.proxy
    assert proxy is not None and proxy.source is not None and proxy.source.forward_to.address == "203.0.113.20"


# --- finish: the forwarding's figures, waited for when the plan asks -----------------------------------------------


class CountingDoor:
    """The source's door as finish reads it: `show stat` whose frontend counter grows by `step` each time it is
    read; repointing and releasing are recorded."""

    frontend = "shop_front"

    def __init__(self, start: int, step: int) -> None:
        self.total = start
        self.step = step
        self.actions: list[str] = []

    def ask(self, command: str) -> str:
        assert command == "show stat"
        self.total += self.step
        return f"# pxname,svname,req_tot\nshop_front,FRONTEND,{self.total}\n"

    def repoint(self, address: str, port: int) -> None:
        self.actions.append(f"repoint {address}:{port}")

    def release(self) -> None:
        self.actions.append("release")

    def forward(self, address: str, port: int) -> int:
        """Repointed and released in one round trip, the count read just before (as HAProxy's batch does)."""
        count = int(self.ask("show stat").splitlines()[-1].rsplit(",", 1)[-1])
        self.repoint(address, port)
        self.release()
        return count


class QuietLog:
    def __getattr__(self, _level: str) -> Any:
        return lambda *_args, **_kwargs: None


def finish_ctx(tmp_path: Path, door_text: str, flipped_at: float, ttl: int) -> StepContext:
    plan = load_plan(plan_file(tmp_path, door_text)).plan
    history = [
        {"event": "run_started"},
        {"event": "step_saved", "step": "repl_switch", "key": SOURCE_HOLD, "value": {"deadline": 1.0}},
        {"event": "step_saved", "step": "dns_flip", "key": FORWARDED,
         "value": {"to": "203.0.113.20:80", "requests": 100}},
    ]  # fmt: skip
    flip = {"flipped_at": flipped_at, "old": [{"id": "r1", "name": "www", "content": "203.0.113.10", "ttl": ttl}]}
    return StepContext(
        run_id="r", step="finish", dry_run=False, rt=SimpleNamespace(plan=plan), log=QuietLog(),
        _outputs={"dns_flip": flip}, _history=lambda: history,
    )  # fmt: skip


def test_finish_reports_at_once_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    front = CountingDoor(start=130, step=0)
    monkeypatch.setattr(frontdoor, "door", lambda _ctx, side: front if side == "source" else None)
    flipped = time.time()
    slept: list[float] = []
    report = frontdoor.forwarding_report(finish_ctx(tmp_path, DOOR, flipped, 60), sleep=slept.append)
    assert slept == []
    assert report["requests_at_old_address"] == 30 and report["forwarded_to"] == "203.0.113.20:80"
    assert report["forwarding_until"] == round(flipped + 60 + 30, 3)
    assert "requests_after_ttl" not in report
    # The door is (still) pointed at the target and lets requests through.
    assert front.actions == ["repoint 203.0.113.20:80", "release"]


def test_finish_waits_until_forwarding_is_no_longer_due(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    front = CountingDoor(start=100, step=7)
    monkeypatch.setattr(frontdoor, "door", lambda _ctx, side: front if side == "source" else None)
    door_text = DOOR.replace("    forward_to: {address: 203.0.113.20, port: 80}\n",
                             "    forward_to: {address: 203.0.113.20, port: 80}\n"
                             "    forward_margin: 0.4\n    wait_forwarding: true\n", 1)  # fmt: skip
    flipped = time.time() - 30 + 0.3  # the records' TTL (30 s) runs out in 0.3 s, forwarding is due 0.4 s more
    report = frontdoor.forwarding_report(finish_ctx(tmp_path, door_text, flipped, 30))
    assert time.time() >= report["forwarding_until"] == round(flipped + 30 + 0.4, 3)
    assert report["forwarding_waited"] is True
    # Read once when the TTL ran out, once when forwarding was no longer due, once for the total.
    assert report["requests_after_ttl"] == 7
    assert report["requests_at_old_address"] == front.total - 100


# --- the commit driven from the source host: two commands there ----------------------------------------------------


def commit_ctx(tmp_path: Path, source: Any) -> StepContext:
    plan = load_plan(plan_file(tmp_path, DOOR)).plan
    history: list[dict[str, Any]] = [
        {"event": "run_started"},
        {"event": "step_saved", "step": "repl_switch", "key": SOURCE_HOLD,
         "value": {"seconds": 70.0, "writes_only": True, "deadline": 1764217000.123, "pid": "4242"}},
    ]  # fmt: skip

    def save(step: str, key: str, value: Any) -> None:
        history.append({"event": "step_saved", "step": step, "key": key, "value": value})

    rt = SimpleNamespace(plan=plan, plan_path=tmp_path / "plan.yaml", source=source, front_doors={},
                         source_door_local=True)  # fmt: skip
    return StepContext(
        run_id="r", step="switch_traffic", dry_run=False, rt=rt, log=QuietLog(), _save=save,
        _history=lambda: history,
    )  # fmt: skip


def test_the_commit_from_the_source_is_one_command_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hold checked, the guard told, the commit recorded, the target's fence lifted over the hop and the door
    repointed and released: one round trip to the source, none to the target or through the door's own connection
    (the target's door is released beside it)."""
    from orchestrator.services import source_commit as sc
    from tests.fakes import RecordingHost
    from tests.test_source_commit import CHECK, framed, servers, stat

    forwarded = framed(f"{stat(12).replace('app_front', 'shop_front')}\n\n\n\n{servers('203.0.113.20', 80)}\n")
    answer = framed(CHECK) + f"{sc.HOLD_OK}\n{sc.MARKED}\n{sc.RECORDED}\n" + forwarded
    source = RecordingHost([(sc.MARKED, answer)])
    released: list[str] = []
    monkeypatch.setattr(frontdoor, "_release_target_door", lambda _ctx: released.append("target") or True)
    monkeypatch.setattr(frontdoor, "door", lambda _ctx, side: SimpleNamespace(
        frontend="shop_front", backend="shop_app", server="app", hold_map="/etc/haproxy/frontdoor.map"))  # fmt: skip
    ctx = commit_ctx(tmp_path, source)
    assert frontdoor.drivable_from_source(ctx)
    record = frontdoor.commit_record(ctx)
    assert record.startswith(f"{ctx.rt.plan.source.private_dir}/{sc.RECORD_PREFIX}") and record.endswith("-r")
    outcome = frontdoor.commit_from_source(ctx, "/var/lib/migrate/migrate-guard-x", record, timeout=5)
    assert outcome == sc.ForwardOutcome(None, "", 12, None)  # the small plan declares no target fence
    assert len(source.commands) == 1 and released == ["target"]
    command = source.commands[0]
    assert command.index("touch /var/lib/migrate/migrate-guard-x/committed") < command.index(f": > {record}")
    assert command.index(f": > {record}") < command.index("set server shop_app/app addr 203.0.113.20 port 80")
    assert ctx.saved(FORWARDED) == {"to": "203.0.113.20:80", "requests": 12}


def test_a_run_that_died_after_its_commit_on_the_source_finishes_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its journal says the commit was sent, not that it committed: the record on the source is read first. Found:
    the run commits in its journal and finishes from here (the door forwarded again), and a rollback is refused.
    Not found: the commit is made as usual."""
    from orchestrator.engine.step import StepError
    from orchestrator.services import source_commit as sc
    from orchestrator.steps.switch_traffic import COMMIT_SENT, COMMITTED_AT, SwitchTraffic
    from tests.fakes import RecordingHost

    source = RecordingHost([(sc.RECORD_PREFIX, f"{sc.RECORDED}\n")])
    ctx = commit_ctx(tmp_path, source)
    ctx.window = SimpleNamespace(blocked_at=None)  # type: ignore[assignment]  # only when writes were blocked is read
    committed: list[str] = []
    ctx._commit = lambda step, reason: committed.append(step)
    ctx.save(COMMIT_SENT, "/tmp/migrate-committed-x")
    monkeypatch.setattr(frontdoor, "forward_to_target", lambda _ctx: True)
    monkeypatch.setattr(frontdoor, "commit_from_source", lambda *_a, **_k: pytest.fail("committed twice"))
    monkeypatch.setattr(frontdoor, "check_source_hold", lambda _ctx: pytest.fail("the hold is gone by now"))
    with pytest.raises(StepError, match=r"committed on the source .* `migrate apply` finishes it"):
        SwitchTraffic().undo(ctx)
    result = SwitchTraffic().run(ctx)
    assert committed == ["switch_traffic"] and ctx.saved(COMMITTED_AT) is not None
    assert result["committed_at"] == ctx.saved(COMMITTED_AT)
    assert [c for c in source.commands if sc.RECORD_PREFIX in c] == [sc.record_probe("/tmp/migrate-committed-x")] * 2

    nothing = RecordingHost()
    ctx = commit_ctx(tmp_path, nothing)
    ctx.save(COMMIT_SENT, "/tmp/migrate-committed-x")
    SwitchTraffic().undo(ctx)  # not committed there: the rollback goes on
    assert nothing.commands == [sc.record_probe("/tmp/migrate-committed-x")]


def test_a_restarted_door_seen_from_the_source_is_a_rollback_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.engine.step import StepError
    from orchestrator.services import source_commit as sc
    from tests.fakes import RecordingHost
    from tests.test_source_commit import CHECK, framed

    restarted = CHECK.replace("4242", "5151").replace("1764217000.123", "0")
    source = RecordingHost([(sc.RECORD_PREFIX, framed(restarted))])
    monkeypatch.setattr(frontdoor, "_release_target_door", lambda _ctx: True)
    monkeypatch.setattr(frontdoor, "door", lambda _ctx, side: SimpleNamespace(
        frontend="shop_front", backend="shop_app", server="app", hold_map="/etc/haproxy/frontdoor.map"))  # fmt: skip
    with pytest.raises(StepError, match=r"lost its hold \(HAProxy pid 4242 → 5151"):
        frontdoor.commit_from_source(
            commit_ctx(tmp_path, source), "/tmp/migrate-guard-x", "/tmp/migrate-committed-x", timeout=5
        )


def test_the_window_holds_and_fences_from_the_source_only_where_the_commit_would_run_there(tmp_path: Path) -> None:
    """One command on the source for the hold, the drain and the fence: when the source host was found able and
    worth driving its door (the commit's finding), there is a fence to put up, and the run goes forward."""
    ready = frontdoor.HoldReady(writes_only=True, pid="4242", clock_offset=0.0, target_at_own_app=True)
    ctx = commit_ctx(tmp_path, None)
    plan = ctx.rt.plan
    fenced = plan.model_copy(update={"services": plan.services.model_copy(
        update={"fence": plan.services.fence.model_copy(update={"enable": "touch /srv/fenced"})})})  # fmt: skip
    ctx.rt.plan = fenced
    assert frontdoor.holds_from_source(ctx, ready)
    assert not frontdoor.holds_from_source(ctx, None), "no source door"
    ctx.rt.source_door_local = False
    assert not frontdoor.holds_from_source(ctx, ready), "driven from here"
    ctx.rt.source_door_local = True
    ctx.rt.plan = plan.model_copy(update={"services": plan.services.model_copy(
        update={"fence": plan.services.fence.model_copy(update={"enable": None})})})  # fmt: skip
    assert not frontdoor.holds_from_source(ctx, ready), "no fence: the hold alone, from here"
    reverse = fenced.model_copy()
    reverse._reverse_of = "shop"
    ctx.rt.plan = reverse
    assert not frontdoor.holds_from_source(ctx, ready), "a reverse run"
