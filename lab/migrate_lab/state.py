"""The lab's layout and state: where everything of the lab lives, shared by `lab up`, the app, load and verify.

Everything is under one directory (default ./.lab). `lab up` writes `lab.json` (this structure) and `lab.env`
(its secrets); every other part of the lab reads them back with `LabState.load`.

    <dir>/lab.json  lab.env  plan.yaml  known_hosts  id_ed25519[.pub]
    <dir>/<host>/   sshd/  mysql/data  run/ (sockets, pid files)  uploads/  app/  log/  bin/ (start/stop scripts)
                    haproxy/ (the front door's config, its hold map and Lua)
    <dir>/cf/       the Cloudflare API double's state, pid and log
    <dir>/relay/    the latency relay's routes, pid and log (only with `lab up --latency/--api-latency`)
    <dir>/load/     the load generator's journal of acknowledged writes and its stats
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

STATE_FILE = "lab.json"
ENV_FILE = "lab.env"
# The modules of the lab's apps other than the demo app, by `app`: their load clients (`clients(state)` → the client
# class and its options) and their verify (`main_verify`, `render`). Looked up by name, as steps are: the generic
# load and verify build on nothing of theirs, and they build on the generic ones.
APP_LOAD_MODULES = {"wordpress": "migrate_lab.wp_load"}
APP_VERIFY_MODULES = {"wordpress": "migrate_lab.wp_verify"}


@dataclass
class HostState:
    name: str  # "source" or "target"
    address: str  # loopback address, e.g. 127.0.0.2
    ssh_port: int
    db_port: int
    app_port: int  # the same on both hosts: clients reach http://<address from DNS>:<app_port>
    server_id: int
    root: str  # absolute <dir>/<name>
    # Where the app itself listens, behind the host's front door (HAProxy on app_port); 0 in labs made before the
    # front door existed: the app listens on app_port and no HAProxy runs.
    app_internal_port: int = 0
    # Where the orchestrator reaches this host when the lab has distance (`lab up --latency`): a loopback address
    # of its own where the latency relay listens on the host's SSH and HTTP ports. '' until a latency is set.
    far_address: str = ""
    # The group whose members may use the front door's admin socket (the lab's operator), 0: root only.
    admin_gid: int = 0

    @property
    def app_listen_port(self) -> int:
        return self.app_internal_port or self.app_port

    @property
    def has_front_door(self) -> bool:
        return self.app_internal_port > 0

    @property
    def path(self) -> Path:
        return Path(self.root)

    @property
    def datadir(self) -> Path:
        return self.path / "mysql" / "data"

    @property
    def run_dir(self) -> Path:
        return self.path / "run"

    @property
    def db_tmp_dir(self) -> Path:
        """The server's own tmpdir: a starting mariadbd deletes every `#sql*` file in its tmpdir, so two servers
        (two labs side by side) sharing /tmp would delete each other's temporary tables."""
        return self.path / "mysql" / "tmp"

    @property
    def db_socket(self) -> Path:
        return self.run_dir / "mysqld.sock"

    @property
    def db_pid_file(self) -> Path:
        return self.run_dir / "mysqld.pid"

    @property
    def sshd_dir(self) -> Path:
        return self.path / "sshd"

    @property
    def home(self) -> Path:
        """The SSH user's home on this host ($HOME of its sessions): each lab host has its own, as two servers
        would, instead of this machine's account home and its shell startup files."""
        return self.path / "home"

    @property
    def sshd_pid_file(self) -> Path:
        return self.run_dir / "sshd.pid"

    @property
    def uploads(self) -> Path:
        return self.path / "uploads"

    @property
    def app_dir(self) -> Path:
        return self.path / "app"

    @property
    def app_pid_file(self) -> Path:
        return self.run_dir / "app.pid"

    @property
    def haproxy_dir(self) -> Path:
        return self.path / "haproxy"

    @property
    def haproxy_socket(self) -> Path:
        """The front door's admin socket (HAProxy's runtime API)."""
        return self.run_dir / "haproxy.sock"

    @property
    def haproxy_pid_file(self) -> Path:
        return self.run_dir / "haproxy.pid"

    @property
    def fence_file(self) -> Path:
        """While this file exists the app refuses writes with 503 (the source's maintenance mode)."""
        return self.app_dir / "FENCED"

    @property
    def log_dir(self) -> Path:
        return self.path / "log"

    @property
    def access_log(self) -> Path:
        return self.log_dir / "access.log"

    @property
    def bin_dir(self) -> Path:
        return self.path / "bin"


