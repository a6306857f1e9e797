"""The lab's demo app, load generator and verify, against a real mariadbd, the Cloudflare double and real HTTP."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from migrate_lab import load as load_mod
from migrate_lab import verify as verify_mod
from migrate_lab.app import db_connect, review_digest
from migrate_lab.load import ACKS_FILE, STATS_FILE, LoadStats, Recorder, Resolver, dns_record_name, main_load
from migrate_lab.state import HostState, LabState
from migrate_lab.verify import VerifyReport, compare_trees, compare_uploads, main_verify, read_acks, render

# How long a test waits for something the lab is expected to do: generous, for a loaded 2-core machine. Only a
# hang reaches it; a test never waits longer than its condition needs.
WAIT_LIMIT = 60.0


def _run_script(host: HostState, name: str) -> None:
    proc = subprocess.run([str(host.bin_dir / name)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"{name} on {host.name} failed: {proc.stderr}"


@pytest.fixture(autouse=True)
def source_serving(request: pytest.FixtureRequest) -> None:
    """Tests of the lab talk to the live source; say so plainly when an earlier test left the lab otherwise."""
    if "lab" not in request.fixturenames:
        return
    lab: LabState = request.getfixturevalue("lab")
    assert call(lab.source, "GET", "/healthz")[0] == 200, "the source app does not serve"
    assert not lab.source.fence_file.exists(), "the source is fenced"
    assert resolve_www(lab) == lab.source.address, "the www record does not point at the source"


# ------------------------------------------------------------------------------------------------- helpers


def call(host: HostState, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host.address, host.app_port, timeout=10)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def post_review(host: HostState, review: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, body = call(host, "POST", "/reviews", json.dumps(review).encode())
    return status, json.loads(body)


def new_review(**overrides: Any) -> dict[str, Any]:
    review = {
        "id": f"t-{secrets.token_hex(6)}",
        "author": "ada",
        "course": "databases-101",
        "rating": 4,
        "body": "Clear lectures; the labs on transactions were the best part.",
    }
    return {**review, **overrides}


def db_row(state: LabState, host: HostState, sql: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    conn = db_connect(state, host, state.secrets()[state.app_password_env])
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchone()
    finally:
        conn.close()


def db_exec(state: LabState, host: HostState, sql: str, args: tuple[Any, ...]) -> None:
    conn = db_connect(state, host, state.secrets()[state.app_password_env])
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
        conn.commit()
    finally:
        conn.close()


@contextlib.contextmanager
def fenced(host: HostState) -> Iterator[None]:
    host.fence_file.touch()
    try:
        yield
    finally:
        host.fence_file.unlink(missing_ok=True)


def access_log_lines(host: HostState) -> list[dict[str, Any]]:
    return [json.loads(line) for line in host.access_log.read_text().splitlines() if line.strip()]


def wait_for(condition: Callable[[], bool], what: str, limit: float = WAIT_LIMIT) -> None:
    """Poll `condition` until it holds; fail naming `what` only when it never did within `limit` seconds."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {limit:.0f} s for {what}")
        time.sleep(0.1)


def running_stats(out: Path) -> dict[str, Any]:
    """The stats a running load writes every few seconds ({} until the first)."""
    try:
        return dict(json.loads((out / STATS_FILE).read_text()))
    except (OSError, ValueError):
        return {}


def acks_so_far(out: Path) -> list[dict[str, Any]]:
    return read_acks(out / ACKS_FILE) if (out / ACKS_FILE).exists() else []


