"""A stateful double of the part of Cloudflare's API v4 that `migrate` uses, for the lab and the tests.

It speaks the v4 envelope ({success, errors, messages, result, result_info}) over plain HTTP on a loopback
address, so the official `cloudflare` SDK can be pointed at it with `base_url=http://HOST:PORT/client/v4`:

    GET    /client/v4/zones?name=...&page=&per_page=           zone lookup
    GET    /client/v4/zones/{zone_id}
    GET    /client/v4/zones/{zone_id}/dns_records               filters: name[.exact|.contains|.startswith|
                                                                .endswith], type, content[.…], proxied;
                                                                page/per_page, order/direction
    POST   /client/v4/zones/{zone_id}/dns_records               create
    GET    /client/v4/zones/{zone_id}/dns_records/{id}
    PATCH  /client/v4/zones/{zone_id}/dns_records/{id}          edit: partial
    PUT    /client/v4/zones/{zone_id}/dns_records/{id}          update: full (name, type, content, ttl required)
    DELETE /client/v4/zones/{zone_id}/dns_records/{id}
    POST   /client/v4/zones/{zone_id}/dns_records/batch         deletes, patches, puts, posts: applied in that
                                                                order, all or nothing
    GET    /client/v4/user/tokens/verify                      a user-owned token: active; an account's: 401
    GET    /client/v4/accounts/{account_id}/tokens/verify     an account-owned token of that account: active

What it does not implement it refuses, in Cloudflare's 400 error shape, instead of ignoring: a query parameter or
a body field it does not know (a list filter such as `tag`, `comment`, `search`, `match=any`), so a client that
relies on one fails in the lab instead of passing there and selecting other records in production.

Authentication is a bearer token (read from <dir>/token, mode 0600, or from CLOUDFLARE_API_TOKEN; never from the
command line). Legacy X-Auth-Email/X-Auth-Key headers are refused with 403, the way an unknown global key is.

Outside /client/v4 a control surface lets tests and the lab inject faults while it runs and read what happened:

    POST   /__lab/latency   {"seconds": s}: every API answer waits that long first (also `--latency` at start)
    GET    /__lab/latency
    POST   /__lab/token     {"owner": "user"|"account", "edit": true|false}: who owns the token (an account's is
                             unknown to /user/tokens/verify, as at Cloudflare) and whether it may edit DNS records
                             (a read-only token's writes answer 403 code 10000, as Cloudflare's do)
    POST   /__lab/faults    {"mode": "429"|"5xx"|"slow"|"success_false"|"invalid_token"|"reset"|"html"|"none",
                             "count": N (-1: until cleared), "methods": ["PATCH", ...] (absent: all),
                             "path_contains": "...", "delay": s, "retry_after": s, "status": 5xx}; "html" answers
                             an HTML page (Cloudflare's edge) with that status, 200 included
    GET    /__lab/faults
    GET    /__lab/state     zones, records, the request log (method, path, status, fault) and counts
    DELETE /__lab/requests  clears the request log

State (zones and records) lives in <dir>/state.json, rewritten atomically on every change, so it survives a
restart; faults and the request log are in memory only.

Process management for the lab: `start(state)`, `stop(state)`, `is_running(state)`.
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from migrate_lab.state import LabState

API_PREFIX = "/client/v4"
CONTROL_PREFIX = "/__lab"
STATE_FILE = "state.json"
TOKEN_FILE = "token"
PID_FILE = "cfapi.pid"
LOG_FILE = "cfapi.log"
TOKEN_ENV = "CLOUDFLARE_API_TOKEN"
MODULE = "migrate_lab.cfapi"

RECORD_TYPES = {
    "A", "AAAA", "CAA", "CERT", "CNAME", "DNSKEY", "DS", "HTTPS", "LOC", "MX", "NAPTR", "NS", "OPENPGPKEY",
    "PTR", "SMIMEA", "SRV", "SSHFP", "SVCB", "TLSA", "TXT", "URI",
}  # fmt: skip
PROXIABLE_TYPES = {"A", "AAAA", "CNAME"}
EDITABLE_FIELDS = {"name", "type", "content", "ttl", "proxied", "comment", "tags", "settings", "priority", "data"}
TEXT_FILTERS = ("", ".exact", ".contains", ".startswith", ".endswith")
# The query parameters each list implements; any other is refused (400), never ignored.
ZONE_LIST_QUERY = {"name", "status", "page", "per_page"}
RECORD_LIST_QUERY = {
    *(f"name{op}" for op in TEXT_FILTERS),
    *(f"content{op}" for op in TEXT_FILTERS),
    "type", "proxied", "page", "per_page", "order", "direction", "match",
}  # fmt: skip
BATCH_KEYS = ("deletes", "patches", "puts", "posts")  # Cloudflare applies them in this order
# Cloudflare's codes as the double answers them: a query parameter, a request body it will not take.
BAD_QUERY_CODE = 1004
BAD_BODY_CODE = 9207
MAX_LATENCY_SECONDS = 600.0
FAULT_MODES = {"none", "429", "5xx", "slow", "success_false", "invalid_token", "reset", "html"}
DEFAULT_RECORDS_PER_PAGE = 100
MAX_RECORDS_PER_PAGE = 5000
DEFAULT_ZONES_PER_PAGE = 20
MAX_ZONES_PER_PAGE = 50
REQUEST_LOG_LIMIT = 10_000


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _new_id() -> str:
    return uuid.uuid4().hex


class ApiError(Exception):
    """An answer in the v4 error format: HTTP status plus Cloudflare error codes."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _not_found(what: str) -> ApiError:
    # Cloudflare's own codes: 7003 for an unknown zone in the path, 81044 for an unknown record.
    if what == "record":
        return ApiError(404, 81044, "Record does not exist.")
    return ApiError(404, 7003, "Could not route to /zones, perhaps your object identifier is invalid?")


