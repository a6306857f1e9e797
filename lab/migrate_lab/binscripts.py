"""The scripts in <host>/bin/: what the lab's plan runs on a host the way a real plan runs `systemctl`.

Every script is bash with absolute paths, idempotent (starting what runs, or stopping what is stopped, succeeds)
and returns only when its effect is in place.
"""

from __future__ import annotations

import sys
from pathlib import Path

from migrate_lab import mariadb
from migrate_lab import postgres as pglab
from migrate_lab.mariadb import q
from migrate_lab.state import HostState, LabState

APP_MODULE = "migrate_lab.app"
SCRIPT_NAMES = ("db-start", "db-stop", "app-start", "app-stop", "fence-on", "fence-off")


def app_marker(state: LabState, host: HostState) -> str:
    """What the app's command line contains: tells our app from an unrelated process that reused its pid."""
    return f"{APP_MODULE} --lab {state.dir} --host {host.name}"


def _app_running_sh(state: LabState, host: HostState) -> str:
    return f"""running() {{
  local pid
  pid=$(cat {q(host.app_pid_file)} 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- {q(app_marker(state, host))} || return 1
  echo "$pid"
}}
"""


def app_start_script(state: LabState, host: HostState, python: str) -> str:
    url = f"http://{host.address}:{host.app_listen_port}/healthz"
    out_log = host.log_dir / "app.out"
    # Any HTTP answer means the server is up (a 503 only says its database is not, which health checks judge).
    probe = (
        "import sys, urllib.request, urllib.error\n"
        "try:\n"
        f"    urllib.request.urlopen({url!r}, timeout=1)\n"
        "except urllib.error.HTTPError:\n"
        "    pass\n"
        "except Exception:\n"
        "    sys.exit(1)\n"
    )
    return f"""#!/bin/bash
# Starts the demo app of {host.name} unless it runs; returns once it answers on {host.address}:{host.app_listen_port}.
set -uo pipefail
PY={q(python)}
{_app_running_sh(state, host)}
mkdir -p {q(host.run_dir)} {q(host.log_dir)} {q(host.app_dir)}
if running >/dev/null; then exit 0; fi
if ! "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("{APP_MODULE}") is None)'; then
  echo "app-start: {APP_MODULE} is not installed; no app started on {host.name}" | tee -a {q(out_log)} >&2
  exit 0
fi
rm -f {q(host.app_pid_file)}
cd {q(host.path)}
setsid nohup "$PY" -m {APP_MODULE} --lab {q(state.dir)} --host {host.name} >>{q(out_log)} 2>&1 </dev/null &
pid=$!
echo "$pid" > {q(host.app_pid_file)}
for _ in $(seq 1 300); do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "app-start: the app of {host.name} exited; last lines of {out_log}:" >&2
    tail -n 15 {q(out_log)} >&2
    exit 1
  fi
  if "$PY" -c {q(probe)}; then exit 0; fi
  sleep 0.1
done
echo "app-start: the app of {host.name} did not answer {url} within 30 s; see {out_log}" >&2
exit 1
"""


def app_stop_script(state: LabState, host: HostState) -> str:
    return f"""#!/bin/bash
# Stops the demo app of {host.name} (SIGTERM: it finishes the requests in flight) and returns once it is gone.
set -uo pipefail
{_app_running_sh(state, host)}
pid=$(running) || {{ rm -f {q(host.app_pid_file)}; exit 0; }}
kill -TERM "$pid" 2>/dev/null || true
for _ in $(seq 1 150); do
  kill -0 "$pid" 2>/dev/null || {{ rm -f {q(host.app_pid_file)}; exit 0; }}
  sleep 0.1
done
kill -KILL "$pid" 2>/dev/null || true
rm -f {q(host.app_pid_file)}
"""


def fence_on_script(host: HostState) -> str:
    return f"""#!/bin/bash
# Maintenance mode of {host.name}: while this file exists its app answers every write with 503.
set -euo pipefail
mkdir -p {q(host.app_dir)}
touch {q(host.fence_file)}
"""


def fence_off_script(host: HostState) -> str:
    return f"""#!/bin/bash
# Lifts the maintenance mode of {host.name}.
set -euo pipefail
rm -f {q(host.fence_file)}
"""


def write_scripts(
    state: LabState, host: HostState, python: str | None = None, *, datadir: Path | None = None
) -> dict[str, Path]:
    """(Re)write the host's bin/ scripts from the current state; returns name → path. `datadir`: the path the
    database's scripts give mariadbd (default the host's datadir)."""
    python = python or sys.executable
    if state.engine == pglab.ENGINE:
        db_scripts = {"db-start": pglab.db_start_script(host), "db-stop": pglab.db_stop_script(host)}
    else:
        db_scripts = {
            "db-start": mariadb.db_start_script(host, datadir),
            "db-stop": mariadb.db_stop_script(host, datadir),
        }
    texts = {
        **db_scripts,
        "app-start": app_start_script(state, host, python),
        "app-stop": app_stop_script(state, host),
        "fence-on": fence_on_script(host),
        "fence-off": fence_off_script(host),
    }
    host.bin_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name, text in texts.items():
        path = host.bin_dir / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(path)
        paths[name] = path
    return paths
