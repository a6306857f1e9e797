"""`migrate lab ...`: bring the local lab up and down, see it, load it and verify it.

Also runnable on its own: `python -m orchestrator.lab.cli up --dir .lab`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import threading
from pathlib import Path
from types import FrameType

import typer

from orchestrator.lab import hosts
from orchestrator.lab.setup import SetupError
from orchestrator.lab.state import STATE_FILE, LabState

lab_app = typer.Typer(help="The local lab: two hosts on loopback addresses, a Cloudflare double, a demo app.")

DirOption = typer.Option(Path(".lab"), "--dir", help="the lab directory")


def _state(lab_dir: Path) -> LabState:
    if not (lab_dir / STATE_FILE).exists():
        typer.echo(f"no lab in {lab_dir.absolute()} (run `lab up` first)", err=True)
        raise typer.Exit(2)
    return LabState.load(lab_dir.absolute())


@lab_app.command()
def up(
    lab_dir: Path = DirOption,
    db_size: int = typer.Option(5, "--db-size", min=1, help="MB of demo reviews in the source database"),
    uploads_size: int = typer.Option(4, "--uploads-size", min=1, help="MB of demo files in the source's uploads"),
    source_address: str = typer.Option(hosts.SOURCE_ADDRESS, "--source-address", help="loopback address"),
    target_address: str = typer.Option(hosts.TARGET_ADDRESS, "--target-address", help="loopback address"),
    random_ports: bool = typer.Option(
        False, "--random-ports", help="random free ports instead of the defaults (for labs side by side)"
    ),
) -> None:
    """Make the lab (or finish / repair it): sshd, MariaDB and the app per host, the Cloudflare double, plan.yaml.

    Addresses and ports are chosen when the lab is made and kept afterwards (lab.json)."""
    try:
        state = hosts.up(
            lab_dir,
            db_size_mb=db_size,
            uploads_size_mb=uploads_size,
            source_address=source_address,
            target_address=target_address,
            default_ports=not random_ports,
            say=typer.echo,
        )
    except (hosts.LabError, SetupError, OSError) as exc:
        typer.echo(f"lab up failed: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"lab is up in {state.dir}; secrets in {state.env_file}; plan in {state.plan_file}")


@lab_app.command()
def down(
    lab_dir: Path = DirOption,
    purge: bool = typer.Option(False, "--purge", help="also delete the lab directory"),
) -> None:
    """Stop everything the lab started (files are kept unless --purge)."""
    try:
        stopped = hosts.down(lab_dir, purge=purge, say=typer.echo)
    except hosts.LabError as exc:
        typer.echo(f"lab down: {exc}", err=True)
        raise typer.Exit(1) from None
    if not stopped:
        typer.echo("nothing was running")


@lab_app.command()
def status(lab_dir: Path = DirOption) -> None:
    """One line per component of the lab: running or stopped, and where."""
    for line in hosts.status(lab_dir):
        typer.echo(line)


@lab_app.command()
def load(
    lab_dir: Path = DirOption,
    duration: float = typer.Option(60.0, help="seconds"),
    rate: float = typer.Option(20.0, help="requests per second, all clients together"),
    clients: int = typer.Option(4, help="concurrent clients"),
    dns_ttl: float = typer.Option(5.0, "--dns-ttl", help="seconds a client caches its DNS answer"),
    upload_every: int = typer.Option(5, "--upload-every", help="an upload every N reviews; 0: none"),
    out: Path | None = typer.Option(None, help="directory of acks.jsonl and stats.json (default: <lab>/load)"),
) -> None:
    """Clients that find the service through DNS and write, upload and read while it moves."""
    state = _state(lab_dir)
    load_mod = importlib.import_module("orchestrator.lab.load")
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # A pid file in load/ lets `lab down` find and stop this run.
    state.load_dir.mkdir(parents=True, exist_ok=True)
    pid_file = state.load_dir / f"cli-{os.getpid()}{hosts.LOAD_PID_SUFFIX}"
    pid_file.write_text(f"{os.getpid()}\n")
    try:
        stats = load_mod.main_load(
            state,
            duration=duration,
            rate=rate,
            clients=clients,
            dns_ttl=dns_ttl,
            upload_every=upload_every,
            out=out,
            stop=stop,
        )
    finally:
        with contextlib.suppress(OSError):
            pid_file.unlink()
    typer.echo(load_mod.summary(stats))


@lab_app.command()
def verify(
    lab_dir: Path = DirOption,
    host: str = typer.Option("target", help="the host whose database and uploads are checked: source or target"),
    load_dir: Path | None = typer.Option(None, "--load-dir", help="where acks.jsonl is (default: <lab>/load)"),
    json_out: Path | None = typer.Option(None, "--json", help="report file (default: <load dir>/verify-HOST.json)"),
) -> None:
    """Check that every acknowledged write of the last load run is on the host, and that the uploads match."""
    if host not in ("source", "target"):
        typer.echo("--host must be source or target", err=True)
        raise typer.Exit(2)
    state = _state(lab_dir)
    verify_mod = importlib.import_module("orchestrator.lab.verify")
    report = verify_mod.main_verify(state, host=host, load_dir=load_dir, out=json_out)
    typer.echo(verify_mod.render(report))
    raise typer.Exit(report.exit_code)


if __name__ == "__main__":
    lab_app()
