"""The lab's load generator: clients that find the service through DNS and write, upload and read during a move.

    python -m migrate_lab.load --lab DIR --duration 60 --rate 20 --clients 4 --dns-ttl 5 --upload-every 5

Each client behaves like a real one during a migration:
- it resolves www.<zone> by asking the Cloudflare API double (zones, then A records) and caches the answer
  for dns_ttl seconds; the first expiry of each client is staggered, so after a DNS flip some clients keep
  talking to the old server for a while, as real resolvers do;
- it posts reviews with unique ids, uploads a small file every `upload_every` reviews (with `overwrite_every`,
  every Nth upload also rewrites the one before; with `delete_every`, every Nth also deletes the one before that:
  uploads change and disappear, not only appear), and reads back its last acknowledged review in between, at its
  share of the total rate (`rate` counts every request of every client: half reviews, half reads, uploads on top);
- a write that is not acknowledged (503, refused, timeout) is retried with the same id until it is
  acknowledged or the run ends, re-resolving only when its cache expires.

Every ACKNOWLEDGED write is one JSON line in <out>/acks.jsonl (flushed per line): the list `verify` checks on
the target. Every HTTP request sent is one line in <out>/requests.jsonl (when it started, how long the client
waited, read or write, and the cause when it failed). The run's figures go to <out>/stats.json (rewritten every
few seconds, final once "finished"): besides the counts, failed requests by cause (connection refused, 503 fenced,
timeout, other) for reads and writes, and request latency p50 / p99 / max for the whole run and, given the migrate
journal, inside the window (writes blocked → DNS flip completed).
<out> defaults to the lab's load/ directory. SIGTERM/SIGINT end the run cleanly, stats written.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import importlib
import itertools
import json
import math
import os
import secrets
import signal
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from migrate_lab.app import review_digest
from migrate_lab.state import APP_LOAD_MODULES, LabState
from orchestrator.engine.events import RollbackCompleted, StepCompleted, StepSaved
from orchestrator.engine.view import JournalView
from orchestrator.plan.model import Cutover

ACKS_FILE = "acks.jsonl"
STATS_FILE = "stats.json"
REQUESTS_FILE = "requests.jsonl"
# Why a request failed, as its client saw it.
CAUSES = ("refused", "fenced", "timeout", "other")
REQUEST_KINDS = ("reads", "writes")
HTTP_TIMEOUT = 5.0
# A client waits longer than any hold of a run that keeps to its budget: the lab plan's cutover.max_write_block,
# plus the hold's margin past it and the time a rollback takes to let the held requests through to the source.
HOLD_WAIT_MARGIN = 30.0
DNS_TIMEOUT = 3.0
# Pause between retries of an unacknowledged write: fast enough to notice the target within a fraction of a
# second, slow enough not to flood a server that is refusing writes.
RETRY_DELAY = 0.1
STATS_EVERY = 2.0
RETRYABLE_CLIENT_ERRORS = (408, 429)
COURSES = ("databases-101", "networks-201", "distributed-systems", "operating-systems", "compilers")


def empty_failures() -> dict[str, dict[str, int]]:
    return {kind: dict.fromkeys(CAUSES, 0) for kind in REQUEST_KINDS}


def cause_of(reason: str) -> str:
    """A failed answer's reason (refused, fenced, timeout, http_<status>, error, ...) as one of CAUSES."""
    return reason if reason in CAUSES else "other"


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (not empty)."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def latency_figures(durations_ms: list[float]) -> dict[str, float]:
    """requests, p50_ms, p99_ms, max_ms of what clients waited (zeros when there were no requests)."""
    values = sorted(durations_ms)
    if not values:
        return {"requests": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    return {
        "requests": len(values),
        "p50_ms": round(percentile(values, 0.50), 1),
        "p99_ms": round(percentile(values, 0.99), 1),
        "max_ms": round(values[-1], 1),
    }


def journal_window(path: Path) -> dict[str, Any] | None:
    """The migration's window from its journal: writes blocked (the cut-over's writes_blocked_at) until the DNS
    flip completed; when the run never flipped, until its rollback completed (or its last event). None when the
    journal has no writes_blocked_at (or cannot be read)."""
    try:
        events = JournalView.read(path)
    except OSError:
        return None
    blocked_at: float | None = None
    for event in events:
        value = None
        if isinstance(event, StepSaved) and event.key == "writes_blocked_at":
            value = event.value
        elif isinstance(event, StepCompleted):
            value = event.result.get("writes_blocked_at")
        if isinstance(value, int | float):
            blocked_at = float(value)
            break
    if blocked_at is None:
        return None
    later = [e for e in events if e.ts >= blocked_at]
    for until, matches in (
        # The commit at the front door (writes flow through it; DNS follows), else the DNS flip.
        ("switch_traffic", lambda e: isinstance(e, StepCompleted) and e.step == "switch_traffic"),
        ("dns_flip", lambda e: isinstance(e, StepCompleted) and e.step == "dns_flip"),
        ("rollback", lambda e: isinstance(e, RollbackCompleted)),
    ):
        end = next((e for e in later if matches(e)), None)
        if end is not None:
            return {"from": round(blocked_at, 3), "to": round(end.ts, 3), "until": until}
    last = later[-1].ts if later else blocked_at
    return {"from": round(blocked_at, 3), "to": round(last, 3), "until": "last event"}


def request_figures(
    records: list[dict[str, Any]], window: dict[str, Any] | None
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]]]:
    """Failed requests by kind and cause, and latency for the run and (given a window) inside it: a request is in
    the window when it overlaps it (sent before it ended, answered after it began)."""
    failed = empty_failures()
    for record in records:
        if not record.get("ok"):
            failed[record["kind"]][cause_of(record.get("cause", "other"))] += 1
    latency = {"run": latency_figures([r["ms"] for r in records])}
    if window is not None:
        inside = [r for r in records if r["t"] <= window["to"] and r["t"] + r["ms"] / 1000 >= window["from"]]
        latency["window"] = latency_figures([r["ms"] for r in inside])
    return failed, latency


