"""The front door's runtime API adapter: parsers of HAProxy's answers (captured from HAProxy 2.6.12, Debian 12),
how answers are judged, and what a dead or absent admin socket gives (real unix sockets, no HAProxy needed)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from orchestrator.transports import haproxy
from orchestrator.transports.haproxy import (
    AdminSocketUnreachable,
    FrontDoor,
    HaproxyRefused,
    check_answer,
    host_clock,
    parse_info,
    parse_map,
    parse_servers_state,
    parse_sessions,
    parse_stat,
    requests_of,
    unix_socket,
)

SHOW_STAT = (
    "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,s"
    "tatus,weight,act,bck,chkfail,chkdown,lastchg,downtime,qlimit,pid,iid,sid,throttle,lbtot,tracked,"
    "type,rate,rate_lim,rate_max,check_status,check_code,check_duration,hrsp_1xx,hrsp_2xx,hrsp_3xx,hr"
    "sp_4xx,hrsp_5xx,hrsp_other,hanafail,req_rate,req_rate_max,req_tot,cli_abrt,srv_abrt,comp_in,comp"
    "_out,comp_byp,comp_rsp,lastsess,last_chk,last_agt,qtime,ctime,rtime,ttime,agent_status,agent_cod"
    "e,agent_duration,check_desc,agent_desc,check_rise,check_fall,check_health,agent_rise,agent_fall,"
    "agent_health,addr,cookie,mode,algo,conn_rate,conn_rate_max,conn_tot,intercepted,dcon,dses,wrew,c"
    "onnect,reuse,cache_lookups,cache_hits,srv_icur,src_ilim,qtime_max,ctime_max,rtime_max,ttime_max,"
    "eint,idle_conn_cur,safe_conn_cur,used_conn_cur,need_conn_est,uweight,agg_server_status,agg_serve"
    "r_check_status,agg_check_status,-,ssl_sess,ssl_reused_sess,ssl_failed_handshake,h2_headers_rcvd,"
    "h2_data_rcvd,h2_settings_rcvd,h2_rst_stream_rcvd,h2_goaway_rcvd,h2_detected_conn_protocol_errors"
    ",h2_detected_strm_protocol_errors,h2_rst_stream_resp,h2_goaway_resp,h2_open_connections,h2_backe"
    "nd_open_streams,h2_total_connections,h2_backend_total_streams,h1_open_connections,h1_open_stream"
    "s,h1_total_connections,h1_total_streams,h1_bytes_in,h1_bytes_out,h1_spliced_bytes_in,h1_spliced_"
    "bytes_out,\napp_front,FRONTEND,,,0,2,9986,2,150,230,0,0,0,,,,,OPEN,,,,,,,,,1,2,0,,,,0,2,0,2,,,,0,"
    "2,0,0,0,0,,2,2,2,,,0,0,0,0,,,,,,,,,,,,,,,,,,,,,http,,2,2,2,0,0,0,0,,,0,0,,,,,,,0,,,,,,,,,-,0,0,0"
    ",0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,2,2,136,272,0,0,\napp_backend,app,0,0,0,1,100,2,150,230,,0,,0,0,0,"
    "0,no check,1,1,0,,,0,,,1,3,1,,2,,2,2,,2,,,,0,2,0,0,0,0,,,,2,0,0,,,,,0,,,0,0,0,1,,,,,,,,,,,,127.0"
    ".0.2:18081,,http,,,,,,,,0,2,0,,,0,,0,0,0,1,0,0,0,0,1,1,,,,-,0,0,0,,,,,,,,,,,,,,,,,,,,,,\napp_back"
    "end,BACKEND,0,0,0,1,999,2,150,230,0,0,,0,0,0,0,UP,1,1,0,,0,0,0,,1,3,0,,2,,1,2,,2,,,,0,2,0,0,0,0,"
    ",,,2,0,0,0,0,0,0,0,,,0,0,0,1,,,,,,,,,,,,,,http,roundrobin,,,,,,,0,2,0,0,0,,,0,0,0,1,0,,,,,1,0,0,"
    "0,-,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,2,2,224,136,0,0,\n\n"
)

SHOW_SERVERS_STATE = (
    "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight "
    "srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state sr"
    "v_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_p"
    "ort srv_check_addr srv_agent_addr srv_agent_port\n3 app_backend 1 app 127.0.0.2 2 0 1 1 0 1 0 2 0"
    " 0 0 0 - 18081 - 0 0 - - 0\n\n"
)

SHOW_MAP = "0x55f8fafedb10 hold_until 0\n\n"
UNKNOWN_COMMAND = "Unknown command, but maybe one of the following ones is a better match:\n  help\n\n"

SHOW_INFO = (
    "Name: HAProxy\nVersion: 2.6.12-1+deb12u4\nRelease_date: 2026/10/17\nNbthread: 2\nNbproc: 1\nProcess_n"
    "um: 1\nPid: 23507\nUptime: 0d 0h00m00s\nUptime_sec: 42\nMemmax_MB: 0\nPoolAlloc_MB: 0\nPoolUsed_MB: 0\n"
    "PoolFailed: 0\nUlimit-n: 20000\nStart_time_sec: 1795436014\n\n"
)

SHOW_SESS = (
    "0x55752dac46f0: proto=tcpv4 src=127.0.0.1:50398 fe=app_front be=<NONE> srv=<none> ts=00 epoch=0x"
    "2 age=1s calls=15 rate=14 cpu=0 lat=0 rq[f=40480000h,i=16384,an=30h,rx=,wx=,ax=0s] rp[f=80000000"
    "h,i=0,an=00h,rx=,wx=,ax=] scf=[8,0h,fd=8] scb=[0,1h,fd=-1] exp=0s rc=0 c_exp=\n0x55752dbc0fe0: pr"
    "oto=unix_stream src=unix:1 fe=GLOBAL be=<NONE> srv=<none> ts=00 epoch=0x2 age=0s calls=1 rate=0 "
    "cpu=0 lat=0 rq[f=c08000h,i=0,an=00h,rx=,wx=,ax=] rp[f=80008002h,i=0,an=00h,rx=,wx=,ax=] scf=[8,2"
    "00h,fd=9] scb=[8,1h,fd=-1] exp= rc=0 c_exp=\n\n"
)

SHOW_ACTIVITY = "thread_id: 1 (1..1)\ndate_now: 1795437180.266151\nctxsw: 24911\n\n"

# Answers HAProxy gave to commands it refused.
UNKNOWN_MAP = "Unknown map identifier. Please use #<id> or <file>.\n\n"
NO_SUCH_SERVER = "No such server.\n\n"
NO_SUCH_BACKEND = "Can't find backend.\n\n"
REPOINTED = "IP changed from '127.0.0.2' to '127.0.0.3', no need to change the port by 'stats socket command'\n\n"


def test_show_stat_rows_by_proxy_and_name() -> None:
    rows = {(row.proxy, row.name): row for row in parse_stat(SHOW_STAT)}
    assert set(rows) == {("app_front", "FRONTEND"), ("app_backend", "app"), ("app_backend", "BACKEND")}
    assert rows[("app_front", "FRONTEND")].status == "OPEN"
    assert rows[("app_front", "FRONTEND")].total == 2
    assert rows[("app_backend", "app")].address == "127.0.0.2:18081"
    assert rows[("app_backend", "BACKEND")].queue == 0


def test_show_stat_refuses_an_error_sentence() -> None:
    with pytest.raises(ValueError, match="not a `show stat` answer"):
        parse_stat("Permission denied\n\n")


def test_show_servers_state() -> None:
    (server,) = parse_servers_state(SHOW_SERVERS_STATE)
    assert (server.backend, server.server, server.address, server.port) == ("app_backend", "app", "127.0.0.2", 18081)
    assert server.operational == 2 and not server.in_maintenance


def test_show_servers_state_of_an_unknown_backend_is_an_error() -> None:
    with pytest.raises(ValueError):
        parse_servers_state(NO_SUCH_BACKEND)


def test_show_sess_tells_held_requests_from_the_cli_itself() -> None:
    streams = parse_sessions(SHOW_SESS)
    assert [(s.frontend, s.backend) for s in streams] == [("app_front", "<NONE>"), ("GLOBAL", "<NONE>")]
    assert streams[0].age == "1s"
    # Each stream is named by its address and the `show sess` epoch it was created in.
    assert (streams[0].id, streams[0].epoch) == ("0x55752dac46f0", "0x2")


def test_show_map_and_info() -> None:
    assert parse_map(SHOW_MAP) == {"hold_until": "0"}
    assert parse_map(UNKNOWN_MAP) == {}
    info = parse_info(SHOW_INFO)
    assert info["Version"] == "2.6.12-1+deb12u4"
    assert host_clock(SHOW_ACTIVITY) == float(SHOW_ACTIVITY.split("date_now: ")[1].split()[0])
    with pytest.raises(ValueError):
        host_clock("Unknown command\n")


@pytest.mark.parametrize("answer", ["\n", "", REPOINTED])
def test_answers_that_mean_success(answer: str) -> None:
    check_answer("set something", answer)


@pytest.mark.parametrize(
    ("answer", "said"),
    [(UNKNOWN_MAP, "Unknown map identifier"), (NO_SUCH_SERVER, "No such server."), ("Permission denied\n", "denied")],
)
def test_answers_that_mean_refusal(answer: str, said: str) -> None:
    with pytest.raises(HaproxyRefused) as caught:
        check_answer("set server app_backend/nosuch addr 127.0.0.3 port 1", answer)
    message = str(caught.value)
    assert "\n" not in message and said in message and "set server app_backend/nosuch" in message


def test_hold_lua_names_its_map_and_action() -> None:
    text = haproxy.hold_lua("/srv/haproxy/frontdoor.map", max_hold_s=75)
    assert 'Map.new("/srv/haproxy/frontdoor.map"' in text
    assert 'core.register_action("frontdoor_hold"' in text
    assert "local max_hold_s = 75.0" in text
    # Writes alone: every method but the reads waits while hold_writes_until is in the future, and the action says
    # it can on the admin socket.
    assert "local reads = { GET = true, HEAD = true, OPTIONS = true }" in text
    assert 'held_until("hold_writes_until")' in text and "txn.sf:method()" in text
    assert 'core.register_cli({ "frontdoor", "version" }' in text and 'applet:send("hold_writes\\n")' in text


# --- the admin socket itself (real unix sockets) ---------------------------------------------------------------


class FakeAdminSocket:
    """A unix socket that answers every command with canned text, as HAProxy does; several commands on one line,
    separated by ';', each get their answer, in order (each canned answer ends with its empty line). As HAProxy's:
    without `prompt` it closes after one line; after `prompt` (the interactive mode) it keeps the connection open and
    ends each answer with the prompt "> ". A canned answer of "" closes the connection without a byte (what an SSH
    tunnel does when the socket behind it cannot be opened); `idle_close` closes a kept connection after each line
    (what HAProxy's `stats timeout` does to an idle one)."""

    def __init__(self, path: Path, answers: dict[str, str]) -> None:
        self.path = path
        self.answers = answers
        self.commands: list[str] = []
        self.connections = 0
        self.idle_close = False
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.converse, args=(conn,), daemon=True).start()

    def converse(self, conn: socket.socket) -> None:
        with conn:
            self.exchanges(conn)

    def exchanges(self, conn: socket.socket) -> None:
        prompt = False
        for raw in conn.makefile("rb"):
            line = raw.decode().strip()
            if line == "prompt":
                prompt = True
                conn.sendall(b"\n> ")
                continue
            out = ""
            for command in (part.strip() for part in line.split(";")):
                self.commands.append(command)
                text = next((text for prefix, text in self.answers.items() if command.startswith(prefix)), "\n")
                if text == "":
                    return
                out += text + ("> " if prompt else "")
            conn.sendall(out.encode())
            if not prompt or self.idle_close:
                return

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[FakeAdminSocket]:
    fake = FakeAdminSocket(
        tmp_path / "admin.sock",
        {
            "show info": SHOW_INFO,
            "show activity": SHOW_ACTIVITY,
            "show stat": SHOW_STAT,
            "show servers state": SHOW_SERVERS_STATE,
            "show sess": SHOW_SESS,
            "show map": SHOW_MAP,
        },
    )
    yield fake
    fake.close()


