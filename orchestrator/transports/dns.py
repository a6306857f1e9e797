"""The DNS seam: what a migration uses of a DNS provider (`DnsProvider`), and the record and the one error type
every provider speaks. `transports/dns_providers.py` opens the provider a plan names (`dns.provider`).

The steps see only these names: a zone looked up once, the records of a name and type, a record's content or TTL
set (and read back), a record read, the API token verified. A provider's failures are `DnsError`s (one readable
line without secrets, `transient` for the retry policies, `retry_after` when the API asked for a wait), so the
steps catch one type whatever the provider. This module imports no provider.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class DnsError(Exception):
    """A DNS API failure, as one readable line without secrets; `transient` says whether a retry may help."""

    def __init__(self, message: str, *, transient: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.transient = transient
        # Seconds the API asked us to wait before trying again (429 Retry-After), when it said.
        self.retry_after = retry_after


@dataclass(frozen=True)
class DnsRecord:
    id: str
    name: str
    type: str
    content: str
    ttl: int
    proxied: bool


@runtime_checkable
class DnsProvider(Protocol):
    """The DNS operations a migration needs. Every call may take a `timeout` (seconds, per API request) so a caller
    inside the downtime window bounds it by what is left of its budget; every failure is a `DnsError`."""

    def verify_token(self, zone_name: str) -> None:
        """Raise DnsError unless the API accepts the token and calls it active (an account-owned token: verified
        against the account that owns `zone_name`)."""

    def check_can_edit(self, zone_id: str, record: DnsRecord) -> None:
        """Raise DnsError unless the token may edit `record`: an edit that changes nothing (the record's own content
        and TTL sent back), so a read-only token is refused before anything changes, not inside the window."""

    def zone_id(self, zone_name: str, *, timeout: float | None = None) -> str:
        """The id of the zone with exactly this name (looked up once per provider object)."""

    def find_records(self, zone_id: str, name: str, type: str, *, timeout: float | None = None) -> list[DnsRecord]:
        """All records with exactly this name and type."""

    def get_record(self, zone_id: str, record_id: str, *, timeout: float | None = None) -> DnsRecord: ...

    def set_content(self, zone_id: str, record: DnsRecord, content: str, *, timeout: float | None = None) -> DnsRecord:
        """Point `record` at `content` (name, type, TTL and proxying kept), read back: the record as it is now."""

    def set_ttl(self, zone_id: str, record: DnsRecord, ttl: int) -> DnsRecord:
        """Give `record` this TTL, leaving its content as the API holds it; read back: the record as it is now."""

    def close(self) -> None: ...