# --------------------------------------------------------------------------------------------------- the store


class Store:
    """Zones and records, persisted to a JSON file after every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.zones: dict[str, dict[str, Any]] = {}
        self.records: dict[str, dict[str, Any]] = {}
        self._in_batch = False
        if path.exists():
            raw = json.loads(path.read_text())
            self.zones = raw.get("zones", {})
            self.records = raw.get("records", {})

    def save(self) -> None:
        with self.lock:
            if self._in_batch:
                return  # written once, when the whole batch has been applied
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"zones": self.zones, "records": self.records}, indent=1))
            os.replace(tmp, self.path)

    def zone_by_name(self, name: str) -> dict[str, Any] | None:
        for zone in self.zones.values():
            if zone["name"] == name.lower():
                return zone
        return None

    def add_zone(self, name: str) -> dict[str, Any]:
        with self.lock:
            existing = self.zone_by_name(name)
            if existing is not None:
                return existing
            now = _now()
            zone = {
                "id": _new_id(),
                "name": name.lower(),
                "account": {"id": "0" * 32, "name": "lab"},
                "activated_on": now,
                "created_on": now,
                "modified_on": now,
                "development_mode": 0,
                "meta": {
                    "cdn_only": False,
                    "dns_only": False,
                    "foundation_dns": False,
                    "page_rule_quota": 3,
                    "phishing_detected": False,
                    "step": 2,
                    "custom_certificate_quota": 0,
                },
                "name_servers": ["ada.ns.cloudflare.com", "bob.ns.cloudflare.com"],
                "original_dnshost": None,
                "original_name_servers": None,
                "original_registrar": None,
                "owner": {"id": None, "name": None, "type": "user"},
                "plan": {
                    "id": "0feeeeeeeeeeeeeeeeeeeeeeeeeeeeee",
                    "name": "Free Website",
                    "price": 0,
                    "currency": "USD",
                    "frequency": "",
                    "is_subscribed": False,
                    "can_subscribe": False,
                    "legacy_id": "free",
                    "legacy_discount": False,
                    "externally_managed": False,
                },
                "paused": False,
                "permissions": ["#dns_records:edit", "#dns_records:read", "#zone:read"],
                "status": "active",
                "type": "full",
            }
            self.zones[str(zone["id"])] = zone
            self.save()
            return zone

    def zone(self, zone_id: str) -> dict[str, Any]:
        zone = self.zones.get(zone_id)
        if zone is None:
            raise _not_found("zone")
        return zone

    def record(self, zone_id: str, record_id: str) -> dict[str, Any]:
        self.zone(zone_id)
        record = self.records.get(record_id)
        if record is None or record["zone_id"] != zone_id:
            raise _not_found("record")
        return record

    def zone_records(self, zone_id: str) -> list[dict[str, Any]]:
        self.zone(zone_id)
        return [r for r in self.records.values() if r["zone_id"] == zone_id]

    def create_record(self, zone_id: str, fields: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            zone = self.zone(zone_id)
            values = _validated(zone, fields, required=("name", "type", "content"))
            values["content"] = stored_content(values["type"], values["content"])
            values.setdefault("ttl", 1)
            values.setdefault("proxied", False)
            self._refuse_duplicate(zone_id, values, except_id=None)
            now = _now()
            record = {
                "id": _new_id(),
                "zone_id": zone_id,
                "zone_name": zone["name"],
                "comment": None,
                "tags": [],
                "settings": {},
                "meta": {},
                "created_on": now,
                "modified_on": now,
                **values,
                "proxiable": values["type"] in PROXIABLE_TYPES,
            }
            self.records[record["id"]] = record
            self.save()
            return record

    def change_record(self, zone_id: str, record_id: str, fields: dict[str, Any], *, full: bool) -> dict[str, Any]:
        """PATCH (full=False) changes the given fields; PUT (full=True) replaces the record's editable fields."""
        with self.lock:
            zone = self.zone(zone_id)
            record = self.record(zone_id, record_id)
            if full:
                values = _validated(zone, fields, required=("name", "type", "content", "ttl"))
                values.setdefault("proxied", False)
                values.setdefault("comment", None)
                values.setdefault("tags", [])
                values.setdefault("settings", {})
            else:
                values = _validated(zone, fields, required=())
            if "content" in values:
                values["content"] = stored_content(values.get("type") or record["type"], values["content"])
            merged = {**record, **values}
            self._refuse_duplicate(zone_id, merged, except_id=record_id)
            changed = any(record.get(key) != value for key, value in values.items())
            record.update(values)
            record["proxiable"] = record["type"] in PROXIABLE_TYPES
            if changed:
                record["modified_on"] = _now()
            self.save()
            return record

    def delete_record(self, zone_id: str, record_id: str) -> dict[str, Any]:
        with self.lock:
            self.record(zone_id, record_id)
            del self.records[record_id]
            self.save()
            return {"id": record_id}

    def batch(self, zone_id: str, body: Any) -> dict[str, list[dict[str, Any]]]:
        """POST /dns_records/batch: deletes, then patches, then puts, then posts, in one transaction: the first
        operation refused leaves every record as it was, and nothing is written."""
        if not isinstance(body, dict):
            raise ApiError(400, BAD_BODY_CODE, "Request body is invalid.")
        _only_fields(body, set(BATCH_KEYS), "a batch")
        operations: dict[str, list[Any]] = {}
        for key in BATCH_KEYS:
            items = body.get(key) or []
            if not isinstance(items, list):
                raise ApiError(400, BAD_BODY_CODE, f"{key} must be a list.")
            operations[key] = items
        with self.lock:
            zone = self.zone(zone_id)
            before = copy.deepcopy(self.records)
            self._in_batch = True
            try:
                done: dict[str, list[dict[str, Any]]] = {key: [] for key in BATCH_KEYS}
                for key in BATCH_KEYS:
                    for index, item in enumerate(operations[key]):
                        try:
                            done[key].append(copy.deepcopy(self._batch_one(zone, key, item)))
                        except ApiError as exc:
                            raise ApiError(exc.status, exc.code, f"{key}[{index}]: {exc.message}") from None
            except BaseException:
                self.records = before
                raise
            finally:
                self._in_batch = False
            self.save()
            return done

    def _batch_one(self, zone: dict[str, Any], key: str, item: Any) -> dict[str, Any]:
        if not isinstance(item, dict):
            raise ApiError(400, BAD_BODY_CODE, "Request body is invalid.")
        if key == "posts":
            _check_body_content(item)
            return self.create_record(zone["id"], item)
        record_id = item.get("id")
        if not isinstance(record_id, str) or not record_id:
            raise ApiError(400, BAD_BODY_CODE, "an id is required")
        if key == "deletes":
            _only_fields(item, {"id"}, "a batch delete")
            record = copy.deepcopy(self.record(zone["id"], record_id))
            self.delete_record(zone["id"], record_id)
            return record
        fields = {k: v for k, v in item.items() if k != "id"}
        if key == "patches":
            if isinstance(fields.get("content"), str):
                _check_content(fields.get("type") or self.record(zone["id"], record_id)["type"], fields["content"])
        else:
            _check_body_content(fields)
        return self.change_record(zone["id"], record_id, fields, full=key == "puts")

    def _refuse_duplicate(self, zone_id: str, values: dict[str, Any], except_id: str | None) -> None:
        for other in self.zone_records(zone_id):
            if other["id"] == except_id:
                continue
            if (other["name"], other["type"], str(other["content"]).lower()) == (
                values["name"],
                values["type"],
                str(values["content"]).lower(),
            ):
                raise ApiError(400, 81058, "An identical record already exists.")


