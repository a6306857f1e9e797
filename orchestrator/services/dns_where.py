"""Where every DNS record of the plan points now: at the source, at the target, or at something else.

`migrate status` reads the records live through the Cloudflare adapter when the API token is at hand (reads only,
a short timeout), else shows the run's last journaled reading, saying which and when. The run report shows the
journaled readings (the flip's read-backs, the rollback's settle reads, and the reading every run makes at its end).

A run that ends with its records pointing at different hosts, or at the host that does not serve (the target after
a rollback, the source after a completed run), says so in its exit code (NEEDS_ATTENTION) and one line
(`problem`). Pure functions, but for `read_live`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from orchestrator import secrets
from orchestrator.engine.journal import RunState, RunStatus
from orchestrator.engine.view import JournalView, Records
from orchestrator.plan.model import Plan

# The journal key of every reading (a step_saved event of the DNS flip step):
# {"at": ts, "records": {name: [contents]}, "source": [contents], "target": content, "end": bool}.
RECORDS_NOW = "records_now"
OLD_RECORDS = "old_records"
# A live read in `migrate status` waits at most this long per API call.
LIVE_TIMEOUT = 5.0

Host = Literal["source", "target", "other"]


@dataclass
class Reading:
    """Every record's contents at one moment, and what the source's and the target's contents are."""

    at: float
    records: dict[str, list[str]]
    source: list[str]
    target: str
    origin: str  # "live" (read just now) or "journal" (the run's last journaled reading)
    end: bool = False  # the reading the run made at its end
    error: str | None = None  # why a live read was not possible (then the journal's reading, if any, is shown)
    # The reading of a reverse run (`Plan.reversed()`: its source is the forward run's target): each host is named
    # as the operator knows it, the forward plan's source and target, never by the reverse plan's swapped roles.
    reverse: bool = False
    where: dict[str, list[Host]] = field(init=False)

    def __post_init__(self) -> None:
        self.where = {
            name: [forward_role(points_at(c, self.source, self.target), self.reverse) for c in cs]
            for name, cs in self.records.items()
        }

    def hosts(self) -> set[Host]:
        return {host for hosts in self.where.values() for host in hosts}

    def as_dict(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "at": self.at,
            "end": self.end,
            "records": {
                name: [{"content": c, "points_at": h} for c, h in zip(cs, self.where[name], strict=True)]
                for name, cs in sorted(self.records.items())
            },
            "error": self.error,
        }

    def line(self) -> str:
        if not self.records:
            return f"DNS: {self.error or 'the run has not read its records'}"
        when = time.strftime("%H:%M:%S", time.localtime(self.at))
        said = "read live at" if self.origin == "live" else "the run's last reading, at"
        where = ", ".join(
            f"{name} → {' + '.join(f'{c} ({h})' for c, h in zip(cs, self.where[name], strict=True)) or '(none)'}"
            for name, cs in sorted(self.records.items())
        )
        why = f" — {self.error}" if self.error else ""
        return f"DNS ({said} {when}): {where}{why}"


def forward_role(host: Host, reverse: bool) -> Host:
    """A host named by a reverse plan's role, as the forward plan names it (the same host)."""
    if not reverse or host == "other":
        return host
    return "target" if host == "source" else "source"


def points_at(content: str, source: list[str], target: str) -> Host:
    if content == target:
        return "target"
    return "source" if content in source else "other"


def serving_host(
    state: RunState | None, *, reverse: bool = False, moved_back: bool = False
) -> Literal["source", "target"] | None:
    """The host that takes writes once the run has ended, named as the forward plan names it: the target after a
    completed forward run, the source after a rollback; the source after a completed reverse run (`reverse`), or
    after a completed forward run that a completed reverse run has since moved back (`moved_back`). None while the
    run is unfinished (no verdict on a stopped host then, only on a split)."""
    if state is None:
        return None
    if state.status == RunStatus.COMPLETED:
        return "source" if reverse or moved_back else "target"
    if state.status == RunStatus.ROLLED_BACK:
        return "target" if reverse else "source"
    return None


