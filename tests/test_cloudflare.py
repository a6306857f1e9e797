"""The Cloudflare API double and our adapter, driven through the official SDK over real HTTP on loopback.

Each fault test asserts what the SDK was OBSERVED to do against the double (requests counted in its log), since
that is what the dns_flip step lives with.
"""

from __future__ import annotations

import json
import os
import secrets as pysecrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudflare
import pytest

from migrate_lab import cfapi
from migrate_lab.state import HostState, LabState
from orchestrator.transports.cloudflare import DnsClient, DnsError, DnsRecord

ZONE = "course-review.test"
WWW = f"www.{ZONE}"


def _lab_state(root: Path, token: str) -> LabState:
    def host(name: str, address: str, server_id: int) -> HostState:
        return HostState(name, address, 0, 0, 0, server_id, str(root / name))

    state = LabState(dir=str(root), source=host("source", "127.0.0.2", 1), target=host("target", "127.0.0.3", 2))
    root.mkdir(parents=True, exist_ok=True)
    state.env_file.write_text(f"CLOUDFLARE_API_TOKEN={token}\n")
    return state


@dataclass
class Double:
    state: LabState
    token: str

    @property
    def base_url(self) -> str:
        return self.state.cf_base_url

    @property
    def control(self) -> str:
        return f"http://{self.state.cf_address}:{self.state.cf_port}/__lab"

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.control}/{path}", data=data, method=method)
        with urllib.request.urlopen(request, timeout=5) as answer:
            return json.loads(answer.read())

    def fault(self, mode: str, **options: Any) -> None:
        self._call("POST", "faults", {"mode": mode, **options})

    def clear(self) -> None:
        self.fault("none")
        self.token_is(owner="user", edit=True)
        self._call("DELETE", "requests")

    def token_is(self, *, owner: str, edit: bool) -> None:
        self._call("POST", "token", {"owner": owner, "edit": edit})

    def lab_state(self) -> dict[str, Any]:
        return self._call("GET", "state")

    def requests(self, method: str | None = None) -> list[dict[str, Any]]:
        return [r for r in self.lab_state()["requests"] if method is None or r["method"] == method]

    def sdk(self, *, max_retries: int = 0, timeout: float = 5.0, token: str | None = None) -> cloudflare.Cloudflare:
        return cloudflare.Cloudflare(
            api_token=token or self.token, base_url=self.base_url, max_retries=max_retries, timeout=timeout
        )

    def adapter(self, **options: Any) -> DnsClient:
        options.setdefault("timeout", 5.0)
        return DnsClient(options.pop("token", self.token), base_url=self.base_url, **options)


@pytest.fixture(scope="module")
def double(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Double]:
    token = "lab-" + pysecrets.token_hex(16)
    state = _lab_state(tmp_path_factory.mktemp("cflab"), token)
    cfapi.start(state)
    try:
        yield Double(state, token)
    finally:
        cfapi.stop(state)


@pytest.fixture
def api(double: Double, monkeypatch: pytest.MonkeyPatch) -> Iterator[Double]:
    """The double with no fault and an empty request log; no Cloudflare credentials in the environment."""
    for name in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY", "CLOUDFLARE_API_TOKEN", "CLOUDFLARE_BASE_URL",
                 "CLOUDFLARE_API_USER_SERVICE_KEY", "CLOUDFLARE_CUSTOM_HEADERS"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    double.clear()
    yield double
    double.clear()


@pytest.fixture
def zone_id(api: Double) -> str:
    with api.sdk() as client:
        return client.zones.list(name=ZONE).result[0].id


def _create(api: Double, zone_id: str, name: str, content: str, type: str = "A", **extra: Any) -> Any:
    with api.sdk() as client:
        return client.dns.records.create(zone_id=zone_id, name=name, type=type, content=content, ttl=120, **extra)


# --------------------------------------------------------------------------------------------- the API itself


def test_zone_lookup_by_name(api: Double) -> None:
    with api.sdk() as client:
        page = client.zones.list(name=ZONE)
        assert [z.name for z in page.result] == [ZONE]
        zone = page.result[0]
        assert zone.status == "active"
        assert client.zones.get(zone_id=zone.id).name == ZONE
        assert client.zones.list(name="nope.test").result == []
    with api.adapter() as dns:
        assert dns.zone_id(ZONE) == zone.id
        with pytest.raises(DnsError) as info:
            dns.zone_id("nope.test")
        assert not info.value.transient


