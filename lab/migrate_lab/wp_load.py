"""The load generator's WordPress clients (`lab load` on a lab made with `--app wordpress`).

Each client behaves like the lab's other clients (DNS through the Cloudflare double, cached; a write retried until
acknowledged; every request timed in requests.jsonl; stats.json), but speaks WordPress's own REST API with an
application password (HTTP Basic auth):
- creates a post (POST /wp-json/wp/v2/posts), then a comment on it (POST /wp-json/wp/v2/comments);
- every `upload_every` posts, uploads a media file (POST /wp-json/wp/v2/media, multipart/form-data), checks that
  WordPress stored as many bytes as it sent;
- in between, reads its last acknowledged post back (GET /wp-json/wp/v2/posts/<id>) and checks its title.
Every acknowledged id is a line in acks.jsonl: {"kind": "post", "id", "title"}, {"kind": "comment", "id", "post",
"sha256"}, {"kind": "media", "id", "file" (relative to the uploads tree), "sha256", "size"}.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import secrets
import time
from typing import Any

from migrate_lab import load, wordpress
from migrate_lab.load import RETRY_DELAY, RETRYABLE_CLIENT_ERRORS, Answer
from migrate_lab.state import LabState

API = "/wp-json/wp/v2"
UPLOADS_PREFIX = "/wp-content/uploads/"


def request(
    address: str,
    port: int,
    method: str,
    path: str,
    *,
    auth: str,
    body: bytes | None = None,
    content_type: str | None = None,
    timeout: float,
) -> tuple[Answer, float, float]:
    """One HTTP request with the client's Basic auth: (answer, when it was sent, how long the client waited in ms)."""
    started = time.time()
    clock = time.monotonic()
    headers = {"Authorization": f"Basic {auth}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        reason = f"http_{response.status}"
        if response.status == 503 and b"fenced" in data:
            reason = "fenced"
        answer = Answer(response.status, data, reason)
    except ConnectionRefusedError:
        answer = Answer(0, b"", "refused")
    except TimeoutError:
        answer = Answer(0, b"", "timeout")
    except (OSError, http.client.HTTPException):
        answer = Answer(0, b"", "error")
    finally:
        conn.close()
    return answer, started, (time.monotonic() - clock) * 1000


def multipart(field: str, filename: str, data: bytes, mime: str) -> tuple[bytes, str]:
    """A multipart/form-data body with one file: (body, its Content-Type header)."""
    boundary = "migrate-lab-" + secrets.token_hex(12)
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
        f"Content-Type: {mime}\r\n\r\n"
    ).encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def comment_digest(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


class WpClient(load.Client):
    """One simulated WordPress author: posts, comments, media, and reads back, through the REST API."""

    def __init__(self, *args: Any, auth: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.auth = auth
        self.posts_acked = 0
        self.last_post: tuple[int, str] | None = None  # (id, title)

    def run(self) -> None:
        next_at = time.monotonic() + self.interval * self.index / self.clients
        seq = 0
        while not self.over():
            self.pause(next_at - time.monotonic())
            if self.over():
                break
            if seq % 2 == 0:
                self.write_post(seq // 2)
                if self.last_post is not None and not self.over():
                    self.write_comment(self.last_post[0], seq // 2)
                due = self.upload_every > 0 and self.posts_acked > 0 and self.posts_acked % self.upload_every == 0
                if due and not self.over():
                    self.write_media(self.posts_acked // self.upload_every)
            else:
                self.read()
            seq += 1
            next_at += self.interval
            next_at = max(next_at, time.monotonic() - self.interval)

    def send_until_acked(
        self, path: str, body: bytes, content_type: str
    ) -> tuple[str, float, int, Answer, dict[str, Any]] | None:
        """POST one write again and again until WordPress acknowledges it (201 with an id)."""
        first_attempt = time.time()
        attempts = 0
        self.pending = True
        self.pending_since = first_attempt
        while not self.over():
            address = self.resolver.resolve(self.recorder)
            if address is None:
                self.recorder.write_failed(None, "unresolved")
                self.pause(RETRY_DELAY * 5)
                continue
            attempts += 1
            answer, started, ms = request(
                address, self.port, "POST", path, auth=self.auth, body=body, content_type=content_type,
                timeout=self.http_timeout,
            )  # fmt: skip
            created: dict[str, Any] = {}
            if answer.status == 201:
                try:
                    created = json.loads(answer.body)
                except ValueError:
                    created = {}
            ok = answer.status == 201 and isinstance(created.get("id"), int)
            self.recorder.request_done("writes", started, ms, answer, ok=ok)
            if ok:
                self.pending = False
                return address, first_attempt, attempts, answer, created
            self.recorder.write_failed(address, answer.reason if answer.status != 201 else "bad_answer")
            if 400 <= answer.status < 500 and answer.status not in RETRYABLE_CLIENT_ERRORS:
                self.pending = False
                self.recorder.count("writes_rejected")
                return None
            self.pause(RETRY_DELAY)
        return None

    def _ack(self, result: tuple[str, float, int, Answer, dict[str, Any]], fields: dict[str, Any]) -> None:
        address, first_attempt, attempts, answer, _ = result
        self.ack((address, first_attempt, attempts, answer), fields)

    def write_post(self, n: int) -> None:
        title = f"{self.run_tag}-c{self.index}-p{n}"
        post = {"title": title, "content": f"Post {n} by client {self.index}. ({secrets.token_hex(8)})"}
        body = json.dumps({**post, "status": "publish"}).encode()
        result = self.send_until_acked(f"{API}/posts?_fields=id", body, "application/json")
        if result is None:
            return
        post_id = int(result[4]["id"])
        self._ack(result, {"kind": "post", "id": post_id, "title": title})
        self.posts_acked += 1
        self.last_post = (post_id, title)

    def write_comment(self, post_id: int, n: int) -> None:
        content = f"Comment {n} by client {self.index} ({self.run_tag}, {secrets.token_hex(8)})"
        body = json.dumps({"post": post_id, "content": content}).encode()
        result = self.send_until_acked(f"{API}/comments?_fields=id", body, "application/json")
        if result is None:
            return
        comment_id = int(result[4]["id"])
        self._ack(result, {"kind": "comment", "id": comment_id, "post": post_id, "sha256": comment_digest(content)})

    def write_media(self, n: int) -> None:
        name = f"{self.run_tag}-c{self.index}-m{n}.txt"
        data = (secrets.token_hex(256 + (n * 977) % 2048) + "\n").encode()
        body, content_type = multipart("file", name, data, "text/plain")
        result = self.send_until_acked(f"{API}/media?_fields=id,source_url,media_details", body, content_type)
        if result is None:
            return
        created = result[4]
        url = str(created.get("source_url") or "")
        size = (created.get("media_details") or {}).get("filesize")
        if UPLOADS_PREFIX not in url or size != len(data):
            # WordPress stored something else than what was sent: never count that as acknowledged.
            self.recorder.write_failed(result[0], "bad_media")
            return
        relative = url.split(UPLOADS_PREFIX, 1)[1]
        self._ack(
            result,
            {
                "kind": "media",
                "id": int(created["id"]),
                "file": relative,
                "url_path": UPLOADS_PREFIX + relative,
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
            },
        )

    def read(self) -> None:
        address = self.resolver.resolve(self.recorder)
        if address is None:
            self.recorder.read(None, ok=False)
            return
        if self.last_post is None:
            answer, started, ms = request(
                address, self.port, "GET", "/wp-json/?_fields=name", auth=self.auth, timeout=self.http_timeout
            )
            self.recorder.request_done("reads", started, ms, answer, ok=answer.status == 200)
            self.recorder.read(address, ok=answer.status == 200)
            return
        post_id, title = self.last_post
        answer, started, ms = request(
            address, self.port, "GET", f"{API}/posts/{post_id}?_fields=id,title&context=edit", auth=self.auth,
            timeout=self.http_timeout,
        )  # fmt: skip
        same = False
        if answer.status == 200:
            try:
                same = json.loads(answer.body)["title"]["raw"] == title
            except (ValueError, KeyError, TypeError):
                same = False
        self.recorder.request_done("reads", started, ms, answer, ok=same)
        self.recorder.read(address, ok=same, missing=answer.status == 404 or (answer.status == 200 and not same))


def clients(state: LabState) -> tuple[type[WpClient], dict[str, Any]]:
    """The lab's load clients for a WordPress lab (lab/migrate_lab/load.py looks this module up by the lab's app)."""
    return WpClient, client_options(state)


def client_options(state: LabState) -> dict[str, Any]:
    """What main_load passes to every WordPress client: the Basic auth of the lab's application password."""
    user, password = wordpress.credentials(state)
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}
