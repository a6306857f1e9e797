"""The commit driven from the source host (orchestrator/services/source_commit.py): its one command and what it
answers.

The answers below are HAProxy 2.6's own, captured from its admin socket in its non-interactive mode (each answer
ends with an empty line; the connection closes after the last)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

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


RECORD = "/tmp/migrate-committed-plan's run"


def test_the_script_is_valid_shell_with_any_path() -> None:
    """Paths with spaces and quotes reach the shell quoted; each script parses."""
    fence = sc.fence_command_on_target("ssh -p 22", "deploy@127.0.0.3", "/srv/bin/fence-off 'now'", sudo=True)
    commit = sc.commit_script(SOCKET, MAP, HOLD, "/tmp/migrate guard's dir", RECORD, fence_on_target=fence,
                              forward=FORWARD)  # fmt: skip
    bare = sc.commit_script(SOCKET, MAP, None, None, RECORD, fence_on_target=None, forward=FORWARD)
    for script in (commit, bare, sc.probe_command(SOCKET), sc.record_probe(RECORD), sc.settle_probe(RECORD)):
        subprocess.run(["sh", "-n", "-c", script], check=True)
    assert "admin sock" in commit and "sudo -n -- sh -c" in fence and commit.startswith("setsid -w sh -c ")


def test_the_commit_is_recorded_after_the_guard_is_told_and_before_the_fence_is_lifted(tmp_path: Path) -> None:
    """Run for real by sh, with stand-ins for socat (answering the hold that stands, then the forward) and ssh:
    the order of what it does, the record left, and its answer parsed."""
    bin_dir, log = _stand_ins(tmp_path)
    guard_dir, record = tmp_path / "guard", tmp_path / "migrate-committed-x"
    guard_dir.mkdir()
    script = sc.commit_script(SOCKET, MAP, HOLD, str(guard_dir), str(record), fence_on_target="fence-off",
                              forward=FORWARD)  # fmt: skip
    # What the record's existence says is read at the fence: the guard told and the record written before it.
    (bin_dir / "fence-off").write_text(
        f"#!/bin/sh\n[ -e {guard_dir}/committed ] && [ -e {record} ] && echo fence >> {log}\n"
    )
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"}).stdout  # fmt: skip
    assert log.read_text().split() == ["socat1", "fence", "socat2"]
    assert record.exists() and not Path(f"{record}.out").exists()
    check, forwarded = sc.parse_commit(out, HOLD, fenced=True, frontend="app_front", forward=FORWARD)
    assert check == sc.CheckOutcome(True, "4242", 1764217000.123)
    assert forwarded == sc.ForwardOutcome(True, "", 17, None)
    assert sc.recorded(subprocess.run(["sh", "-c", sc.record_probe(str(record))], capture_output=True, text=True,
                                      check=True).stdout)  # fmt: skip


def _stand_ins(tmp_path: Path) -> tuple[Path, Path]:
    """socat answering the hold that stands, then the forward; a fence that logs: (bin dir, log)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "did"
    bin_dir.mkdir()
    answers = tmp_path / "answers"
    answers.mkdir()
    (answers / "1").write_text(CHECK)
    (answers / "2").write_text(forward_body())
    (bin_dir / "socat").write_text(
        f"#!/bin/sh\ncat >/dev/null; n=$(ls {tmp_path}/did.socat* 2>/dev/null | wc -l); n=$((n + 1)); "
        f"touch {tmp_path}/did.socat$n; echo socat$n >> {log}; cat {answers}/$n\n"
    )
    (bin_dir / "fence-off").write_text(f"#!/bin/sh\necho fence >> {log}\n")
    for tool in ("socat", "fence-off"):
        (bin_dir / tool).chmod(0o755)
    return bin_dir, log


def _sh(script: str, bin_dir: Path | None = None) -> str:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"} if bin_dir else None
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True, env=env).stdout


