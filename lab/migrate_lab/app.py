"""The lab's demo application, "course reviews": a small HTTP service on one lab host, backed by its MariaDB.

    python -m migrate_lab.app --lab DIR --host source|target

It serves on HostState.address:app_listen_port (behind the host's front door, HAProxy on app_port) and talks to
the host's MariaDB through its unix socket as the `app` user (one connection per request: a socket connect is
cheap and a dead database is noticed at once, never hidden by a pooled connection). What a migration needs from it:

- a write is answered 201/200 only after COMMIT, so an acknowledged write is durable on that host;
- a retried write (same review id, same content) answers 200: clients retry what was not acknowledged;
- while HostState.fence_file exists, every write answers 503 {"error": "fenced"} before touching disk or
  database (the source's maintenance mode during cut-over); reads still work while the database is up;
- every request is one JSON line in HostState.access_log, so operators can watch traffic leave the source.

Endpoints: GET /healthz, POST /reviews, GET /reviews/<id>, GET /reviews?limit=N, PUT /uploads/<name>,
GET /uploads/<name>, DELETE /uploads/<name> (file and row; a name already gone answers 200 too: retried deletes).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from migrate_lab import appdb
from migrate_lab.state import HostState, LabState

MAX_UPLOAD_BYTES = 16 * 1024 * 1024
MAX_JSON_BYTES = 1024 * 1024
REVIEW_FIELDS = ("author", "course", "rating", "body")
# Review ids and upload names are path segments and file names: keep them to a safe alphabet.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
UPLOAD_TMP_SUFFIX = ".uploading"


def review_digest(author: str, course: str, rating: int, body: str) -> str:
    """The sha256 of a review's content: load records it for each acknowledged write, verify recomputes it."""
    canonical = json.dumps(
        {"author": author, "course": course, "rating": int(rating), "body": body},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def db_connect(state: LabState, host: HostState, password: str) -> Any:
    """A connection to the host's database through its unix socket, as the app user, with bounded timeouts (the
    lab's engine's: lab/migrate_lab/appdb.py)."""
    return appdb.for_state(state).connect(state, host, password)


class DatabaseDown(Exception):
    """The database did not answer (connect or query failed): the request gets 503."""


class AccessLog:
    """One JSON line per request, appended and flushed under a lock (threads share the file)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the app
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


class App:
    """What request handlers share: the lab host, the database credentials and the access log."""

    def __init__(self, state: LabState, host: HostState, password: str) -> None:
        self.state = state
        self.host = host
        self._password = password
        self.access_log = AccessLog(host.access_log)
        self.dbapi = appdb.for_state(state)

    @contextlib.contextmanager
    def db(self) -> Iterator[Any]:
        try:
            conn = self.dbapi.connect(self.state, self.host, self._password)
        except self.dbapi.error as exc:
            raise DatabaseDown(f"connect: {exc.args[0] if exc.args else exc}") from None
        try:
            yield conn
        except self.dbapi.integrity_error:
            raise
        except self.dbapi.down_errors as exc:
            raise DatabaseDown(f"query: {exc.args[0] if exc.args else exc}") from None
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    def fenced(self) -> bool:
        return self.host.fence_file.exists()


class Handler(BaseHTTPRequestHandler):
    server_version = "course-reviews/1"
    # Socket timeout per connection: a client that stalls mid-request cannot hold a thread (or the shutdown).
    timeout = 10
    app: App  # set on the subclass made by make_server

    # --- plumbing -------------------------------------------------------------------------------------------

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        status = code.value if isinstance(code, HTTPStatus) else code
        self.app.access_log.write(
            {
                "time": datetime.now().astimezone().isoformat(timespec="milliseconds"),
                "ts": round(time.time(), 6),
                "host": self.app.host.name,
                "method": self.command,
                "path": self.path,
                "status": int(status) if str(status).isdigit() else status,
                "client": self.client_address[0],
                "ms": round((time.monotonic() - getattr(self, "_started", time.monotonic())) * 1000, 1),
            }
        )

    def log_message(self, format: str, *args: Any) -> None:
        # Only errors reach here (requests go to the access log); keep them on stderr, the app's log file.
        sys.stderr.write(f"{self.log_date_time_string()} {self.client_address[0]} {format % args}\n")

    def parse_request(self) -> bool:
        self._started = time.monotonic()
        return super().parse_request()

    def send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status: int, obj: Any) -> None:
        self.send(status, json.dumps(obj).encode() + b"\n", "application/json")

    def send_text(self, status: int, text: str) -> None:
        self.send(status, text.encode() + b"\n", "text/plain; charset=utf-8")

    def content_length(self, limit: int) -> int | None:
        raw = self.headers.get("Content-Length")
        if raw is None or not raw.isdigit():
            return None
        length = int(raw)
        return length if length <= limit else None

    def read_body(self, length: int) -> bytes:
        chunks: list[bytes] = []
        remaining = length
        while remaining > 0:
            chunk = self.rfile.read(min(remaining, 1 << 16))
            if not chunk:
                raise ConnectionError("client closed the connection before the end of its body")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def refuse_write_if_fenced(self) -> bool:
        """503 a write while fenced, before any disk or database work. True when the request was refused."""
        if not self.app.fenced():
            return False
        # The body is drained from the socket (memory only) so the client reads our answer instead of a reset.
        length = self.content_length(MAX_UPLOAD_BYTES)
        with contextlib.suppress(OSError, ConnectionError):
            if length:
                self.read_body(length)
        self.send_json(503, {"error": "fenced"})
        return True

    def route(self, handlers: dict[str, Any]) -> None:
        try:
            handler = handlers.get(self.command)
            if handler is None:
                self.send_json(405, {"error": "method not allowed"})
                return
            handler()
        except DatabaseDown as exc:
            self.log_message("database unavailable: %s", exc)
            self.send_json(503, {"error": "database unavailable"})
        except self.app.dbapi.error as exc:
            # Any other database error (a missing table, a lock wait timeout): the write did not happen.
            self.log_message("database error: %s", exc.args[0] if exc.args else type(exc).__name__)
            self.send_json(503, {"error": "database error"})
        except (ConnectionError, TimeoutError):
            pass  # the client went away; nothing to answer
        except OSError as exc:
            # The uploads directory failed us (full disk, permissions): the write did not happen.
            self.log_message("storage error: %s", exc)
            self.send_json(500, {"error": "storage error"})

    # --- HTTP verbs -----------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self.route({"GET": self.get})

    def do_POST(self) -> None:
        self.route({"POST": self.post})

    def do_PUT(self) -> None:
        self.route({"PUT": self.put})

    def do_DELETE(self) -> None:
        self.route({"DELETE": self.delete})

    def get(self) -> None:
        url = urlsplit(self.path)
        path = url.path
        if path == "/healthz":
            self.healthz()
        elif path == "/reviews":
            self.list_reviews(parse_qs(url.query))
        elif path.startswith("/reviews/"):
            self.get_review(unquote(path.removeprefix("/reviews/")))
        elif path.startswith("/uploads/"):
            self.get_upload(unquote(path.removeprefix("/uploads/")))
        else:
            self.send_json(404, {"error": "not found"})

    def post(self) -> None:
        if self.refuse_write_if_fenced():
            return
        if urlsplit(self.path).path != "/reviews":
            self.send_json(404, {"error": "not found"})
            return
        self.post_review()

    def put(self) -> None:
        if self.refuse_write_if_fenced():
            return
        path = urlsplit(self.path).path
        if not path.startswith("/uploads/"):
            self.send_json(404, {"error": "not found"})
            return
        self.put_upload(unquote(path.removeprefix("/uploads/")))

    def delete(self) -> None:
        if self.refuse_write_if_fenced():
            return
        path = urlsplit(self.path).path
        if not path.startswith("/uploads/"):
            self.send_json(404, {"error": "not found"})
            return
        self.delete_upload(unquote(path.removeprefix("/uploads/")))

    # --- endpoints ------------------------------------------------------------------------------------------

    def healthz(self) -> None:
        try:
            with self.app.db() as conn, conn.cursor() as cur:
                cur.execute("SELECT 1")
                cur.fetchone()
        except DatabaseDown:
            self.send_text(503, f"database unavailable {self.app.host.name}")
            return
        self.send_text(200, f"ok {self.app.host.name}")

    def post_review(self) -> None:
        length = self.content_length(MAX_JSON_BYTES)
        if length is None:
            self.send_json(411, {"error": "a Content-Length of at most 1 MiB is required"})
            return
        review, problem = parse_review(self.read_body(length))
        if review is None:
            self.send_json(400, {"error": problem})
            return
        with self.app.db() as conn, conn.cursor() as cur:
            try:
                cur.execute(
                    "INSERT INTO reviews (id, author, course, rating, body) VALUES (%s, %s, %s, %s, %s)",
                    (review["id"], review["author"], review["course"], review["rating"], review["body"]),
                )
                conn.commit()
            except self.app.dbapi.integrity_error as exc:
                conn.rollback()
                if not self.app.dbapi.is_duplicate(exc):
                    raise DatabaseDown(f"insert: {exc.args[0]}") from None
                # A client retrying a write whose answer it never got: same content → the same success.
                cur.execute("SELECT author, course, rating, body FROM reviews WHERE id = %s", (review["id"],))
                row = cur.fetchone()
                if row is not None and tuple(row) == tuple(review[f] for f in REVIEW_FIELDS):
                    self.send_json(200, {"id": review["id"], "status": "exists"})
                else:
                    self.send_json(409, {"error": "a different review has this id"})
                return
        self.send_json(201, {"id": review["id"], "status": "created"})

    def get_review(self, review_id: str) -> None:
        if not SAFE_NAME.match(review_id):
            self.send_json(404, {"error": "not found"})
            return
        with self.app.db() as conn, self.app.dbapi.dict_cursor(conn) as cur:
            cur.execute("SELECT id, author, course, rating, body, created_at FROM reviews WHERE id = %s", (review_id,))
            row = cur.fetchone()
        if row is None:
            self.send_json(404, {"error": "not found"})
            return
        self.send_json(200, review_json(row))

    def list_reviews(self, query: dict[str, list[str]]) -> None:
        raw = query.get("limit", ["20"])[0]
        limit = min(max(int(raw), 1), 500) if raw.isdigit() else 20
        with self.app.db() as conn, self.app.dbapi.dict_cursor(conn) as cur:
            cur.execute(
                "SELECT id, author, course, rating, body, created_at FROM reviews ORDER BY created_at DESC LIMIT %s",
                (limit,),
            )
            rows = cur.fetchall()
        self.send_json(200, {"reviews": [review_json(row) for row in rows]})

    def put_upload(self, name: str) -> None:
        if not SAFE_NAME.match(name) or name.endswith(UPLOAD_TMP_SUFFIX):
            self.send_json(400, {"error": "bad upload name"})
            return
        length = self.content_length(MAX_UPLOAD_BYTES)
        if length is None:
            self.send_json(411, {"error": "a Content-Length of at most 16 MiB is required"})
            return
        data = self.read_body(length)
        digest = hashlib.sha256(data).hexdigest()
        # Connect first: with the database down nothing is written to disk either.
        with self.app.db() as conn, conn.cursor() as cur:
            write_file_atomically(self.app.host.uploads / name, data)
            inserted = self.app.dbapi.upsert_upload(cur, name, len(data), digest)
            conn.commit()
        self.send_json(201 if inserted else 200, {"name": name, "size": len(data), "sha256": digest})

    def delete_upload(self, name: str) -> None:
        """The row first, then the file, both before the answer: an acknowledged delete is gone from disk and
        database. Deleting a name already gone succeeds (a client retrying a delete whose answer it lost)."""
        if not SAFE_NAME.match(name) or name.endswith(UPLOAD_TMP_SUFFIX):
            self.send_json(400, {"error": "bad upload name"})
            return
        with self.app.db() as conn, conn.cursor() as cur:
            cur.execute("DELETE FROM uploads WHERE name = %s", (name,))
            (self.app.host.uploads / name).unlink(missing_ok=True)
            conn.commit()
        self.send_json(200, {"name": name, "status": "deleted"})

    def get_upload(self, name: str) -> None:
        if not SAFE_NAME.match(name) or name.endswith(UPLOAD_TMP_SUFFIX):
            self.send_json(404, {"error": "not found"})
            return
        try:
            data = (self.app.host.uploads / name).read_bytes()
        except FileNotFoundError:
            self.send_json(404, {"error": "not found"})
            return
        self.send(200, data, "application/octet-stream")


def parse_review(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """The review in a POST body, or None and why it is refused."""
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None, "body is not JSON"
    if not isinstance(obj, dict):
        return None, "body must be a JSON object"
    review_id = obj.get("id")
    if not isinstance(review_id, str) or not SAFE_NAME.match(review_id) or len(review_id) > 64:
        return None, "id must be 1-64 characters of [A-Za-z0-9._-]"
    for text_field, limit in (("author", 100), ("course", 100), ("body", 60000)):
        value = obj.get(text_field)
        if not isinstance(value, str) or len(value) > limit:
            return None, f"{text_field} must be a string of at most {limit} characters"
    rating = obj.get("rating")
    if not isinstance(rating, int) or isinstance(rating, bool) or not 1 <= rating <= 5:
        return None, "rating must be an integer from 1 to 5"
    return {"id": review_id, **{f: obj[f] for f in REVIEW_FIELDS}}, ""


def review_json(row: dict[str, Any]) -> dict[str, Any]:
    created = row.get("created_at")
    return {
        "id": row["id"],
        "author": row["author"],
        "course": row["course"],
        "rating": row["rating"],
        "body": row["body"],
        "created_at": created.isoformat() if isinstance(created, datetime) else created,
        "sha256": review_digest(row["author"], row["course"], row["rating"], row["body"]),
    }


def write_file_atomically(path: Path, data: bytes) -> None:
    """tmp + fsync + rename + fsync of the directory: readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}{UPLOAD_TMP_SUFFIX}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class AppServer(ThreadingHTTPServer):
    allow_reuse_address = True
    # On shutdown, wait for requests in flight (each is bounded by the database timeouts) before exiting.
    daemon_threads = False
    block_on_close = True
    request_queue_size = 128