def test_seeded_records_point_at_the_source(api: Double, zone_id: str) -> None:
    with api.adapter() as dns:
        for name in api.state.records:
            records = dns.find_records(zone_id, name, "A")
            assert len(records) == 1
            assert records[0].content == api.state.source.address
            assert records[0].ttl == api.state.record_ttl
            assert records[0].proxied is False


def test_records_parse_as_their_sdk_class(api: Double, zone_id: str) -> None:
    _create(api, zone_id, "cls.course-review.test", "cls-target.example.net", type="CNAME")
    with api.sdk() as client:
        a_record = client.dns.records.list(zone_id=zone_id, name={"exact": WWW}, type="A").result[0]
        cname = client.dns.records.list(zone_id=zone_id, name={"exact": f"cls.{ZONE}"}).result[0]
    assert type(a_record).__name__ == "ARecord"
    assert type(cname).__name__ == "CNAMERecord"
    assert a_record.zone_name == ZONE  # type: ignore[union-attr]
    assert a_record.proxiable is True


def test_list_pagination_ends_after_the_last_page(api: Double, zone_id: str) -> None:
    for i in range(7):
        _create(api, zone_id, f"page{i}.course-review.test", f"10.0.7.{i}")
    api.clear()
    with api.sdk() as client:
        first = client.dns.records.list(zone_id=zone_id, name={"startswith": "page"}, per_page=3)
        assert len(first.result) == 3
        info = first.result_info
        assert info is not None
        assert (info.page, info.per_page) == (1, 3)
        assert (info.count, info.total_count, info.total_pages) == (3, 7, 3)  # type: ignore[attr-defined]
        names = [r.name for r in first]  # auto-iteration: fetches page+1 until a page is empty
        beyond = client.dns.records.list(zone_id=zone_id, name={"startswith": "page"}, per_page=3, page=9)
    assert sorted(names) == sorted(f"page{i}.{ZONE}" for i in range(7))
    assert beyond.result == []
    pages = [r["query"] for r in api.requests("GET")]
    # Iteration starts from the page in hand; pages 2-3 carry records, page 4 comes back empty and ends it.
    assert pages == [
        "name.startswith=page&per_page=3",
        "name.startswith=page&per_page=3&page=2",
        "name.startswith=page&per_page=3&page=3",
        "name.startswith=page&per_page=3&page=4",
        "name.startswith=page&page=9&per_page=3",
    ]


def test_adapter_reads_bounded_pages(api: Double, zone_id: str) -> None:
    for i in range(5):
        _create(api, zone_id, f"multi.{ZONE}", f"10.0.5.{i}")
    api.clear()
    with api.adapter(per_page=2) as dns:
        records = dns.find_records(zone_id, f"multi.{ZONE}", "A")
    assert sorted(r.content for r in records) == [f"10.0.5.{i}" for i in range(5)]
    assert len(api.requests("GET")) == 3  # 2 + 2 + 1: the short last page ends it, no extra request
    with api.adapter(per_page=1, max_pages=2) as dns, pytest.raises(DnsError, match="more than 2 pages"):
        dns.find_records(zone_id, f"multi.{ZONE}", "A")


def test_filters(api: Double, zone_id: str) -> None:
    _create(api, zone_id, f"filt.{ZONE}", "10.0.9.1")
    _create(api, zone_id, f"filt.{ZONE}", "v=spf1 -all", type="TXT")
    _create(api, zone_id, f"sub.filt.{ZONE}", "10.0.9.2")
    with api.sdk() as client:

        def names(**query: Any) -> list[tuple[str, str]]:
            return sorted((r.name, r.type) for r in client.dns.records.list(zone_id=zone_id, **query).result)

        assert names(name={"exact": f"filt.{ZONE}"}) == [(f"filt.{ZONE}", "A"), (f"filt.{ZONE}", "TXT")]
        assert names(name={"exact": f"filt.{ZONE}"}, type="TXT") == [(f"filt.{ZONE}", "TXT")]
        assert names(name={"endswith": f"filt.{ZONE}"}, type="A") == [(f"filt.{ZONE}", "A"), (f"sub.filt.{ZONE}", "A")]
        assert names(content={"exact": "10.0.9.2"}) == [(f"sub.filt.{ZONE}", "A")]
        assert names(name={"exact": f"FILT.{ZONE.upper()}"}, type="A") == [(f"filt.{ZONE}", "A")]
        assert names(name={"exact": f"absent.{ZONE}"}) == []