def door(path: Path) -> FrontDoor:
    return FrontDoor(
        unix_socket(str(path)), frontend="app_front", backend="app_backend", server="app", hold_map="/m.map"
    )


def test_hold_sets_a_deadline_on_the_host_clock(admin: FakeAdminSocket) -> None:
    deadline = door(admin.path).hold(30)
    assert deadline == round(host_clock(SHOW_ACTIVITY) + 30, 3)
    assert admin.commands[-1] == f"set map /m.map hold_until {deadline}"


def test_writes_alone_are_held_only_when_the_action_says_it_can(admin: FakeAdminSocket) -> None:
    front = door(admin.path)
    admin.answers["frontdoor version"] = UNKNOWN_COMMAND
    assert not front.holds_writes_only()  # an older hold action
    admin.answers["frontdoor version"] = "hold_writes\n\n"
    assert not front.holds_writes_only()  # the action can, but its map has no hold_writes_until line
    admin.answers["show map"] = "0x55f8fafedb10 hold_until 0\n0x55f8fafedb40 hold_writes_until 0\n\n"
    assert front.holds_writes_only()
    deadline = front.hold(30, writes_only=True)
    assert admin.commands[-1] == f"set map /m.map hold_writes_until {deadline}"


def test_release_clears_a_hold_of_the_writes_too_in_one_round_trip(admin: FakeAdminSocket) -> None:
    front = door(admin.path)
    admin.answers["set map /m.map hold_writes_until"] = "entry not found.\n\n"  # an action that cannot hold writes
    front.release()
    assert admin.commands == ["set map /m.map hold_until 0", "set map /m.map hold_writes_until 0"]
    del admin.answers["set map /m.map hold_writes_until"]
    admin.answers["set map /m.map hold_until"] = "unknown map identifier.\n\n"
    with pytest.raises(HaproxyRefused, match="hold_until"):
        front.release()


