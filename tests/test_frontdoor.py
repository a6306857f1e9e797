"""The plan's `proxy` section (the front doors): what it accepts, every mistake one `file:line:col` line, the JSON
Schema, the reverse plan swapping the doors, and the example plan's commented section being a valid one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.plan.loader import PlanError, load_plan, plan_json_schema
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
