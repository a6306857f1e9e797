"""Cloudflare DNS through the official `cloudflare` SDK: the `DnsProvider` (transports/dns.py) a plan gets with
`dns.provider: cloudflare`, a thin, typed adapter whose every failure is a `DnsError`.

What the SDK (5.x) does that callers must not trip over, and how this adapter handles it:
- `Cloudflare(api_key=None, api_email=None)` still reads CLOUDFLARE_API_KEY / CLOUDFLARE_EMAIL from the
  environment, and when they are set it authenticates with them instead of the token. The adapter clears them
  (and any auth header injected through CLOUDFLARE_CUSTOM_HEADERS) after building the client, and always passes
  an explicit base URL so CLOUDFLARE_BASE_URL cannot send the token elsewhere.
- A 200 answer with `"success": false` and `"result": null` makes `get`/`edit` return None and makes a list
  look empty instead of raising: the adapter turns both into a `DnsError`.
- Iterating a list page fetches page+1 until a page comes back empty, without bound: the adapter reads one page
  at a time, up to `max_pages`.
- The SDK retries 408/409/429/5xx and connection errors itself; here it retries at most `max_retries` times
  (default 0) because callers own retries (tenacity), deciding from `DnsError.transient` and honouring
  `DnsError.retry_after` (a 429's Retry-After).
- Every operation takes an optional `timeout` (seconds, per HTTP request) so a caller inside the downtime window
  bounds each call by what is left of its budget, not by the client's default.
"""

from __future__ import annotations

import ipaddress
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import cloudflare
import httpx

from orchestrator import secrets
from orchestrator.engine.interrupt import Interrupted
from orchestrator.plan.checks import dns_content_form
from orchestrator.transports.dns import DnsError, DnsRecord
from orchestrator.transports.meter import RoundTrips

if TYPE_CHECKING:
    from orchestrator.plan.model import Dns

__all__ = ["DnsClient", "DnsError", "DnsRecord", "open_provider"]

DEFAULT_BASE_URL = "https://api.cloudflare.com/client/v4"
_AUTH_HEADERS = {"authorization", "x-auth-key", "x-auth-email", "x-auth-user-service-key"}
_MESSAGE_LIMIT = 300
# What the SDK raises, not as a CloudflareError, on an answer that is not the API's JSON (Cloudflare's edge answers
# HTML 502/52x pages, and a 200 with HTML happens): AttributeError where it reads a field of the text. Caught only
# around the SDK's own calls, it becomes a transient DnsError, retried like any other.
NOT_THE_APIS_JSON: tuple[type[Exception], ...] = (AttributeError, TypeError, ValueError)
SDK_FAILURES: tuple[type[Exception], ...] = (cloudflare.CloudflareError, *NOT_THE_APIS_JSON)


def open_provider(
    settings: Dns, token: str, *, timeout: float | None = None, meter: RoundTrips | None = None
) -> DnsClient:
    """The plan's `dns` section as a client (transports/dns_providers.py calls this): callers own retries."""
    return DnsClient(
        token,
        base_url=settings.base_url,
        timeout=settings.timeout if timeout is None else timeout,
        max_retries=0,
        meter=meter,
    )