def test_get_edit_update(api: Double, zone_id: str) -> None:
    created = _create(api, zone_id, f"edit.{ZONE}", "10.0.1.1", comment="keep me", proxied=False)
    with api.sdk() as client:
        got = client.dns.records.get(created.id, zone_id=zone_id)
        assert (got.name, got.content, got.ttl, got.comment) == (f"edit.{ZONE}", "10.0.1.1", 120, "keep me")

        edited = client.dns.records.edit(
            created.id, zone_id=zone_id, name=f"edit.{ZONE}", type="A", ttl=120, content="10.0.1.2"
        )
        assert edited is not None
        assert (edited.content, edited.comment, edited.ttl) == ("10.0.1.2", "keep me", 120)  # partial: kept
        assert edited.modified_on > got.modified_on
        assert edited.created_on == got.created_on

        updated = client.dns.records.update(
            created.id, zone_id=zone_id, name=f"edit.{ZONE}", type="A", ttl=300, content="10.0.1.3"
        )
        assert updated is not None
        assert (updated.content, updated.ttl, updated.comment) == ("10.0.1.3", 300, None)  # full: replaced

        # PUT is a full replacement: without content the API refuses it.
        with pytest.raises(cloudflare.BadRequestError):
            client.dns.records.update(created.id, zone_id=zone_id, name=f"edit.{ZONE}", type="A", ttl=300)
        assert client.dns.records.get(created.id, zone_id=zone_id).content == "10.0.1.3"


def test_invalid_bodies_and_unknown_ids(api: Double, zone_id: str) -> None:
    created = _create(api, zone_id, f"bad.{ZONE}", "10.0.2.1")
    with api.sdk() as client:
        with pytest.raises(cloudflare.BadRequestError) as bad_ip:
            client.dns.records.edit(created.id, zone_id=zone_id, name=f"bad.{ZONE}", type="A", ttl=120,
                                    content="not-an-address")  # fmt: skip
        assert bad_ip.value.errors[0].code == 9005
        with pytest.raises(cloudflare.BadRequestError):
            client.dns.records.edit(created.id, zone_id=zone_id, name=f"bad.{ZONE}", type="A", ttl=7)
        with pytest.raises(cloudflare.NotFoundError):
            client.dns.records.get("f" * 32, zone_id=zone_id)
        with pytest.raises(cloudflare.NotFoundError):
            client.dns.records.list(zone_id="0" * 32)
        assert client.dns.records.get(created.id, zone_id=zone_id).content == "10.0.2.1"
    with api.adapter() as dns:
        record = dns.get_record(zone_id, created.id)
        with pytest.raises(DnsError) as invalid:
            dns.set_content(zone_id, record, "not-an-address")
        assert not invalid.value.transient and "400" in str(invalid.value)
        with pytest.raises(DnsError) as missing:
            dns.get_record(zone_id, "f" * 32)
        assert not missing.value.transient and "404" in str(missing.value)


def test_verify_token(api: Double) -> None:
    with api.adapter() as dns:
        dns.verify_token(ZONE)
    with api.adapter(token="not-the-token") as dns, pytest.raises(DnsError) as info:
        dns.verify_token(ZONE)
    assert not info.value.transient and "401" in str(info.value)


# --------------------------------------------------------------------------------------------- the adapter


def test_an_account_owned_token_is_verified_against_the_zones_account(api: Double) -> None:
    """As at Cloudflare: an account's token is unknown to /user/tokens/verify (401 there); the adapter verifies it
    at the account that owns the zone. A token the API does not know fails both ways."""
    api.token_is(owner="account", edit=True)
    with api.sdk() as client, pytest.raises(cloudflare.AuthenticationError):
        client.user.tokens.verify()
    with api.adapter() as dns:
        dns.verify_token(ZONE)
    with api.adapter(token="lab-not-a-token") as dns, pytest.raises(DnsError) as info:
        dns.verify_token(ZONE)
    assert not info.value.transient


def test_a_read_only_token_is_refused_before_anything_changes(api: Double, zone_id: str) -> None:
    """Its reads all pass; the edit that changes nothing is refused (403), in one line naming the permission. With
    the edit permission the same edit passes and the record stays as it was."""
    with api.adapter() as dns:
        (record,) = dns.find_records(zone_id, WWW, "A")
        api.token_is(owner="user", edit=False)
        with pytest.raises(DnsError, match="DNS > Edit") as info:
            dns.check_can_edit(zone_id, record)
        assert not info.value.transient
        api.token_is(owner="user", edit=True)
        dns.check_can_edit(zone_id, record)
        assert dns.get_record(zone_id, record.id) == record