def test_a_commit_settled_before_it_arrives_is_cancelled_and_does_nothing(tmp_path: Path) -> None:
    """A run stopped at its commit settles it before it rolls back: the record's name claimed for a cancellation.
    The commit, arriving late, finds the name taken: nothing recorded, no fence lifted, the door left alone; a
    resumed run reads no commit; a settle asked again still says cancelled."""
    bin_dir, log = _stand_ins(tmp_path)
    record = tmp_path / "migrate-committed-x"
    assert _sh(sc.settle_probe(str(record))).split() == [sc.CANCELLED]
    script = sc.commit_script(SOCKET, MAP, HOLD, None, str(record), fence_on_target="fence-off", forward=FORWARD)
    out = _sh(script, bin_dir)
    assert log.read_text().split() == ["socat1"], "only the hold was read"
    assert not sc.recorded(out)
    assert not sc.recorded(_sh(sc.record_probe(str(record))))
    assert _sh(sc.settle_probe(str(record))).split() == [sc.CANCELLED]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(record.name)] == [record.name]


def test_a_commit_that_recorded_itself_settles_as_made_with_its_time(tmp_path: Path) -> None:
    bin_dir, _log = _stand_ins(tmp_path)
    record = tmp_path / "migrate-committed-x"
    script = sc.commit_script(SOCKET, MAP, HOLD, None, str(record), fence_on_target="fence-off", forward=FORWARD)
    before = time.time()
    assert sc.recorded(_sh(script, bin_dir))
    settled = _sh(sc.settle_probe(str(record)))
    at = sc.recorded_at(settled)
    assert at is not None and before - 1 <= at <= time.time() + 1, settled
    assert sc.recorded_at(_sh(sc.record_probe(str(record)))) == at


def test_a_hold_that_does_not_stand_records_nothing_and_lifts_nothing(tmp_path: Path) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "did"
    bin_dir.mkdir()
    (tmp_path / "answer").write_text(CHECK.replace("4242", "5151"))
    (bin_dir / "socat").write_text(f"#!/bin/sh\ncat >/dev/null; echo socat >> {log}; cat {tmp_path}/answer\n")
    (bin_dir / "fence-off").write_text(f"#!/bin/sh\necho fence >> {log}\n")
    for tool in ("socat", "fence-off"):
        (bin_dir / tool).chmod(0o755)
    record = tmp_path / "migrate-committed-x"
    script = sc.commit_script(SOCKET, MAP, HOLD, str(tmp_path / "guard"), str(record), fence_on_target="fence-off",
                              forward=FORWARD)  # fmt: skip
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"}).stdout  # fmt: skip
    assert log.read_text().split() == ["socat"] and not record.exists()
    check, forwarded = sc.parse_commit(out, HOLD, fenced=True, frontend="app_front", forward=FORWARD)
    assert check == sc.CheckOutcome(False, "5151", 1764217000.123) and forwarded is None
    assert not sc.recorded(subprocess.run(["sh", "-c", sc.record_probe(str(record))], capture_output=True,
                                          text=True, check=True).stdout)  # fmt: skip


def test_a_door_command_that_could_break_the_line_is_refused() -> None:
    with pytest.raises(ValueError):
        sc.commit_script(SOCKET, MAP, None, None, RECORD, fence_on_target=None,
                         forward=sc.Forward("b;x", "s", MAP, "1.2.3.4", 1))  # fmt: skip


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


def forward_body(address: str = "127.0.0.3", port: int = 8080, *, repoint: str = "") -> str:
    said = repoint or "no need to change the addr, port changed from '8081' to '8080' by 'stats socket command'\n"
    return f"{stat(17)}\n{said}\n\n\n{servers(address, port)}\n"


def forward_answer(address: str = "127.0.0.3", port: int = 8080, *, repoint: str = "") -> str:
    return framed(forward_body(address, port, repoint=repoint))


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


# --- the window's first command: the hold, the drain and the fence on the source ---------------------------------


