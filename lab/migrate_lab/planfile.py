"""The lab's migration plan, <dir>/plan.yaml: the lab's two hosts as a user would describe two real servers.

Written as commented text (it is also the example users read first), then loaded back and validated against the
plan model, so a plan `lab up` writes can never be one `migrate apply` rejects.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from migrate_lab import bastion, haproxy, operator, wordpress
from migrate_lab import postgres as pglab
from migrate_lab.state import HostState, LabState
from orchestrator.plan.model import Plan

PLAN_NAME = "course-review-lab"


def s(value: object) -> str:
    """A YAML scalar: JSON strings are valid YAML double-quoted strings, whatever the path holds."""
    return json.dumps(str(value))


def _host(host: HostState, state: LabState) -> str:
    address = state.orchestrator_address(host)
    if address == host.address:
        where = f"  address: {s(host.address)}"
    else:
        # With distance the orchestrator connects through the latency relay; the records point at the host itself.
        where = f"  address: {s(address)}   # through the lab's latency relay\n  public_address: {s(host.address)}"
    return f"""{where}
  ssh_port: {host.ssh_port}
  user: root
  key: {s(state.ssh_key)}
  known_hosts: {s(state.known_hosts)}   # host keys are always verified"""


def _hop_options(state: LabState, origin: HostState, destination: HostState) -> str:
    """The ssh options of the hop between the hosts: from the origin's own address, and straight to the
    destination even when the orchestrator reaches it through the relay (the hop between two servers has no
    orchestrator's distance)."""
    options = ["-o", f"BindAddress={origin.address}"]
    if state.orchestrator_address(destination) != destination.address:
        options += ["-o", f"HostName={destination.address}"]
    return "[" + ", ".join(s(o) for o in options) + "]"


def _endpoint(host: HostState) -> str:
    return f"""    socket: {s(host.db_socket)}
    datadir: {s(host.datadir)}
    start: {s(host.bin_dir / "db-start")}
    stop: {s(host.bin_dir / "db-stop")}"""


def _pg_endpoint(host: HostState) -> str:
    return f"""    host: {s(host.address)}
    port: {host.db_port}
    datadir: {s(pglab.data_dir(host))}
    start: {s(host.bin_dir / "db-start")}
    stop: {s(host.bin_dir / "db-stop")}"""


def _database(state: LabState) -> str:
    src, tgt = state.source, state.target
    if state.engine == pglab.ENGINE:
        return f"""\
# PostgreSQL: the data directory is pre-synced in rounds while the source runs, then the app's roles are
# fenced (NOLOGIN, their sessions ended), a CHECKPOINT, a clean shutdown of the source and a final pass. The copy
# carries the fence: the target's roles log in again when it starts. `schemas` names the database to verify.
database:
  engine: postgresql
  user: {s(state.migrate_user)}
  password: {{env: {state.db_password_env}}}
  schemas: [{s(state.db_name)}]
  source:
{_pg_endpoint(src)}
  target:
{_pg_endpoint(tgt)}"""
    return f"""\
# MariaDB: the datadir is pre-synced in rounds while the source runs, then FLUSH TABLES WITH READ LOCK, a clean
# shutdown of the source and a final pass. The start/stop commands are the lab's scripts (systemctl on a real host).
database:
  engine: mariadb
  user: {s(state.migrate_user)}
  password: {{env: {state.db_password_env}}}
  schemas: [{s(state.db_name)}]
  source:
{_endpoint(src)}
  target:
{_endpoint(tgt)}"""


