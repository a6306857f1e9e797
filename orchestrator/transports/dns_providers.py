"""The one factory of DNS providers: the plan's `dns.provider` → its implementation (a `transports.dns.DnsProvider`).

A second provider is a sibling module of `cloudflare.py` with an `open_provider(settings, token, *, timeout, meter)`,
its name added to the plan's `dns.provider` literal, and its `case` here (mypy's exhaustiveness check fails until
both agree). Each provider is imported only when a run first needs DNS: commands that never touch it do not load
its SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, assert_never

if TYPE_CHECKING:
    from orchestrator.plan.model import Dns
    from orchestrator.transports.dns import DnsProvider
    from orchestrator.transports.meter import RoundTrips


def open_provider(
    settings: Dns, token: str, *, timeout: float | None = None, meter: RoundTrips | None = None
) -> DnsProvider:
    """The provider the plan's `dns` section names, authenticated with `token`; `timeout` (seconds per API call)
    overrides the section's (a status reading bounded tighter than a run)."""
    match settings.provider:
        case "cloudflare":
            from orchestrator.transports import cloudflare

            return cloudflare.open_provider(settings, token, timeout=timeout, meter=meter)
        case unknown:
            assert_never(unknown)
