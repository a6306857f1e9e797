"""`lab up`, `lab down`, `lab status`: the two lab hosts with their daemons, made, checked and stopped.

`up` is idempotent: on a fresh directory it makes everything; on a half-made lab it finishes it; on a running lab
it checks every part and repairs what is missing. It never starts or stops the target's database or app once the
lab exists (a migration may have moved the service there), and it never recreates keys or secrets.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import ipaddress
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from migrate_lab import (
    bastion,
    binscripts,
    haproxy,
    mariadb,
    operator,
    planfile,
    procs,
    relay,
    setup,
    sshd,
    uploads_tree,
    wordpress,
)
from migrate_lab import postgres as pglab
from migrate_lab.state import STATE_FILE, HostState, LabState
from orchestrator.transports.haproxy import HaproxyError

SOURCE_ADDRESS = "127.0.0.2"
APPS = ("demo", wordpress.APP_NAME)
ENGINES = ("mariadb", pglab.ENGINE)
TARGET_ADDRESS = "127.0.0.3"
# The ports `lab up` prefers (and docker-compose.test.yml publishes); any taken one is replaced by a free one.
DEFAULT_SSH_PORT = 2222
DEFAULT_DB_PORT = 3307
DEFAULT_APP_PORT = 8080  # the front door (HAProxy); the app itself listens on the internal port behind it
DEFAULT_APP_INTERNAL_PORT = 8081
DEFAULT_CF_PORT = 8443
LOAD_PID_SUFFIX = ".pid"
CF_MODULE = "migrate_lab.cfapi"
MAX_SOCKET_PATH = 107  # sockaddr_un.sun_path holds 108 bytes with its terminating NUL

Say = Callable[[str], None]


class LabError(RuntimeError):
    """The lab could not be brought up or down; the message names the part and its log."""


class LabRefused(LabError):
    """A request the lab refuses before changing anything: a bad argument, or a directory that is not a lab."""


# Directories a lab is never made in nor purged: a typo'd --dir must not fill or wipe one of them.
SYSTEM_DIRS = frozenset(
    Path(p)
    for p in (
        "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media", "/mnt",
        "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys", "/tmp", "/usr", "/usr/bin",
        "/usr/lib", "/usr/local", "/usr/local/bin", "/usr/sbin", "/usr/share", "/var", "/var/lib", "/var/log",
        "/var/tmp", "/var/www",
    )
)  # fmt: skip
# Nothing of a lab lives under these pseudo-filesystems.
SYSTEM_TREES = (Path("/proc"), Path("/sys"), Path("/dev"))


def _quiet(_: str) -> None:
    pass


def _optional_module(name: str) -> ModuleType | None:
    """A lab module written separately (the Cloudflare double, load, verify), or None while it does not exist."""
    if importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name)


# --- the lab directory ----------------------------------------------------------------------------------------


def check_address(address: str) -> None:
    """A lab host's address: an IP address on the loopback network (the lab never listens anywhere else)."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        raise LabRefused(f"{address!r} is not an IP address (the lab's hosts use 127.0.0.0/8)") from None
    if not parsed.is_loopback:
        raise LabRefused(f"{address} is not a loopback address: the lab lives on 127.0.0.0/8 only")


def protected_dir(path: Path) -> str | None:
    """Why `path` may never be a lab directory (the filesystem root, a home directory, a system directory),
    or None when it may be one."""
    resolved = path.expanduser().resolve()
    if resolved == Path("/"):
        return "the filesystem root"
    if resolved == Path.home().resolve():
        return "your home directory"
    if resolved in SYSTEM_DIRS or any(resolved.is_relative_to(tree) for tree in SYSTEM_TREES):
        return "a system directory"
    return None


def lab_state_of(lab_dir: Path) -> LabState | None:
    """The lab whose directory `lab_dir` is: its lab.json exists, reads, and names this very directory;
    None otherwise (no lab.json, an unreadable one, or one copied from another lab)."""
    lab_dir = lab_dir.expanduser().absolute()
    if not (lab_dir / STATE_FILE).is_file():
        return None
    try:
        state = LabState.load(lab_dir)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if Path(state.dir).resolve() != lab_dir.resolve():
        return None
    return state