def hold_and_fence(
    tmp_path: Path, awk: str, answers: list[str], *, fence: str = "echo fenced >> {log}", then: str | None = None
) -> str:
    """Run the script for real by sh with a stand-in socat that answers `answers` in turn (the last repeating) and
    records each line it was sent, with `awk` as the host's awk."""
    bin_dir, log = tmp_path / "bin", tmp_path / "did"
    bin_dir.mkdir(exist_ok=True)
    for i, answer in enumerate(answers, 1):
        (tmp_path / f"answer{i}").write_text(answer)
    (bin_dir / "socat").write_text(
        f"#!/bin/sh\nread line; echo \"socat: $line\" >> {log}; n=$(grep -c '^socat' {log}); "
        f"[ -f {tmp_path}/answer$n ] || n={len(answers)}; cat {tmp_path}/answer$n\n"
    )
    (bin_dir / "awk").symlink_to(awk)
    for tool in ("socat",):
        (bin_dir / tool).chmod(0o755)
    script = sc.hold_and_fence_script("/run/haproxy/admin.sock", MAP, key="hold_writes_until", deadline=1030.5,
                                      frontend="app_front", writes_only=True, drain_seconds=5,
                                      fence=fence.format(log=log),
                                      then=None if then is None else then.format(log=log))  # fmt: skip
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"}).stdout  # fmt: skip


@pytest.mark.parametrize("awk", ["/usr/bin/gawk", "/usr/bin/mawk"])
def test_the_hold_then_the_writes_in_flight_drained_then_the_fence(tmp_path: Path, awk: str) -> None:
    """The hold and the first listing in one exchange; the listing again until the write in flight (the POST: the
    GET in flight is a read, which the fence does not refuse) is gone; then, only then, the fence."""
    from tests.test_haproxy import SHOW_SESS_ALL

    if not Path(awk).exists():
        pytest.skip(f"{awk} is not installed")
    get_only = SHOW_SESS_ALL[: SHOW_SESS_ALL.index("0x5576ba59b960")]
    out = hold_and_fence(tmp_path, awk, ["\n" + SHOW_SESS_ALL + "\n", SHOW_SESS_ALL + "\n", get_only + "\n"])
    did = (tmp_path / "did").read_text().splitlines()
    assert did[0] == f"socat: set map {MAP} hold_writes_until 1030.5; show sess all"
    assert did[1:] == ["socat: show sess all", "socat: show sess all", "fenced"]
    assert sc.parse_hold_and_fence(out) == sc.HoldAndFence(True, "", 1, True, True, "exit 0")


def test_a_hold_refused_fences_nothing_and_a_failed_fence_says_why(tmp_path: Path) -> None:
    out = hold_and_fence(tmp_path, "/usr/bin/gawk", ["entry not found.\n\n"])
    sent = [f"socat: set map {MAP} hold_writes_until 1030.5; show sess all"]
    assert (tmp_path / "did").read_text().splitlines() == sent
    assert sc.parse_hold_and_fence(out) == sc.HoldAndFence(False, "entry not found.")
    failing = tmp_path / "again"
    failing.mkdir()
    out = hold_and_fence(failing, "/usr/bin/gawk", ["\n\n"], fence="echo 'fence: permission denied'; exit 3")
    assert sc.parse_hold_and_fence(out) == sc.HoldAndFence(True, "", 0, True, False, "fence: permission denied")


def test_what_follows_the_fence_runs_only_once_it_is_up_and_comes_back_with_its_status(tmp_path: Path) -> None:
    """The window's first command goes on after its fence with what the switch adds (the database's stop, the
    uploads' pass started): after the fence, in that order, its output and status in the answer; never when the
    fence failed."""
    then = "echo stopping >> {log}; echo 'position 0-1-42'; echo 'a warning' >&2; exit 3"
    out = hold_and_fence(tmp_path, "/usr/bin/gawk", ["\n\n"], then=then)
    assert (tmp_path / "did").read_text().splitlines()[1:] == ["fenced", "stopping"]
    done = sc.parse_hold_and_fence(out)
    assert (done.held, done.fenced, done.then_status) == (True, True, 3)
    assert done.then_said.split() == ["position", "0-1-42", "a", "warning"]
    failing = tmp_path / "fence-fails"
    failing.mkdir()
    out = hold_and_fence(failing, "/usr/bin/gawk", ["\n\n"], fence="exit 4", then=then)
    assert "stopping" not in (failing / "did").read_text()
    done = sc.parse_hold_and_fence(out)
    assert (done.fenced, done.then_status, done.then_said) == (False, None, "")
    (tmp_path / "plain").mkdir()
    plain = sc.parse_hold_and_fence(hold_and_fence(tmp_path / "plain", "/usr/bin/gawk", ["\n\n"]))
    assert plain.fenced and plain.then_status is None, "nothing follows when nothing is asked"
