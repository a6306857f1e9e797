"""`make demo`: a whole migration on the local lab, under live traffic, then the verify report.

Brings the lab up afresh (so the demo can be run again and again), starts clients that find the service through DNS,
runs `migrate apply` on the lab's plan, lets stale DNS caches expire, stops the clients and proves nothing
acknowledged was lost. The lab stays up for inspection.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from ruamel.yaml import YAML

from migrate_lab import hosts, planfile
from migrate_lab.state import LabState


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def migrate(*args: str) -> int:
    return subprocess.call([sys.executable, "-m", "orchestrator.cli.commands", *args])


def journal_options(state: LabState) -> list[str]:
    """The migrate journal gives the figures inside the window. (The clients wait longer than the plan's
    write-block budget by default: the front door holds requests, it does not refuse them.)"""
    name = YAML(typ="safe").load(state.plan_file.read_text()).get("name", planfile.PLAN_NAME)
    journal = state.path / ".migrate" / str(name) / "journal.jsonl"
    return ["--journal", str(journal)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path(".lab"), help="the lab directory (default: .lab)")
    parser.add_argument("--db-size", type=int, default=20, help="MB of demo data in the source database")
    parser.add_argument("--rate", type=float, default=20.0, help="client requests per second")
    parser.add_argument("--dns-ttl", type=float, default=5.0, help="seconds each client caches the DNS answer")
    parser.add_argument(
        "--app", choices=hosts.APPS, default="demo", help="what the lab serves: demo (Python) or wordpress"
    )
    parser.add_argument(
        "--engine",
        choices=hosts.ENGINES,
        default=None,
        help="the database of both hosts: mariadb (default) or postgresql",
    )
    args = parser.parse_args(argv)
    lab_dir: Path = args.dir.resolve()

    say(f"bringing up a fresh lab in {lab_dir}")
    try:
        hosts.down(lab_dir, purge=True)
        hosts.up(lab_dir, db_size_mb=args.db_size, app=args.app, engine=args.engine,
                 say=lambda line: print(f"   {line}", flush=True))  # fmt: skip
    except hosts.LabRefused as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    except hosts.LabError as exc:
        print(f"demo: the lab did not come up: {exc}", file=sys.stderr)
        return 1
    state = LabState.load(lab_dir)
    plan, env_file = str(state.plan_file), str(state.env_file)

    say("the plan, rehearsed: `migrate apply --dry-run`")
    migrate("apply", plan, "--dry-run", "--env-file", env_file)

    what = "post, comment and upload media through WordPress's REST API" if args.app == "wordpress" else "post reviews"
    say(f"starting live traffic: clients resolve DNS (TTL {args.dns_ttl:g} s), {what}, read back")
    load = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "migrate_lab.load",
            "--lab",
            str(lab_dir),
            "--duration",
            "600",
            "--rate",
            str(args.rate),
            "--dns-ttl",
            str(args.dns_ttl),
            *journal_options(state),
        ],
    )
    try:
        time.sleep(3)
        say("migrating: `migrate apply --yes`")
        code = migrate("apply", plan, "--yes", "--env-file", env_file)
        say(f"migrate exited {code}; letting stale DNS caches expire")
        time.sleep(args.dns_ttl + 3)
    finally:
        load.send_signal(signal.SIGTERM)
        load.wait(timeout=60)

    say("verify: every acknowledged write and upload must be on the target")
    # Besides lost writes: failed requests (reads, writes, by cause) and latency p50 / p99 / max, run and window.
    clients_file = state.load_dir / "verify-target.json"
    verdict = subprocess.call(
        [
            sys.executable,
            "-m",
            "migrate_lab.verify",
            "--lab",
            str(lab_dir),
            "--json",
            str(clients_file),
            *journal_options(state),
        ]
    )
    migrate("status", plan)
    say(f"the lab is still up: `migrate lab status --dir {lab_dir}`; stop it with `migrate lab down --dir {lab_dir}`")
    say_report(plan, clients_file)
    return code or verdict


def say_report(plan: str, clients_file: Path) -> None:
    """The last words of the demo: the run's page (with what the clients saw) and the clients' figures."""
    with_clients = ["--clients", str(clients_file)] if clients_file.exists() else []
    page = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.commands", "report", plan, *with_clients],
        capture_output=True,
        text=True,
    )
    if page.returncode != 0:
        say(f"no report page: {page.stderr.strip()}")
        return
    say(f"the run's report (open it in a browser): {page.stdout.strip()}")
    try:
        clients = json.loads(clients_file.read_text())
    except (OSError, ValueError):
        return
    window = clients.get("window") or {}
    span = round(window["to"] - window["from"], 2) if "to" in window and "from" in window else None
    figures = [
        f"window (writes blocked → DNS flipped) {_figure(span, ' s')}",
        f"longest write stall {_figure(clients.get('longest_write_stall_s'), ' s')}",
        f"failed writes {_figure(clients.get('write_attempts_failed'))}",
        f"failed reads {_figure(clients.get('reads_failed'))}",
        f"acknowledged writes lost {_figure(clients.get('acknowledged_lost'))}",
    ]
    print("   clients: " + ", ".join(figures), flush=True)


def _figure(value: object, unit: str = "") -> str:
    return "unknown" if value is None else f"{value}{unit}"


if __name__ == "__main__":
    sys.exit(main())