class BackgroundLoad:
    """A load run in a thread, until the test has seen what it waits for and stops it."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.result: list[LoadStats] = []
        self.errors: list[BaseException] = []

    @property
    def stats(self) -> LoadStats:
        assert not self.errors, f"the load failed: {self.errors[0]!r}"
        assert self.result, "the load returned no stats"
        return self.result[0]


@contextlib.contextmanager
def background_load(lab: LabState, out: Path, **options: Any) -> Iterator[BackgroundLoad]:
    """Run main_load in a thread for as long as the block lasts (its duration is only a safety net); on the way
    out, always ask it to stop and wait for it, so no test leaves a load running behind it."""
    run = BackgroundLoad()

    def target() -> None:
        try:
            run.result.append(main_load(lab, duration=WAIT_LIMIT * 2, out=out, stop=run.stop, **options))
        except BaseException as exc:  # reported by .stats in the test's own thread
            run.errors.append(exc)

    worker = threading.Thread(target=target, name="test-load", daemon=True)
    worker.start()
    try:
        yield run
    finally:
        run.stop.set()
        worker.join(timeout=WAIT_LIMIT)
    assert not worker.is_alive(), f"the load did not stop within {WAIT_LIMIT:.0f} s of being asked"


# ----------------------------------------------------------------------------------------------------- app


@pytest.mark.lab
def test_reviews_are_stored_read_back_and_retries_are_idempotent(lab: LabState) -> None:
    host = lab.source
    review = new_review()
    status, answer = post_review(host, review)
    assert (status, answer["id"]) == (201, review["id"])

    status, body = call(host, "GET", f"/reviews/{review['id']}")
    assert status == 200
    stored = json.loads(body)
    assert {k: stored[k] for k in ("id", "author", "course", "rating", "body")} == review
    assert stored["sha256"] == review_digest(review["author"], review["course"], review["rating"], review["body"])

    # A client that never saw the answer sends the same write again: success, and still one row.
    status, _ = post_review(host, review)
    assert status == 200
    row = db_row(lab, host, "SELECT COUNT(*) FROM reviews WHERE id = %s", (review["id"],))
    assert row == (1,)
    # The same id with other content is a conflict, not a silent overwrite.
    status, _ = post_review(host, {**review, "body": "something else"})
    assert status == 409
    assert db_row(lab, host, "SELECT body FROM reviews WHERE id = %s", (review["id"],)) == (review["body"],)

    status, body = call(host, "GET", "/reviews?limit=5")
    assert status == 200
    assert review["id"] in [r["id"] for r in json.loads(body)["reviews"]]
    assert call(host, "GET", "/reviews/no-such-review")[0] == 404


@pytest.mark.lab
def test_invalid_reviews_are_refused(lab: LabState) -> None:
    host = lab.source
    assert post_review(host, new_review(rating=9))[0] == 400
    assert post_review(host, new_review(id="../etc"))[0] == 400
    assert call(host, "POST", "/reviews", b"not json")[0] == 400


@pytest.mark.lab
def test_uploads_are_written_whole_and_recorded(lab: LabState) -> None:
    host = lab.source
    data = os.urandom(70_000)
    name = f"t-{secrets.token_hex(4)}.bin"
    status, body = call(host, "PUT", f"/uploads/{name}", data)
    assert status == 201
    digest = hashlib.sha256(data).hexdigest()
    assert json.loads(body)["sha256"] == digest
    assert (host.uploads / name).read_bytes() == data
    assert db_row(lab, host, "SELECT size, sha256 FROM uploads WHERE name = %s", (name,)) == (len(data), digest)
    assert not [p for p in host.uploads.iterdir() if p.name.startswith(".")], "a temporary file was left behind"

    assert call(host, "GET", f"/uploads/{name}") == (200, data)
    assert call(host, "GET", "/uploads/missing.bin")[0] == 404
    assert call(host, "PUT", "/uploads/..%2Fescape", b"x")[0] == 400


@pytest.mark.lab
def test_fence_refuses_writes_before_touching_disk_or_database(lab: LabState) -> None:
    host = lab.source
    existing = new_review()
    assert post_review(host, existing)[0] == 201
    review = new_review()
    name = f"t-{secrets.token_hex(4)}.bin"
    uploads_before = sorted(p.name for p in host.uploads.iterdir())
    with fenced(host):
        status, answer = post_review(host, review)
        assert (status, answer) == (503, {"error": "fenced"})
        status, body = call(host, "PUT", f"/uploads/{name}", b"payload")
        assert (status, json.loads(body)) == (503, {"error": "fenced"})
        # Reads still work while fenced.
        assert call(host, "GET", f"/reviews/{existing['id']}")[0] == 200
        assert call(host, "GET", "/healthz")[0] == 200
        assert sorted(p.name for p in host.uploads.iterdir()) == uploads_before
        assert db_row(lab, host, "SELECT COUNT(*) FROM reviews WHERE id = %s", (review["id"],)) == (0,)
        assert db_row(lab, host, "SELECT COUNT(*) FROM uploads WHERE name = %s", (name,)) == (0,)
    # Fence lifted: the client's retry goes through.
    assert post_review(host, review)[0] == 201

    log = access_log_lines(host)
    fenced_posts = [r for r in log if r["method"] == "POST" and r["status"] == 503]
    assert fenced_posts, "the refused write is missing from the access log"
    assert {"time", "method", "path", "status", "client"} <= set(fenced_posts[-1])
    assert fenced_posts[-1]["client"] == "127.0.0.1" or fenced_posts[-1]["client"].startswith("127.")


@pytest.mark.lab
def test_database_down_gives_503_and_service_comes_back(lab: LabState) -> None:
    host = lab.source
    assert call(host, "GET", "/healthz") == (200, f"ok {host.name}\n".encode())
    _run_script(host, "db-stop")
    try:
        status, _ = call(host, "GET", "/healthz")
        assert status == 503
        assert post_review(host, new_review())[0] == 503
        name = f"t-{secrets.token_hex(4)}.bin"
        assert call(host, "PUT", f"/uploads/{name}", b"data")[0] == 503
        assert not (host.uploads / name).exists()
    finally:
        _run_script(host, "db-start")
    assert call(host, "GET", "/healthz")[0] == 200


@pytest.mark.lab
def test_app_exits_cleanly_on_sigterm_and_starts_again(lab: LabState) -> None:
    host = lab.source
    pid = int(host.app_pid_file.read_text())
    out_log = host.log_dir / "app.out"
    stopped_lines = out_log.read_text().count(f"course-reviews ({host.name}) stopped")
    os.kill(pid, signal.SIGTERM)
    try:
        deadline = time.monotonic() + 15
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        # A clean exit: it said so and removed its own pid file.
        assert out_log.read_text().count(f"course-reviews ({host.name}) stopped") == stopped_lines + 1
        assert not host.app_pid_file.exists()
    finally:
        _run_script(host, "app-start")
    assert call(host, "GET", "/healthz")[0] == 200


# ---------------------------------------------------------------------------------------------------- load


def cf_api(lab: LabState, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One call to the Cloudflare double's API, as any API client would make it."""
    headers = {"Authorization": f"Bearer {lab.secrets()[lab.token_env]}", "Content-Type": "application/json"}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{lab.cf_base_url}{path}", data=data, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=5) as answer:
        return json.loads(answer.read())["result"]