def problem(reading: Reading | None, serving: Literal["source", "target"] | None) -> str | None:
    """One line when the records do not all point at the one host that serves; None when they do (or unknown)."""
    if reading is None or not reading.records:
        return None
    hosts = reading.hosts()
    where = "; ".join(f"{name} → {'+'.join(hs)}" for name, hs in sorted(reading.where.items()))
    if len(hosts) > 1:
        return f"DNS split: the records point at different hosts ({where})"
    if "other" in hosts:
        return f"DNS points at neither host ({where})"
    if serving is not None and hosts != {serving}:
        (host,) = hosts
        return f"DNS points at the {host}, which does not serve after this run: the {serving} does ({where})"
    return None


def end_problem(events: Records, state: RunState | None, *, reverse: bool = False) -> str | None:
    """The verdict on the reading the run made at its end (None without one: an older reading may be stale)."""
    reading = journaled(events, reverse=reverse)
    return problem(reading, serving_host(state, reverse=reverse)) if reading is not None and reading.end else None


def journaled(events: Records, *, reverse: bool = False) -> Reading | None:
    """The last reading journaled in the last run of `events` (None: the run never read its records)."""
    readings = [v for v in JournalView.of(events).last_run().saved_values(None, RECORDS_NOW) if v]
    found = readings[-1] if readings else None
    if not isinstance(found, dict) or not isinstance(found.get("records"), dict):
        return None
    return Reading(
        at=float(found.get("at", 0.0)),
        records={str(n): [str(c) for c in cs] for n, cs in found["records"].items()},
        source=[str(c) for c in found.get("source") or []],
        target=str(found.get("target") or ""),
        origin="journal",
        end=bool(found.get("end")),
        reverse=reverse,
    )


def source_contents(plan: Plan, events: Records) -> list[str]:
    """What the records held before the run moved them (journaled), and the source's own DNS content."""
    contents = {plan.source.dns_content}
    for value in JournalView.of(events).saved_values(None, OLD_RECORDS):
        if isinstance(value, dict):
            contents |= {str(r.get("content")) for r in value.values() if isinstance(r, dict)}
    return sorted(contents)


def read_live(plan: Plan, plan_path: Path, events: Records, *, timeout: float = LIVE_TIMEOUT) -> Reading:
    """Every record of the plan, read now through its DNS provider (reads only, each call bounded).

    Raises `LiveReadError` (one line) when the token is not at hand or the API does not answer."""
    from orchestrator.transports.dns_providers import open_provider

    try:
        token = secrets.resolve(plan.dns.api_token, Path(plan_path).resolve().parent)
    except secrets.SecretError as exc:
        raise LiveReadError(f"no API token to read DNS live ({exc})") from None
    records: dict[str, list[str]] = {}
    try:
        client = open_provider(plan.dns, token, timeout=timeout)
        try:
            zone_id = client.zone_id(plan.dns.zone, timeout=timeout)
            for name in plan.dns.records:
                records[name] = sorted(r.content for r in client.find_records(zone_id, name, plan.dns.type))
        finally:
            client.close()
    except Exception as exc:  # any failure of the API or the network: one line, never a traceback
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise LiveReadError(f"DNS cannot be read live: {secrets.redact(text)}") from None
    reverse = plan.reverse_of is not None
    return Reading(time.time(), records, source_contents(plan, events), plan.dns_content, "live", reverse=reverse)


class LiveReadError(Exception):
    pass


def now(plan: Plan, plan_path: Path, events: Records, *, live: bool) -> Reading | None:
    """Where the records point: read live when possible, else the journal's last reading (with why not live)."""
    if live:
        try:
            return read_live(plan, plan_path, events)
        except LiveReadError as exc:
            error = str(exc)
        fallback = journaled(events, reverse=plan.reverse_of is not None)
        if fallback is not None:
            fallback.error = error
            return fallback
        return Reading(time.time(), {}, [], plan.dns_content, "none", error=error)
    return journaled(events, reverse=plan.reverse_of is not None)