class DnsClient:
    """The DNS operations a migration needs (a `DnsProvider`), over one SDK client (close it, or use it as a context
    manager)."""

    def __init__(
        self,
        api_token: str,
        *,
        base_url: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 0,
        per_page: int = 100,
        max_pages: int = 50,
        meter: RoundTrips | None = None,
    ) -> None:
        if not api_token:
            raise DnsError("Cloudflare API token is empty", transient=False)
        secrets.register(api_token)
        self._token = api_token
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.timeout = timeout
        # The timeout of the call in progress, per thread (records are read and edited side by side).
        self._calls = threading.local()
        self.per_page = per_page
        self.max_pages = max_pages
        self._meter = meter if meter is not None else RoundTrips()
        # A zone's id never changes while it exists: looked up once (preflight), not again inside the window.
        self._zones: dict[str, str] = {}
        self._client = cloudflare.Cloudflare(
            api_token=api_token,
            api_key=None,
            api_email=None,
            base_url=self.base_url,
            timeout=timeout,
            max_retries=max_retries,
            http_client=_http_client(self.base_url),
        )
        # The constructor fills None from CLOUDFLARE_API_KEY / CLOUDFLARE_EMAIL / CLOUDFLARE_API_USER_SERVICE_KEY,
        # and those win over the token: only the token we were given may authenticate.
        self._client.api_key = None
        self._client.api_email = None
        self._client.user_service_key = None
        custom = getattr(self._client, "_custom_headers", None)
        if isinstance(custom, dict):
            for key in [k for k in custom if k.lower() in _AUTH_HEADERS]:
                del custom[key]

    # --- lifecycle

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> DnsClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- operations

    def verify_token(self, zone_name: str) -> None:
        """Raise DnsError unless the API accepts the token and calls it active. An account-owned token (what
        Cloudflare recommends) is unknown to /user/tokens/verify (401 there): it is verified against the account
        that owns the zone instead, found by reading the zone with it."""
        try:
            answer = self._client.user.tokens.verify()
        except cloudflare.AuthenticationError:
            answer = self._verify_account_token(zone_name)
        except SDK_FAILURES as exc:
            raise self._error("verify the API token", exc) from None
        if answer is None:
            raise DnsError("Cloudflare verify the API token: the API answered success: false", transient=False)
        if answer.status != "active":
            raise DnsError(f"Cloudflare API token is {answer.status}", transient=False)

    def _verify_account_token(self, zone_name: str) -> Any:
        wanted = zone_name.lower().rstrip(".")
        action = "verify the API token (an account's: /user/tokens/verify refused it)"
        try:
            page = self._client.zones.list(name=wanted, page=1, per_page=50, timeout=self._timeout(None))
            zones = [z for z in self._page_items(page, action) if z.name.lower() == wanted]
            if len(zones) != 1 or zones[0].account is None or not zones[0].account.id:
                raise DnsError(
                    f"Cloudflare {action}: the token cannot read zone {wanted} to find its account", transient=False
                )
            return self._client.accounts.tokens.verify(account_id=str(zones[0].account.id))
        except SDK_FAILURES as exc:
            raise self._error(action, exc) from None

    def check_can_edit(self, zone_id: str, record: DnsRecord) -> None:
        # A batch of one patch that changes nothing (the record's own content): it takes the DNS edit permission
        # like any write, and, a POST to /batch, leaves the record edits' own request path alone.
        action = f"edit {record.type} {record.name} (its own content sent back: the token's edit permission)"
        try:
            answer = self._client.dns.records.batch(
                zone_id=zone_id,
                patches=[{"id": record.id, "content": record.content}],  # type: ignore[list-item]  # the SDK types a patch per record type
                timeout=self._timeout(None),
            )
        except cloudflare.PermissionDeniedError:
            raise DnsError(
                f"Cloudflare: the API token may read zone records but not edit them ({record.name}): give it the "
                "Zone > DNS > Edit permission for this zone",
                transient=False,
            ) from None
        except SDK_FAILURES as exc:
            raise self._error(action, exc) from None
        if answer is None:
            raise DnsError(f"Cloudflare {action}: the API answered success: false", transient=False)

    def _timeout(self, timeout: float | None) -> float:
        self._meter.add("dns")  # asked once per API call, just before it is made
        # Remembered for the error message of the call it bounds (one call at a time per thread).
        self._calls.timeout = self.timeout if timeout is None else max(0.05, min(timeout, self.timeout))
        return float(self._calls.timeout)

    def zone_id(self, zone_name: str, *, timeout: float | None = None) -> str:
        """The id of the zone with exactly this name, as the token sees it."""
        wanted = zone_name.lower().rstrip(".")
        if wanted in self._zones:
            return self._zones[wanted]
        try:
            page = self._client.zones.list(name=wanted, page=1, per_page=50, timeout=self._timeout(timeout))
        except SDK_FAILURES as exc:
            raise self._error(f"look up zone {wanted}", exc) from None
        zones = [z for z in self._page_items(page, f"look up zone {wanted}") if z.name.lower() == wanted]
        if not zones:
            raise DnsError(f"Cloudflare zone {wanted} not found (or the token cannot read it)", transient=False)
        if len(zones) > 1:
            raise DnsError(f"Cloudflare has {len(zones)} zones named {wanted}", transient=False)
        self._zones[wanted] = str(zones[0].id)
        return self._zones[wanted]

    def find_records(self, zone_id: str, name: str, type: str, *, timeout: float | None = None) -> list[DnsRecord]:
        """All records with exactly this name and type, read one bounded page at a time."""
        wanted = name.lower().rstrip(".")
        action = f"list {type} records of {wanted}"
        found: list[DnsRecord] = []
        for page_number in range(1, self.max_pages + 1):
            try:
                page = self._client.dns.records.list(
                    zone_id=zone_id,
                    name={"exact": wanted},
                    type=type,  # type: ignore[arg-type]  # a str from the plan; the SDK types it as a literal
                    page=page_number,
                    per_page=self.per_page,
                    timeout=self._timeout(timeout),
                )
            except SDK_FAILURES as exc:
                raise self._error(action, exc) from None
            items = self._page_items(page, action)
            # The filter is the server's; checking again costs nothing and guards against a loose match.
            found.extend(_to_record(item) for item in items if item.name.lower() == wanted and item.type == type)
            info = page.result_info
            total_pages = getattr(info, "total_pages", None) if info is not None else None
            if len(items) < self.per_page or (isinstance(total_pages, int) and page_number >= total_pages):
                return found
        raise DnsError(f"Cloudflare {action}: more than {self.max_pages} pages of results", transient=False)

    def get_record(self, zone_id: str, record_id: str, *, timeout: float | None = None) -> DnsRecord:
        try:
            answer = self._client.dns.records.get(record_id, zone_id=zone_id, timeout=self._timeout(timeout))
        except SDK_FAILURES as exc:
            raise self._error(f"read record {record_id}", exc) from None
        if answer is None:
            raise DnsError(f"Cloudflare read record {record_id}: the API answered success: false", transient=False)
        return _to_record(answer)

    def set_content(self, zone_id: str, record: DnsRecord, content: str, *, timeout: float | None = None) -> DnsRecord:
        """Point `record` at `content` (PATCH keeping name, type, ttl, proxied), then read it back to be sure."""
        action = f"set {record.type} {record.name} to {content}"
        try:
            # record.type is the API's own string; the SDK's overloads want one literal per record type.
            answer = self._client.dns.records.edit(  # type: ignore[call-overload]  # see above
                record.id,
                zone_id=zone_id,
                name=record.name,
                type=record.type,
                ttl=record.ttl,
                proxied=record.proxied,
                content=content,
                timeout=self._timeout(timeout),
            )
        except SDK_FAILURES as exc:
            raise self._error(action, exc) from None
        if answer is None:
            raise DnsError(f"Cloudflare {action}: the API answered success: false", transient=False)
        current = self.get_record(zone_id, record.id, timeout=timeout)
        if current.content != dns_content_form(content):
            raise DnsError(f"Cloudflare {action}: read back {current.content!r} after the edit", transient=False)
        return current

    def set_ttl(self, zone_id: str, record: DnsRecord, ttl: int) -> DnsRecord:
        """Give `record` this TTL (PATCH of name, type and ttl only: content and proxying are left as the API holds
        them, so an edit of the content made meanwhile is never undone), then read it back to be sure."""
        action = f"set the TTL of {record.type} {record.name} to {ttl}"
        try:
            answer = self._client.dns.records.edit(  # type: ignore[call-overload]  # record.type: as in set_content
                record.id,
                zone_id=zone_id,
                name=record.name,
                type=record.type,
                ttl=ttl,
            )
        except SDK_FAILURES as exc:
            raise self._error(action, exc) from None
        if answer is None:
            raise DnsError(f"Cloudflare {action}: the API answered success: false", transient=False)
        current = self.get_record(zone_id, record.id)
        if current.ttl != ttl:
            raise DnsError(f"Cloudflare {action}: read back TTL {current.ttl} after the edit", transient=False)
        return current

    # --- helpers

    def _page_items(self, page: Any, action: str) -> list[Any]:
        extra = getattr(page, "model_extra", None) or {}
        if extra.get("success") is False or page.result is None:
            raise DnsError(f"Cloudflare {action}: the API answered success: false", transient=False)
        return list(page.result)

    def _error(self, action: str, exc: Exception) -> DnsError:
        _reraise_interruption(exc)
        transient, detail = _classify(exc, float(getattr(self._calls, "timeout", self.timeout)))
        message = " ".join(f"Cloudflare {action}: {detail}".split())
        if len(message) > _MESSAGE_LIMIT:
            message = message[: _MESSAGE_LIMIT - 3] + "..."
        return DnsError(
            secrets.redact(message.replace(self._token, secrets.MASK)),
            transient=transient,
            retry_after=_retry_after(exc),
        )