def _validated(zone: dict[str, Any], fields: Any, required: tuple[str, ...]) -> dict[str, Any]:
    """Check a record body the way the API does; returns the normalized editable fields."""
    if not isinstance(fields, dict):
        raise ApiError(400, 9207, "Request body is invalid.")
    _only_fields(fields, EDITABLE_FIELDS, "a DNS record")
    missing = [name for name in required if fields.get(name) in (None, "")]
    if missing:
        raise ApiError(400, 9005 if "content" in missing else 9000, f"DNS record is missing {', '.join(missing)}")
    values = {key: value for key, value in fields.items() if key in EDITABLE_FIELDS}
    if "type" in values and values["type"] not in RECORD_TYPES:
        raise ApiError(400, 9007, f"Invalid DNS record type {values['type']!r}")
    if "name" in values:
        values["name"] = _full_name(zone["name"], values["name"])
    if "ttl" in values:
        ttl = values["ttl"]
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or int(ttl) != ttl:
            raise ApiError(400, 9021, "Invalid TTL. Must be between 60 and 86400 seconds, or 1 for Automatic.")
        if not (ttl == 1 or 30 <= ttl <= 86400):
            raise ApiError(400, 9021, "Invalid TTL. Must be between 60 and 86400 seconds, or 1 for Automatic.")
        values["ttl"] = int(ttl)
    if "proxied" in values and not isinstance(values["proxied"], bool):
        raise ApiError(400, 9003, "Invalid 'proxied' value, must be a boolean")
    if "content" in values and not isinstance(values["content"], str):
        raise ApiError(400, 9005, "Content must be a string.")

    if "comment" in values and values["comment"] is not None and not isinstance(values["comment"], str):
        raise ApiError(400, 9207, "Comment must be a string.")
    if "tags" in values and not isinstance(values["tags"], list):
        raise ApiError(400, 9207, "Tags must be a list.")
    if "settings" in values and not isinstance(values["settings"], dict):
        raise ApiError(400, 9207, "Settings must be an object.")
    return values