def test_forward_repoints_and_releases_in_one_connection(admin: FakeAdminSocket) -> None:
    front = door(admin.path)
    moved = SHOW_SERVERS_STATE.replace("127.0.0.2", "127.0.0.3")
    admin.answers["show servers state"] = moved
    requests = front.forward("127.0.0.3", front_port(moved))
    assert requests == requests_of(SHOW_STAT, "app_front")
    assert admin.commands[1].startswith("set server app_backend/app addr 127.0.0.3 port ")
    assert admin.commands[2:4] == ["set map /m.map hold_until 0", "set map /m.map hold_writes_until 0"]
    # The read-back says the server points elsewhere: refused, one line.
    admin.answers["show servers state"] = SHOW_SERVERS_STATE
    with pytest.raises(HaproxyRefused, match=r"still points at 127\.0\.0\.2"):
        front.forward("127.0.0.3", 9)
    assert door(admin.path).pid_and_hold() == (parse_info(SHOW_INFO)["Pid"], 0.0)


def front_port(servers_state: str) -> int:
    return parse_servers_state(servers_state)[0].port


def test_state_combines_stat_map_info_and_server(admin: FakeAdminSocket) -> None:
    state = door(admin.path).state()
    assert not state.holding and state.held_until == 0
    assert state.server.address == "127.0.0.2" and state.held == 1


