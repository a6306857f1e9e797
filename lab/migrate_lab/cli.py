"""`migrate lab ...`: bring the local lab up and down, see it, load it and verify it.

Also runnable on its own: `python -m migrate_lab.cli up --dir .lab`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import NoReturn

import pymysql
import typer

from migrate_lab import hosts
from migrate_lab.state import APP_VERIFY_MODULES, STATE_FILE, LabState

# The proof of `lab verify` for each app a lab can run (the demo app's is the default).

lab_app = typer.Typer(help="The local lab: two hosts on loopback addresses, a Cloudflare double, a demo app.")

DirOption = typer.Option(Path(".lab"), "--dir", help="the lab directory")

# Exit codes: a refused request changed nothing; a failure of the lab itself names the part and its log.
EXIT_REFUSED = 2
EXIT_LAB_FAILED = 1
# What a part of the lab raises when it fails: its own errors (all RuntimeError), the OS, a script, the database.
LAB_FAILURES = (RuntimeError, OSError, subprocess.SubprocessError, pymysql.err.MySQLError)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _refuse(message: str) -> NoReturn:
    typer.echo(_one_line(message), err=True)
    raise typer.Exit(EXIT_REFUSED)


@contextlib.contextmanager
def _one_line_errors(command: str) -> Iterator[None]:
    """Every error of a lab command as one line on stderr: exit 2 when refused, 1 when the lab failed."""
    try:
        yield
    except (hosts.LabRefused, ValueError) as exc:
        _refuse(f"lab {command}: {exc}")
    except LAB_FAILURES as exc:
        typer.echo(_one_line(f"lab {command} failed: {exc}"), err=True)
        raise typer.Exit(EXIT_LAB_FAILED) from None


def _state(lab_dir: Path) -> LabState:
    lab_dir = lab_dir.expanduser().absolute()
    if not (lab_dir / STATE_FILE).exists():
        _refuse(f"no lab in {lab_dir} (run `lab up` first)")
    state = hosts.lab_state_of(lab_dir)
    if state is None:
        _refuse(f"{lab_dir / STATE_FILE} is unreadable or belongs to a lab made elsewhere")
    return state


@lab_app.command()
def up(
    lab_dir: Path = DirOption,
    db_size: int = typer.Option(5, "--db-size", help="MB of demo reviews in the source database (at least 1)"),
    uploads_size: int = typer.Option(4, "--uploads-size", help="MB of demo files in the source's uploads (at least 1)"),
    source_address: str = typer.Option(hosts.SOURCE_ADDRESS, "--source-address", help="loopback address"),
    target_address: str = typer.Option(hosts.TARGET_ADDRESS, "--target-address", help="loopback address"),
    random_ports: bool = typer.Option(
        False, "--random-ports", help="random free ports instead of the defaults (for labs side by side)"
    ),
    files: int = typer.Option(0, "--files", help="also N small uploads (1-16 KiB) in hashed directories, seeded"),
    latency: float | None = typer.Option(
        None,
        "--latency",
        help="milliseconds of one-way delay between migrate and the hosts (its SSH, its health checks), through "
        "the lab's latency relay; 0: direct; default: what the lab has",
    ),
    api_latency: float | None = typer.Option(
        None,
        "--api-latency",
        help="milliseconds of one-way delay between migrate and the Cloudflare double, through the same relay; "
        "0: direct; default: what the lab has",
    ),
    app: str | None = typer.Option(
        None, "--app", help="what serves: demo (the Python app, a new lab's default) or wordpress (nginx, php-fpm)"
    ),
    with_bastion: bool = typer.Option(
        False, "--bastion", help="also a bastion sshd (127.0.0.4): the plan reaches both hosts through it (jump:)"
    ),
    with_operator: bool = typer.Option(
        False, "--operator", help="the plan logs in as an unprivileged account of this machine, root through sudo"
    ),
    engine: str | None = typer.Option(
        None, "--engine", help="the hosts' database: mariadb (a new lab's default) or postgresql (one cluster per host)"
    ),
) -> None:
    """Make the lab (or finish / repair it): sshd, MariaDB and the app per host, the Cloudflare double, plan.yaml.

    Addresses and ports are chosen when the lab is made and kept afterwards (lab.json)."""
    with _one_line_errors("up"):
        state = hosts.up(
            lab_dir,
            db_size_mb=db_size,
            uploads_size_mb=uploads_size,
            source_address=source_address,
            target_address=target_address,
            default_ports=not random_ports,
            files=files,
            latency_ms=latency,
            api_latency_ms=api_latency,
            app=app,
            with_bastion=with_bastion,
            with_operator=with_operator,
            engine=engine,
            say=typer.echo,
        )
    typer.echo(f"lab is up in {state.dir}; secrets in {state.env_file}; plan in {state.plan_file}")


@lab_app.command()
def down(
    lab_dir: Path = DirOption,
    purge: bool = typer.Option(False, "--purge", help="also delete the lab directory"),
) -> None:
    """Stop everything the lab started (files are kept unless --purge: only a lab directory is ever deleted)."""
    if not (lab_dir.expanduser() / STATE_FILE).exists():
        _refuse(f"no lab in {lab_dir.expanduser().absolute()} (no {STATE_FILE}): nothing stopped, nothing deleted")
    with _one_line_errors("down"):
        stopped = hosts.down(lab_dir, purge=purge, say=typer.echo)
    if not stopped:
        typer.echo("nothing was running")


@lab_app.command()
def status(lab_dir: Path = DirOption) -> None:
    """One line per component of the lab: running or stopped, and where."""
    _state(lab_dir)
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
    overwrite_every: int = typer.Option(
        3, "--overwrite-every", help="every Nth upload of a client rewrites its previous one; 0: never"
    ),
    delete_every: int = typer.Option(
        0, "--delete-every", help="every Nth upload of a client deletes the one before its previous; 0: never"
    ),
    out: Path | None = typer.Option(None, help="directory of acks.jsonl and stats.json (default: <lab>/load)"),
    journal: Path | None = typer.Option(
        None, "--journal", help="the migrate journal of the run under this load: latency inside its window"
    ),
    app: str | None = typer.Option(
        None, "--app", help="the lab's app (demo or wordpress); default: the one the lab was made with"
    ),
    http_timeout: float | None = typer.Option(
        None,
        "--http-timeout",
        help="seconds a client waits for an answer (default: the lab plan's cutover.max_write_block + 30 s: longer "
        "than the front door holds requests)",
    ),
) -> None:
    """Clients that find the service through DNS and write, upload and read while it moves."""
    if not (
        rate > 0
        and clients >= 1
        and duration >= 0
        and dns_ttl >= 0
        and upload_every >= 0
        and overwrite_every >= 0
        and delete_every >= 0
        and (http_timeout is None or http_timeout > 0)
    ):
        _refuse(
            "lab load: --rate, --clients and --http-timeout must be positive;"
            " --duration, --dns-ttl, --upload-every, --overwrite-every, --delete-every not negative"
        )
    state = _state(lab_dir)
    if app is not None and app != state.app:
        _refuse(
            f"lab load: the lab in {state.dir} runs the {state.app} app, not {app} (`lab up --app {app}` makes one)"
        )
    load_mod = importlib.import_module("migrate_lab.load")
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    pid_file = state.load_dir / f"cli-{os.getpid()}{hosts.LOAD_PID_SUFFIX}"
    try:
        with _one_line_errors("load"):
            # A pid file in load/ lets `lab down` find and stop this run.
            state.load_dir.mkdir(parents=True, exist_ok=True)
            pid_file.write_text(f"{os.getpid()}\n")
            stats = load_mod.main_load(
                state,
                duration=duration,
                rate=rate,
                clients=clients,
                dns_ttl=dns_ttl,
                upload_every=upload_every,
                out=out,
                stop=stop,
                overwrite_every=overwrite_every,
                journal=journal,
                http_timeout=http_timeout,
                delete_every=delete_every,
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
    journal: Path | None = typer.Option(
        None, "--journal", help="the migrate journal of the run under the load: latency inside its window"
    ),
) -> None:
    """Check that every acknowledged write of the last load run is on the host, and that the uploads match."""
    if host not in ("source", "target"):
        _refuse(f"lab verify: --host must be source or target, not {host!r}")
    state = _state(lab_dir)
    verify_mod = importlib.import_module(APP_VERIFY_MODULES.get(state.app, "migrate_lab.verify"))
    with _one_line_errors("verify"):
        report = verify_mod.main_verify(state, host=host, load_dir=load_dir, out=json_out, journal=journal)
    typer.echo(verify_mod.render(report))
    raise typer.Exit(report.exit_code)


if __name__ == "__main__":
    lab_app()