def check_dir_for_up(lab_dir: Path) -> None:
    """`lab up` makes or repairs a lab only in a directory of its own: missing, empty, or already a lab."""
    lab_dir = lab_dir.expanduser().absolute()
    reason = protected_dir(lab_dir)
    if reason is not None:
        raise LabRefused(f"{lab_dir} is {reason}: a lab needs a directory of its own (e.g. --dir .lab)")
    if lab_dir.exists() and not lab_dir.is_dir():
        raise LabRefused(f"{lab_dir} exists and is not a directory")
    if (lab_dir / STATE_FILE).exists():
        if lab_state_of(lab_dir) is None:
            raise LabRefused(f"{lab_dir / STATE_FILE} is unreadable or belongs to a lab made elsewhere")
        return
    if lab_dir.is_dir() and any(lab_dir.iterdir()):
        raise LabRefused(f"{lab_dir} is not empty and holds no lab ({STATE_FILE}): choose a new or empty directory")


# --- state and secrets ---------------------------------------------------------------------------------------


def new_state(lab_dir: Path, source_address: str, target_address: str, *, default_ports: bool) -> LabState:
    addresses = (source_address, target_address)
    taken: list[int] = []

    def pick(prefer: int) -> int:
        port = procs.free_port(addresses, prefer=prefer if default_ports else None, avoid=taken)
        taken.append(port)
        return port

    ssh_port, db_port, app_port = pick(DEFAULT_SSH_PORT), pick(DEFAULT_DB_PORT), pick(DEFAULT_APP_PORT)
    app_internal_port = pick(DEFAULT_APP_INTERNAL_PORT)

    def host(name: str, address: str, server_id: int) -> HostState:
        return HostState(
            name=name,
            address=address,
            ssh_port=ssh_port,
            db_port=db_port,
            app_port=app_port,
            app_internal_port=app_internal_port,
            server_id=server_id,
            root=str(lab_dir / name),
        )

    return LabState(
        dir=str(lab_dir),
        source=host("source", source_address, 1),
        target=host("target", target_address, 2),
    )


def _ours_or_free(host: HostState, port: int, ours_running: bool) -> bool:
    return ours_running or procs.port_is_free(host.address, port)


def repair_ports(state: LabState) -> bool:
    """Re-pick a port kind (the same on both hosts) when a stopped part of ours would find it taken by someone
    else. Returns True when a port changed (configs, known_hosts and the plan are rewritten anyway)."""
    changed = False
    hosts = (state.source, state.target)
    addresses = [h.address for h in hosts]
    kinds: dict[str, Callable[[HostState], bool]] = {
        "ssh_port": lambda h: sshd.running_pid(h) is not None,
        "db_port": lambda h: db_pid(h) is not None,
        "app_port": lambda h: haproxy.running_pid(h) is not None if h.has_front_door else app_running(state, h),
        "app_internal_port": lambda h: app_running(state, h),
    }
    if not state.source.has_front_door:
        del kinds["app_internal_port"]
    for attr, is_running in kinds.items():
        port = getattr(state.source, attr)
        if all(_ours_or_free(h, port, is_running(h)) for h in hosts):
            continue
        if any(is_running(h) for h in hosts):
            raise LabError(f"{attr.replace('_', ' ')} {port} is taken by another process while part of the lab runs")
        others = [getattr(state.source, a) for a in kinds if a != attr]
        new_port = procs.free_port(addresses, avoid=others)
        for h in hosts:
            setattr(h, attr, new_port)
        changed = True
    return changed