def _only_fields(body: dict[str, Any], known: set[str], what: str) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise ApiError(
            400, BAD_BODY_CODE, f"the lab's double does not implement the field {unknown[0]!r} of {what}: refused, "
            "not ignored"
        )  # fmt: skip


def _only_query(query: dict[str, str], known: set[str]) -> None:
    unknown = sorted(set(query) - known)
    if unknown:
        raise ApiError(
            400, BAD_QUERY_CODE, f"the lab's double does not implement the query parameter {unknown[0]!r}: refused, "
            "not ignored"
        )  # fmt: skip
    if query.get("match", "all").lower() != "all":
        # Filters combined with OR: not implemented (every filter must match, which is what `all` asks).
        raise ApiError(400, BAD_QUERY_CODE, "the lab's double implements match=all only: refused, not ignored")


def stored_content(record_type: str, content: str) -> str:
    """As Cloudflare stores what it is sent: a CNAME target lower-cased without its trailing dot, an IPv6 address in
    its compressed form (the read-back differs from the text sent)."""
    if record_type == "CNAME":
        return content.strip().lower().rstrip(".")
    if record_type == "AAAA":
        try:
            return str(ipaddress.IPv6Address(content.strip()))
        except ValueError:
            return content
    return content


def _check_content(record_type: str, content: str) -> None:
    try:
        if record_type == "A":
            ipaddress.IPv4Address(content)
        elif record_type == "AAAA":
            ipaddress.IPv6Address(content)
    except ValueError:
        kind = "IPv4" if record_type == "A" else "IPv6"
        raise ApiError(400, 9005, f"Content for {record_type} record must be a valid {kind} address.") from None
    if record_type == "CNAME" and not re.fullmatch(r"[A-Za-z0-9_.-]+", content):
        raise ApiError(400, 9007, "Content for CNAME record is invalid.")


def _full_name(zone_name: str, name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ApiError(400, 9000, "DNS name is invalid.")
    name = name.strip().lower().rstrip(".")
    if name == "@":
        return zone_name
    if name != zone_name and not name.endswith("." + zone_name):
        name = f"{name}.{zone_name}"
    if not re.fullmatch(r"[a-z0-9_*]([a-z0-9_.*-]*[a-z0-9_])?", name):
        raise ApiError(400, 9000, "DNS name is invalid.")
    return name


# --------------------------------------------------------------------------------------------------- faults


class Faults:
    """The fault switch: which requests get which wrong answer, and how many more times."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.current: dict[str, Any] = {"mode": "none"}

    def set(self, spec: Any) -> dict[str, Any]:
        if not isinstance(spec, dict) or spec.get("mode", "none") not in FAULT_MODES:
            raise ApiError(400, 9207, f"fault mode must be one of {sorted(FAULT_MODES)}")
        methods = spec.get("methods")
        if methods == "all":
            methods = None
        if methods is not None and (not isinstance(methods, list) or not all(isinstance(m, str) for m in methods)):
            raise ApiError(400, 9207, "methods must be a list of HTTP methods or 'all'")
        fault = {
            "mode": spec.get("mode", "none"),
            "count": int(spec.get("count", -1)),
            "methods": [m.upper() for m in methods] if methods else None,
            "path_contains": spec.get("path_contains"),
            "delay": float(spec.get("delay", 2.0)),
            "retry_after": spec.get("retry_after", 1),
            "status": int(spec.get("status", 503)),
        }
        with self.lock:
            self.current = fault
        return fault

    def take(self, method: str, path: str) -> dict[str, Any] | None:
        """The fault this request gets, if any, consuming one of its count."""
        with self.lock:
            fault = self.current
            if fault["mode"] == "none" or fault["count"] == 0:
                return None
            if fault["methods"] is not None and method not in fault["methods"]:
                return None
            if fault["path_contains"] and fault["path_contains"] not in path:
                return None
            if fault["count"] > 0:
                fault["count"] -= 1
            return dict(fault)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return dict(self.current)


# --------------------------------------------------------------------------------------------------- the server


class EdgePage(str):
    """An answer of Cloudflare's edge rather than of the API: HTML, sent as text/html."""


class CfApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], store: Store, token: str, latency: float = 0.0) -> None:
        super().__init__(address, CfApiHandler)
        self.store = store
        self.token = token
        self.latency = latency  # seconds every API answer waits (the latency knob)
        self.faults = Faults()
        self.token_owner = "user"  # or "account" (POST /__lab/token)
        self.token_can_edit = True
        self.log_lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []

    def log_request_entry(self, entry: dict[str, Any]) -> None:
        with self.log_lock:
            self.requests.append(entry)
            if len(self.requests) > REQUEST_LOG_LIMIT:
                del self.requests[: len(self.requests) - REQUEST_LOG_LIMIT]


class CfApiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without this, Nagle plus delayed ACKs add 40 ms to every answer.
    disable_nagle_algorithm = True
    server: CfApiServer
    server_version = "cloudflare-lab"
    sys_version = ""

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        # Paths and statuses only: request headers (where the token travels) are never logged.
        sys.stderr.write(f"{_now()} {self.address_string()} {format % args}\n")

    # --- plumbing

    def _handle(self, method: str) -> None:
        parts = urlsplit(self.path)
        path = parts.path.rstrip("/") or "/"
        query = {key: values[-1] for key, values in parse_qs(parts.query, keep_blank_values=True).items()}
        # Read the body first whatever the outcome, so a keep-alive connection stays in step.
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length) if length > 0 else b""
        if path.startswith(CONTROL_PREFIX):
            self._control(method, path, raw_body)
            return
        entry: dict[str, Any] = {
            "time": _now(),
            "method": method,
            "path": path,
            "query": parts.query,
            "status": 0,
            "fault": None,
            # Who asked (the SDK says "Cloudflare/Python …"; the load's resolvers use urllib): tests tell the
            # orchestrator's calls from the clients' lookups by it.
            "agent": (self.headers.get("User-Agent") or "")[:80],
        }
        try:
            status, body, headers = self._api(method, path, query, raw_body, entry)
        except ApiError as exc:
            status, body, headers = exc.status, _envelope_error(exc.code, exc.message), {}
        except Exception as exc:  # a bug in the double must still answer in the v4 format
            status, body, headers = 500, _envelope_error(10001, f"internal error: {type(exc).__name__}"), {}
        entry["status"] = status
        self.server.log_request_entry(entry)
        if status == 0:  # the "reset" fault: drop the connection without an answer
            self.close_connection = True
            return
        self._send(status, body, headers)

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        page = isinstance(body, EdgePage)
        data = str(body).encode() if page else json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/html" if page else "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (e.g. its timeout fired during a "slow" fault).
            self.close_connection = True

    def _authenticate(self) -> None:
        if self.headers.get("X-Auth-Key") is not None or self.headers.get("X-Auth-Email") is not None:
            # The double knows API tokens only; a global API key can never be valid here.
            raise ApiError(403, 9103, "Unknown X-Auth-Key or X-Auth-Email")
        auth = self.headers.get("Authorization") or ""
        scheme, _, presented = auth.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip() or presented.strip() != self.server.token:
            raise ApiError(401, 10000, "Authentication error")

    # --- the API

    def _api(
        self, method: str, path: str, query: dict[str, str], raw_body: bytes, entry: dict[str, Any]
    ) -> tuple[int, Any, dict[str, str]]:
        if not path.startswith(API_PREFIX + "/") and path != API_PREFIX:
            raise ApiError(404, 7000, "No route for that URI")
        latency = self.server.latency
        if latency > 0:
            time.sleep(latency)  # the API's own slowness: every answer, whatever it is, comes this much later
        fault = self.server.faults.take(method, path)
        if fault is not None:
            entry["fault"] = fault["mode"]
            answered = self._apply_fault(fault)
            if answered is not None:
                return answered
        self._authenticate()
        if fault is not None and fault["mode"] == "success_false":
            # What Cloudflare sends when an operation fails late: HTTP 200, success false, no result.
            return 200, _envelope_error(1001, "simulated failure (success: false)", result=None), {}
        body: Any = None
        if method in ("POST", "PATCH", "PUT"):
            try:
                body = json.loads(raw_body or b"null")
            except ValueError:
                raise ApiError(400, 6007, "Malformed JSON in request body") from None
        with self.server.store.lock:  # one request at a time sees and changes the store
            status, result, result_info = self._route(method, path[len(API_PREFIX) :], query, body)
        envelope: dict[str, Any] = {"success": True, "errors": [], "messages": [], "result": result}
        if result_info is not None:
            envelope["result_info"] = result_info
        return status, envelope, {}

    def _apply_fault(self, fault: dict[str, Any]) -> tuple[int, Any, dict[str, str]] | None:
        mode = fault["mode"]
        if mode == "429":
            retry_after = str(fault["retry_after"])
            return (
                429,
                _envelope_error(971, "Please wait and consider throttling your request speed"),
                {"Retry-After": retry_after},
            )
        if mode == "5xx":
            return fault["status"], _envelope_error(10001, "simulated server error"), {}
        if mode == "invalid_token":
            return 401, _envelope_error(10000, "Authentication error"), {}
        if mode == "reset":
            return 0, None, {}
        if mode == "html":
            # Cloudflare's edge in front of the API: an HTML page, not the API's JSON (502/52x, or even a 200).
            return fault["status"], EdgePage(f"<html><title>{fault['status']} Bad Gateway</title>cloudflare</html>"), {}
        if mode == "slow":
            time.sleep(fault["delay"])
        return None  # "slow" and "success_false" go on to the real handling

    def _route(
        self, method: str, path: str, query: dict[str, str], body: Any
    ) -> tuple[int, Any, dict[str, Any] | None]:
        store = self.server.store
        segments = [s for s in path.split("/") if s]
        listing = method == "GET" and (segments == ["zones"] or (len(segments) == 3 and segments[2] == "dns_records"))
        if not listing:
            _only_query(query, set())  # only the lists take query parameters
        verified = {"id": "lab" + "0" * 29, "status": "active", "expires_on": None, "not_before": None}
        if segments == ["user", "tokens", "verify"] and method == "GET":
            if self.server.token_owner != "user":
                raise ApiError(401, 1000, "Invalid API Token")
            return 200, verified, None
        if len(segments) == 4 and segments[0] == "accounts" and segments[2:] == ["tokens", "verify"]:
            accounts = {str(zone["account"]["id"]) for zone in store.zones.values()}
            if method != "GET" or self.server.token_owner != "account" or segments[1] not in accounts:
                raise ApiError(401, 1000, "Invalid API Token")
            return 200, verified, None
        if method in ("POST", "PATCH", "PUT", "DELETE") and not self.server.token_can_edit:
            # What Cloudflare answers a token without the DNS edit permission.
            raise ApiError(403, 10000, "Authentication error")
        if segments == ["zones"] and method == "GET":
            _only_query(query, ZONE_LIST_QUERY)
            zones = sorted(store.zones.values(), key=lambda z: z["name"])
            if "name" in query:
                zones = [z for z in zones if z["name"] == query["name"].lower()]
            if "status" in query:
                zones = [z for z in zones if z["status"] == query["status"]]
            return _paginate(zones, query, DEFAULT_ZONES_PER_PAGE, MAX_ZONES_PER_PAGE)
        if len(segments) == 2 and segments[0] == "zones" and method == "GET":
            return 200, store.zone(segments[1]), None
        if len(segments) == 3 and segments[0] == "zones" and segments[2] == "dns_records":
            zone_id = segments[1]
            if method == "GET":
                _only_query(query, RECORD_LIST_QUERY)
                records = _filter_records(store.zone_records(zone_id), query)
                return _paginate(records, query, DEFAULT_RECORDS_PER_PAGE, MAX_RECORDS_PER_PAGE)
            if method == "POST":
                _check_body_content(body)
                return 200, store.create_record(zone_id, body), None
        if len(segments) == 4 and segments[0] == "zones" and segments[2:] == ["dns_records", "batch"]:
            if method != "POST":
                raise ApiError(405, 10405, "Method not allowed for this route")
            return 200, store.batch(segments[1], body), None
        if len(segments) == 4 and segments[0] == "zones" and segments[2] == "dns_records":
            zone_id, record_id = segments[1], segments[3]
            if method == "GET":
                return 200, store.record(zone_id, record_id), None
            if method == "DELETE":
                return 200, store.delete_record(zone_id, record_id), None
            if method in ("PATCH", "PUT"):
                if method == "PATCH" and isinstance(body, dict) and "content" in body:
                    record_type = body.get("type") or store.record(zone_id, record_id)["type"]
                    if isinstance(body["content"], str):
                        _check_content(record_type, body["content"])
                elif isinstance(body, dict):
                    _check_body_content(body)
                return 200, store.change_record(zone_id, record_id, body, full=method == "PUT"), None
        raise ApiError(
            404 if method == "GET" else 405,
            7000 if method == "GET" else 10405,
            "No route for that URI" if method == "GET" else "Method not allowed for this route",
        )

    # --- the control surface

    def _control(self, method: str, path: str, raw_body: bytes) -> None:
        server = self.server
        if path == CONTROL_PREFIX + "/faults" and method == "POST":
            try:
                fault = server.faults.set(json.loads(raw_body or b"{}"))
            except (ValueError, TypeError) as exc:
                self._send(400, {"error": str(exc)})
                return
            except ApiError as exc:
                self._send(400, {"error": exc.message})
                return
            self._send(200, fault)
        elif path == CONTROL_PREFIX + "/latency" and method == "POST":
            try:
                server.latency = _latency_seconds(json.loads(raw_body or b"{}").get("seconds"))
            except (ValueError, TypeError, AttributeError) as exc:
                self._send(400, {"error": str(exc)})
                return
            self._send(200, {"seconds": server.latency})
        elif path == CONTROL_PREFIX + "/token" and method == "POST":
            try:
                asked = json.loads(raw_body or b"{}")
                owner, edit = asked.get("owner", "user"), asked.get("edit", True)
                if owner not in ("user", "account") or not isinstance(edit, bool):
                    raise ValueError("owner: user|account, edit: a boolean")
            except (ValueError, TypeError, AttributeError) as exc:
                self._send(400, {"error": str(exc)})
                return
            server.token_owner, server.token_can_edit = owner, edit
            self._send(200, {"owner": owner, "edit": edit})
        elif path == CONTROL_PREFIX + "/latency" and method == "GET":
            self._send(200, {"seconds": server.latency})
        elif path == CONTROL_PREFIX + "/faults" and method == "GET":
            self._send(200, server.faults.snapshot())
        elif path == CONTROL_PREFIX + "/state" and method == "GET":
            with server.log_lock:
                requests = list(server.requests)
            with server.store.lock:
                zones = list(server.store.zones.values())
                records = list(server.store.records.values())
            counts = Counter(f"{r['method']} {r['status']}" for r in requests)
            self._send(
                200,
                {
                    "pid": os.getpid(),
                    "zones": zones,
                    "records": records,
                    "requests": requests,
                    "counts": dict(counts),
                    "faults": server.faults.snapshot(),
                    "latency": server.latency,
                },
            )
        elif path == CONTROL_PREFIX + "/requests" and method == "DELETE":
            with server.log_lock:
                server.requests.clear()
            self._send(200, {"cleared": True})
        else:
            self._send(404, {"error": "unknown control endpoint"})