@dataclass
class LabState:
    dir: str
    source: HostState
    target: HostState
    cf_address: str = "127.0.0.1"
    cf_port: int = 0
    zone: str = "course-review.test"
    records: list[str] = field(default_factory=lambda: ["course-review.test", "www.course-review.test"])
    record_ttl: int = 60
    db_name: str = "coursereview"
    app_user: str = "app"
    migrate_user: str = "migrate"
    repl_user: str = "repl"
    # Names of the variables in lab.env; the values never go into lab.json.
    token_env: str = "CLOUDFLARE_API_TOKEN"
    db_password_env: str = "MIGRATE_DB_PASSWORD"
    app_password_env: str = "LAB_APP_DB_PASSWORD"
    repl_password_env: str = "MIGRATE_REPL_PASSWORD"
    # The distance between the orchestrator and the lab (one way, milliseconds; 0: direct): to the hosts, and to
    # the Cloudflare double. The latency relay adds it (lab/migrate_lab/relay.py); the plan points through it.
    latency_ms: float = 0.0
    api_latency_ms: float = 0.0
    relay_api_port: int = 0  # where the relay takes the orchestrator's API calls to the double

    @property
    def orchestrator_cf_base_url(self) -> str:
        """The Cloudflare double's API as the lab's plan gives it to the orchestrator: through the relay when the
        API has distance. Lab tooling (the load's clients, the bench's resets) uses `cf_base_url`, direct."""
        if self.api_latency_ms > 0 and self.relay_api_port:
            return f"http://{self.cf_address}:{self.relay_api_port}/client/v4"
        return self.cf_base_url

    def orchestrator_address(self, host: HostState) -> str:
        """Where the lab's plan tells the orchestrator to reach `host`: through the relay when hosts have distance."""
        return host.far_address if self.latency_ms > 0 and host.far_address else host.address

    # What serves on the hosts: "demo" (the lab's Python app) or "wordpress" (nginx + php-fpm + WordPress).
    app: str = "demo"
    # The database engine of both hosts: "mariadb" or "postgresql" (lab/migrate_lab/postgres.py); db_port is its.
    engine: str = "mariadb"
    # The bastion's address when `lab up --bastion` made one (the plan's hosts are reached through it), else "".
    bastion_address: str = ""
    # The unprivileged account the plan logs in as (`lab up --operator`, root through sudo), else "" (root).
    operator: str = ""

    @property
    def path(self) -> Path:
        return Path(self.dir)

    @property
    def cf_base_url(self) -> str:
        return f"http://{self.cf_address}:{self.cf_port}/client/v4"

    @property
    def cf_dir(self) -> Path:
        return self.path / "cf"

    @property
    def load_dir(self) -> Path:
        return self.path / "load"

    @property
    def plan_file(self) -> Path:
        return self.path / "plan.yaml"

    @property
    def env_file(self) -> Path:
        return self.path / ENV_FILE

    @property
    def known_hosts(self) -> Path:
        return self.path / "known_hosts"

    @property
    def ssh_key(self) -> Path:
        return self.path / "id_ed25519"

    def host(self, name: str) -> HostState:
        return self.source if name == "source" else self.target

    def secrets(self) -> dict[str, str]:
        """The lab's secrets, read from lab.env (KEY=VALUE lines)."""
        values: dict[str, str] = {}
        for line in self.env_file.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                values[key.removeprefix("export ").strip()] = value.strip().strip("'\"")
        return values

    def save(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, self.path / STATE_FILE)

    @classmethod
    def load(cls, lab_dir: str | Path) -> LabState:
        raw = json.loads((Path(lab_dir) / STATE_FILE).read_text())
        raw["source"] = HostState(**raw["source"])
        raw["target"] = HostState(**raw["target"])
        return cls(**raw)