def ensure_env_file(state: LabState) -> dict[str, str]:
    """lab.env: the lab's secrets, random, made once (mode 0600) and kept; a missing variable is added."""
    names = (state.token_env, state.db_password_env, state.app_password_env, state.repl_password_env)
    values = state.secrets() if state.env_file.exists() else {}
    missing = [n for n in names if not values.get(n)]
    if missing:
        for name in missing:
            values[name] = secrets.token_urlsafe(24)
        lines = ["# The lab's secrets (made once by `lab up`). Load with: set -a; . ./lab.env; set +a"]
        lines += [f"{k}={v}" for k, v in values.items()]
        fd = os.open(state.env_file.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write("\n".join(lines) + "\n")
        os.replace(state.env_file.with_suffix(".tmp"), state.env_file)
    state.env_file.chmod(0o600)
    return values


# --- processes -----------------------------------------------------------------------------------------------


def db_pid(host: HostState) -> int | None:
    """The host's database server: its mariadbd, or its postmaster in a PostgreSQL lab."""
    return procs.running_pid(host.db_pid_file, f"--datadir={host.datadir}") or pglab.pid(host)


def add_front_door(state: LabState) -> bool:
    """A lab made before the front door existed gets one: its app moves behind HAProxy. Only while no app of
    the lab runs (an app still listening on the clients' port would keep HAProxy from binding it)."""
    if state.source.has_front_door:
        return False
    if any(app_pid(state, h) is not None for h in (state.source, state.target)):
        raise LabError("this lab predates its front door (HAProxy): run `lab down`, then `lab up` to add it")
    addresses = [state.source.address, state.target.address]
    taken = [state.source.ssh_port, state.source.db_port, state.source.app_port]
    port = procs.free_port(addresses, prefer=None, avoid=taken)
    for host in (state.source, state.target):
        host.app_internal_port = port
    return True


def app_pid(state: LabState, host: HostState) -> int | None:
    return procs.running_pid(host.app_pid_file, binscripts.app_marker(state, host))


def app_running(state: LabState, host: HostState) -> bool:
    """The host's app runs: the demo app, or WordPress's nginx or php-fpm."""
    if state.app == wordpress.APP_NAME:
        return any(pid is not None for pid in wordpress.stack_pids(host).values())
    return app_pid(state, host) is not None


def load_pids(state: LabState) -> list[int]:
    """Load generators of this lab: pid files in load/ and any `migrate_lab.load` naming this lab's dir."""
    found: set[int] = set()
    if state.load_dir.is_dir():
        for pid_file in state.load_dir.glob(f"*{LOAD_PID_SUFFIX}"):
            pid = procs.running_pid(pid_file)
            if pid is not None and pid != os.getpid():
                found.add(pid)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            line = procs.cmdline(int(entry.name))
            if "migrate_lab.load" in line and state.dir in line:
                found.add(int(entry.name))
    return sorted(found)


def run_script(host: HostState, name: str, *, timeout: float = 600.0) -> None:
    path = host.bin_dir / name
    proc = subprocess.run(
        [str(path)], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
    )
    if proc.returncode != 0:
        # One line: the script's first line on stderr names what failed and its log, the last one says why.
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()] or ["no message"]
        said = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
        raise LabError(f"{path} failed (exit {proc.returncode}): {said}")


def cf_module() -> ModuleType | None:
    return _optional_module(CF_MODULE)


def cf_pid(state: LabState) -> int | None:
    """The Cloudflare double's pid, from the pid file in cf/ (whatever its exact name)."""
    if not state.cf_dir.is_dir():
        return None
    for pid_file in sorted(state.cf_dir.glob("*.pid")):
        pid = procs.running_pid(pid_file, CF_MODULE)
        if pid is not None:
            return pid
    return None


# --- up ------------------------------------------------------------------------------------------------------