def _latency_seconds(value: Any) -> float:
    seconds = float(value)
    if not 0 <= seconds <= MAX_LATENCY_SECONDS:
        raise ValueError(f"latency is seconds between 0 and {MAX_LATENCY_SECONDS:g}, not {value!r}")
    return seconds


def _check_body_content(body: Any) -> None:
    if isinstance(body, dict) and isinstance(body.get("content"), str) and isinstance(body.get("type"), str):
        _check_content(body["type"], body["content"])


def _envelope_error(code: int, message: str, result: Any = None) -> dict[str, Any]:
    return {"success": False, "errors": [{"code": code, "message": message}], "messages": [], "result": result}


def _int_param(query: dict[str, str], name: str, default: int, maximum: int) -> int:
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(float(raw))
    except ValueError:
        raise ApiError(400, 1004, f"Invalid '{name}': must be a positive integer") from None
    if value < 1:
        raise ApiError(400, 1004, f"Invalid '{name}': must be a positive integer")
    return min(value, maximum)


def _paginate(
    items: list[dict[str, Any]], query: dict[str, str], default_per_page: int, max_per_page: int
) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
    page = _int_param(query, "page", 1, 10**9)
    per_page = _int_param(query, "per_page", default_per_page, max_per_page)
    start = (page - 1) * per_page
    chunk = items[start : start + per_page]  # past the last page: an empty list, which ends SDK iteration
    total = len(items)
    info = {
        "page": page,
        "per_page": per_page,
        "count": len(chunk),
        "total_count": total,
        "total_pages": (total + per_page - 1) // per_page,
    }
    return 200, chunk, info


