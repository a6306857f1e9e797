"""The WordPress example plan (plans/wordpress.yaml) and the WordPress lab's configuration, without a lab."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ruamel.yaml import YAML

from migrate_lab import hosts, planfile, wordpress
from migrate_lab.state import LabState
from orchestrator.database.mysql import seed
from orchestrator.plan.loader import load_plan
from orchestrator.transports import rsync, ssh
from tests.engine.world import Result

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "plans" / "wordpress.yaml"
MIGRATE = Path(sys.executable).with_name("migrate")


def test_the_wordpress_example_validates_with_real_health_checks() -> None:
    result = subprocess.run([str(MIGRATE), "validate", str(EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    plan = load_plan(EXAMPLE).plan
    urls = [check.url for check in plan.health.checks if check.kind == "http"]
    assert any("/wp-json/" in url for url in urls) and any(url.endswith("/fpm-ping") for url in urls), urls
    queries = [check.query for check in plan.health.checks if check.kind == "sql"]
    assert any("wp_posts" in query for query in queries), queries
    assert {service.name for service in plan.services.target} == {"nginx", "php-fpm"}
    assert [tree.source for tree in plan.files] == ["/var/lib/wordpress/wp-content/uploads"]


def test_the_example_fences_with_the_flag_file_its_nginx_snippet_checks() -> None:
    text = EXAMPLE.read_text()
    plan = load_plan(EXAMPLE).plan
    checked = re.findall(r"if \(-f (\S+)\)", text)
    assert checked, "the plan's comments show no nginx fence"
    for fence in (plan.services.fence, plan.services.target_fence):
        assert fence is not None
        assert fence.enable == f"touch {checked[0]}" and fence.disable == f"rm -f {checked[0]}"


def a_lab_state(tmp_path: Path) -> LabState:
    state = hosts.new_state(tmp_path, hosts.SOURCE_ADDRESS, hosts.TARGET_ADDRESS, default_ports=False)
    state.app = wordpress.APP_NAME
    state.cf_port = 8443
    state.save()
    state.env_file.write_text(f"{state.app_password_env}=not-a-real-one\n")
    return state


def test_the_wordpress_lab_plan_checks_wordpress_php_fpm_and_the_database(tmp_path: Path) -> None:
    state = a_lab_state(tmp_path)
    plan = load_plan(planfile.write_plan(state)).plan
    assert plan.name == "wordpress-lab"
    urls = [check.url for check in plan.health.checks if check.kind == "http"]
    target = f"http://{state.target.address}:{state.target.app_port}"
    assert urls == [f"{target}/wp-json/?_fields=name,namespaces", f"{target}{wordpress.FPM_PING}"]
    assert [check.query for check in plan.health.checks if check.kind == "sql"] == [
        f"SELECT EXISTS(SELECT 1 FROM {state.db_name}.wp_posts)"
    ]


def test_each_lab_host_gets_its_own_nginx_php_fpm_and_wordpress_config(tmp_path: Path) -> None:
    state = a_lab_state(tmp_path)
    source, target = (wordpress.nginx_text(state, h) for h in (state.source, state.target))
    # Both serve the same site name: the config is chosen by a fastcgi_param, never by the Host header.
    names = {wordpress.config_name(state, h) for h in (state.source, state.target)}
    assert len(names) == 2 and all(re.fullmatch(r"[a-zA-Z0-9-]+", name) for name in names)
    for text, host in ((source, state.source), (target, state.target)):
        assert f"fastcgi_param WORDPRESS_CONFIG {wordpress.config_name(state, host)};" in text
        assert f"listen {host.address}:{host.app_internal_port};" in text
        assert f"if (-f {host.fence_file})" in text and "return 503" in text
        fpm = wordpress.fpm_text(host)
        assert str(wordpress.fpm_socket(host)) in fpm and str(wordpress.fpm_pid_file(host)) in fpm
        config = wordpress.wp_config_text(state, host, {"AUTH_KEY": "k"})
        assert f"'{host.address}:{host.db_port}'" in config and str(wordpress.content_dir(host)) in config


def test_a_host_may_name_a_jump_host_with_its_own_key_and_known_hosts(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace(
        "  known_hosts: ~/.ssh/known_hosts\ntarget:",
        "  known_hosts: ~/.ssh/known_hosts\n  jump:\n    address: 198.51.100.7\n    user: ops\n"
        "    key: ~/.ssh/bastion\n    known_hosts: ~/.ssh/bastion_known_hosts\ntarget:",
        1,
    )
    path = tmp_path / "jump.yaml"
    path.write_text(text)
    plan = load_plan(path).plan
    assert plan.source.jump is not None and plan.target.jump is None
    assert (plan.source.jump.address, plan.source.jump.user, plan.source.jump.ssh_port) == ("198.51.100.7", "ops", 22)
    assert plan.source.jump.known_hosts == "~/.ssh/bastion_known_hosts"
    # The reverse run reaches each server the same way: the jump goes with its host.
    reversed_plan = plan.reversed()
    assert reversed_plan.target.jump == plan.source.jump and reversed_plan.source.jump is None


def test_an_unknown_key_under_jump_is_one_line_naming_it(tmp_path: Path, migrate_here: Callable[..., Result]) -> None:
    text = EXAMPLE.read_text().replace(
        "  known_hosts: ~/.ssh/known_hosts\ntarget:",
        "  known_hosts: ~/.ssh/known_hosts\n  jump:\n    address: 198.51.100.7\n    hostkey: x\ntarget:",
        1,
    )
    path = tmp_path / "jump.yaml"
    path.write_text(text)
    result = migrate_here("validate", str(path))
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "source.jump.hostkey" in lines[0] and f"{path}:" in lines[0], result.stderr


WORDPRESS_PACKAGES = ("nginx", "php8.2-fpm", "php8.2-mysql", "wordpress")


def test_the_compose_file_describes_the_wordpress_stack_on_both_hosts() -> None:
    compose = YAML(typ="safe").load((REPO / "docker-compose.test.yml").read_text())
    for name in ("source", "target"):
        service = compose["services"][name]
        # One switch for both hosts: `LAB_APP=wordpress docker compose ... up` runs the WordPress stack.
        assert service["environment"]["LAB_APP"] == "${LAB_APP:-demo}", service
        assert (REPO / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    dockerfile = (REPO / "docker" / "host.Dockerfile").read_text()
    installed = set(" ".join(re.findall(r"apt-get install[^&]*", dockerfile, flags=re.S)).replace("\\", " ").split())
    makefile = (REPO / "Makefile").read_text()
    system_packages = set(re.search(r"^SYSTEM_PACKAGES := (.*)$", makefile, flags=re.M).group(1).split())
    for package in WORDPRESS_PACKAGES:
        assert package in installed, f"{package} is not installed in docker/host.Dockerfile"
        assert package in system_packages, f"{package} is not in the Makefile's SYSTEM_PACKAGES"
    entry = (REPO / "docker" / "lab_host.py").read_text()
    assert 'os.environ.get("LAB_APP"' in entry and "wordpress.install(state, host)" in entry


def plan_as_operator(tmp_path: Path, become: str = "sudo") -> Path:
    text = EXAMPLE.read_text().replace("  user: root\n", f"  user: ops\n  become: {become}\n")
    path = tmp_path / "operator.yaml"
    path.write_text(text)
    return path


def test_become_sudo_runs_every_command_through_passwordless_sudo(tmp_path: Path) -> None:
    plan = load_plan(plan_as_operator(tmp_path)).plan
    assert (plan.source.user, plan.source.become, plan.target.become) == ("ops", "sudo", "sudo")
    command = "cd /var/lib/mysql && ls | wc -l > /tmp/x"
    wrapped = ssh.as_root(plan.source, command)
    assert shlex.split(wrapped) == ["sudo", "-n", "--", "sh", "-c", command]
    root = load_plan(EXAMPLE).plan
    assert root.source.become is None and ssh.as_root(root.source, command) == command


def test_rsyncs_remote_end_and_the_seeds_receiver_run_through_sudo_on_a_become_target(tmp_path: Path) -> None:
    plan = load_plan(plan_as_operator(tmp_path)).plan
    push = shlex.split(rsync.push_command(plan, "/a", "/b", live=True))
    assert "--rsync-path=" + shlex.join([*rsync.NICE, "sudo", "-n", "--", "rsync"]) in push
    assert "--rsync-path=sudo -n -- rsync" in shlex.split(rsync.push_command(plan, "/a", "/b", live=False))
    assert "--rsync-path=sudo -n -- rsync" in shlex.split(rsync.compare_command(plan, "/a", "/b"))
    root = load_plan(EXAMPLE).plan
    assert not [a for a in shlex.split(rsync.push_command(root, "/a", "/b", live=False)) if "rsync-path" in a]
    spec = seed.SeedSpec("/var/lib/mysql", "/var/lib/mysql", ("ssh", "ops@t"), target_sudo=True)
    script = shlex.split(seed.seed_stream_command(spec))[-1]  # bash -c SCRIPT
    assert "ssh ops@t 'sudo -n -- sh -c '\"'\"'rm -rf" in script, script
    plain = seed.SeedSpec("/var/lib/mysql", "/var/lib/mysql", ("ssh", "t"))
    assert "sudo" not in shlex.split(seed.seed_stream_command(plain))[-1]


def test_become_is_sudo_or_nothing(tmp_path: Path, migrate_here: Callable[..., Result]) -> None:
    result = migrate_here("validate", str(plan_as_operator(tmp_path, "su")))
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [
        "source.become: must be 'sudo', got 'su'",
        "target.become: must be 'sudo', got 'su'",
    ], result.stderr


def test_lab_load_of_another_app_than_the_labs_is_refused_in_one_line(
    tmp_path: Path, migrate_here: Callable[..., Result]
) -> None:
    state = a_lab_state(tmp_path)
    result = migrate_here("lab", "load", "--dir", str(state.path), "--app", "demo", "--duration", "1")
    assert result.returncode == 2, result
    assert result.stderr.strip() == (
        f"lab load: the lab in {state.dir} runs the wordpress app, not demo (`lab up --app demo` makes one)"
    )
    assert not state.load_dir.exists()