def seed_uploads(state: LabState, uploads_size_mb: int) -> int:
    """Demo files in the source's uploads (random bytes, so nothing compresses them away), recorded in the
    `uploads` table. Returns how many files it wrote."""
    uploads = state.source.uploads
    uploads.mkdir(parents=True, exist_ok=True)
    state.target.uploads.mkdir(parents=True, exist_ok=True)
    total = max(1, uploads_size_mb) * 1024 * 1024
    count = max(8, min(2000, total // (256 * 1024)))
    size = total // count
    written = 0
    rows: list[str] = []
    recorded: list[tuple[str, int, str]] = []
    for index in range(1, count + 1):
        path = uploads / f"seed-{index:04d}.bin"
        if not (path.exists() and path.stat().st_size == size):
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(os.urandom(size))
            tmp.replace(path)
            written += 1
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        rows.append(f"('{path.name}', {size}, '{digest}')")
        recorded.append((path.name, size, digest))
    if state.engine == pglab.ENGINE:
        pglab.record_uploads(state, recorded)
        return written
    mariadb.run_sql(
        state.source,
        "INSERT INTO uploads (name, size, sha256) VALUES "
        + ",\n".join(rows)
        + " ON DUPLICATE KEY UPDATE size = VALUES(size), sha256 = VALUES(sha256);",
        database=state.db_name,
    )
    return written


def _load_or_new(lab_dir: Path, source_address: str, target_address: str, default_ports: bool) -> LabState:
    if (lab_dir / STATE_FILE).exists():
        state = LabState.load(lab_dir)
        if state.dir != str(lab_dir):
            raise LabError(f"{lab_dir / STATE_FILE} belongs to a lab made in {state.dir}; a lab cannot be moved")
        return state
    return new_state(lab_dir, source_address, target_address, default_ports=default_ports)


def _start_sshds(state: LabState, say: Say) -> None:
    """Both sshd; when another process took the port between our check and sshd's bind, once more on a new one."""
    for attempt in (1, 2):
        for host in (state.source, state.target):
            sshd.prepare(state, host)
        sshd.write_known_hosts(state)
        try:
            for host in (state.source, state.target):
                pid = sshd.start(state, host)
                say(f"{host.name}: sshd on {host.address}:{host.ssh_port} (pid {pid})")
            return
        except sshd.LabSshError:
            if attempt == 2 or all(procs.port_is_free(h.address, h.ssh_port) for h in (state.source, state.target)):
                raise
            for host in (state.source, state.target):
                sshd.stop(host)
            repair_ports(state)
            state.save()


def up(
    lab_dir: Path,
    *,
    db_size_mb: int = 5,
    uploads_size_mb: int = 4,
    source_address: str = SOURCE_ADDRESS,
    target_address: str = TARGET_ADDRESS,
    default_ports: bool = True,
    files: int = 0,
    file_sizes: tuple[int, int] = uploads_tree.SIZES,
    latency_ms: float | None = None,
    api_latency_ms: float | None = None,
    app: str | None = None,
    with_bastion: bool = False,
    with_operator: bool = False,
    engine: str | None = None,
    say: Say = _quiet,
) -> LabState:
    """Bring the lab up (or finish / repair it) and return its state, saved in <dir>/lab.json.

    `latency_ms` / `api_latency_ms`: the one-way delay between the orchestrator and the hosts / the Cloudflare
    double (the latency relay adds it; 0: direct); None keeps what the lab has.

    `engine`: the database of both hosts, mariadb (a new lab's default) or postgresql; an existing lab keeps its own.

    `files`: that many more small uploads in hashed directories, each of `file_sizes` bytes (smallest, largest).

    `default_ports=False` picks random free ports even when the defaults are free: for test labs made next to
    other labs on the same machine, where two runs racing for the same default port would collide.
    """
    for address in (source_address, target_address):
        check_address(address)
    if ipaddress.ip_address(source_address) == ipaddress.ip_address(target_address):
        raise LabRefused("the source and the target need different addresses")
    if db_size_mb < 1 or uploads_size_mb < 1:
        raise LabRefused("the database and uploads sizes are whole megabytes, at least 1")
    if files < 0:
        raise LabRefused("--files is a number of files, not negative")
    for name, value in (("--latency", latency_ms), ("--api-latency", api_latency_ms)):
        if value is not None:
            try:
                relay.check_latency(name, value)
            except ValueError as exc:
                raise LabRefused(str(exc)) from None
    if app is not None and app not in APPS:
        raise LabRefused(f"--app must be one of {', '.join(APPS)}, not {app!r}")
    if engine is not None and engine not in ENGINES:
        raise LabRefused(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine == pglab.ENGINE and app == wordpress.APP_NAME:
        raise LabRefused("WordPress runs on MariaDB only: --engine postgresql serves the demo app")
    check_dir_for_up(lab_dir)
    installed = setup.ensure_system_tools(pglab.missing_packages() if engine == pglab.ENGINE else [])
    if installed:
        say(f"installed system packages: {' '.join(installed)}")
    lab_dir = lab_dir.expanduser().absolute()
    lab_dir.mkdir(parents=True, exist_ok=True)
    state = _load_or_new(lab_dir, source_address, target_address, default_ports)
    if app is not None and (lab_dir / STATE_FILE).exists() and state.app != app:
        raise LabRefused(f"the lab in {lab_dir} runs the {state.app} app, not {app}: `lab down --purge` it first")
    state.app = app or state.app  # a new lab's default: the demo app; an existing lab keeps its own
    if engine is not None and (lab_dir / STATE_FILE).exists() and state.engine != engine:
        raise LabRefused(f"the lab in {lab_dir} runs {state.engine}, not {engine}: `lab down --purge` it first")
    state.engine = engine or state.engine
    if state.engine == pglab.ENGINE:
        try:
            pglab.check_reachable(lab_dir)  # before anything starts: the clusters' account must reach the lab
        except pglab.LabPgError as exc:
            raise LabRefused(str(exc)) from None
    if with_bastion and not state.bastion_address:
        state.bastion_address = bastion.BASTION_ADDRESS
    if with_operator or state.operator:
        state.operator = operator.ensure(state)
        for host in (state.source, state.target):
            host.admin_gid = operator.gid(state)
        say(f"operator: {state.operator} logs in on both hosts, root through passwordless sudo")
    longest_socket = max(len(str(p)) for h in (state.source, state.target) for p in (h.db_socket, h.haproxy_socket))
    if longest_socket > MAX_SOCKET_PATH:
        raise LabError(f"the lab directory {lab_dir} is too deep: unix socket paths would pass {MAX_SOCKET_PATH} bytes")
    if not state.cf_port and default_ports:
        state.cf_port = DEFAULT_CF_PORT  # the double takes it when free, else picks another and records it
    fresh_target = not (mariadb.installed_marker(state.target).exists() or pglab.pg_dir(state.target).exists())
    if add_front_door(state):
        say("the lab gets its front door: HAProxy on the clients' port, the apps behind it")
    if repair_ports(state):
        say("some ports were taken by other processes: picked new ones")
    state.save()
    ensure_env_file(state)
    secrets_ = state.secrets()

    # Keys and sshd: the lab key pair logs into both hosts and lets the source reach the target.
    sshd.keygen(state.ssh_key, "migrate-lab")
    for host in (state.source, state.target):
        for sub in (host.run_dir, host.log_dir, host.uploads, host.app_dir, host.haproxy_dir):
            sub.mkdir(parents=True, exist_ok=True)
    _start_sshds(state, say)
    for host in (state.source, state.target):
        sshd.verify_login(state, host)
    sshd.verify_source_to_target(state)
    if state.bastion_address:
        pid = bastion.up(state)
        say(f"bastion: sshd on {state.bastion_address}:{state.source.ssh_port} (pid {pid}); the plan's hosts via it")
    say("ssh: both hosts answer with verified host keys; the source reaches the target")

    if state.engine == pglab.ENGINE:
        _up_postgres(state, secrets_, db_size_mb, say)
    else:
        _up_mariadb(state, secrets_, db_size_mb, fresh_target, say)
    written = seed_uploads(state, uploads_size_mb)
    say(f"source: uploads in {state.source.uploads} ({written} files written)")
    if state.app == wordpress.APP_NAME and wordpress.install(state, state.source):
        say(f"source: WordPress installed (admin {wordpress.ADMIN_USER}, application password in {state.env_file})")
    if files:
        written = uploads_tree.write_tree(state.source.uploads, files, sizes=file_sizes)
        say(f"source: {files} small uploads in hashed directories ({written} written)")
    if fresh_target:
        run_script(state.target, "app-stop")
    _up_rest(state, latency_ms, api_latency_ms, say)
    return state


def _up_postgres(state: LabState, secrets_: dict[str, str], db_size_mb: int, say: Say) -> None:
    """PostgreSQL: the source's cluster made, started, provisioned and filled; the target has none (the
    migration seeds it, as pg_basebackup needs an empty data directory)."""
    for host in (state.source, state.target):
        binscripts.write_scripts(state, host)
        pglab.prepare_dirs(host)
    if pglab.init_cluster(state, state.source):
        say(f"source: PostgreSQL cluster made in {pglab.data_dir(state.source)}")
    pid = pglab.start(state.source)
    pglab.provision(state, secrets_)
    added = pglab.fill_reviews(state, db_size_mb)
    say(f"source: postgresql on {state.source.address}:{state.source.db_port} (pid {pid}), {added} seed rows added")


def _up_mariadb(state: LabState, secrets_: dict[str, str], db_size_mb: int, fresh_target: bool, say: Say) -> None:
    # MariaDB: both datadirs installed; the source runs with users, schema and data; the target stays stopped.
    for host in (state.source, state.target):
        binscripts.write_scripts(state, host)
        if state.app == wordpress.APP_NAME:
            wordpress.write_host(state, host)
        if mariadb.install_datadir(host):
            say(f"{host.name}: datadir installed in {host.datadir}")
    run_script(state.source, "db-start")
    mariadb.provision_users(state, secrets_)
    added = mariadb.fill_reviews(state, db_size_mb)
    say(f"source: mariadb on {state.source.address}:{state.source.db_port}, {added} seed rows added")
    if fresh_target:
        # The seed's preparation: the target's database is installed but stopped (the migration overwrites it).
        run_script(state.target, "db-stop")


def _up_rest(state: LabState, latency_ms: float | None, api_latency_ms: float | None, say: Say) -> None:
    # The front doors: HAProxy where clients reach each host, whether or not an app runs behind it yet.
    for host in (state.source, state.target):
        pid = haproxy.start(host)
        say(f"{host.name}: front door (HAProxy) on {host.address}:{host.app_port} (pid {pid})")

    # The demo app serves on the source, behind its front door.
    run_script(state.source, "app-start", timeout=60)
    demo = state.app != wordpress.APP_NAME
    if demo and app_pid(state, state.source) is None and _optional_module(binscripts.APP_MODULE) is not None:
        raise LabError(f"the app of the source did not start; see {state.source.log_dir / 'app.out'}")
    say(f"source: app on http://{state.source.address}:{state.source.app_listen_port} behind its front door")

    # The Cloudflare API double: it picks and records cf_port itself.
    cf = cf_module()
    if cf is None:
        say("cloudflare double: migrate_lab.cfapi is not installed; not started")
    else:
        cf.start(state)
        say(f"cloudflare double on {state.cf_address}:{state.cf_port}")
    state.save()

    # The distance between the orchestrator and the lab: the relay the plan points the orchestrator through.
    if latency_ms is not None:
        state.latency_ms = float(latency_ms)
    if api_latency_ms is not None:
        state.api_latency_ms = float(api_latency_ms)
    if state.latency_ms > 0 or state.api_latency_ms > 0:
        relay.ensure_addresses(state)
    state.save()
    relay_pid = relay.start(state)
    sshd.write_known_hosts(state)
    if relay_pid is not None:
        distance = f"hosts +{state.latency_ms:g} ms, API +{state.api_latency_ms:g} ms one way"
        say(f"latency relay (pid {relay_pid}): {distance}")

    (state.path / "hooks").mkdir(exist_ok=True)
    planfile.write_plan(state)
    say(f"plan: {state.plan_file}")


# --- down ----------------------------------------------------------------------------------------------------


def _stop_wordpress(host: HostState, problems: list[str]) -> list[Stopped]:
    """nginx and php-fpm of a WordPress lab host, stopped by its own app-stop script."""
    running = {name: pid for name, pid in wordpress.stack_pids(host).items() if pid is not None}
    if not running:
        return []
    try:
        run_script(host, "app-stop", timeout=60)
    except (LabError, OSError) as exc:
        problems.append(str(exc))
    return [Stopped(f"{host.name} {name}", pid) for name, pid in running.items()]


@dataclass
class Stopped:
    component: str
    pid: int


def _stop_db(host: HostState) -> tuple[Stopped, list[str]] | None:
    pg_pid = pglab.pid(host)
    if pg_pid is not None:
        try:
            pglab.stop(host)
        except (pglab.LabPgError, OSError, subprocess.SubprocessError) as exc:
            procs.stop_pid(pg_pid, timeout=120)  # SIGTERM is postgres's smart shutdown
            return Stopped(f"{host.name} postgresql", pg_pid), [str(exc)]
        return Stopped(f"{host.name} postgresql", pg_pid), []
    pid = db_pid(host)
    if pid is None:
        return None
    problems: list[str] = []
    try:
        run_script(host, "db-stop")
    except (LabError, OSError) as exc:
        problems.append(str(exc))
        procs.stop_pid(pid, timeout=120)  # SIGTERM is a clean shutdown too
    if procs.is_alive(pid):
        problems.append(f"mariadbd of {host.name} (pid {pid}) is still running")
    return Stopped(f"{host.name} mariadb", pid), problems


def tracker_pids(state: LabState) -> list[int]:
    """The change trackers (inotifywait) runs left watching this lab's trees: a run rolled back before its undo, or
    a step driven alone by a test. Found by their working directory, which a tracker keeps at its tree's root."""
    roots = [host.path.resolve() for host in (state.source, state.target)]
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "inotifywait":
                continue
            cwd = Path(os.readlink(entry / "cwd").removesuffix(" (deleted)"))
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if any(cwd == root or root in cwd.parents for root in roots):
            found.append(int(entry.name))
    return found


def down(lab_dir: Path, *, purge: bool = False, say: Say = _quiet) -> list[Stopped]:
    """Stop everything the lab started (load, apps, the Cloudflare double, both databases cleanly, both sshd),
    by their pid files; keep the files unless `purge`. Returns what it stopped."""
    lab_dir = lab_dir.expanduser().absolute()
    stopped: list[Stopped] = []
    if not (lab_dir / STATE_FILE).exists():
        if purge and lab_dir.exists():
            # Only a lab is ever deleted: a mistyped --dir must not wipe whatever folder it names.
            raise LabRefused(f"{lab_dir} is not a lab (no {STATE_FILE}): nothing deleted")
        return stopped
    state = lab_state_of(lab_dir)
    if state is None:
        # A copied lab.json names another lab's pid files: stopping or deleting anything would hit the wrong lab.
        raise LabRefused(f"{lab_dir / STATE_FILE} is unreadable or belongs to a lab made elsewhere: nothing done")
    if purge:
        reason = protected_dir(lab_dir)
        if reason is not None:
            raise LabRefused(f"{lab_dir} is {reason}: not deleted")
    problems: list[str] = []

    pid: int | None
    for pid in load_pids(state):
        procs.stop_pid(pid, timeout=15)
        stopped.append(Stopped("load", pid))
    for pid in tracker_pids(state):
        procs.stop_pid(pid, timeout=10)
        stopped.append(Stopped("change tracker", pid))
    for host in (state.source, state.target):
        pid = haproxy.stop(host)
        if pid is not None:
            stopped.append(Stopped(f"{host.name} haproxy", pid))
    for host in (state.source, state.target):
        pid = app_pid(state, host)
        if pid is not None:
            procs.stop_pid(pid, timeout=15)
            stopped.append(Stopped(f"{host.name} app", pid))
        if state.app == wordpress.APP_NAME:
            stopped += _stop_wordpress(host, problems)
    cf = cf_module()
    pid = cf_pid(state)
    if cf is not None:
        with contextlib.suppress(FileNotFoundError):
            cf.stop(state)
    if pid is not None:
        procs.stop_pid(pid, timeout=10)
        stopped.append(Stopped("cloudflare double", pid))
    pid = relay.stop(state)
    if pid is not None:
        stopped.append(Stopped("latency relay", pid))
    # Both databases shut down at once: a clean shutdown mostly waits on InnoDB flushing its own files.
    with ThreadPoolExecutor(max_workers=2) as pool:
        for result in pool.map(_stop_db, (state.source, state.target)):
            if result is not None:
                stopped.append(result[0])
                problems += result[1]
    for host in (state.source, state.target):
        pid = sshd.stop(host)
        if pid is not None:
            stopped.append(Stopped(f"{host.name} sshd", pid))
    if state.bastion_address:
        pid = bastion.stop(state)
        if pid is not None:
            stopped.append(Stopped("bastion sshd", pid))
    for item in stopped:
        say(f"stopped {item.component} (pid {item.pid})")
    if problems:
        raise LabError("; ".join(problems))
    if purge:
        wordpress.remove_host_configs(state)
        operator.remove(state)
        shutil.rmtree(lab_dir)
        say(f"removed {lab_dir}")
    return stopped


# --- status --------------------------------------------------------------------------------------------------


@dataclass
class Component:
    name: str
    pid: int | None
    address: str

    @property
    def running(self) -> bool:
        return self.pid is not None

    def line(self) -> str:
        state = f"running (pid {self.pid})" if self.pid is not None else "stopped"
        return f"{self.name:<20} {state:<22} {self.address}"


def components(state: LabState) -> list[Component]:
    """Every process the lab may run, with its pid when it runs."""
    found: list[Component] = []
    for host in (state.source, state.target):
        found += [
            Component(f"{host.name} sshd", sshd.running_pid(host), f"{host.address}:{host.ssh_port}"),
            Component(f"{host.name} {state.engine}", db_pid(host), f"{host.address}:{host.db_port}"),
            Component(f"{host.name} app", app_pid(state, host), f"{host.address}:{host.app_listen_port}"),
        ]
        if state.app == wordpress.APP_NAME:
            found = found[:-1] + [
                Component(f"{host.name} {name}", pid, f"{host.address}:{host.app_internal_port}")
                for name, pid in wordpress.stack_pids(host).items()
            ]
        if host.has_front_door:
            found.append(
                Component(f"{host.name} haproxy", haproxy.running_pid(host), f"{host.address}:{host.app_port}")
            )
    if state.bastion_address:
        found.append(
            Component("bastion sshd", bastion.running_pid(state), f"{state.bastion_address}:{state.source.ssh_port}")
        )
    found.append(Component("cloudflare double", cf_pid(state), f"{state.cf_address}:{state.cf_port}"))
    relay_pid = relay.running_pid(state)
    if relay_pid is not None or state.latency_ms > 0 or state.api_latency_ms > 0:
        distance = f"hosts +{state.latency_ms:g} ms, API +{state.api_latency_ms:g} ms one way"
        found.append(Component("latency relay", relay_pid, distance))
    for pid in load_pids(state):
        found.append(Component("load", pid, "-"))
    return found


def status(lab_dir: Path) -> list[str]:
    """One line per component: running/stopped and address:port (plus the source's fence)."""
    lab_dir = lab_dir.expanduser().absolute()
    if not (lab_dir / STATE_FILE).exists():
        return [f"no lab in {lab_dir} (run `lab up`)"]
    state = LabState.load(lab_dir)
    lines = [c.line() for c in components(state)]
    if relay.running_pid(state) is not None:
        lines += [f"{'relay ' + r.name:<20} {r.listen} → {r.upstream}" for r in relay.routes(state)]
    for host in (state.source, state.target):
        if host.fence_file.exists():
            lines.append(f"{host.name + ' fence':<20} on (writes refused)")
        if host.has_front_door and haproxy.running_pid(host) is not None:
            with contextlib.suppress(HaproxyError, ValueError):
                door = haproxy.front_door(host).state()
                if door.holding:
                    left = door.held_until - door.host_now
                    lines.append(
                        f"{host.name + ' front door':<20} holding {door.held} requests (at most {left:.0f} s more)"
                    )
                if (door.server.address, door.server.port) != (host.address, host.app_internal_port):
                    lines.append(
                        f"{host.name + ' front door':<20} forwards to {door.server.address}:{door.server.port}"
                    )
    return lines