def read_requests(path: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return records
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


@dataclass
class ServerCounts:
    writes_acked: int = 0
    uploads_acked: int = 0
    write_attempts_failed: int = 0
    reads_ok: int = 0
    reads_failed: int = 0


@dataclass
class LoadStats:
    """The figures of one load run (stats.json)."""

    started_at: float = 0.0
    ended_at: float = 0.0
    duration_s: float = 0.0
    finished: bool = False
    rate: float = 0.0
    clients: int = 0
    dns_ttl: float = 0.0
    upload_every: int = 0
    writes_acked: int = 0
    uploads_acked: int = 0
    uploads_deleted: int = 0  # acknowledged deletes (also counted in writes_acked)
    write_attempts_failed: int = 0
    write_failures_by_reason: dict[str, int] = field(default_factory=dict)
    # Writes still unacknowledged when the run ended: never acknowledged, so never counted as lost.
    writes_pending_at_end: int = 0
    # How long the oldest of those had been retried when the run ended (a stall no ack ever closed).
    longest_pending_s: float = 0.0
    # Writes the server refused as invalid (4xx): given up, never acknowledged. Should stay 0.
    writes_rejected: int = 0
    reads_ok: int = 0
    reads_failed: int = 0
    # Reads that got 404 for a review this client had been told was stored: a durability failure.
    reads_missing: int = 0
    longest_write_stall_s: float = 0.0
    longest_write_stall_key: str | None = None
    longest_ack_gap_s: float = 0.0
    longest_ack_gap_from: float | None = None
    dns_resolutions: int = 0
    dns_failures: int = 0
    # How many times a client's resolved address changed (after a DNS flip: once per client).
    address_changes: int = 0
    per_server: dict[str, ServerCounts] = field(default_factory=dict)
    server_names: dict[str, str] = field(default_factory=dict)  # address → "source" / "target"
    # Requests sent that failed, by kind (reads, writes) then cause (refused, fenced, timeout, other).
    requests_failed: dict[str, dict[str, int]] = field(default_factory=lambda: empty_failures())
    # How long clients waited for each answer: {"run": {...}, "window": {...}} with requests, p50_ms, p99_ms,
    # max_ms ("window" only with a journal that has one).
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    # The migration's window, from its journal: {"from": ts, "to": ts, "until": "switch_traffic" | "dns_flip" | ...}.
    window: dict[str, Any] | None = None
    journal: str | None = None
    http_timeout: float = HTTP_TIMEOUT

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> LoadStats:
        raw = dict(raw)
        raw["per_server"] = {k: ServerCounts(**v) for k, v in raw.get("per_server", {}).items()}
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in raw.items() if k in known})