def test_contents_read_back_as_cloudflare_stores_them_and_compare_equal(api: Double, zone_id: str) -> None:
    """Cloudflare lower-cases a CNAME target and drops its trailing dot, and compresses an IPv6 address: the
    double stores them so, and the adapter compares in that form (no false read-back failure)."""
    cname = _create(api, zone_id, f"alias.{ZONE}", "Target.Example.TEST.", type="CNAME")
    six = _create(api, zone_id, f"six.{ZONE}", "2001:0DB8:0000:0000:0000:0000:0000:0001", type="AAAA")
    try:
        with api.sdk() as client:
            assert client.dns.records.get(cname.id, zone_id=zone_id).content == "target.example.test"
            assert client.dns.records.get(six.id, zone_id=zone_id).content == "2001:db8::1"
        with api.adapter() as dns:
            (alias,) = dns.find_records(zone_id, f"alias.{ZONE}", "CNAME")
            moved = dns.set_content(zone_id, alias, "Other.Example.TEST.")
            assert moved.content == "other.example.test"
            (address,) = dns.find_records(zone_id, f"six.{ZONE}", "AAAA")
            assert dns.set_content(zone_id, address, "2001:DB8:0:0:0:0:0:2").content == "2001:db8::2"
    finally:
        with api.sdk() as client:
            for created in (cname, six):
                client.dns.records.delete(created.id, zone_id=zone_id)


@pytest.mark.parametrize("status", [200, 502, 522])
def test_an_answer_that_is_not_the_apis_json_is_a_transient_dns_error(api: Double, zone_id: str, status: int) -> None:
    """Cloudflare's edge answers HTML (502/52x, even a 200) instead of the API's JSON: every call of the adapter turns
    it into one transient DnsError (retried like any other), never an AttributeError or a TypeError."""
    with api.adapter() as dns:
        (record,) = dns.find_records(zone_id, WWW, "A")
        api.fault("html", status=status)
        calls = [
            lambda: dns.verify_token(ZONE),
            lambda: dns.find_records(zone_id, WWW, "A"),
            lambda: dns.get_record(zone_id, record.id),
            lambda: dns.set_content(zone_id, record, record.content),
            lambda: dns.set_ttl(zone_id, record, record.ttl),
            lambda: dns.check_can_edit(zone_id, record),
        ]
        for call in calls:
            with pytest.raises(DnsError) as info:
                call()
            assert info.value.transient, info.value
            assert "\n" not in str(info.value)
        api.fault("none")
        assert dns.get_record(zone_id, record.id) == record


def test_set_content_edits_then_reads_back(api: Double, zone_id: str) -> None:
    created = _create(api, zone_id, f"flip.{ZONE}", "10.0.3.1", proxied=False)
    with api.adapter() as dns:
        [record] = dns.find_records(zone_id, f"flip.{ZONE}", "A")
        api.clear()
        result = dns.set_content(zone_id, record, "10.0.3.2")
    assert result == DnsRecord(created.id, f"flip.{ZONE}", "A", "10.0.3.2", 120, False)
    assert [(r["method"], r["status"]) for r in api.requests()] == [("PATCH", 200), ("GET", 200)]
    stored = next(r for r in api.lab_state()["records"] if r["id"] == created.id)
    assert (stored["content"], stored["ttl"], stored["proxied"]) == ("10.0.3.2", 120, False)


def test_state_is_persisted_to_disk(api: Double, zone_id: str) -> None:
    created = _create(api, zone_id, f"disk.{ZONE}", "10.0.4.1")
    with api.adapter() as dns:
        dns.set_content(zone_id, dns.get_record(zone_id, created.id), "10.0.4.2")
    on_disk = json.loads((api.state.cf_dir / cfapi.STATE_FILE).read_text())
    assert on_disk["records"][created.id]["content"] == "10.0.4.2"


# --------------------------------------------------------------------------------------------- faults


@pytest.fixture
def flip_record(api: Double, zone_id: str, request: pytest.FixtureRequest) -> DnsRecord:
    name = f"{request.node.name.replace('_', '-')[:40]}.{ZONE}"
    created = _create(api, zone_id, name, "10.0.0.1")
    api.clear()
    return DnsRecord(created.id, name, "A", "10.0.0.1", 120, False)


def test_429_is_retried_by_the_sdk_when_allowed(api: Double, zone_id: str, flip_record: DnsRecord) -> None:
    api.fault("429", count=2, methods=["PATCH"], retry_after=0.05)
    with api.adapter(max_retries=2) as dns:
        assert dns.set_content(zone_id, flip_record, "10.0.0.2").content == "10.0.0.2"
    assert [r["status"] for r in api.requests("PATCH")] == [429, 429, 200]