def test_a_refused_change_is_one_clear_error(admin: FakeAdminSocket) -> None:
    admin.answers["set server"] = NO_SUCH_SERVER
    with pytest.raises(HaproxyRefused, match=r"HAProxy refused `set server app_backend/app addr 127.0.0.3 port 9`"):
        door(admin.path).repoint("127.0.0.3", 9)


def test_a_missing_socket_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AdminSocketUnreachable) as caught:
        door(tmp_path / "absent.sock").release()
    assert str(tmp_path / "absent.sock") in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.transient


def test_a_connection_closed_without_an_answer_is_unreachable(admin: FakeAdminSocket) -> None:
    # What an SSH tunnel does when the remote socket cannot be opened: accept, then close without a byte.
    admin.answers["set map"] = ""
    with pytest.raises(AdminSocketUnreachable, match="closed without an answer"):
        door(admin.path).release()


# `show sess all` of HAProxy 2.6.12 in front of the lab's app (two streams at the server, a GET and a POST; the
# lines below each `txn=` line and two fields of the second line left out).
SHOW_SESS_ALL = """\
0x5576ba5863f0: [25/Nov/2026:03:08:15.954666] id=2212 proto=tcpv4 source=127.0.0.1:35914
  flags=0xc4a, conn_retries=0, srv_conn=0x5576ba3c4660, pend_pos=(nil) waiting=0 epoch=0x20
  frontend=app_front (id=2 mode=http), listener=? (id=1) addr=127.0.0.2:29122
  backend=app_backend (id=3 mode=http) addr=127.0.0.2:57404
  server=app (id=1) addr=127.0.0.2:30319
  task=0x5576ba37b6b0 (state=0x00 nice=0 calls=2 rate=0 exp=1s tmask=0x1 age=0s)
  txn=0x5576ba59d940 flags=0x3000 meth=1 status=-1 req.st=MSG_DONE rsp.st=MSG_RPBEFORE req.f=0x4c rsp.f=0x00
0x5576ba59b960: [25/Nov/2026:03:08:16.136086] id=2214 proto=tcpv4 source=127.0.0.1:35932
  flags=0x84a, conn_retries=0, srv_conn=0x5576ba3c4660, pend_pos=(nil) waiting=0 epoch=0x20
  frontend=app_front (id=2 mode=http), listener=? (id=1) addr=127.0.0.2:29122
  backend=app_backend (id=3 mode=http) addr=127.0.0.2:57418
  server=app (id=1) addr=127.0.0.2:30319
  task=0x5576ba37adf0 (state=0x00 nice=0 calls=2 rate=0 exp=1s tmask=0x1 age=?)
  txn=0x5576ba579c20 flags=0x0 meth=3 status=-1 req.st=MSG_DONE rsp.st=MSG_RPBEFORE req.f=0x0d rsp.f=0x00
"""


