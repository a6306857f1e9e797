"""A datadir that is a symbolic link to another directory (/var/lib/mysql kept on a bigger disk), on both lab hosts,
migrated in both modes while an application account commits rows on the source, through `migrate apply`.

The plan names the links; each server's configuration names either the link or the real directory (its scripts give
mariadbd one or the other): the replicate run with the target configured by the real directory and the source by
the link, the shutdown run the other way round. Each run: exit 0, every acknowledged row on the target, the target's
server running on the real directory (which holds the new data), the links still links; the replicate run keeps the
target's previous datadir as `<real directory>.before-seed`, beside it, and nothing beside the link; the source's
datadir stays as it was.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest

from migrate_lab import binscripts
from migrate_lab.state import HostState, LabState
from orchestrator import exit_codes
from tests.test_e2e import migrate_apply, outcome, plan_copy, run_bin
from tests.test_replicate_e2e import TIMEOUT, connect, replicate_plan, restore

pytestmark = pytest.mark.lab

MARKER = "previous-target-datadir"


def real_dir(host: HostState) -> Path:
    """Where the host's datadir really is while its usual path is a link: another directory, as another disk."""
    return host.path / "other-disk" / "mysql"


def configure(state: LabState, host: HostState, *, by_real: bool) -> None:
    """The host's database configured by the real directory (by_real) or by the link: stopped with the scripts that
    started it, its scripts rewritten (restore() starts the source again)."""
    run_bin(host, "db-stop")
    binscripts.write_scripts(state, host, datadir=real_dir(host) if by_real else None)


def link_datadirs(state: LabState) -> None:
    for host in (state.source, state.target):
        run_bin(host, "db-stop")
        real = real_dir(host)
        shutil.rmtree(real.parent, ignore_errors=True)
        real.parent.mkdir(parents=True)
        host.datadir.rename(real)
        host.datadir.symlink_to(real)
        for leftover in (".seed", ".before-seed"):  # an earlier replicate run's, beside the plain datadir
            shutil.rmtree(f"{host.datadir}{leftover}", ignore_errors=True)
    (real_dir(state.target) / MARKER).write_text("the target's datadir before the migration\n")


def unlink_datadirs(state: LabState) -> None:
    """Each datadir back at its usual path, a directory again, the scripts as the lab writes them."""
    for host in (state.source, state.target):
        run_bin(host, "db-stop")
        binscripts.write_scripts(state, host)
        real = real_dir(host)
        if host.datadir.is_symlink():
            host.datadir.unlink()
        if real.is_dir() and not host.datadir.exists():
            real.rename(host.datadir)
        shutil.rmtree(real.parent, ignore_errors=True)
        for leftover in (".seed", ".before-seed"):  # what renaming the link instead of its directory would leave
            shutil.rmtree(f"{host.datadir}{leftover}", ignore_errors=True)
            Path(f"{host.datadir}{leftover}").unlink(missing_ok=True)


@pytest.fixture
def linked(lab: LabState) -> Iterator[LabState]:
    try:
        link_datadirs(lab)  # both databases stopped, then started again by restore()
        restore(lab)
        yield lab
    finally:
        unlink_datadirs(lab)
        restore(lab)


@contextlib.contextmanager
def app_writer(state: LabState, prefix: str) -> Iterator[list[str]]:
    """The application's account committing rows on the source, paced, until the block ends; the ids acknowledged.
    (The application's account: read_only stops it, as it stops the application.)"""
    acked: list[str] = []
    stop = threading.Event()
    password = state.secrets()[state.app_password_env]

    def _run() -> None:
        conn: pymysql.Connection | None = None
        n = 0
        while not stop.is_set():
            try:
                if conn is None:
                    conn = pymysql.connect(
                        host=state.source.address, port=state.source.db_port, user=state.app_user, password=password,
                        database=state.db_name, autocommit=True, connect_timeout=5, read_timeout=30,
                    )  # fmt: skip
                n += 1
                row = f"{prefix}-{n:08d}"
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO reviews (id, author, course, rating, body) VALUES (%s, 'w', 'c', 3, 'b')",
                                (row,))  # fmt: skip
                acked.append(row)
            except pymysql.MySQLError:
                with contextlib.suppress(Exception):
                    if conn is not None:
                        conn.close()
                conn = None
            stop.wait(0.02)
        if conn is not None:
            conn.close()

    thread = threading.Thread(target=_run, daemon=True)
    thread.start()
    try:
        yield acked
    finally:
        stop.set()
        thread.join(timeout=60)


def on_target(state: LabState, prefix: str) -> tuple[str, set[str]]:
    """The target server's datadir (as its configuration names it) and the rows of `prefix` it holds."""
    conn = connect(state, state.target, state.db_name)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@datadir")
            datadir = str(cur.fetchone()[0])
            cur.execute("SELECT id FROM reviews WHERE id LIKE %s", (f"{prefix}-%",))
            return datadir, {str(row[0]) for row in cur.fetchall()}
    finally:
        conn.close()


def assert_links_stand(state: LabState) -> None:
    for host in (state.source, state.target):
        assert host.datadir.is_symlink(), f"the {host.name}'s datadir link was replaced"
        assert host.datadir.resolve() == real_dir(host)
    # The source's data stays where it was (the shutdown mode keeps it as at the cut-over, the replicate mode
    # leaves it read-only): the real directory, never moved.
    assert (real_dir(state.source) / state.db_name / "reviews.ibd").is_file()


def test_a_symlinked_datadir_migrates_in_both_modes_configured_by_either_path(linked: LabState) -> None:
    state = linked
    target = state.target

    # Replicate: the target's server configured by the real directory, the source's by the link.
    configure(state, target, by_real=True)
    plan = replicate_plan(state, "linked-repl", mode="replicate")
    prefix = f"linked-repl-{uuid.uuid4().hex[:8]}"  # the lab's source keeps the rows of earlier runs
    with app_writer(state, prefix) as acked:
        result = migrate_apply(state, plan, timeout=TIMEOUT)
    assert result.returncode == exit_codes.OK, outcome(result)
    datadir, rows = on_target(state, prefix)
    assert Path(datadir) == real_dir(target)
    assert acked and set(acked) <= rows, f"{len(set(acked) - rows)} acknowledged row(s) lost"
    assert_links_stand(state)
    # The seed replaced the real directory and kept the previous one beside it; nothing beside the link.
    kept = real_dir(target).with_name("mysql.before-seed")
    assert (kept / MARKER).is_file() and not (real_dir(target) / MARKER).exists()
    assert not real_dir(target).with_name("mysql.seed").exists()
    assert not Path(f"{target.datadir}.before-seed").exists() and not Path(f"{target.datadir}.seed").exists()

    # Shutdown: the target's server configured by the link, the source's by the real directory (a restart also
    # ends the read_only the replicate run left on the source).
    configure(state, target, by_real=False)
    configure(state, state.source, by_real=True)
    restore(state)
    plan = plan_copy(state, "linked-shutdown", {})
    prefix = f"linked-shutdown-{uuid.uuid4().hex[:8]}"
    with app_writer(state, prefix) as acked:
        result = migrate_apply(state, plan, timeout=TIMEOUT)
    assert result.returncode == exit_codes.OK, outcome(result)
    datadir, rows = on_target(state, prefix)
    assert Path(datadir) == target.datadir  # the link, as its configuration names it: the data is in the real dir
    assert acked and set(acked) <= rows, f"{len(set(acked) - rows)} acknowledged row(s) lost"
    assert_links_stand(state)
    assert (real_dir(target) / state.db_name / "reviews.ibd").is_file()
