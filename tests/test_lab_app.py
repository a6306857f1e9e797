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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lab import verify as verify_mod
from orchestrator.lab.app import db_connect, review_digest
from orchestrator.lab.load import ACKS_FILE, STATS_FILE, LoadStats, Recorder, Resolver, dns_record_name, main_load
from orchestrator.lab.state import HostState, LabState
from orchestrator.lab.verify import compare_trees, main_verify, read_acks


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
def test_resolver_caches_for_its_ttl_then_follows_a_flip(lab: LabState, tmp_path: Path) -> None:
    recorder = Recorder(tmp_path, LoadStats())
    token = lab.secrets()[lab.token_env]
    resolver = Resolver(lab.cf_base_url, token, lab.zone, dns_record_name(lab), ttl=0.3, first_ttl=0.3)
    assert resolver.resolve(recorder) == lab.source.address
    set_dns(lab, lab.target.address)
    try:
        assert resolver.resolve(recorder) == lab.source.address, "the answer must stay cached for its TTL"
        time.sleep(0.4)
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
        cli = [sys.executable, "-m", "orchestrator.lab.verify", "--lab", lab.dir, "--host", "source",
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
    holder: dict[str, LoadStats] = {}
    worker = threading.Thread(
        target=lambda: holder.update(
            stats=main_load(lab, duration=3.0, rate=30, clients=2, dns_ttl=1, upload_every=3, out=out)
        )
    )
    worker.start()
    time.sleep(0.8)
    with fenced(lab.source):
        time.sleep(0.8)
    worker.join(timeout=30)
    stats = holder["stats"]
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
    holder: dict[str, LoadStats] = {}
    worker = threading.Thread(
        target=lambda: holder.update(
            stats=main_load(lab, duration=4.0, rate=30, clients=3, dns_ttl=0.5, upload_every=3, out=out)
        )
    )
    worker.start()
    try:
        time.sleep(1.0)
        # The record moves to the target, where no app serves here: clients reach it once their cache expires,
        # their writes fail there and stay pending until the record comes back.
        set_dns(lab, lab.target.address)
        time.sleep(1.2)
    finally:
        set_dns(lab, lab.source.address)
        worker.join(timeout=30)
    stats = holder["stats"]
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
    argv = [sys.executable, "-m", "orchestrator.lab.load", "--lab", lab.dir, "--duration", "60", "--rate", "20",
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