def test_show_sess_all_tells_the_writes_in_flight_from_the_reads() -> None:
    streams = haproxy.parse_sessions_all(SHOW_SESS_ALL)
    assert [(s.frontend, s.backend, s.server, s.id, s.epoch, method) for s, method in streams] == [
        ("app_front", "app_backend", "app", "0x5576ba5863f0", "0x20", "1"),  # GET
        ("app_front", "app_backend", "app", "0x5576ba59b960", "0x20", "3"),  # POST
    ]
    # A stream whose method HAProxy does not show (no request parsed yet) counts as a write.
    no_txn = "\n".join(line for line in SHOW_SESS_ALL.splitlines() if "meth=1" not in line)
    assert [method for _, method in haproxy.parse_sessions_all(no_txn)] == [None, "3"]


def test_a_hold_of_the_writes_waits_only_for_the_writes_in_flight(admin: FakeAdminSocket) -> None:
    admin.answers = {"show sess all": SHOW_SESS_ALL + "\n", **admin.answers}
    assert door(admin.path).writes_at_server() == {("0x5576ba59b960", "0x20")}


# --- the kept connection (the runtime API's interactive mode) ----------------------------------------------------

# HAProxy 2.6.12 in its interactive mode, one line of three commands (`show servers state be; set server be/app addr
# 127.0.0.1 port 10; help nothing`), answers shortened: each answer, its empty line, the prompt.
PROMPTED = (
    "1\n# be_id be_name srv_id srv_name srv_addr\n3 be 1 app 127.0.0.1\n\n> "
    "no need to change the addr, port changed from '9' to '10' by 'stats socket command'\n\n> "
    "\n> "
)


