"""The lab's hosts: real sshd, real mariadbd, real scripts; `lab up` idempotent, `lab down` leaves nothing running."""

from __future__ import annotations

import io
import os
import shlex
import socket
import stat
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pymysql
import pytest
import typer
from ruamel.yaml import YAML

from migrate_lab import cli, hosts, planfile, procs, relay, setup, sshd
from migrate_lab.mariadb import SCHEMA_SQL, run_sql
from migrate_lab.state import HostState, LabState
from orchestrator.plan.loader import load_plan
from tests.engine.world import Result

REPO = Path(__file__).resolve().parent.parent


def run(path: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(path)], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def own_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabState]:
    """A lab of this module's own, for what changes a lab (start/stop, down, up again): the session `lab`
    is shared with every other test and must stay as it is."""
    lab_dir = tmp_path_factory.mktemp("own-lab")
    try:
        yield hosts.up(lab_dir, db_size_mb=1, uploads_size_mb=1, default_ports=False)
    finally:
        hosts.down(lab_dir)


# --- ssh ----------------------------------------------------------------------------------------------------


@pytest.mark.lab
@pytest.mark.parametrize("name", ["source", "target"])
def test_ssh_logs_into_each_host_with_its_host_key_verified(lab: LabState, name: str) -> None:
    host = lab.host(name)
    proc = sshd.run_on(lab, host, 'echo "$LAB_HOST $(id -u) ${SSH_CONNECTION##* }"')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [name, "0", str(host.ssh_port)]


