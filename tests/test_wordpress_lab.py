"""WordPress on nginx + php8.2-fpm (Debian's packages), moved by `migrate` under its own REST clients.

One WordPress lab for both cut-over modes: under `lab load` (posts, comments, multipart media through the REST API
with an application password), `migrate apply` moves it to the target in the replicate mode, then `migrate apply
--reverse` brings it back in the shutdown mode. After each: nothing acknowledged is lost on the serving host (rows,
and the media files byte for byte), no request failed, the site serves from that host's front door (`/wp-json/`
and a media URL), the run's report shows its window.
"""

from __future__ import annotations

import base64
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from migrate_lab import bastion, hosts, operator, planfile, sshd, wordpress
from migrate_lab.app import db_connect
from migrate_lab.state import HostState, LabState
from migrate_lab.verify import read_acks
from migrate_lab.wp_verify import WpVerifyReport, main_verify
from orchestrator import exit_codes
from tests.test_e2e import dns_contents, migrate_apply, outcome, plan_name, run_report, wait_for_load_acks_on
from tests.test_frontdoor_e2e import CLIENT_HTTP_TIMEOUT, no_failed_requests, one_clear_line

pytestmark = pytest.mark.lab

CLIENT_DNS_CACHE = 2.0
TIMEOUT = 300.0


@pytest.fixture(scope="module")
def wp_lab() -> Iterator[LabState]:
    """The WordPress lab, its plan logging in as an unprivileged operator (root through sudo) through a bastion. Made
    in a directory of its own under /tmp: the operator must be able to enter it (pytest's are private to root)."""
    lab_dir = Path(tempfile.mkdtemp(prefix="migrate-wplab-", dir="/tmp"))
    try:
        yield hosts.up(
            lab_dir, default_ports=False, app="wordpress", with_bastion=True, with_operator=True, db_size_mb=1,
            uploads_size_mb=1,
        )  # fmt: skip
    finally:
        try:
            hosts.down(lab_dir, purge=True)  # also the operator account and the configs in /etc/wordpress
        except hosts.LabRefused:
            shutil.rmtree(lab_dir, ignore_errors=True)  # `lab up` failed before the lab was one