class Recorder:
    """Counters shared by every client, and the acknowledgement journal; all under one lock."""

    def __init__(self, out_dir: Path, stats: LoadStats) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir = out_dir
        self.stats = stats
        self._lock = threading.Lock()
        # A new run starts a new journal: verify checks the writes of the latest run.
        self._acks = open(out_dir / ACKS_FILE, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._requests = open(out_dir / REQUESTS_FILE, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._request_records: list[dict[str, Any]] = []
        self._ack_times: list[float] = []
        self.journal: Path | None = None

    def server(self, address: str) -> ServerCounts:
        return self.stats.per_server.setdefault(address, ServerCounts())

    def ack(self, record: dict[str, Any]) -> None:
        stall = record["ack_ts"] - record["first_attempt_ts"]
        key = record.get("id") or record.get("name")
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self._acks.write(line + "\n")
            self._acks.flush()
            self._ack_times.append(record["ack_ts"])
            counts = self.server(record["server"])
            if record["kind"] in ("upload", "media"):  # media: WordPress's uploads
                self.stats.uploads_acked += 1
                counts.uploads_acked += 1
            else:
                self.stats.writes_acked += 1
                counts.writes_acked += 1
                if record["kind"] == "upload_deleted":
                    self.stats.uploads_deleted += 1
            if stall > self.stats.longest_write_stall_s:
                self.stats.longest_write_stall_s = round(stall, 3)
                self.stats.longest_write_stall_key = key

    def request_done(self, kind: str, started: float, ms: float, answer: Answer, ok: bool) -> None:
        """One HTTP request sent and answered (or failed): what its client waited, and why it failed."""
        record: dict[str, Any] = {"t": round(started, 6), "ms": round(ms, 1), "kind": kind, "ok": ok}
        if not ok:
            record["cause"] = cause_of(answer.reason) if answer.status != 200 else "other"
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self._requests.write(line + "\n")
            self._request_records.append(record)
            if not ok:
                self.stats.requests_failed[kind][record["cause"]] += 1

    def write_failed(self, address: str | None, reason: str) -> None:
        with self._lock:
            self.stats.write_attempts_failed += 1
            by_reason = self.stats.write_failures_by_reason
            by_reason[reason] = by_reason.get(reason, 0) + 1
            if address is not None:
                self.server(address).write_attempts_failed += 1

    def read(self, address: str | None, ok: bool, missing: bool = False) -> None:
        with self._lock:
            if ok:
                self.stats.reads_ok += 1
            else:
                self.stats.reads_failed += 1
                self.stats.reads_missing += int(missing)
            if address is not None:
                counts = self.server(address)
                if ok:
                    counts.reads_ok += 1
                else:
                    counts.reads_failed += 1

    def count(self, name: str, by: int = 1) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + by)

    def write_stats(self, *, finished: bool) -> LoadStats:
        with self._lock:
            self.stats.finished = finished
            self.stats.ended_at = round(time.time(), 3)
            self.stats.duration_s = round(self.stats.ended_at - self.stats.started_at, 3)
            times = sorted(self._ack_times)
            gaps = [(b - a, a) for a, b in itertools.pairwise(times)]
            if gaps:
                gap, at = max(gaps)
                self.stats.longest_ack_gap_s = round(gap, 3)
                self.stats.longest_ack_gap_from = round(at, 3)
            window = journal_window(self.journal) if self.journal is not None else None
            self.stats.window = window
            self.stats.journal = str(self.journal) if self.journal is not None else None
            self.stats.requests_failed, self.stats.latency = request_figures(self._request_records, window)
            self._requests.flush()
            payload = json.dumps(self.stats.to_json(), indent=2)
        tmp = self.out_dir / (STATS_FILE + ".tmp")
        tmp.write_text(payload)
        os.replace(tmp, self.out_dir / STATS_FILE)
        return self.stats

    def close(self) -> None:
        with self._lock:
            self._acks.close()
            self._requests.close()


class Resolver:
    """A caching resolver of one A record, asking the Cloudflare API (the lab's authoritative DNS)."""

    def __init__(self, base_url: str, token: str, zone: str, record: str, ttl: float, first_ttl: float) -> None:
        self._base_url = base_url.rstrip("/")
        self._token = token
        self._zone = zone
        self._record = record
        self._ttl = ttl
        self._first_ttl = first_ttl
        self._zone_id: str | None = None
        self.address: str | None = None
        self._expires = 0.0

    def _get(self, path: str, query: dict[str, str]) -> list[dict[str, Any]]:
        url = f"{self._base_url}{path}?{urllib.parse.urlencode(query)}"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {self._token}"})
        with urllib.request.urlopen(request, timeout=DNS_TIMEOUT) as response:
            body = json.loads(response.read())
        if not body.get("success", False):
            raise LookupError(f"API answered success=false for {path}")
        return list(body.get("result") or [])

    def _lookup(self) -> str:
        if self._zone_id is None:
            zones = self._get("/zones", {"name": self._zone})
            if not zones:
                raise LookupError(f"zone {self._zone} not found")
            self._zone_id = str(zones[0]["id"])
        records = self._get(f"/zones/{self._zone_id}/dns_records", {"name.exact": self._record, "type": "A"})
        if not records:
            raise LookupError(f"no A record for {self._record}")
        return str(records[0]["content"])

    def resolve(self, recorder: Recorder) -> str | None:
        """The cached address, looked up again once expired; a failed lookup keeps the stale answer."""
        now = time.monotonic()
        if self.address is not None and now < self._expires:
            return self.address
        try:
            address = self._lookup()
        except (OSError, ValueError, LookupError, KeyError, http.client.HTTPException):
            recorder.count("dns_failures")
            self._expires = now + min(1.0, self._ttl) if self._ttl > 0 else now
            return self.address
        recorder.count("dns_resolutions")
        if self.address is not None and address != self.address:
            recorder.count("address_changes")
        self.address = address
        ttl = self._first_ttl if self._first_ttl >= 0 else self._ttl
        self._first_ttl = -1.0
        self._expires = now + ttl
        return address


@dataclass
class Answer:
    status: int  # 0 when no HTTP answer came (refused, reset, timeout)
    body: bytes
    reason: str  # for failures: fenced, http_<status>, refused, timeout, error


def request(
    address: str, port: int, method: str, path: str, body: bytes | None = None, *, timeout: float = HTTP_TIMEOUT
) -> Answer:
    conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if method == "POST" else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
    except ConnectionRefusedError:
        return Answer(0, b"", "refused")
    except TimeoutError:
        return Answer(0, b"", "timeout")
    except (OSError, http.client.HTTPException):
        return Answer(0, b"", "error")
    finally:
        conn.close()
    reason = f"http_{response.status}"
    if response.status == 503 and b"fenced" in data:
        reason = "fenced"
    return Answer(response.status, data, reason)


def timed_request(
    address: str, port: int, method: str, path: str, body: bytes | None = None, *, timeout: float = HTTP_TIMEOUT
) -> tuple[Answer, float, float]:
    """request(), with when it was sent (unix seconds) and how long its client waited (ms)."""
    started = time.time()
    clock = time.monotonic()
    answer = request(address, port, method, path, body, timeout=timeout)
    return answer, started, (time.monotonic() - clock) * 1000


class Client:
    """One simulated user: its own resolver cache, its own sequence of writes and reads."""

    def __init__(
        self,
        index: int,
        state: LabState,
        recorder: Recorder,
        resolver: Resolver,
        *,
        run_tag: str,
        interval: float,
        clients: int,
        upload_every: int,
        deadline: float,
        stop: threading.Event,
        overwrite_every: int = 0,
        delete_every: int = 0,
        http_timeout: float = HTTP_TIMEOUT,
    ) -> None:
        self.index = index
        self.port = state.source.app_port
        self.http_timeout = http_timeout
        self.recorder = recorder
        self.resolver = resolver
        self.run_tag = run_tag
        self.interval = interval
        self.clients = clients
        self.upload_every = upload_every
        self.overwrite_every = overwrite_every
        self.delete_every = delete_every
        self.deadline = deadline
        self.stop = stop
        self.reviews_acked = 0
        self.last_acked: tuple[str, str] | None = None  # (id, sha256)
        self.pending = False
        self.pending_since = 0.0

    def over(self) -> bool:
        return self.stop.is_set() or time.monotonic() >= self.deadline

    def pause(self, seconds: float) -> None:
        self.stop.wait(max(0.0, min(seconds, self.deadline - time.monotonic())))

    def run(self) -> None:
        # Spread the clients over one interval so their requests do not arrive in bursts.
        next_at = time.monotonic() + self.interval * self.index / self.clients
        seq = 0
        while not self.over():
            self.pause(next_at - time.monotonic())
            if self.over():
                break
            if seq % 2 == 0:
                self.write_review(seq // 2)
                due_upload = self.upload_every > 0 and self.reviews_acked % self.upload_every == 0
                if due_upload and self.reviews_acked > 0 and not self.over():
                    self.write_upload(self.reviews_acked // self.upload_every)
                    self.overwrite_upload(self.reviews_acked // self.upload_every)
                    self.delete_upload(self.reviews_acked // self.upload_every)
            else:
                self.read()
            seq += 1
            next_at += self.interval
            # A client that fell behind (a long stall) resumes its pace instead of bursting to catch up.
            next_at = max(next_at, time.monotonic() - self.interval)

    def write_until_acked(self, method: str, path: str, body: bytes) -> tuple[str, float, int, Answer] | None:
        """Send one write again and again until acknowledged: (server, first attempt, attempts, answer)."""
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
            answer, started, ms = timed_request(address, self.port, method, path, body, timeout=self.http_timeout)
            self.recorder.request_done("writes", started, ms, answer, ok=answer.status in (200, 201))
            if answer.status in (200, 201):
                self.pending = False
                return address, first_attempt, attempts, answer
            self.recorder.write_failed(address, answer.reason)
            if 400 <= answer.status < 500 and answer.status not in RETRYABLE_CLIENT_ERRORS:
                # The server refused this write for what it is: sending it again cannot succeed.
                self.pending = False
                self.recorder.count("writes_rejected")
                return None
            self.pause(RETRY_DELAY)
        return None

    def write_review(self, n: int) -> None:
        review_id = f"{self.run_tag}-c{self.index}-r{n}"
        review: dict[str, Any] = {
            "id": review_id,
            "author": f"student-{self.index}",
            "course": COURSES[n % len(COURSES)],
            "rating": 1 + n % 5,
            "body": f"Review {n} by client {self.index}: clear lectures. ({secrets.token_hex(8)})",
        }
        digest = review_digest(review["author"], review["course"], review["rating"], review["body"])
        result = self.write_until_acked("POST", "/reviews", json.dumps(review).encode())
        if result is None:
            return
        self.ack(
            result,
            {
                "kind": "review",
                "id": review_id,
                "sha256": digest,
            },
        )
        self.reviews_acked += 1
        self.last_acked = (review_id, digest)

    def write_upload(self, n: int) -> None:
        name = f"{self.run_tag}-c{self.index}-u{n}.bin"
        data = os.urandom(512 + (n * 977) % 4096)
        digest = hashlib.sha256(data).hexdigest()
        result = self.write_until_acked("PUT", f"/uploads/{name}", data)
        if result is None:
            return
        address, _, _, answer = result
        with contextlib.suppress(ValueError):
            served = json.loads(answer.body).get("sha256")
            if served != digest:
                # The server stored something else than what we sent: never count that as acknowledged.
                self.recorder.write_failed(address, "bad_digest")
                return
        self.ack(
            result,
            {
                "kind": "upload",
                "name": name,
                "sha256": digest,
                "size": len(data),
            },
        )

    def ack(self, result: tuple[str, float, int, Answer], fields: dict[str, Any]) -> None:
        """One acknowledged write in the record, with what every ack carries: where, how, when."""
        address, first_attempt, attempts, answer = result
        self.recorder.ack(
            {
                **fields,
                "server": address,
                "status": answer.status,
                "attempts": attempts,
                "client": self.index,
                "first_attempt_ts": round(first_attempt, 6),
                "ack_ts": round(time.time(), 6),
            }
        )

    def overwrite_upload(self, n: int) -> None:
        """Every `overwrite_every`-th upload, rewrite the previous one with new bytes under its name: uploads change
        in place, not only grow. Each rewrite is one more upload acknowledged; `verify` checks a name's last one."""
        if self.overwrite_every > 0 and n > 1 and n % self.overwrite_every == 0 and not self.over():
            self.write_upload(n - 1)

    def delete_upload(self, n: int) -> None:
        """Every `delete_every`-th upload, delete upload n-2 (n-1 may still be rewritten by the next overwrite, n-2
        never is again): the acknowledged delete is one line in the acks, and `verify` checks the name is gone."""
        if self.delete_every <= 0 or n <= 2 or n % self.delete_every != 0 or self.over():
            return
        name = f"{self.run_tag}-c{self.index}-u{n - 2}.bin"
        result = self.write_until_acked("DELETE", f"/uploads/{name}", b"")
        if result is None:
            return
        self.ack(
            result,
            {
                "kind": "upload_deleted",
                "name": name,
            },
        )

    def read(self) -> None:
        address = self.resolver.resolve(self.recorder)
        if address is None:
            self.recorder.read(None, ok=False)
            return
        if self.last_acked is None:
            # Nothing of ours to read back yet; the health check still reads through the database.
            answer, started, ms = timed_request(address, self.port, "GET", "/healthz", timeout=self.http_timeout)
            self.recorder.request_done("reads", started, ms, answer, ok=answer.status == 200)
            self.recorder.read(address, ok=answer.status == 200)
            return
        review_id, digest = self.last_acked
        answer, started, ms = timed_request(
            address, self.port, "GET", f"/reviews/{review_id}", timeout=self.http_timeout
        )
        if answer.status == 200:
            try:
                same = json.loads(answer.body).get("sha256") == digest
            except ValueError:
                same = False
            self.recorder.request_done("reads", started, ms, answer, ok=same)
            self.recorder.read(address, ok=same, missing=not same)
        else:
            self.recorder.request_done("reads", started, ms, answer, ok=False)
            self.recorder.read(address, ok=False, missing=answer.status == 404)


def default_http_timeout(state: LabState) -> float:
    """How long a client waits for an answer unless told: longer than the lab plan's write-block budget (the front
    door holds requests that long, it does not refuse them), never less than HTTP_TIMEOUT."""
    try:
        data = YAML(typ="safe").load(state.plan_file.read_text())
        budget = float((data.get("cutover") or {}).get("max_write_block", Cutover().max_write_block))
    except (OSError, YAMLError, AttributeError, TypeError, ValueError):
        return HTTP_TIMEOUT
    return max(HTTP_TIMEOUT, budget + HOLD_WAIT_MARGIN)


def dns_record_name(state: LabState) -> str:
    """The name clients resolve: the www record of the lab's zone."""
    return next((r for r in state.records if r.startswith("www.")), f"www.{state.zone}")


def app_clients(state: LabState) -> tuple[type[Client], dict[str, Any]]:
    """The clients of the lab's app: the demo app's, or WordPress's REST clients (a lab made with --app wordpress)."""
    module = APP_LOAD_MODULES.get(state.app)
    if module is None:
        return Client, {}
    clients: tuple[type[Client], dict[str, Any]] = importlib.import_module(module).clients(state)
    return clients


def main_load(
    state: LabState,
    *,
    duration: float,
    rate: float,
    clients: int,
    dns_ttl: float,
    upload_every: int,
    out: Path | None,
    stop: threading.Event | None = None,
    overwrite_every: int = 0,
    journal: Path | None = None,
    http_timeout: float | None = None,
    delete_every: int = 0,
) -> LoadStats:
    """Run the load for `duration` seconds (or until `stop` is set); returns the final stats.

    `out` is the directory of acks.jsonl, requests.jsonl and stats.json (default: the lab's load/ directory).
    `journal`: the migrate journal of the run made under this load; its window gets its own latency figures.
    `http_timeout`: how long a client waits for an answer before it gives up (and retries a write); default:
    longer than the lab plan's cutover.max_write_block (default_http_timeout).
    Blocking; safe to call from a background thread (pass `stop` to end it early).
    """
    if rate <= 0 or clients <= 0 or duration < 0 or dns_ttl < 0:
        raise ValueError("rate and clients must be positive, duration and dns_ttl not negative")
    out_dir = out if out is not None else state.load_dir
    if http_timeout is None:
        http_timeout = default_http_timeout(state)
    stop = stop if stop is not None else threading.Event()
    token = state.secrets()[state.token_env]
    stats = LoadStats(
        started_at=round(time.time(), 3),
        rate=rate,
        clients=clients,
        dns_ttl=dns_ttl,
        upload_every=upload_every,
        http_timeout=http_timeout,
        server_names={state.source.address: "source", state.target.address: "target"},
    )
    recorder = Recorder(out_dir, stats)
    recorder.journal = journal
    run_tag = time.strftime("%H%M%S") + "-" + secrets.token_hex(3)
    deadline = time.monotonic() + duration
    record = dns_record_name(state)
    workers: list[threading.Thread] = []
    users: list[Client] = []
    client_class, client_options = app_clients(state)
    for index in range(clients):
        # Staggered first expiry: client i keeps its first answer for (i+1)/clients of the TTL.
        resolver = Resolver(
            state.cf_base_url, token, state.zone, record, dns_ttl, first_ttl=dns_ttl * (index + 1) / clients
        )
        client = client_class(
            index,
            state,
            recorder,
            resolver,
            run_tag=run_tag,
            interval=clients / rate,
            clients=clients,
            upload_every=upload_every,
            deadline=deadline,
            stop=stop,
            overwrite_every=overwrite_every,
            delete_every=delete_every,
            http_timeout=http_timeout,
            **client_options,
        )
        users.append(client)
        worker = threading.Thread(target=client.run, name=f"load-client-{index}", daemon=True)
        workers.append(worker)
        worker.start()
    try:
        next_stats = time.monotonic() + STATS_EVERY
        while any(w.is_alive() for w in workers):
            for worker in workers:
                worker.join(timeout=0.2)
            if time.monotonic() >= next_stats:
                recorder.write_stats(finished=False)
                next_stats = time.monotonic() + STATS_EVERY
            if time.monotonic() > deadline + http_timeout + 2 * DNS_TIMEOUT:
                break  # every request is bounded; this only guards against a wedged socket
    finally:
        stop.set()
        pending_since = [user.pending_since for user in users if user.pending]
        stats.writes_pending_at_end = len(pending_since)
        stats.longest_pending_s = round(time.time() - min(pending_since), 3) if pending_since else 0.0
        final = recorder.write_stats(finished=True)
        recorder.close()
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m migrate_lab.load", description="Lab load generator.")
    parser.add_argument("--lab", default=".lab", help="the lab directory (default: .lab)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds (default: 60)")
    parser.add_argument("--rate", type=float, default=20.0, help="requests/s, all clients (default: 20)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (default: 4)")
    parser.add_argument("--dns-ttl", type=float, default=5.0, help="seconds a client caches DNS (default: 5)")
    parser.add_argument("--upload-every", type=int, default=5, help="an upload every N reviews; 0: none")
    parser.add_argument("--out", type=Path, default=None, help="directory of acks.jsonl and stats.json")
    parser.add_argument(
        "--overwrite-every", type=int, default=0, help="every Nth upload rewrites the previous; 0: never"
    )
    parser.add_argument(
        "--delete-every", type=int, default=0, help="every Nth upload deletes the one before the previous; 0: never"
    )
    parser.add_argument("--journal", type=Path, default=None, help="migrate journal: latency inside its window")
    parser.add_argument(
        "--http-timeout",
        type=float,
        default=None,
        help="seconds a client waits (default: the lab plan's cutover.max_write_block + 30 s)",
    )
    args = parser.parse_args(argv)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stats = main_load(
        LabState.load(args.lab),
        duration=args.duration,
        rate=args.rate,
        clients=args.clients,
        dns_ttl=args.dns_ttl,
        upload_every=args.upload_every,
        out=args.out,
        stop=stop,
        overwrite_every=args.overwrite_every,
        journal=args.journal,
        http_timeout=args.http_timeout,
        delete_every=args.delete_every,
    )
    print(summary(stats))
    return 0


def summary(stats: LoadStats) -> str:
    servers = ", ".join(
        f"{address}: {c.writes_acked} writes, {c.uploads_acked} uploads, {c.reads_ok} reads"
        for address, c in sorted(stats.per_server.items())
    )
    return (
        f"load: {stats.duration_s:.1f}s, {stats.writes_acked} writes and {stats.uploads_acked} uploads"
        f" acknowledged, {stats.write_attempts_failed} write attempts failed,"
        f" {stats.writes_pending_at_end} pending at the end (oldest {stats.longest_pending_s:.2f}s);"
        f" reads {stats.reads_ok} ok / {stats.reads_failed} failed ({stats.reads_missing} missing);"
        f" longest write stall {stats.longest_write_stall_s:.2f}s, longest gap between acks"
        f" {stats.longest_ack_gap_s:.2f}s; per server: {servers or 'none'}\n"
        + "\n".join(request_lines(stats.requests_failed, stats.latency, stats.window))
    )


def failures_line(kind: str, failed: dict[str, int]) -> str:
    total = sum(failed.values())
    causes = ", ".join(f"{failed.get(cause, 0)} {cause}" for cause in CAUSES)
    return f"{kind} failed: {total} ({causes})"


def latency_line(label: str, figures: dict[str, float]) -> str:
    return (
        f"latency {label}: p50 {figures['p50_ms']:.0f} ms, p99 {figures['p99_ms']:.0f} ms,"
        f" max {figures['max_ms']:.0f} ms over {int(figures['requests'])} requests"
    )


def request_lines(
    failed: dict[str, dict[str, int]], latency: dict[str, dict[str, float]], window: dict[str, Any] | None
) -> list[str]:
    """Failed requests by cause and latency, as `lab load` and `lab verify` print them."""
    lines = [failures_line(kind, failed.get(kind, {})) for kind in REQUEST_KINDS]
    if "run" in latency:
        lines.append(latency_line("during the run", latency["run"]))
    if window is not None and "window" in latency:
        span = window["to"] - window["from"]
        label = f"inside the window ({span:.2f} s, writes blocked → {window['until']})"
        lines.append(latency_line(label, latency["window"]))
    return lines


if __name__ == "__main__":
    sys.exit(main())