def www_record(lab: LabState) -> tuple[str, dict[str, Any]]:
    zone_id = cf_api(lab, "GET", f"/zones?name={lab.zone}")[0]["id"]
    record = cf_api(lab, "GET", f"/zones/{zone_id}/dns_records?name.exact={dns_record_name(lab)}&type=A")[0]
    return zone_id, record


def resolve_www(lab: LabState) -> str:
    return str(www_record(lab)[1]["content"])


def set_dns(lab: LabState, content: str) -> None:
    """Point the www record at `content` through the Cloudflare double's API (as the migration would)."""
    zone_id, record = www_record(lab)
    cf_api(lab, "PATCH", f"/zones/{zone_id}/dns_records/{record['id']}", {"content": content})


@pytest.mark.lab
def test_resolver_caches_for_its_ttl_then_follows_a_flip(
    lab: LabState, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The resolver's clock is the test's: "still cached" and "expired" do not depend on how fast the machine is.
    clock = [1000.0]
    monkeypatch.setattr(load_mod, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    recorder = Recorder(tmp_path, LoadStats())
    token = lab.secrets()[lab.token_env]
    resolver = Resolver(lab.cf_base_url, token, lab.zone, dns_record_name(lab), ttl=30, first_ttl=30)
    assert resolver.resolve(recorder) == lab.source.address
    set_dns(lab, lab.target.address)
    try:
        clock[0] += 29
        assert resolver.resolve(recorder) == lab.source.address, "the answer must stay cached for its TTL"
        clock[0] += 2
        assert resolver.resolve(recorder) == lab.target.address
    finally:
        set_dns(lab, lab.source.address)
    recorder.close()
    assert recorder.stats.address_changes == 1


@pytest.mark.lab
def test_load_then_verify_passes_and_catches_every_loss(lab: LabState, tmp_path: Path) -> None:
    out = tmp_path / "load"
    stats = main_load(lab, duration=2.5, rate=40, clients=3, dns_ttl=1, upload_every=2, out=out)
    acks = read_acks(out / ACKS_FILE)
    assert stats.finished and stats.writes_acked > 0 and stats.uploads_acked > 0
    assert len(acks) == stats.writes_acked + stats.uploads_acked
    assert {a["server"] for a in acks} == {lab.source.address}
    assert stats.per_server[lab.source.address].writes_acked == stats.writes_acked
    assert stats.reads_ok > 0 and stats.reads_missing == 0
    assert json.loads((out / STATS_FILE).read_text())["writes_acked"] == stats.writes_acked

    report = main_verify(lab, host="source", load_dir=out)
    assert report.error is None
    assert report.ok, report.lost
    assert report.reviews_acknowledged == stats.writes_acked
    assert report.uploads_acknowledged == stats.uploads_acked
    assert (out / "verify-source.json").exists()
    # The uploads just acknowledged by the source are not on the (not yet migrated) target.
    assert report.trees_identical is False and report.source_tree_on_target is False

    # An acknowledged review disappears from the database: verify fails, and says which.
    review_ack = next(a for a in acks if a["kind"] == "review")
    saved = db_row(lab, lab.source, "SELECT id, author, course, rating, body, created_at FROM reviews "
                   "WHERE id = %s", (review_ack["id"],))  # fmt: skip
    assert saved is not None
    db_exec(lab, lab.source, "DELETE FROM reviews WHERE id = %s", (review_ack["id"],))
    try:
        report = main_verify(lab, host="source", load_dir=out)
        assert (report.reviews_lost, report.ok, report.exit_code) == (1, False, verify_mod.EXIT_LOST)
        assert review_ack["id"] in report.lost
        cli = [sys.executable, "-m", "migrate_lab.verify", "--lab", lab.dir, "--host", "source",
               "--load-dir", str(out)]  # fmt: skip
        proc = subprocess.run(cli, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == verify_mod.EXIT_LOST, proc.stdout + proc.stderr
        assert "FAILED" in proc.stdout
        migrate = Path(sys.executable).with_name("migrate")
        cli = [str(migrate), "lab", "verify", "--dir", lab.dir, "--host", "source", "--load-dir", str(out)]
        proc = subprocess.run(cli, capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == verify_mod.EXIT_LOST, proc.stdout + proc.stderr
    finally:
        db_exec(lab, lab.source, "INSERT INTO reviews (id, author, course, rating, body, created_at) "
                "VALUES (%s, %s, %s, %s, %s, %s)", saved)  # fmt: skip

    # An acknowledged upload's file disappears: verify fails too.
    upload_ack = next(a for a in acks if a["kind"] == "upload")
    path = lab.source.uploads / upload_ack["name"]
    data = path.read_bytes()
    path.unlink()
    try:
        report = main_verify(lab, host="source", load_dir=out)
        assert (report.uploads_lost, report.upload_rows_lost, report.ok) == (1, 0, False)
    finally:
        path.write_bytes(data)
    assert main_verify(lab, host="source", load_dir=out).ok


@pytest.mark.lab
def test_unacknowledged_writes_are_retried_until_acknowledged(lab: LabState, tmp_path: Path) -> None:
    out = tmp_path / "load"
    with background_load(lab, out, rate=30, clients=2, dns_ttl=1, upload_every=3) as run:
        wait_for(lambda: len(acks_so_far(out)) >= 3, "the first acknowledged writes")
        with fenced(lab.source):
            wait_for(
                lambda: running_stats(out).get("write_failures_by_reason", {}).get("fenced", 0) > 0,
                "writes refused by the fence",
            )
        wait_for(lambda: any(a["attempts"] > 1 for a in acks_so_far(out)), "a write acknowledged after a retry")
    stats = run.stats
    assert stats.write_failures_by_reason.get("fenced", 0) > 0
    assert stats.longest_write_stall_s > 0
    acks = read_acks(out / ACKS_FILE)
    keys = [a.get("id") or a["name"] for a in acks]
    assert len(keys) == len(set(keys)), "a write was acknowledged twice"
    retried = [a for a in acks if a["attempts"] > 1]
    assert retried, "no write was acknowledged after a retry"
    assert main_verify(lab, host="source", load_dir=out).ok


@pytest.mark.lab
def test_clients_follow_the_dns_record_and_retry_where_it_points(lab: LabState, tmp_path: Path) -> None:
    out = tmp_path / "load"
    clients = 3
    with background_load(lab, out, rate=30, clients=clients, dns_ttl=0.5, upload_every=3) as run:
        try:
            wait_for(lambda: len(acks_so_far(out)) >= 3, "the first acknowledged writes")
            # The record moves to the target, where no app serves here: clients reach it once their cache
            # expires, their writes fail there and stay pending until the record comes back.
            set_dns(lab, lab.target.address)

            def every_client_tried_the_target() -> bool:
                stats = running_stats(out)
                failed = stats.get("per_server", {}).get(lab.target.address, {}).get("write_attempts_failed", 0)
                return stats.get("address_changes", 0) >= clients and failed > 0

            wait_for(every_client_tried_the_target, "every client to follow the record to the target")
        finally:
            set_dns(lab, lab.source.address)
        wait_for(lambda: any(a["attempts"] > 1 for a in acks_so_far(out)), "a pending write acknowledged back")
    stats = run.stats
    assert stats.address_changes >= stats.clients
    target = stats.per_server[lab.target.address]
    assert target.write_attempts_failed > 0
    assert (target.writes_acked, target.uploads_acked) == (0, 0)
    acks = read_acks(out / ACKS_FILE)
    assert {a["server"] for a in acks} == {lab.source.address}
    assert any(a["attempts"] > 1 for a in acks)
    assert main_verify(lab, host="source", load_dir=out).ok


@pytest.mark.lab
def test_load_subprocess_stops_cleanly_on_sigterm(lab: LabState, tmp_path: Path) -> None:
    out = tmp_path / "load"
    argv = [sys.executable, "-m", "migrate_lab.load", "--lab", lab.dir, "--duration", "60", "--rate", "20",
            "--clients", "2", "--dns-ttl", "1", "--upload-every", "3", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if (out / ACKS_FILE).exists() and len(read_acks(out / ACKS_FILE)) >= 3:
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    stats = json.loads((out / STATS_FILE).read_text())
    assert stats["finished"] is True
    assert stats["writes_acked"] + stats["uploads_acked"] == len(read_acks(out / ACKS_FILE)) >= 3
    assert "acknowledged" in stdout


# -------------------------------------------------------------------------------------------------- verify


@pytest.mark.lab
def test_verify_cannot_check_without_a_database(lab: LabState, tmp_path: Path) -> None:
    (tmp_path / ACKS_FILE).write_text(json.dumps({"kind": "review", "id": "x", "sha256": "0" * 64}) + "\n")
    # The lab's target has no database running here: verify must say it cannot check, never "ok".
    report = main_verify(lab, host="target", load_dir=tmp_path)
    assert report.exit_code in (verify_mod.EXIT_CANNOT_VERIFY, verify_mod.EXIT_LOST)
    assert not report.ok


def test_compare_trees_sees_missing_and_changed_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        (root / "sub").mkdir(parents=True)
        (root / "sub" / "same.txt").write_text("same")
    assert compare_trees(a, b) == []
    (a / "only-a.txt").write_text("x")
    (b / "sub" / "same.txt").write_text("changed")
    assert compare_trees(a, b) == ["only on source: only-a.txt", "differs: sub/same.txt"]


def test_torn_last_ack_line_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / ACKS_FILE
    path.write_text(json.dumps({"kind": "review", "id": "a", "sha256": "1"}) + '\n{"kind": "rev')
    assert [a["id"] for a in read_acks(path)] == ["a"]


def test_review_digest_changes_with_every_field() -> None:
    base = review_digest("ada", "databases-101", 3, "fine")
    variants = [
        review_digest("bob", "databases-101", 3, "fine"),
        review_digest("ada", "networks-201", 3, "fine"),
        review_digest("ada", "databases-101", 4, "fine"),
        review_digest("ada", "databases-101", 3, "fine!"),
    ]
    assert base not in variants and len(set(variants)) == len(variants)


def test_recorder_measures_the_longest_stall_and_gap(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path, LoadStats(started_at=time.time()))
    acks = [  # (key, first attempt, ack): the second write waited 4 s; acks 3 s apart between 11.5 and 14.5
        ("a", 10.0, 10.5),
        ("b", 7.5, 11.5),
        ("c", 14.0, 14.5),
    ]
    for key, first, ack in acks:
        recorder.ack({"kind": "review", "id": key, "sha256": "0", "server": "127.0.0.2",
                      "first_attempt_ts": first, "ack_ts": ack})  # fmt: skip
    stats = recorder.write_stats(finished=True)
    recorder.close()
    assert (stats.longest_write_stall_s, stats.longest_write_stall_key) == (4.0, "b")
    assert (stats.longest_ack_gap_s, stats.longest_ack_gap_from) == (3.0, 11.5)
    assert [a["id"] for a in read_acks(tmp_path / ACKS_FILE)] == ["a", "b", "c"]
    assert json.loads((tmp_path / STATS_FILE).read_text())["writes_acked"] == 3


def uploads_lab(tmp_path: Path) -> LabState:
    """A lab layout on disk only (no daemons): enough to compare the two hosts' uploads trees."""

    def host(name: str, address: str, server_id: int) -> HostState:
        return HostState(name, address, 2222, 3307, 8080, server_id, str(tmp_path / name))

    state = LabState(dir=str(tmp_path), source=host("source", "127.0.0.2", 1), target=host("target", "127.0.0.3", 2))
    for root in (state.source.uploads, state.target.uploads):
        root.mkdir(parents=True)
    return state


def test_verify_reports_uploads_made_after_the_flip_apart_from_differences(tmp_path: Path) -> None:
    state = uploads_lab(tmp_path)
    for name in ("seed-1.bin", "seed-2.bin"):
        data = os.urandom(100)
        (state.source.uploads / name).write_bytes(data)
        (state.target.uploads / name).write_bytes(data)
    for index in range(3):  # uploaded on the target after the flip
        (state.target.uploads / f"late-{index}.bin").write_bytes(os.urandom(50))

    report = VerifyReport(host="target", load_dir=str(tmp_path))
    compare_uploads(state, "target", report)
    # The fields tests and scripts read stay as they were: strictly, the trees differ.
    assert (report.trees_identical, report.source_tree_on_target, report.tree_difference_count) == (False, True, 3)
    assert (report.other_tree_on_host, report.other_tree_files, report.only_on_host) == (True, 2, 3)
    text = render(report)
    assert "uploads of the source     all 2 on the target, identical byte for byte" in text
    assert "uploads made on the target after the flip: 3" in text
    assert "MISSING" not in text and "late-0.bin" not in text and "identical   no" not in text
    assert text.splitlines()[-1] == "  OK: nothing acknowledged was lost"

    # A file of the source that is not on the target byte for byte is a difference, said plainly and listed.
    (state.target.uploads / "seed-2.bin").write_bytes(b"torn")
    report = VerifyReport(host="target", load_dir=str(tmp_path))
    compare_uploads(state, "target", report)
    assert (report.source_tree_on_target, report.other_tree_on_host, report.other_tree_missing) == (False, False, 1)
    text = render(report)
    assert "uploads of the source     1 MISSING or different on the target" in text
    assert "    differs: seed-2.bin" in text
    assert "late-0.bin" not in text
    assert "but 1 uploads of the source are missing or different on the target" in text.splitlines()[-1]

    # Seen from the source (after a move back), the target's files are the ones that must all be there.
    report = VerifyReport(host="source", load_dir=str(tmp_path))
    compare_uploads(state, "source", report)
    assert (report.other_host, report.other_tree_files, report.other_tree_missing, report.only_on_host) == (
        "target", 5, 4, 0,
    )  # fmt: skip