def make_server(state: LabState, host: HostState, password: str) -> tuple[AppServer, App]:
    app = App(state, host, password)
    handler = type("BoundHandler", (Handler,), {"app": app})
    server = AppServer((host.address, host.app_listen_port), handler)
    return server, app


def write_pid_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{os.getpid()}\n")
    os.replace(tmp, path)


def remove_own_pid_file(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.read_text().strip() == str(os.getpid()):
            path.unlink()


def serve(state: LabState, host_name: str) -> None:
    """Serve until SIGTERM/SIGINT; the pid file (HostState.app_pid_file) lives as long as the server."""
    host = state.host(host_name)
    password = state.secrets()[state.app_password_env]
    host.uploads.mkdir(parents=True, exist_ok=True)
    host.app_dir.mkdir(parents=True, exist_ok=True)
    server, app = make_server(state, host, password)

    def stop(signum: int, _frame: Any) -> None:
        # shutdown() waits for serve_forever to return, so it must not run on the thread that is serving.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    write_pid_file(host.app_pid_file)
    print(f"course-reviews ({host.name}) serving on http://{host.address}:{host.app_listen_port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        app.access_log.close()
        remove_own_pid_file(host.app_pid_file)
    print(f"course-reviews ({host.name}) stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m migrate_lab.app", description="The lab's demo app.")
    parser.add_argument("--lab", default=".lab", help="the lab directory (default: .lab)")
    parser.add_argument("--host", choices=["source", "target"], required=True)
    args = parser.parse_args(argv)
    serve(LabState.load(args.lab), args.host)
    return 0


if __name__ == "__main__":
    sys.exit(main())