def _replication(state: LabState) -> str:
    src, tgt = state.source, state.target
    if state.engine == pglab.ENGINE:
        return f"""\
# The replicate mode. The target is seeded with pg_basebackup through an ssh -R forward (WAL streamed, a slot on the
# source), then runs as a streaming standby through an SSH tunnel (ssh -R; ssh -L for the reverse path): nothing
# of it crosses the network outside SSH. Inside the window the source's app roles are fenced, its server stopped
# cleanly, the standby replays its last record and is promoted with proof. The password is a reference; the
# standby reads it from a 0600 file beside its data directory.
replication:
  user: {s(state.repl_user)}
  password: {{env: {state.repl_password_env}}}
  source:   # the databases' TCP addresses as seen from their own hosts: the tunnels' far ends
    host: {s(src.address)}
    port: {src.db_port}
  target:
    host: {s(tgt.address)}
    port: {tgt.db_port}
  max_lag: 1
  lag_wait: 120
  compare: true
  chunk_rows: 2000
  keep_reverse: 0
"""
    return f"""\
# The replicate mode. Replication runs through an SSH tunnel the source opens over its host-key-verified hop to the
# target (ssh -R; ssh -L for the reverse path after the flip): nothing of it crosses the network outside SSH. The
# password is a reference, like every secret. Defaults: max_lag 1 s (0-3600), lag_wait 600 s (0-86400), no seed
# throttle (1-100000 read operations per second), seed_nice true, compare true, chunk_rows 2000 (10-10000000),
# compare_pause 0 (0-100), keep_reverse 0 s (0-86400).
replication:
  user: {s(state.repl_user)}
  password: {{env: {state.repl_password_env}}}
  source:   # the databases' TCP addresses as seen from their own hosts: the tunnels' far ends
    host: {s(src.address)}
    port: {src.db_port}
  target:
    host: {s(tgt.address)}
    port: {tgt.db_port}
  max_lag: 1
  lag_wait: 120
  compare: true
  chunk_rows: 2000
  app_users: [{s(state.app_user)}]   # must not hold READ_ONLY ADMIN or SUPER: read_only must stop them
  keep_reverse: 0
"""


def _front_door(host: HostState, other: HostState) -> str:
    return f"""    kind: haproxy
    admin_socket: {s(host.haproxy_socket)}
    frontend: {haproxy.FRONTEND}
    backend: {haproxy.BACKEND}
    server: {haproxy.SERVER}
    hold_map: {s(haproxy.map_file(host))}
    app: {{address: {s(host.address)}, port: {host.app_internal_port}}}
    forward_to: {{address: {s(other.address)}, port: {other.app_port}}}
    drain_timeout: 5
    hold: writes"""


def _proxy(src: HostState, tgt: HostState) -> str:
    if not (src.has_front_door and tgt.has_front_door):
        return ""  # a lab made before the front door existed: the fence answers clients during the window
    return f"""# The front doors: HAProxy in front of each host's app. While writes are blocked the source's holds
# requests (they wait, none is refused); at the commit point it forwards them, and every client with a stale DNS
# answer, to the target's front door. The target's holds the clients that follow the new records before its
# fence is lifted.
# A hold is a deadline on HAProxy's clock (the budget + a margin): if migrate dies, it ends by itself.
# hold: writes — in the replicate mode the source database serves reads through the window (it is only read-only),
# and the lab app's reads never write: GET, HEAD and OPTIONS go on to the source, only the others are held.
proxy:
  source:
{_front_door(src, tgt)}
  target:
{_front_door(tgt, src)}

"""


MODES = ("auto", "replicate", "shutdown")


def _engine_title(state: LabState) -> str:
    return "PostgreSQL" if state.engine == pglab.ENGINE else "MariaDB"


def _exists_query(state: LabState) -> str:
    if state.engine == pglab.ENGINE:  # connected to the database itself; EXISTS is a boolean there
        return "SELECT EXISTS(SELECT 1 FROM reviews)::int"
    return f"SELECT EXISTS(SELECT 1 FROM {state.db_name}.reviews)"