def start_load(state: LabState, load_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "migrate_lab.load", "--lab", str(state.path), "--duration", "400",
            "--rate", "8", "--clients", "3", "--dns-ttl", str(CLIENT_DNS_CACHE), "--upload-every", "2",
            "--out", str(load_dir), "--http-timeout", str(CLIENT_HTTP_TIMEOUT),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def get(host: HostState, path: str) -> tuple[int, bytes]:
    """A GET through the host's front door (HAProxy), as a client whose DNS points there."""
    with urllib.request.urlopen(f"http://{host.address}:{host.app_port}{path}", timeout=30) as answer:
        return answer.status, answer.read()


def assert_serves(state: LabState, host: HostState, media: dict[str, Any]) -> None:
    """WordPress answers its REST index and a media URL (a file uploaded through the REST API) from `host`."""
    status, body = get(host, "/wp-json/?_fields=name,namespaces")
    assert status == 200 and "wp/v2" in json.loads(body)["namespaces"], body[:200]
    status, data = get(host, media["url_path"])
    assert status == 200 and len(data) == media["size"], (status, len(data))
    # The front door forwarded nothing: nginx of this very host served it (its access log has the request).
    assert media["url_path"] in (host.log_dir / "nginx-access.log").read_text()


def assert_nothing_lost(verify: WpVerifyReport) -> None:
    assert verify.error is None, verify.error
    assert verify.posts_acknowledged > 0 and verify.comments_acknowledged > 0 and verify.media_acknowledged > 0
    assert verify.acknowledged_lost == 0, verify.lost
    no_failed_requests(verify)


def journal(state: LabState, name: str) -> Path:
    return state.path / ".migrate" / name / "journal.jsonl"


def steps_of(report: dict[str, Any]) -> list[str]:
    return [step["name"] for step in report["steps"]]


def post_through_nginx(state: LabState, host: HostState, title: str) -> tuple[int, bytes]:
    """A REST write sent to the host's nginx itself (not its front door, which may hold it during a run)."""
    user, password = wordpress.credentials(state)
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(
        f"http://{host.address}:{host.app_internal_port}/wp-json/wp/v2/posts?_fields=id",
        data=json.dumps({"title": title, "status": "publish"}).encode(),
        method="POST",
        headers={"Authorization": f"Basic {auth}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def posts_titled(state: LabState, host: HostState, title: str) -> int:
    conn = db_connect(state, host, state.secrets()[state.app_password_env])
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM wp_posts WHERE post_title = %s", (title,))
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def test_nginx_answers_writes_503_while_the_fence_file_exists_and_reads_go_on(wp_lab: LabState) -> None:
    state = wp_lab
    subprocess.run([str(state.source.bin_dir / "fence-on")], check=True, timeout=30)
    try:
        status, body = post_through_nginx(state, state.source, "written-while-fenced")
        assert status == 503 and b"fenced" in body, (status, body[:200])
        assert get(state.source, "/wp-json/?_fields=name")[0] == 200
    finally:
        subprocess.run([str(state.source.bin_dir / "fence-off")], check=True, timeout=30)
    assert posts_titled(state, state.source, "written-while-fenced") == 0
    status, body = post_through_nginx(state, state.source, "written-after-the-fence")
    assert status == 201, (status, body[:200])
    assert posts_titled(state, state.source, "written-after-the-fence") == 1


def test_a_stopped_php_fpm_on_the_target_is_one_line_and_a_rollback_with_the_source_serving(
    wp_lab: LabState,
) -> None:
    state = wp_lab
    planfile.write_plan(state, "replicate")
    stop_fpm = (
        f'[ "$MIGRATE_STEP" = repl_catchup ] || exit 0\n'
        f"pid=$(cat {wordpress.fpm_pid_file(state.target)}) || exit 1\n"
        'kill -QUIT "$pid"\n'
        'while [ -e "/proc/$pid" ]; do sleep 0.1; done\n'
    )
    plan = plan_with_hook(state, "nofpm", "before-step", stop_fpm)
    result = migrate_apply(state, plan, timeout=TIMEOUT)
    assert result.returncode == exit_codes.FAILED, outcome(result)
    one_clear_line(result, "health check php-fpm ping failed", "status 502")
    assert dns_contents(state) == {record: state.source.address for record in state.records}
    status, body = post_through_nginx(state, state.source, "written-after-the-rollback")
    assert status == 201, (status, body[:200])
    assert not state.source.fence_file.exists()


def logins_through_the_bastion(state: LabState) -> int:
    return bastion.log_file(state).read_text().count("Accepted publickey")


def test_a_wrong_jump_host_key_is_one_line_and_nothing_changes(wp_lab: LabState, tmp_path: Path) -> None:
    state = wp_lab
    planfile.write_plan(state, "replicate")
    # A known_hosts that names the bastion's address with another key (the source's): a man in the middle.
    wrong = tmp_path / "known_hosts"
    bastion_host = bastion.host_state(state)
    key = sshd.host_key(state.source).with_suffix(".pub").read_text().split()[:2]
    wrong.write_text(f"[{bastion_host.address}]:{bastion_host.ssh_port} {key[0]} {key[1]}\n")
    yaml = YAML()
    data = yaml.load(state.plan_file.read_text())
    data["name"] = f"{data['name']}-wrongjump"
    for side in ("source", "target"):
        data[side]["jump"]["known_hosts"] = str(wrong)
    plan = state.path / "plan-wrongjump.yaml"
    with plan.open("w") as out:
        yaml.dump(data, out)
    logins = logins_through_the_bastion(state)
    result = migrate_apply(state, plan, timeout=TIMEOUT)
    assert result.returncode == exit_codes.FAILED, outcome(result)
    one_clear_line(result, "(jump host of source): host key not verifiable against", str(wrong))
    assert logins_through_the_bastion(state) == logins  # no login: the key was refused before authenticating
    assert dns_contents(state) == {record: state.source.address for record in state.records}
    assert not state.source.fence_file.exists()
    steps = run_report(state, plan_name(plan))["steps"]
    assert steps[0]["name"] == "preflight" and {step["state"] for step in steps[1:]} == {"pending"}, steps
    status, body = post_through_nginx(state, state.source, "written-after-the-refused-jump")
    assert status == 201, (status, body[:200])


def test_a_sudo_refusal_is_one_line_at_preflight_naming_the_command_and_nothing_changes(wp_lab: LabState) -> None:
    state = wp_lab
    planfile.write_plan(state, "replicate")
    sudoers = operator.sudoers_file(state)
    allowed = sudoers.read_text()
    sudoers.write_text(allowed.replace("/usr/bin/sh, ", ""))  # rsync only: the commands' shell is refused
    try:
        result = migrate_apply(state, plan_with_hook(state, "nosudo", "before-step", "exit 0\n"), timeout=TIMEOUT)
    finally:
        sudoers.write_text(allowed)
    assert result.returncode == exit_codes.FAILED, outcome(result)
    one_clear_line(result, "source ssh", "sudo refused `sudo -n -- sh -c", f"for {state.operator}@")
    steps = run_report(state, f"{plan_name(state.plan_file)}-nosudo")["steps"]
    assert steps[0]["name"] == "preflight" and {step["state"] for step in steps[1:]} == {"pending"}, steps
    assert dns_contents(state) == {record: state.source.address for record in state.records}
    status, body = post_through_nginx(state, state.source, "written-after-the-sudo-refusal")
    assert status == 201, (status, body[:200])


def plan_with_hook(state: LabState, suffix: str, event: str, body: str) -> Path:
    """A copy of the lab's plan under its own name, with one hook and few health-check attempts."""
    yaml = YAML()
    data = yaml.load(state.plan_file.read_text())
    data["name"] = f"{data['name']}-{suffix}"
    data["health"]["attempts"] = 3
    data["health"]["interval"] = 0.2
    hooks_dir = state.path / f"hooks-{suffix}"
    hooks_dir.mkdir(exist_ok=True)
    hook = hooks_dir / event
    hook.write_text("#!/bin/bash\nset -u\n" + body)
    hook.chmod(0o755)
    data["hooks"] = {"dir": str(hooks_dir)}
    path = state.path / f"plan-{suffix}.yaml"
    with path.open("w") as out:
        yaml.dump(data, out)
    return path


def test_wordpress_under_load_moves_there_in_the_replicate_mode_and_back_in_the_shutdown_mode(
    wp_lab: LabState, tmp_path: Path
) -> None:
    state = wp_lab
    planfile.write_plan(state, "replicate")
    name = plan_name(state.plan_file)
    load_dir = tmp_path / "load"
    acks = load_dir / "acks.jsonl"
    logins = logins_through_the_bastion(state)
    load = start_load(state, load_dir)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (acks.exists() and '"media"' in acks.read_text()):
            time.sleep(0.1)  # posts, comments and media flowing to the source before the migration begins
        forward = migrate_apply(state, state.plan_file, timeout=TIMEOUT)
        assert forward.returncode == exit_codes.OK, outcome(forward)
        wait_for_load_acks_on(load_dir, state.target.address, since=time.time())
        there = main_verify(state, host="target", load_dir=load_dir, journal=journal(state, name), trees=False)
        media_before = next(a for a in read_acks(acks) if a["kind"] == "media" and a["server"] == state.source.address)
        assert_serves(state, state.target, media_before)

        back = migrate_apply(state, state.plan_file, "--reverse", timeout=TIMEOUT)
        assert back.returncode == exit_codes.OK, outcome(back)
        wait_for_load_acks_on(load_dir, state.source.address, since=time.time())
    finally:
        load.send_signal(signal.SIGTERM)
        output, _ = load.communicate(timeout=CLIENT_HTTP_TIMEOUT + 30)
    print(output)

    # There, in the replicate mode: every post, comment and media item acknowledged so far is on the target.
    forward_report = run_report(state, name)
    assert forward_report["status"] == "completed"
    assert "repl_switch" in steps_of(forward_report) and "cutover" not in steps_of(forward_report)
    assert_nothing_lost(there)
    # The orchestrator reached both hosts through the bastion (the plan's `jump:`), at every run, as the operator.
    assert logins_through_the_bastion(state) >= logins + 2
    for host in (state.source, state.target):
        assert f"Accepted publickey for {state.operator} " in (host.log_dir / "sshd.log").read_text()
    assert there.window is not None and forward_report["write_block_seconds"] > 0
    # The commit is made at the front door; DNS moves after the window.
    assert {"repl_switch", "verify_target", "switch_traffic"} <= set(forward_report["window_parts"])

    # Back, in the shutdown mode: everything acknowledged during the whole load is on the source, served there.
    reverse_report = run_report(state, f"{name}-reverse")
    assert reverse_report["status"] == "completed"
    assert "cutover" in steps_of(reverse_report) and "repl_switch" not in steps_of(reverse_report)
    assert reverse_report["write_block_seconds"] > 0 and "switch_traffic" in reverse_report["window_parts"]
    home = main_verify(state, host="source", load_dir=load_dir, journal=journal(state, f"{name}-reverse"))
    assert_nothing_lost(home)
    assert set(home.per_server) == {state.source.address, state.target.address}, home.per_server
    assert dns_contents(state) == {record: state.source.address for record in state.records}
    assert_serves(state, state.source, media_before)
    media_on_target = next(a for a in read_acks(acks) if a["kind"] == "media" and a["server"] == state.target.address)
    assert_serves(state, state.source, media_on_target)
    # The proof can fail: a media file altered and a comment deleted on the source are each reported lost.
    altered = state.source.uploads / media_on_target["file"]
    altered.write_bytes(altered.read_bytes() + b"changed")
    comment = next(a for a in read_acks(acks) if a["kind"] == "comment")
    conn = db_connect(state, state.source, state.secrets()[state.app_password_env])
    try:
        with conn.cursor() as cur:
            cur.execute("DELETE FROM wp_comments WHERE comment_ID = %s", (comment["id"],))
        conn.commit()
    finally:
        conn.close()
    broken = main_verify(state, host="source", load_dir=load_dir, out=tmp_path / "broken.json", trees=False)
    assert (broken.media_files_lost, broken.comments_lost, broken.posts_lost) == (1, 1, 0), broken.lost
    assert broken.exit_code == 1
    print(
        f"wordpress: replicate window {forward_report['write_block_seconds']} s {forward_report['window_parts']}; "
        f"shutdown window {reverse_report['write_block_seconds']} s {reverse_report['window_parts']}; "
        f"acknowledged {home.posts_acknowledged} posts, {home.comments_acknowledged} comments, "
        f"{home.media_acknowledged} media; longest write stall {home.longest_write_stall_s} s; "
        f"failed {home.requests_failed}; latency {home.latency}"
    )