def _text_match(value: str, query: dict[str, str], field: str) -> bool:
    value = value.lower()
    for op in ("", ".exact", ".contains", ".startswith", ".endswith"):
        wanted = query.get(field + op)
        if wanted is None:
            continue
        wanted = wanted.lower().rstrip(".") if field == "name" else wanted.lower()
        ok = {
            "": value == wanted,
            ".exact": value == wanted,
            ".contains": wanted in value,
            ".startswith": value.startswith(wanted),
            ".endswith": value.endswith(wanted),
        }[op]
        if not ok:
            return False
    return True


def _filter_records(records: list[dict[str, Any]], query: dict[str, str]) -> list[dict[str, Any]]:
    selected = [
        r for r in records
        if _text_match(r["name"], query, "name")
        and _text_match(str(r["content"]), query, "content")
        and ("type" not in query or r["type"] == query["type"].upper())
        and ("proxied" not in query or r["proxied"] == (query["proxied"].lower() == "true"))
    ]  # fmt: skip
    order = query.get("order")
    if order not in {"type", "name", "content", "ttl", "proxied"}:
        order = None
    reverse = query.get("direction") == "desc"
    # A stable order (creation, then id) keeps pages disjoint when nothing changes between two page reads.
    selected.sort(key=lambda r: (r["created_on"], r["id"]))
    if order is not None:
        selected.sort(key=lambda r: str(r[order]), reverse=reverse)
    return selected


# --------------------------------------------------------------------------------------------------- running


def read_token(cf_dir: Path) -> str:
    token_file = cf_dir / TOKEN_FILE
    token = token_file.read_text().strip() if token_file.exists() else os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise SystemExit(f"no API token: write {token_file} or set {TOKEN_ENV}")
    return token


def write_token(cf_dir: Path, token: str) -> None:
    cf_dir.mkdir(parents=True, exist_ok=True)
    path = cf_dir / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    os.chmod(path, 0o600)