def test_429_without_retries_is_a_transient_error(api: Double, zone_id: str, flip_record: DnsRecord) -> None:
    api.fault("429", count=1, methods=["PATCH"], retry_after=7)
    with api.sdk(max_retries=0) as client, pytest.raises(cloudflare.RateLimitError) as raw:
        client.dns.records.edit(flip_record.id, zone_id=zone_id, name=flip_record.name, type="A", ttl=120,
                                content="10.0.0.2")  # fmt: skip
    assert raw.value.response.headers["retry-after"] == "7"
    api.fault("429", count=1, methods=["PATCH"], retry_after=7)
    with api.adapter(max_retries=0) as dns, pytest.raises(DnsError) as info:
        dns.set_content(zone_id, flip_record, "10.0.0.2")
    assert info.value.transient
    assert "429" in str(info.value) and "retry after 7s" in str(info.value)
    assert [r["status"] for r in api.requests("PATCH")] == [429, 429]  # one request each, no retry


def test_5xx_is_retried_by_the_sdk_when_allowed(api: Double, zone_id: str, flip_record: DnsRecord) -> None:
    api.fault("5xx", count=1, status=502, methods=["PATCH"])
    with api.adapter(max_retries=1) as dns:
        # No Retry-After on a 5xx: the SDK backs off ~0.5 s itself.
        assert dns.set_content(zone_id, flip_record, "10.0.0.3").content == "10.0.0.3"
    assert [r["status"] for r in api.requests("PATCH")] == [502, 200]


def test_5xx_without_retries_is_a_transient_error(api: Double, zone_id: str, flip_record: DnsRecord) -> None:
    api.fault("5xx", count=2, status=503)
    with api.sdk() as client, pytest.raises(cloudflare.InternalServerError):
        client.dns.records.get(flip_record.id, zone_id=zone_id)
    with api.adapter() as dns, pytest.raises(DnsError) as info:
        dns.find_records(zone_id, flip_record.name, "A")
    assert info.value.transient and "503" in str(info.value)
    assert len(api.requests()) == 2


def test_slow_answer_times_out_as_transient(api: Double, zone_id: str, flip_record: DnsRecord) -> None:
    api.fault("slow", count=2, delay=1.0)
    with api.sdk(timeout=0.2) as client, pytest.raises(cloudflare.APITimeoutError):
        client.dns.records.get(flip_record.id, zone_id=zone_id)
    with api.adapter(timeout=0.2) as dns, pytest.raises(DnsError) as info:
        dns.get_record(zone_id, flip_record.id)
    assert info.value.transient and "0.2s" in str(info.value)
    # The fault is used up: the next answer is normal.
    with api.adapter(timeout=5.0) as dns:
        assert dns.get_record(zone_id, flip_record.id) == flip_record


def test_success_false_returns_none_and_the_adapter_raises(api: Double, zone_id: str, flip_record: DnsRecord) -> None:
    api.fault("success_false", count=1, methods=["PATCH"])
    with api.sdk() as client:
        answer = client.dns.records.edit(flip_record.id, zone_id=zone_id, name=flip_record.name, type="A",
                                         ttl=120, content="10.0.0.4")  # fmt: skip
    assert answer is None  # no exception from the SDK: the caller has to notice
    api.fault("success_false", count=1, methods=["PATCH"])
    with api.adapter() as dns:
        with pytest.raises(DnsError) as info:
            dns.set_content(zone_id, flip_record, "10.0.0.4")
        assert not info.value.transient and "success: false" in str(info.value)
        assert dns.get_record(zone_id, flip_record.id).content == "10.0.0.1"


def test_success_false_on_a_list_is_not_an_empty_list(api: Double, zone_id: str, flip_record: DnsRecord) -> None:
    api.fault("success_false", count=1, methods=["GET"])
    with api.sdk() as client:
        assert client.dns.records.list(zone_id=zone_id, name={"exact": flip_record.name}).result is None
    api.fault("success_false", count=1, methods=["GET"])
    with api.adapter() as dns, pytest.raises(DnsError) as info:
        dns.find_records(zone_id, flip_record.name, "A")
    assert not info.value.transient


def test_invalid_token_is_permanent(api: Double, zone_id: str, flip_record: DnsRecord) -> None:
    api.fault("invalid_token", count=2)
    with api.sdk(max_retries=2) as client, pytest.raises(cloudflare.AuthenticationError) as raw:
        client.dns.records.get(flip_record.id, zone_id=zone_id)
    assert raw.value.errors[0].code == 10000
    with api.adapter(max_retries=2) as dns, pytest.raises(DnsError) as info:
        dns.get_record(zone_id, flip_record.id)
    assert not info.value.transient and "401" in str(info.value)
    # Never retried: each client asked for the record once. (Only the record's own requests are counted: a request
    # of the fixture's that the SDK retried after a client-side timeout may be logged late on a loaded machine.)
    asked = [r["status"] for r in api.requests("GET") if r["path"].endswith(flip_record.id)]
    assert asked == [401, 401]


