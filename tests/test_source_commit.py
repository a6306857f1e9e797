"""The commit driven from the source host (orchestrator/services/source_commit.py): its two commands and what they
answer.

The answers below are HAProxy 2.6's own, captured from its admin socket in its non-interactive mode (each answer
ends with an empty line; the connection closes after the last)."""

from __future__ import annotations

import subprocess

import pytest

from orchestrator.services import source_commit as sc

SOCKET, MAP = "/run/haproxy/admin sock", "/etc/haproxy/frontdoor.map"
FORWARD = sc.Forward("app_backend", "app", MAP, "127.0.0.3", 8080)
STAT_HEADER = "# pxname,svname,qcur,req_tot,status\n"
SERVERS_HEADER = (
    "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight "
    "srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state "
    "srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port "
    "srv_check_addr srv_agent_addr srv_agent_port\n"
)


def framed(body: str, status: int = 0) -> str:
    return f"{sc.DOOR_BEGIN}\n{body}{sc.DOOR_EXIT}{status}\n{sc.DOOR_END}\n"


def servers(address: str, port: int) -> str:
    return SERVERS_HEADER + f"3 app_backend 1 app {address} 2 0 1 1 9 1 0 2 0 0 0 0 - {port} - 0 0 - - 0\n"


def stat(requests: int) -> str:
    return STAT_HEADER + f"app_front,FRONTEND,,{requests},OPEN\napp_backend,app,0,0,UP\n"


HOLD = sc.HoldToCheck("4242", 1764217000.123, writes_only=True)
CHECK = "Name: HAProxy\nPid: 4242\nUptime_sec: 9\n\n0x55 hold_until 0\n0x56 hold_writes_until 1764217000.123\n\n"


def test_the_scripts_are_valid_shell_with_any_path() -> None:
    """Paths with spaces and quotes reach the shell quoted; each script parses."""
    check = sc.check_and_mark_script(SOCKET, MAP, HOLD, "/tmp/migrate guard's dir")
    fence = sc.fence_command_on_target("ssh -p 22", "deploy@127.0.0.3", "/srv/bin/fence-off 'now'", sudo=True)
    lift = sc.lift_and_forward_script(SOCKET, fence_on_target=fence, forward=FORWARD)
    for script in (check, lift, sc.probe_command(SOCKET)):
        subprocess.run(["sh", "-n", "-c", script], check=True)
    assert "'/run/haproxy/admin sock'" in check and "sudo -n -- sh -c" in fence


def test_a_door_command_that_could_break_the_line_is_refused() -> None:
    with pytest.raises(ValueError):
        sc.lift_and_forward_script(SOCKET, fence_on_target=None, forward=sc.Forward("b;x", "s", MAP, "1.2.3.4", 1))


def test_the_hold_that_stands_is_read_back_and_the_guard_was_told() -> None:
    outcome = sc.parse_check(framed(CHECK) + f"{sc.HOLD_OK}\n{sc.MARKED}\n", HOLD)
    assert outcome == sc.CheckOutcome(True, "4242", 1764217000.123)


def test_a_restarted_door_is_read_back_and_nothing_was_marked() -> None:
    restarted = CHECK.replace("4242", "5151").replace("1764217000.123", "0")
    outcome = sc.parse_check(framed(restarted), HOLD)
    assert outcome == sc.CheckOutcome(False, "5151", 0.0)


def test_a_door_socat_cannot_reach_is_one_line() -> None:
    said = "2026/11/27 04:29:40 socat[11682] E connect(...): No such file or directory\n"
    with pytest.raises(sc.DoorUnanswered, match=r"exited 1: .*No such file"):
        sc.parse_check(framed(said, 1), HOLD)
    with pytest.raises(sc.DoorUnanswered):
        sc.parse_check("", HOLD)


def test_without_a_hold_to_check_only_the_marker_counts() -> None:
    assert sc.parse_check(f"{sc.MARKED}\n", None) == sc.CheckOutcome(True)
    assert sc.parse_check("", None) == sc.CheckOutcome(False)


def forward_answer(address: str = "127.0.0.3", port: int = 8080, *, repoint: str = "") -> str:
    said = repoint or "no need to change the addr, port changed from '8081' to '8080' by 'stats socket command'\n"
    return framed(f"{stat(17)}\n{said}\n\n\n{servers(address, port)}\n")


def test_the_fence_lifted_then_the_door_forwarding_read_back() -> None:
    out = f"{sc.FENCE_EXIT}0\n" + forward_answer()
    outcome = sc.parse_forward(out, fenced=True, frontend="app_front", forward=FORWARD)
    assert outcome == sc.ForwardOutcome(True, "", 17, None)


def test_a_fence_that_fails_leaves_the_door_alone() -> None:
    out = f"fence-off: permission denied\n{sc.FENCE_EXIT}1\n"
    outcome = sc.parse_forward(out, fenced=True, frontend="app_front", forward=FORWARD)
    assert outcome == sc.ForwardOutcome(False, "fence-off: permission denied")


def test_a_door_that_does_not_point_at_the_target_afterwards_is_an_error() -> None:
    out = forward_answer("127.0.0.2", 8081)
    outcome = sc.parse_forward(out, fenced=False, frontend="app_front", forward=FORWARD)
    assert outcome.fence_lifted is None and outcome.requests is None
    assert outcome.door_error is not None and "still points at 127.0.0.2:8081" in outcome.door_error
    refused = sc.parse_forward(forward_answer(repoint="No such server.\n"), fenced=False, frontend="app_front",
                               forward=FORWARD)  # fmt: skip
    assert refused.door_error is not None and "No such server" in refused.door_error


def test_answers_split_on_their_empty_lines() -> None:
    assert sc.split_answers("a\nb\n\n\nc\n\n", 3) == ["a\nb\n", "", "c\n"]
    with pytest.raises(sc.DoorUnanswered, match="1 of 2"):
        sc.split_answers("a\n\nb\n", 2)


def test_the_commit_runs_on_the_source_only_when_two_round_trips_cost_more_than_its_work_there() -> None:
    script = sc.cost_probe_command("/run/haproxy/admin.sock", "ssh -p 22 app@target true")
    assert script.count("socat") == 2 and "ssh -p 22 app@target true" in script
    assert sc.LOCAL_COST in script
    cost = sc.parse_local_cost(f"noise\n{sc.LOCAL_COST}60000000\n")
    assert cost == 0.06
    assert sc.parse_local_cost("socat: not found\n") is None
    # Near hosts (2 ms round trips): the source's 60 ms of processes cost more; 40 ms away they are worth it.
    assert not sc.worth_driving_from_source(0.002, cost)
    assert sc.worth_driving_from_source(0.040, cost)
    assert not sc.worth_driving_from_source(1.0, None), "an unmeasured cost is no reason to move it"