def seed(cf_dir: Path, zone: str, records: list[str], content: str, ttl: int, record_type: str = "A") -> Store:
    """Make sure the zone and one record per name exist; existing state (e.g. a flipped record) is kept."""
    cf_dir.mkdir(parents=True, exist_ok=True)
    store = Store(cf_dir / STATE_FILE)
    zone_obj = store.add_zone(zone)
    have = {(r["name"], r["type"]) for r in store.zone_records(zone_obj["id"])}
    for name in records:
        full = _full_name(zone_obj["name"], name)
        if (full, record_type) not in have:
            store.create_record(
                zone_obj["id"], {"name": full, "type": record_type, "content": content, "ttl": ttl, "proxied": False}
            )
    store.save()
    return store


def serve(cf_dir: Path, host: str, port: int, latency: float = 0.0) -> None:
    store = Store(cf_dir / STATE_FILE)
    server = CfApiServer((host, port), store, read_token(cf_dir), _latency_seconds(latency))

    def _terminate(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _terminate)
    sys.stderr.write(f"{_now()} cloudflare double listening on http://{host}:{port}{API_PREFIX}\n")
    sys.stderr.flush()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        store.save()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path, help="state directory (state.json, token)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds every API answer waits (0-600)")
    args = parser.parse_args(argv)
    serve(args.dir, args.host, args.port, args.latency)


# --------------------------------------------------------------------------------------------------- lab control

# Children started by this process, kept so they can be reaped (no zombies, no ResourceWarning).
_children: dict[int, subprocess.Popen[bytes]] = {}


def _pid_file(state: LabState) -> Path:
    return state.cf_dir / PID_FILE


def _read_pid(state: LabState) -> int | None:
    try:
        return int(_pid_file(state).read_text().strip())
    except (OSError, ValueError):
        return None


def _is_our_process(pid: int) -> bool:
    """Alive, not a zombie, and really the double (a recycled pid must never be signalled)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if stat.rpartition(")")[2].split()[0] in ("Z", "X"):
        return False
    return MODULE.encode() in cmdline


def _port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the server binds: connections of an earlier run in TIME_WAIT must not make the port look taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _answering_pid(host: str, port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{CONTROL_PREFIX}/state", timeout=1) as answer:
            return int(json.loads(answer.read())["pid"])
    except (OSError, ValueError, KeyError, urllib.error.URLError):
        return None


def is_running(state: LabState) -> bool:
    pid = _read_pid(state)
    return pid is not None and _is_our_process(pid)


def start(state: LabState, *, timeout: float = 10.0, latency: float = 0.0) -> None:
    """Start the double for the lab (a no-op when it already runs); sets and saves state.cf_port. `latency`:
    seconds every API answer waits (changed while it runs with POST /__lab/latency)."""
    if is_running(state):
        return
    cf_dir = state.cf_dir
    cf_dir.mkdir(parents=True, exist_ok=True)
    token = state.secrets().get(state.token_env, "")
    if not token:
        raise RuntimeError(f"{state.env_file} has no {state.token_env}: the double needs its API token")
    write_token(cf_dir, token)
    seed(cf_dir, state.zone, state.records, state.source.address, state.record_ttl)
    # Another process can take a port between the check and the bind: try a few ports.
    last_error = "no attempt"
    for attempt in range(3):
        if attempt == 0 and state.cf_port and _port_is_free(state.cf_address, state.cf_port):
            port = state.cf_port
        else:
            port = _free_port(state.cf_address)
        with open(cf_dir / LOG_FILE, "ab") as log:
            env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}  # the token file is the source
            proc = subprocess.Popen(
                [sys.executable, "-m", MODULE, "--dir", str(cf_dir), "--host", state.cf_address,
                 "--port", str(port), "--latency", str(_latency_seconds(latency))],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env,
            )  # fmt: skip
        _children[proc.pid] = proc
        _pid_file(state).write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                last_error = f"exited with code {proc.returncode} (see {cf_dir / LOG_FILE})"
                break
            if _answering_pid(state.cf_address, port) == proc.pid:
                state.cf_port = port
                state.save()
                return
            time.sleep(0.05)
        else:
            _terminate(proc.pid)
            last_error = f"did not answer within {timeout:.0f}s"
        _children.pop(proc.pid, None)
        _pid_file(state).unlink(missing_ok=True)
    raise RuntimeError(f"the Cloudflare double could not start: {last_error}")


def _terminate(pid: int, timeout: float = 5.0) -> None:
    proc = _children.pop(pid, None)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return
        if proc is None and not _is_our_process(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if proc is not None:
        proc.wait(timeout=timeout)


def stop(state: LabState) -> None:
    """Stop the double started by `start` (by its pid file); a no-op when it does not run."""
    pid = _read_pid(state)
    if pid is not None and _is_our_process(pid):
        _terminate(pid)
    elif pid is not None and pid in _children:
        _children.pop(pid).poll()  # reap it
    _pid_file(state).unlink(missing_ok=True)


if __name__ == "__main__":
    main()