def test_dropped_connection_is_transient(api: Double, zone_id: str, flip_record: DnsRecord) -> None:
    api.fault("reset", count=1)
    with api.adapter() as dns, pytest.raises(DnsError) as info:
        dns.get_record(zone_id, flip_record.id)
    assert info.value.transient


def test_the_token_never_appears_in_errors(api: Double, zone_id: str) -> None:
    wrong = "wrong-" + pysecrets.token_hex(12)
    messages: list[str] = []
    with api.adapter(token=wrong) as dns:
        for call in (
            lambda: dns.zone_id(ZONE),
            lambda: dns.verify_token(ZONE),
            lambda: dns.find_records(zone_id, WWW, "A"),
        ):
            with pytest.raises(DnsError) as info:
                call()
            messages.append(str(info.value))
    api.fault("slow", count=1, delay=0.5)
    with api.adapter(timeout=0.1) as dns, pytest.raises(DnsError) as slow:
        dns.zone_id(ZONE)
    messages.append(str(slow.value))
    for message in messages:
        assert wrong not in message and api.token not in message
        assert "\n" not in message
    log = (api.state.cf_dir / cfapi.LOG_FILE).read_text()
    assert api.token not in log and wrong not in log


def test_global_key_in_environment_does_not_win(api: Double, zone_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOUDFLARE_EMAIL", "someone@example.com")
    monkeypatch.setenv("CLOUDFLARE_API_KEY", "global-key-0123456789")
    monkeypatch.setenv("CLOUDFLARE_BASE_URL", "http://127.0.0.1:9/client/v4")
    # The pitfall, observed: a plain SDK client sends the global key instead of the token.
    plain = cloudflare.Cloudflare(api_token=api.token, base_url=api.base_url, max_retries=0)
    with plain as client, pytest.raises(cloudflare.PermissionDeniedError):
        client.zones.list(name=ZONE)
    with api.adapter() as dns:
        dns.verify_token(ZONE)
        assert dns.zone_id(ZONE) == zone_id
        assert dns.find_records(zone_id, WWW, "A")


# --------------------------------------------------------------------------------------------- lab control


def test_start_stop_restart_keeps_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLOUDFLARE_EMAIL", raising=False)
    monkeypatch.delenv("CLOUDFLARE_API_KEY", raising=False)
    token = "lab-" + pysecrets.token_hex(16)
    state = _lab_state(tmp_path / "lab", token)
    cfapi.start(state)
    try:
        assert cfapi.is_running(state)
        pid = int((state.cf_dir / cfapi.PID_FILE).read_text())
        assert (state.cf_dir / cfapi.TOKEN_FILE).stat().st_mode & 0o777 == 0o600
        assert token not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        assert LabState.load(state.dir).cf_port == state.cf_port > 0
        cfapi.start(state)  # already running: nothing happens
        assert int((state.cf_dir / cfapi.PID_FILE).read_text()) == pid

        with DnsClient(token, base_url=state.cf_base_url, timeout=5) as dns:
            zone_id = dns.zone_id(state.zone)
            [record] = dns.find_records(zone_id, WWW, "A")
            assert record.content == state.source.address
            dns.set_content(zone_id, record, state.target.address)

        cfapi.stop(state)
        assert not cfapi.is_running(state)
        assert not os.path.exists(f"/proc/{pid}") or not cfapi._is_our_process(pid)
        port = state.cf_port
        cfapi.start(state, latency=0.05)  # the latency knob, set at start
        assert cfapi.is_running(state) and state.cf_port == port  # the old port was free again
        knob = f"http://{state.cf_address}:{state.cf_port}/__lab/latency"
        with urllib.request.urlopen(knob, timeout=5) as answer:
            assert json.loads(answer.read()) == {"seconds": 0.05}
        with DnsClient(token, base_url=state.cf_base_url, timeout=5) as dns:
            [again] = dns.find_records(dns.zone_id(state.zone), WWW, "A")
        assert again == DnsRecord(record.id, WWW, "A", state.target.address, state.record_ttl, False)
    finally:
        cfapi.stop(state)
    assert not cfapi.is_running(state)


def test_unknown_fault_mode_is_refused(api: Double) -> None:
    with pytest.raises(urllib.error.HTTPError) as info:
        api.fault("bogus")
    assert info.value.code == 400
    assert api.lab_state()["faults"]["mode"] == "none"


# --------------------------------------------------------------------------------------------- what it refuses


def _raw(api: Double, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    """One API request as bytes on the wire, without the SDK: (HTTP status, the JSON envelope)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{api.base_url}{path}", data=data, method=method,
        headers={"Authorization": f"Bearer {api.token}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_list_filters_it_does_not_implement_are_refused_not_ignored(api: Double, zone_id: str) -> None:
    _create(api, zone_id, f"tagged.{ZONE}", "10.0.11.1", comment="blue", tags=["team:blue"])
    _create(api, zone_id, f"untagged.{ZONE}", "10.0.11.2")
    with api.sdk() as client:
        for query in (
            {"tag": {"exact": "team:blue"}},
            {"comment": {"exact": "blue"}},
            {"search": "tagged"},
            {"match": "any", "name": {"exact": f"tagged.{ZONE}"}, "type": "A"},
            {"tag_match": "any"},
        ):
            with pytest.raises(cloudflare.BadRequestError) as refused:
                client.dns.records.list(zone_id=zone_id, **query)  # type: ignore[arg-type]
            assert refused.value.errors[0].code == cfapi.BAD_QUERY_CODE, query
        # What it implements still answers: every filter must match (match=all, the API's default).
        page = client.dns.records.list(zone_id=zone_id, match="all", name={"exact": f"tagged.{ZONE}"}, type="A")
        assert [r.content for r in page.result] == ["10.0.11.1"]
        with pytest.raises(cloudflare.BadRequestError):
            client.zones.list(name=ZONE, account={"id": "0" * 32})
    status, envelope = _raw(api, "GET", f"/zones/{zone_id}/dns_records?tag=team:blue")
    assert status == 400
    assert envelope == {
        "success": False,
        "errors": [{"code": cfapi.BAD_QUERY_CODE, "message": envelope["errors"][0]["message"]}],
        "messages": [],
        "result": None,
    }
    assert "'tag'" in envelope["errors"][0]["message"]
    # A query parameter on a route that takes none is refused too.
    assert _raw(api, "GET", "/user/tokens/verify?verbose=1")[0] == 400


def test_body_fields_it_does_not_implement_are_refused_and_change_nothing(api: Double, zone_id: str) -> None:
    created = _create(api, zone_id, f"fields.{ZONE}", "10.0.12.1")
    path = f"/zones/{zone_id}/dns_records/{created.id}"
    for method, body in (
        ("PATCH", {"content": "10.0.12.2", "ttl_seconds": 60}),
        ("PUT", {"name": f"fields.{ZONE}", "type": "A", "content": "10.0.12.2", "ttl": 60, "locked": True}),
    ):
        status, envelope = _raw(api, method, path, body)
        assert (status, envelope["success"], envelope["result"]) == (400, False, None)
        assert envelope["errors"][0]["code"] == cfapi.BAD_BODY_CODE
    with api.sdk() as client:
        with pytest.raises(cloudflare.BadRequestError):
            client.dns.records.create(zone_id=zone_id, name=f"new.{ZONE}", type="A", content="10.0.12.3", ttl=60,
                                      extra_body={"priority_boost": 1})  # fmt: skip
        assert client.dns.records.get(created.id, zone_id=zone_id).content == "10.0.12.1"
        assert client.dns.records.list(zone_id=zone_id, name={"exact": f"new.{ZONE}"}).result == []


def test_the_products_own_calls_send_nothing_it_refuses(api: Double, zone_id: str) -> None:
    """Every request orchestrator/transports/cloudflare.py makes, answered without a 400."""
    created = _create(api, zone_id, f"product.{ZONE}", "10.0.13.1")
    api.clear()
    with api.adapter() as dns:
        dns.verify_token(ZONE)
        assert dns.zone_id(ZONE) == zone_id
        [record] = dns.find_records(zone_id, f"product.{ZONE}", "A")
        dns.set_content(zone_id, record, "10.0.13.2")
        dns.set_ttl(zone_id, dns.get_record(zone_id, created.id), 300)
    statuses = [(r["method"], r["status"]) for r in api.requests()]
    assert statuses and all(status == 200 for _, status in statuses), statuses


# --------------------------------------------------------------------------------------------- the batch


def test_batch_through_the_sdk_applies_deletes_patches_puts_posts_in_order(api: Double, zone_id: str) -> None:
    gone = _create(api, zone_id, f"batch-a.{ZONE}", "10.0.14.1")
    patched = _create(api, zone_id, f"batch-b.{ZONE}", "10.0.14.2", comment="kept by a patch")
    put = _create(api, zone_id, f"batch-c.{ZONE}", "10.0.14.3", comment="dropped by a put")
    with api.sdk() as client:
        result = client.dns.records.batch(
            zone_id=zone_id,
            deletes=[{"id": gone.id}],
            patches=[{"id": patched.id, "content": "10.0.14.20"}],  # type: ignore[list-item]
            puts=[{"id": put.id, "name": f"batch-c.{ZONE}", "type": "A", "content": "10.0.14.30", "ttl": 300}],
            # The deleted record's name and content again: only valid because deletes come first.
            posts=[{"name": f"batch-a.{ZONE}", "type": "A", "content": "10.0.14.1", "ttl": 60}],
        )
        assert result is not None
        assert [r.id for r in result.deletes or []] == [gone.id]
        assert [(r.id, r.content, r.comment) for r in result.patches or []] == [
            (patched.id, "10.0.14.20", "kept by a patch")
        ]
        assert [(r.id, r.content, r.ttl, r.comment) for r in result.puts or []] == [(put.id, "10.0.14.30", 300, None)]
        [posted] = result.posts or []
        assert posted.id != gone.id and posted.content == "10.0.14.1"
        with pytest.raises(cloudflare.NotFoundError):
            client.dns.records.get(gone.id, zone_id=zone_id)
        assert client.dns.records.get(posted.id, zone_id=zone_id).name == f"batch-a.{ZONE}"
    on_disk = json.loads((api.state.cf_dir / cfapi.STATE_FILE).read_text())["records"]
    assert gone.id not in on_disk and on_disk[put.id]["content"] == "10.0.14.30"


def test_batch_is_all_or_nothing(api: Double, zone_id: str) -> None:
    first = _create(api, zone_id, f"atomic-a.{ZONE}", "10.0.15.1")
    second = _create(api, zone_id, f"atomic-b.{ZONE}", "10.0.15.2")
    state_file = api.state.cf_dir / cfapi.STATE_FILE
    before = state_file.read_text()
    with api.sdk() as client:
        for batch in (
            # The last operation is refused: a bad address.
            {
                "deletes": [{"id": first.id}],
                "patches": [{"id": second.id, "content": "10.0.15.20"}],
                "posts": [{"name": f"atomic-c.{ZONE}", "type": "A", "content": "not-an-address", "ttl": 60}],
            },
            # An unknown record, after an edit that would have succeeded.
            {"patches": [{"id": second.id, "content": "10.0.15.21"}, {"id": "f" * 32, "content": "10.0.15.22"}]},
            # A field the double does not implement.
            {"patches": [{"id": second.id, "content": "10.0.15.23", "priority_boost": 1}]},
        ):
            with pytest.raises((cloudflare.BadRequestError, cloudflare.NotFoundError)):
                client.dns.records.batch(zone_id=zone_id, **batch)  # type: ignore[arg-type]
        assert client.dns.records.get(first.id, zone_id=zone_id).content == "10.0.15.1"
        assert client.dns.records.get(second.id, zone_id=zone_id).content == "10.0.15.2"
        assert client.dns.records.list(zone_id=zone_id, name={"exact": f"atomic-c.{ZONE}"}).result == []
    assert state_file.read_text() == before  # nothing written either
    status, envelope = _raw(api, "POST", f"/zones/{zone_id}/dns_records/batch", {"upserts": []})
    assert (status, envelope["success"], envelope["errors"][0]["code"]) == (400, False, cfapi.BAD_BODY_CODE)


# --------------------------------------------------------------------------------------------- the latency knob


def test_latency_knob_delays_every_answer_and_is_set_at_runtime(api: Double, zone_id: str) -> None:
    assert api._call("GET", "latency") == {"seconds": 0.0}
    try:
        assert api._call("POST", "latency", {"seconds": 0.3}) == {"seconds": 0.3}
        with api.adapter() as dns:
            began = time.monotonic()
            dns.verify_token(ZONE)
            # A lower bound only: the answer cannot come before the knob's wait.
            assert time.monotonic() - began >= 0.3
        assert api.lab_state()["latency"] == 0.3
        with pytest.raises(urllib.error.HTTPError):
            api._call("POST", "latency", {"seconds": -1})
    finally:
        api._call("POST", "latency", {"seconds": 0})
    assert api._call("GET", "latency") == {"seconds": 0.0}