def _to_record(answer: Any) -> DnsRecord:
    return DnsRecord(
        id=str(answer.id),
        name=str(answer.name),
        type=str(answer.type),
        # As the provider stores it (a CNAME lower-cased, an IPv6 address compressed): compared in that form.
        content=dns_content_form(str(answer.content)) if answer.content is not None else "",
        ttl=int(answer.ttl),
        proxied=bool(answer.proxied),
    )


def _http_client(base_url: str) -> httpx.Client | None:
    """For a loopback API (the lab's double) ignore proxy settings from the environment; else the SDK's default."""
    host = urlsplit(base_url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    return cloudflare.DefaultHttpxClient(trust_env=False) if loopback else None


def _reraise_interruption(exc: BaseException) -> None:
    """An operator's signal raised inside the HTTP call comes back wrapped as a connection error: it is not one
    (retrying it would carry on past the interruption), so it goes on as itself."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, Interrupted | KeyboardInterrupt):
            raise cause
        cause = cause.__cause__ or cause.__context__


def _retry_after(exc: Exception) -> float | None:
    if not isinstance(exc, cloudflare.APIStatusError) or exc.status_code != 429:
        return None
    try:
        return max(0.0, float(exc.response.headers.get("retry-after", "")))
    except ValueError:
        return None


EXCERPT = 80


def _excerpt(exc: Exception) -> str:
    """A short, one-line piece of the answer's body (an HTML page's title, say), or nothing."""
    response = getattr(exc, "response", None)
    text = getattr(response, "text", "") if response is not None else ""
    one_line = " ".join(str(text).split())
    return one_line[:EXCERPT] + ("..." if len(one_line) > EXCERPT else "")


def _classify(exc: Exception, timeout: float) -> tuple[bool, str]:
    """(transient, readable detail) for an SDK exception."""
    if isinstance(exc, NOT_THE_APIS_JSON):
        return True, "an answer that is not the API's JSON"
    if isinstance(exc, cloudflare.APITimeoutError):
        return True, f"no answer within {timeout:g}s"
    if isinstance(exc, cloudflare.APIConnectionError):
        cause = exc.__cause__
        return True, f"connection failed ({type(cause).__name__ if cause else 'no answer'})"
    if isinstance(exc, cloudflare.APIStatusError):
        status = exc.status_code
        listed = getattr(exc, "errors", None)
        errors = (
            "; ".join(
                f"{getattr(e, 'code', '')} {getattr(e, 'message', '')}".strip() for e in (listed or []) if e is not None
            )
            if isinstance(listed, list)
            else ""
        )
        detail = f"HTTP {status}: {errors or _excerpt(exc) or 'no details'}"
        if status == 429:
            retry_after = exc.response.headers.get("retry-after")
            if retry_after:
                detail += f" (retry after {retry_after}s)"
        return status in (408, 409, 429) or status >= 500, detail
    if isinstance(exc, cloudflare.APIResponseValidationError):
        return False, f"unexpected answer (HTTP {exc.status_code})"
    return False, type(exc).__name__