@pytest.mark.lab
def test_ssh_refuses_a_host_whose_key_is_not_the_known_one(lab: LabState, tmp_path: Path) -> None:
    # known_hosts naming the target's key for the source: the source must be refused, never trusted on first use.
    target_key = " ".join(sshd.host_key(lab.target).with_suffix(".pub").read_text().split()[:2])
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[{lab.source.address}]:{lab.source.ssh_port} {target_key}\n")
    proc = subprocess.run(
        [*sshd.ssh_base_argv(lab, lab.source, known_hosts=wrong), "true"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 255
    assert "host key" in proc.stderr.lower()

    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    proc = subprocess.run(
        [*sshd.ssh_base_argv(lab, lab.source, known_hosts=empty), "true"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 255
    assert "host key verification failed" in proc.stderr.lower()


@pytest.mark.lab
def test_source_reaches_target_from_its_own_address(lab: LabState) -> None:
    hop = " ".join(shlex.quote(a) for a in [*sshd.source_to_target_argv(lab), 'echo "$LAB_HOST $SSH_CLIENT"'])
    proc = sshd.run_on(lab, lab.source, hop)
    assert proc.returncode == 0, proc.stderr
    host_name, client_address = proc.stdout.split()[:2]
    assert (host_name, client_address) == ("target", lab.source.address)


@pytest.mark.lab
def test_password_login_is_refused(lab: LabState) -> None:
    proc = subprocess.run(
        [
            "ssh", "-F", "/dev/null", "-o", f"UserKnownHostsFile={lab.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "PubkeyAuthentication=no", "-p", str(lab.source.ssh_port),
            f"root@{lab.source.address}", "true",
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 255
    assert "permission denied" in proc.stderr.lower()


# --- MariaDB ------------------------------------------------------------------------------------------------


def connect(lab: LabState, host: HostState, user: str, password: str) -> pymysql.connections.Connection:
    return pymysql.connect(
        host=host.address, port=host.db_port, user=user, password=password, connect_timeout=5, read_timeout=30
    )


@pytest.mark.lab
def test_source_database_has_the_schema_rows_and_users(lab: LabState) -> None:
    secrets = lab.secrets()
    with connect(lab, lab.source, lab.migrate_user, secrets[lab.db_password_env]) as conn, conn.cursor() as cur:
        cur.execute(f"SHOW TABLES FROM {lab.db_name}")
        assert {row[0] for row in cur.fetchall()} >= {"reviews", "uploads"}
        cur.execute(f"SELECT COUNT(*) FROM {lab.db_name}.reviews")
        assert cur.fetchone()[0] > 1000
        cur.execute(f"SELECT COUNT(*) FROM {lab.db_name}.uploads WHERE name LIKE 'seed-%'")
        files = list(lab.source.uploads.glob("seed-*"))
        assert cur.fetchone()[0] == len(files) > 0
        # The migration user needs RELOAD (FTWRL) and SHUTDOWN; ALL PRIVILEGES ON *.* has both.
        cur.execute("SHOW GRANTS")
        assert any("ALL PRIVILEGES ON *.*" in row[0] for row in cur.fetchall())
        cur.execute("SELECT @@server_id, @@log_bin")
        assert cur.fetchone() == (lab.source.server_id, 1)
    with connect(lab, lab.source, lab.app_user, secrets[lab.app_password_env]) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM {lab.db_name}.reviews")
        assert cur.fetchone()[0] > 0
        with pytest.raises(pymysql.err.OperationalError):
            cur.execute("SELECT COUNT(*) FROM mysql.user")  # the app sees its own schema only


@pytest.mark.lab
def test_binlog_index_is_relative_so_a_copied_datadir_uses_its_own_binlogs(lab: LabState) -> None:
    lines = (lab.source.datadir / "binlog.index").read_text().split()
    assert lines
    assert all(not line.startswith("/") for line in lines)


@pytest.mark.lab
def test_schema_sql_is_idempotent(lab: LabState) -> None:
    run_sql(lab.source, SCHEMA_SQL, database=lab.db_name)
    tables = run_sql(lab.source, "SHOW TABLES;", database=lab.db_name).split()
    assert {"reviews", "uploads"} <= set(tables)


@pytest.mark.lab
def test_target_is_installed_but_left_stopped(own_lab: LabState) -> None:
    target = own_lab.target
    assert (target.datadir / "mysql").is_dir()
    assert hosts.db_pid(target) is None
    assert hosts.app_pid(own_lab, target) is None
    assert not procs.port_answers(target.address, target.db_port)
    # The app is stopped; its front door (HAProxy) answers on the clients' port.
    assert not procs.port_answers(target.address, target.app_listen_port)


@pytest.mark.lab
def test_target_database_starts_and_stops_with_its_scripts(own_lab: LabState) -> None:
    target = own_lab.target
    assert run(target.bin_dir / "db-start").returncode == 0
    pid = hosts.db_pid(target)
    assert pid is not None
    assert run_sql(target, "SELECT @@server_id;").strip() == str(target.server_id)
    assert run(target.bin_dir / "db-start").returncode == 0  # starting a running database changes nothing
    assert hosts.db_pid(target) == pid

    stop = run(target.bin_dir / "db-stop")
    assert stop.returncode == 0, stop.stderr
    assert not procs.is_alive(pid)  # db-stop returns only once the server is gone
    assert not procs.port_answers(target.address, target.db_port)
    # A clean shutdown: the error log says so.
    assert "Shutdown complete" in (target.log_dir / "mysqld.err").read_text()
    assert run(target.bin_dir / "db-stop").returncode == 0  # stopping a stopped database succeeds


# --- app, fence ---------------------------------------------------------------------------------------------


@pytest.mark.lab
def test_app_answers_healthz_on_the_source(lab: LabState) -> None:
    url = f"http://{lab.source.address}:{lab.source.app_port}/healthz"
    with urllib.request.urlopen(url, timeout=5) as answer:
        assert answer.status == 200
        assert answer.read().decode().startswith("ok")


@pytest.mark.lab
def test_app_and_fence_scripts(own_lab: LabState) -> None:
    source = own_lab.source
    assert run(source.bin_dir / "fence-on").returncode == 0
    assert source.fence_file.exists()
    assert run(source.bin_dir / "fence-on").returncode == 0
    assert run(source.bin_dir / "fence-off").returncode == 0
    assert not source.fence_file.exists()
    assert run(source.bin_dir / "fence-off").returncode == 0

    pid = hosts.app_pid(own_lab, source)
    assert pid is not None
    assert run(source.bin_dir / "app-stop").returncode == 0
    assert not procs.is_alive(pid)
    assert not procs.port_answers(source.address, source.app_listen_port)
    assert run(source.bin_dir / "app-start").returncode == 0
    assert procs.port_answers(source.address, source.app_listen_port)  # app-start returns once it serves


# --- lab.env, plan -----------------------------------------------------------------------------------------


@pytest.mark.lab
def test_secrets_live_only_in_lab_env(lab: LabState) -> None:
    assert stat.S_IMODE(lab.env_file.stat().st_mode) == 0o600
    values = lab.secrets()
    names = {lab.token_env, lab.db_password_env, lab.app_password_env}
    assert names <= values.keys()
    public = [lab.path / "lab.json", lab.plan_file]
    for host in (lab.source, lab.target):
        public += [*host.bin_dir.iterdir(), *host.log_dir.glob("*"), host.sshd_dir / "sshd_config"]
    for path in public:
        text = path.read_text()
        for name in names:
            assert values[name] not in text, f"{name} leaked into {path}"


@pytest.mark.lab
def test_plan_file_validates_and_describes_the_lab(lab: LabState) -> None:
    plan = load_plan(lab.plan_file).plan
    assert (plan.source.address, plan.target.address) == (lab.source.address, lab.target.address)
    assert plan.dns.content == lab.target.address
    assert plan.dns.base_url == lab.cf_base_url
    assert lab.cf_port > 0
    assert plan.database.target.start == str(lab.target.bin_dir / "db-start")
    assert plan.transfer.source_to_target_options == ["-o", f"BindAddress={lab.source.address}"]
    assert Path(plan.hooks.dir).is_dir()
    for command in (plan.services.fence.enable, plan.services.fence.disable, plan.database.source.stop):
        assert command is not None
        assert os.access(command, os.X_OK)
    # The same text through the plain YAML loader and the model, as the task's users would check it.
    data = YAML(typ="safe").load(io.StringIO(lab.plan_file.read_text()))
    assert (
        planfile.validate_text(lab.plan_file.read_text()).model_dump() == type(plan).model_validate(data).model_dump()
    )


# --- up twice, down, status, CLI ---------------------------------------------------------------------------


def pids_of(state: LabState) -> dict[str, int]:
    return {c.name: c.pid for c in hosts.components(state) if c.pid is not None}


@pytest.mark.lab
def test_up_on_a_running_lab_keeps_everything(own_lab: LabState) -> None:
    before = pids_of(own_lab)
    files = {p: p.read_bytes() for p in (own_lab.env_file, own_lab.known_hosts, own_lab.ssh_key)}
    rows = run_sql(own_lab.source, "SELECT COUNT(*) FROM reviews;", database=own_lab.db_name)
    again = hosts.up(own_lab.path, db_size_mb=1, uploads_size_mb=1, default_ports=False)
    assert pids_of(again) == before
    assert {"source sshd", "target sshd", "source mariadb", "source app", "cloudflare double"} <= before.keys()
    assert {p: p.read_bytes() for p in files} == files
    assert run_sql(own_lab.source, "SELECT COUNT(*) FROM reviews;", database=own_lab.db_name) == rows
    assert (again.source.ssh_port, again.source.db_port, again.cf_port) == (
        own_lab.source.ssh_port, own_lab.source.db_port, own_lab.cf_port,
    )  # fmt: skip


@pytest.mark.lab
def test_status_and_cli(own_lab: LabState) -> None:
    relay.set_distance(own_lab, 5, 5)
    proc = subprocess.run(
        [sys.executable, "-m", "migrate_lab.cli", "status", "--dir", own_lab.dir],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = {line.split("  ")[0].strip(): line for line in proc.stdout.splitlines()}
    assert "running" in lines["source mariadb"]
    assert f"{own_lab.source.address}:{own_lab.source.db_port}" in lines["source mariadb"]
    assert "running" in lines["cloudflare double"]
    assert "running" in lines["latency relay"] and "hosts +5 ms, API +5 ms one way" in lines["latency relay"]
    relayed = f"{own_lab.source.far_address}:{own_lab.source.ssh_port} → {own_lab.source.address}:"
    assert relayed in lines["relay source ssh"]


@pytest.mark.lab
def test_down_stops_everything_and_up_brings_it_back(own_lab: LabState) -> None:
    assert run(own_lab.target.bin_dir / "db-start").returncode == 0  # the target's database too, when it runs
    relay.set_distance(own_lab, 5, 5)  # the latency relay too
    before = pids_of(own_lab)
    assert "latency relay" in before
    assert len(before) >= 6
    stopped = hosts.down(own_lab.path)
    assert {s.pid for s in stopped} == set(before.values())
    assert not [name for name, pid in before.items() if procs.is_alive(pid)]
    assert pids_of(own_lab) == {}
    for host in (own_lab.source, own_lab.target):
        for port in (host.ssh_port, host.db_port, host.app_port, host.app_listen_port):
            assert procs.port_is_free(host.address, port)
    assert all("stopped" in line for line in hosts.status(own_lab.path))
    assert hosts.down(own_lab.path) == []  # nothing left to stop

    # A stopped, partly damaged lab comes back with the same keys, secrets and data; the target stays stopped.
    secrets = own_lab.env_file.read_bytes()
    own_lab.plan_file.unlink()
    (own_lab.source.bin_dir / "db-start").unlink()
    sshd.config_file(own_lab.target).unlink()
    # Someone else took the ssh port meanwhile: the lab moves its sshd (both hosts: one port per kind).
    old_ssh_port = own_lab.target.ssh_port
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port may have sockets in TIME_WAIT
        squatter.bind((own_lab.target.address, old_ssh_port))
        squatter.listen()
        again = hosts.up(own_lab.path, db_size_mb=1, uploads_size_mb=1, default_ports=False)
    assert again.source.ssh_port == again.target.ssh_port != old_ssh_port
    assert f"[{again.target.address}]:{again.target.ssh_port} " in again.known_hosts.read_text()
    running = pids_of(again)
    assert {"source sshd", "target sshd", "source mariadb", "source app", "cloudflare double"} <= running.keys()
    assert "target mariadb" not in running
    # The lab's distance is kept, and its relay follows the moved port (the host key known there too).
    assert "latency relay" in running and again.latency_ms == 5
    assert f"[{again.target.far_address}]:{again.target.ssh_port} " in again.known_hosts.read_text()
    assert own_lab.env_file.read_bytes() == secrets
    sshd.verify_login(again, again.target)
    assert load_plan(again.plan_file).plan.target.ssh_port == again.target.ssh_port
    assert os.access(again.source.bin_dir / "db-start", os.X_OK)


# --- pure logic ---------------------------------------------------------------------------------------------


def test_free_port_skips_a_taken_preferred_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.2", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert not procs.port_is_free("127.0.0.2", port)
        chosen = procs.free_port(["127.0.0.2", "127.0.0.3"], prefer=port)
        assert chosen != port
        assert procs.port_is_free("127.0.0.2", chosen) and procs.port_is_free("127.0.0.3", chosen)
    assert procs.free_port(["127.0.0.2"], prefer=port) == port  # free again once released


def test_missing_tools_are_named_in_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(setup, "find_tool", lambda name: None if name in ("mariadbd", "rsync") else "/bin/true")
    monkeypatch.setattr(setup, "can_install", lambda: False)
    assert setup.missing_packages() == ["mariadb-server", "rsync"]
    with pytest.raises(setup.SetupError, match="mariadb-server rsync"):
        setup.ensure_system_tools()


def test_compose_file_matches_the_native_lab() -> None:
    compose = YAML(typ="safe").load((REPO / "docker-compose.test.yml").read_text())
    services = compose["services"]
    assert set(services) == {"source", "target", "cloudflare-api"}

    def published(service: str) -> set[int]:
        return {int(str(p).split(":")[-1].split("/")[0]) for p in services[service].get("ports", [])}

    host_ports = {hosts.DEFAULT_SSH_PORT, hosts.DEFAULT_DB_PORT, hosts.DEFAULT_APP_PORT}
    assert published("source") == host_ports
    assert published("target") == host_ports
    assert published("cloudflare-api") == {hosts.DEFAULT_CF_PORT}
    addresses = {name: services[name]["networks"]["lab"]["ipv4_address"] for name in ("source", "target")}
    assert addresses == {"source": hosts.SOURCE_ADDRESS.replace("127.0.0", "172.30.0"),
                         "target": hosts.TARGET_ADDRESS.replace("127.0.0", "172.30.0")}  # fmt: skip
    for service in services.values():
        build = service["build"]
        assert (REPO / build["context"] / build["dockerfile"]).is_file()


# --- refusals: a mistyped --dir or argument changes nothing ----------------------------------------------------

MIGRATE = Path(sys.executable).with_name("migrate")


def migrate_lab(*args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home)} if home is not None else None
    return subprocess.run(
        [str(MIGRATE), "lab", *args], capture_output=True, text=True, timeout=60, check=False, env=env
    )


def lab_here(migrate_here: Callable[..., Result], *args: str, home: Path | None = None) -> Result:
    """`migrate lab ARGS` run in the test's process (the same `main`, without a process start-up: each test below
    also runs one refusal through the installed command)."""
    return migrate_here("lab", *args, env={"HOME": str(home)} if home is not None else None)


def assert_refused_in_one_line(proc: subprocess.CompletedProcess[str] | Result, code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def precious_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "my-project"
    folder.mkdir()
    (folder / "precious.txt").write_text("years of work")
    return folder


def fake_lab(lab_dir: Path) -> LabState:
    """A lab's lab.json with nothing running: what `lab down --purge` may delete."""
    lab_dir.mkdir(parents=True, exist_ok=True)
    state = hosts.new_state(lab_dir, hosts.SOURCE_ADDRESS, hosts.TARGET_ADDRESS, default_ports=False)
    state.save()
    return state


def test_purge_refuses_a_directory_that_is_not_a_lab(tmp_path: Path, migrate_here: Callable[..., Result]) -> None:
    folder = precious_dir(tmp_path)
    with pytest.raises(hosts.LabRefused, match="not a lab"):
        hosts.down(folder, purge=True)
    line = assert_refused_in_one_line(migrate_lab("down", "--dir", str(folder), "--purge"))
    assert str(folder) in line and "nothing deleted" in line
    assert (folder / "precious.txt").read_text() == "years of work"

    # A lab.json copied from another lab does not make a folder a lab either.
    other = fake_lab(tmp_path / "other-lab")
    (folder / "lab.json").write_bytes((other.path / "lab.json").read_bytes())
    with pytest.raises(hosts.LabRefused, match="made elsewhere"):
        hosts.down(folder, purge=True)
    assert_refused_in_one_line(lab_here(migrate_here, "down", "--dir", str(folder), "--purge"))
    assert (folder / "precious.txt").read_text() == "years of work"

    # The lab itself is purged.
    proc = lab_here(migrate_here, "down", "--dir", str(other.path), "--purge")
    assert proc.returncode == 0, proc.stderr
    assert not other.path.exists()
    assert (folder / "precious.txt").exists()


def test_up_refuses_root_home_system_and_foreign_directories(
    tmp_path: Path, migrate_here: Callable[..., Result]
) -> None:
    folder = precious_dir(tmp_path)
    before = sorted(folder.iterdir())
    with pytest.raises(hosts.LabRefused, match="not empty"):
        hosts.up(folder)
    line = assert_refused_in_one_line(migrate_lab("up", "--dir", str(folder)))
    assert "not empty" in line
    assert sorted(folder.iterdir()) == before

    home = tmp_path / "home"
    home.mkdir()  # empty: refused for being the home directory, not for its content
    assert "home directory" in assert_refused_in_one_line(lab_here(migrate_here, "up", "--dir", str(home), home=home))
    assert list(home.iterdir()) == []
    assert "home directory" in assert_refused_in_one_line(lab_here(migrate_here, "up", "--dir", "~", home=home))
    for system in ("/", "/usr", "/etc", "/var/lib", "/proc/self"):
        assert_refused_in_one_line(lab_here(migrate_here, "up", "--dir", system))
    assert not Path("/lab.json").exists() and not Path("/usr/lab.json").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["up", "--dir", "{new}", "--source-address", "banana"],
        ["up", "--dir", "{new}", "--target-address", "10.0.0.1"],
        ["up", "--dir", "{new}", "--source-address", "127.0.0.9", "--target-address", "127.0.0.9"],
        ["up", "--dir", "{new}", "--db-size", "0"],
        ["up", "--dir", "{new}", "--uploads-size", "-4"],
        ["up", "--dir", "{new}", "--latency", "-20"],
        ["up", "--dir", "{new}", "--api-latency", "10001"],
        ["verify", "--dir", "{new}", "--host", "nowhere"],
        ["verify", "--dir", "{new}"],
        ["load", "--dir", "{new}", "--rate", "0"],
        ["load", "--dir", "{new}", "--clients", "-1"],
        ["status", "--dir", "/nonexistent/lab"],
        ["down", "--dir", "/nonexistent/lab"],
    ],
)
def test_bad_lab_arguments_are_one_line_and_exit_2(
    tmp_path: Path, args: list[str], migrate_here: Callable[..., Result]
) -> None:
    new = tmp_path / "new-lab"
    argv = [a.replace("{new}", str(new)) for a in args]
    # One of them through the installed command as well: the same one line and exit code from a process of its own.
    proc = migrate_lab(*argv) if args[0] == "status" else lab_here(migrate_here, *argv)
    assert_refused_in_one_line(proc)
    assert not new.exists(), "a refused command wrote something"


def test_a_failing_part_of_the_lab_is_one_line_naming_it_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = fake_lab(tmp_path / "lab").source
    host.bin_dir.mkdir(parents=True)
    script = host.bin_dir / "db-start"
    log = host.log_dir / "mysqld.err"
    script.write_text(
        f"#!/bin/sh\necho 'db-start: mariadbd did not start; see {log}' >&2\necho 'disk full' >&2\nexit 1\n"
    )
    script.chmod(0o755)
    with pytest.raises(typer.Exit) as exit_info, cli._one_line_errors("up"):
        hosts.run_script(host, "db-start")
    assert exit_info.value.exit_code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "db-start" in lines[0] and str(log) in lines[0] and "disk full" in lines[0]
