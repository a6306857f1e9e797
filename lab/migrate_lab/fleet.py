"""A fleet lab: N small lab services side by side under one directory, and the fleet file that moves them.

Each service is a whole lab (lab/migrate_lab/hosts.py: its own source and target hosts with sshd, MariaDB, the app
behind HAProxy, a Cloudflare double) in `<dir>/svc-<i>`, on its own loopback addresses (127.0.<i>.2 → 127.0.<i>.3)
and random free ports. Every service's source reads from one named storage, `shared-nfs`, so the fleet's
`limits.per_storage` is what bounds how many pre-syncs run at once — the situation of a provider moving every
service off one NFS server.

    python -m migrate_lab.fleet up DIR [--services 4] [--max-parallel 2]
    migrate fleet apply DIR/fleet.yaml --yes
    python -m migrate_lab.fleet down DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ruamel.yaml import YAML

from migrate_lab import hosts, planfile
from migrate_lab.state import LabState

STORAGE = "shared-nfs"
FLEET_FILE = "fleet.yaml"


def service_dir(fleet_dir: Path, index: int) -> Path:
    return fleet_dir / f"svc-{index}"


def addresses(index: int) -> tuple[str, str]:
    return f"127.0.{index}.2", f"127.0.{index}.3"


def up(fleet_dir: Path, services: int = 4, *, max_parallel: int = 2, mode: str = "shutdown") -> list[LabState]:
    """Bring up `services` small labs (1 MB of database and uploads each) and write `<dir>/fleet.yaml`."""
    fleet_dir = fleet_dir.expanduser().absolute()
    fleet_dir.mkdir(parents=True, exist_ok=True)
    states = []
    for index in range(1, services + 1):
        source, target = addresses(index)
        state = hosts.up(
            service_dir(fleet_dir, index),
            db_size_mb=1,
            uploads_size_mb=1,
            source_address=source,
            target_address=target,
            default_ports=False,
        )
        planfile.write_plan(state, mode)
        small_fsync_sample(state.plan_file)
        states.append(state)
    write_fleet(fleet_dir, states, max_parallel=max_parallel)
    return states


def small_fsync_sample(plan_file: Path) -> None:
    """A shorter fsync sample in the storage preflight (the lab's plan samples up to 2 s per round and host): with
    several services on one small machine it is most of each plan's run, and the lab's hosts share one disk."""
    yaml = YAML()
    data = yaml.load(plan_file.read_text())
    data["preflight"] = {**dict(data.get("preflight") or {}), "fsync_writes": 20, "fsync_seconds": 0.3}
    with plan_file.open("w") as out:
        yaml.dump(data, out)


def fleet_text(fleet_dir: Path, states: list[LabState], *, max_parallel: int, name: str = "lab-fleet") -> str:
    lines = [f"name: {name}", "plans:"]
    for state in states:
        lines += [
            f"  - name: {state.path.name}",
            f"    plan: {state.plan_file.relative_to(fleet_dir)}",
            f"    env_file: {state.env_file.relative_to(fleet_dir)}",
            f"    storage: {STORAGE}",
        ]
    canary = states[0].path.name
    rest = ", ".join(s.path.name for s in states[1:])
    lines += [
        "waves:",
        f"  - [{canary}]  # the canary, alone",
        *([f"  - [{rest}]"] if rest else []),
        f"max_parallel: {max_parallel}",
        "limits:",
        "  per_source_host: 1",
        "  per_storage:",
        f"    {STORAGE}: {max_parallel}",
        "stop:",
        "  on_rollback: true",
        "  on_needs_attention: true",
        "confirm: once",
    ]
    return "\n".join(lines) + "\n"


def write_fleet(fleet_dir: Path, states: list[LabState], *, max_parallel: int, name: str = "lab-fleet") -> Path:
    path = fleet_dir / FLEET_FILE
    path.write_text(fleet_text(fleet_dir, states, max_parallel=max_parallel, name=name))
    return path


def down(fleet_dir: Path) -> None:
    """Stop every service's lab (files kept)."""
    for lab_dir in sorted(fleet_dir.glob("svc-*")):
        if hosts.lab_state_of(lab_dir) is not None:
            hosts.down(lab_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m migrate_lab.fleet", description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("dir", type=Path)
    parser.add_argument("--services", type=int, default=4)
    parser.add_argument("--max-parallel", type=int, default=2)
    args = parser.parse_args(argv)
    if args.action == "down":
        down(args.dir)
        return 0
    if not 1 <= args.services <= 50:
        print("--services: 1 to 50", file=sys.stderr)
        return 2
    up(args.dir, args.services, max_parallel=args.max_parallel)
    print(args.dir.absolute() / FLEET_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