def test_answers_in_the_interactive_mode_end_with_an_empty_line_and_the_prompt() -> None:
    assert haproxy.split_prompted(PROMPTED, 3) == [
        "1\n# be_id be_name srv_id srv_name srv_addr\n3 be 1 app 127.0.0.1\n",
        "no need to change the addr, port changed from '9' to '10' by 'stats socket command'\n",
        "",
    ]
    assert haproxy.split_prompted(PROMPTED[:-3], 3) is None  # the last answer has not come yet
    assert haproxy.split_prompted("\n> " + PROMPTED, 4) == ["", *(haproxy.split_prompted(PROMPTED, 3) or [])]


def test_a_door_keeps_one_connection_each_command_one_exchange(admin: FakeAdminSocket) -> None:
    meter = haproxy.RoundTrips()
    front = FrontDoor(unix_socket(str(admin.path)), frontend="app_front", backend="app_backend", server="app",
                      hold_map="/m.map", meter=meter)  # fmt: skip
    with structlog.contextvars.bound_contextvars(step="repl_switch"):
        front.connect()
        front.hold(30, host_now=1000.0)
        front.release()
        assert front.server_state().address == "127.0.0.2"
    assert admin.connections == 1
    # One for the connection's opening, then one per exchange (the release's two commands are one).
    assert meter.by_step() == {"repl_switch": {"haproxy": 1 + 4}}
    assert admin.commands == ["show info", "set map /m.map hold_until 1030.0", "set map /m.map hold_until 0",
                              "set map /m.map hold_writes_until 0", "show servers state app_backend"]  # fmt: skip
    front.close()


def test_a_kept_connection_haproxy_closed_is_opened_again_and_the_command_answered(admin: FakeAdminSocket) -> None:
    front = door(admin.path)
    admin.idle_close = True  # HAProxy's `stats timeout`: the kept connection is closed after each answer
    for _ in range(3):
        assert front.pid_and_hold() == (parse_info(SHOW_INFO)["Pid"], 0.0)
    assert admin.connections == 3
    front.close()


def test_the_hold_and_the_requests_in_flight_in_one_exchange(admin: FakeAdminSocket) -> None:
    admin.answers = {"show sess all": SHOW_SESS_ALL + "\n", **admin.answers}
    front = door(admin.path)
    deadline, writes = front.hold_and_in_flight(30, writes_only=True, host_now=1000.0)
    assert deadline == 1030.0 and writes == {("0x5576ba59b960", "0x20")}  # the POST; the GET may go on
    assert admin.commands[-2:] == ["set map /m.map hold_writes_until 1030.0", "show sess all"]
    _, every = front.hold_and_in_flight(30, host_now=1000.0)
    assert every == {("0x5576ba5863f0", "0x20"), ("0x5576ba59b960", "0x20")}
    asked = len(admin.commands)
    assert front.wait_finished(set(), timeout=1.0)  # nothing in flight: nothing asked
    assert len(admin.commands) == asked
    admin.answers["set map"] = UNKNOWN_MAP
    with pytest.raises(HaproxyRefused, match="hold_until"):
        front.hold_and_in_flight(30, host_now=1000.0)
    front.close()