def plan_text(state: LabState, mode: str = "auto") -> str:
    src, tgt = state.source, state.target
    records = "\n".join(f"    - {s(r)}" for r in state.records)
    return f"""# The lab's migration: "course reviews" moves from the source ({src.address}) to the target
# ({tgt.address}).
# Written by `migrate lab up`; every value comes from {state.path / "lab.json"}. Secrets are not here: they are
# named by environment variable (see {state.env_file}: `set -a; . lab.env; set +a`).
{distance_comment(state)}name: {PLAN_NAME}
description: "course reviews: uploads + {_engine_title(state)} + DNS, lab source to lab target"

# Both servers are reached over SSH as root with the lab's key.
source:
{_host(src, state)}
target:
{_host(tgt, state)}

# Uploaded files: pre-synced live, then the delta once writes are blocked.
files:
  - name: uploads
    source: {s(src.uploads)}
    target: {s(tgt.uploads)}

{_database(state)}

services:
  # Started on the target once its database runs.
  target:
    - name: app
      start: {s(tgt.bin_dir / "app-start")}
      stop: {s(tgt.bin_dir / "app-stop")}
  # The live service on the source.
  source:
    - name: app
      start: {s(src.bin_dir / "app-start")}
      stop: {s(src.bin_dir / "app-stop")}
  # Maintenance mode: while fenced the source app answers writes with 503.
  fence:
    enable: {s(src.bin_dir / "fence-on")}
    disable: {s(src.bin_dir / "fence-off")}
  # The same for the target: fenced before its app starts (health checks are reads), lifted once every DNS record
  # points at it, so a flip failing half-way rolls back without losing a write. Also what `--reverse` fences.
  target_fence:
    enable: {s(tgt.bin_dir / "fence-on")}
    disable: {s(tgt.bin_dir / "fence-off")}

# What must be true of the target before DNS moves. Inside the window a check must cost O(1), not O(data): the SQL
# check asks whether one review exists (EXISTS stops at the first row; COUNT(*) would read them all). `when` says
# where a check runs in the replicate mode, whose target serves (fenced) before the window: both (default: before
# the window and again inside it), before (only before: a costly check), window (only inside). The shutdown mode
# runs every check inside the window (its target starts there).
health:
  checks:
    - kind: http
      name: app
      url: {s(f"http://{state.orchestrator_address(tgt)}:{tgt.app_port}/healthz")}
      expect_status: 200
      expect_body: ok
    - kind: sql
      name: reviews present
      query: {s(_exists_query(state))}
      expect: "1"
  attempts: 20
  interval: 0.5

# The commit point: the records move to the target (the lab's Cloudflare API double answers at base_url).
dns:
  provider: cloudflare
  api_token: {{env: {state.token_env}}}
  zone: {s(state.zone)}
  records:
{records}
  type: A
  content: {s(tgt.address)}
  base_url: {s(state.orchestrator_cf_base_url)}

# How the database moves. 'auto' picks 'replicate' when both servers allow it (binlog on, ROW, GTID strict,
# log_slave_updates, distinct server ids, mariadb-backup installed: the lab's do), else 'shutdown'; preflight says
# which and why. 'replicate': seed the target with a hot backup, keep it a GTID replica, switch in well under a
# second. 'shutdown': stop the source database under the lock and copy the datadir's delta.
cutover:
  lock_wait_timeout: 3
  max_write_block: 60
  mode: {mode}

{_replication(state)}
{_proxy(src, tgt)}
# rsync runs on the source and pushes to the target; the source ssh's to the target from its own address.
transfer:
  source_to_target_key: {s(state.ssh_key)}
  source_to_target_known_hosts: {s(state.known_hosts)}
  source_to_target_options: {_hop_options(state, src, tgt)}

hooks:
  dir: {s(state.path / "hooks")}

# `migrate apply --reverse` moves the service back after the flip, carrying the target's writes: the same steps with
# source and target swapped. Only what cannot be derived is written here: how the target reaches the source. The
# health checks are derived (the forward checks, aimed at the source's address).
reverse:
  transfer:
    source_to_target_key: {s(state.ssh_key)}
    source_to_target_known_hosts: {s(state.known_hosts)}
    source_to_target_options: {_hop_options(state, tgt, src)}
"""


def distance_comment(state: LabState) -> str:
    if not (state.latency_ms or state.api_latency_ms):
        return ""
    return (
        f"# Distance (`lab up --latency {state.latency_ms:g} --api-latency {state.api_latency_ms:g}`): the "
        "orchestrator's own connections\n# (SSH to each host, the health check, the Cloudflare API) go through the "
        "lab's latency relay, which delays\n# each byte by that many milliseconds each way; the hosts reach each "
        "other directly.\n"
    )


def current_mode(state: LabState) -> str:
    """The cut-over mode the lab's plan file has now ('auto' when there is none or it does not read)."""
    try:
        data = YAML(typ="safe").load(state.plan_file.read_text())
        mode = str(data["cutover"]["mode"])
    except (OSError, KeyError, TypeError, ValueError, YAMLError):
        return "auto"
    return mode if mode in MODES else "auto"


def validate_text(text: str) -> Plan:
    data = YAML(typ="safe").load(io.StringIO(text))
    return Plan.model_validate(data)


def write_plan(state: LabState, mode: str = "auto") -> Path:
    """Write <dir>/plan.yaml (and the empty hooks dir it names); raises if the plan would not validate."""
    text = plan_text(state, mode)
    if state.app == wordpress.APP_NAME:
        text = wordpress.plan_text(text, state)
    if state.bastion_address:
        text = bastion.plan_text(text, state)
    if state.operator:
        text = operator.plan_text(text, state)
    validate_text(text)
    (state.path / "hooks").mkdir(parents=True, exist_ok=True)
    tmp = state.plan_file.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(state.plan_file)
    return state.plan_file
