"""The run report as a page, and as a Markdown table to paste into a post-mortem.

`write_html(report_path)` reads a run's `report-<id>.json` and the journal beside it and writes
`report-<id>.html` next to them: one self-contained file (inline CSS, inline SVG, no script, nothing fetched) with
a timeline of the steps (the downtime window highlighted, the bytes each step moved, the write-block budget
`cutover.max_write_block`), the checks that ran before, inside and after the window, and, for a lab run, what the
clients saw (longest stall, failed requests), from a `migrate lab verify --json` report.

Everything the page shows goes through `read_run`, the one place that knows the JSON report's and the journal's
shapes, so a change of the report's model changes that function only. Every piece of text that comes from the run
(plan name, paths, errors, health check names) is HTML-escaped.
"""

from __future__ import annotations

import html
import json
import math
import time
import webbrowser
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from orchestrator.engine.events import RunStarted, UndoCompleted, UndoFailed, UndoStarted
from orchestrator.engine.view import JournalView, Records
from orchestrator.report.build import build_report, run_events, seed_hold_text, write_report
from orchestrator.results import AuditResult
from orchestrator.secrets import redact_obj

JOURNAL_FILE = "journal.jsonl"
STATE_DIR = ".migrate"
# Before, inside and after the downtime window (from writes blocked until DNS points at the target).
PHASES = ("before", "window", "after")
PHASE_TITLES = {
    "before": "Before the window (service live)",
    "window": "Inside the window (writes blocked)",
    "after": "After the DNS flip",
}


class ReportError(Exception):
    """No report can be made (no run recorded for this plan, unreadable files): one line for the operator."""


# ------------------------------------------------------------------------------------------------ the run's data


@dataclass(frozen=True)
class StepView:
    name: str
    title: str
    state: str
    started_at: float | None
    ended_at: float | None
    duration: float | None
    attempts: int
    error: str | None
    bytes_moved: int
    undo_started_at: float | None = None
    undo_ended_at: float | None = None


@dataclass(frozen=True)
class CheckView:
    """One check the run made: where it sits relative to the window, and what it found."""

    name: str
    step: str
    phase: str  # one of PHASES
    passed: bool
    detail: str
    at: float | None = None


@dataclass(frozen=True)
class ClientsView:
    """The lab's clients' experience of the move (from `migrate lab verify --json`)."""

    host: str
    longest_write_stall_s: float | None
    longest_ack_gap_s: float | None
    write_attempts_failed: int | None
    reads_failed: int | None
    reads_missing: int | None
    writes_pending_at_end: int | None
    reviews_acknowledged: int
    uploads_acknowledged: int
    acknowledged_lost: int
    error: str | None
    checked_at: float | None = None
    per_server: dict[str, dict[str, Any]] = field(default_factory=dict)
    server_names: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunView:
    run_id: str
    plan_name: str
    plan_path: str
    status: str
    started_at: float
    ended_at: float
    duration: float
    error: str | None
    rollback_reason: str | None
    steps: list[StepView]
    bytes_moved: int
    writes_blocked_at: float | None
    window_ended_at: float | None  # DNS flipped, or writes unblocked by the rollback
    dns_flipped_at: float | None
    write_block_seconds: float | None
    max_write_block: float | None  # None: the journal (which holds the plan) was not there
    checks: list[CheckView]
    clients: ClientsView | None = None
    # Where every DNS record pointed at the run's last reading (report["dns"]) and the rollback's reserve.
    dns: dict[str, Any] | None = None
    rollback_reserve: dict[str, Any] | None = None

    @property
    def window_bytes(self) -> int:
        if self.writes_blocked_at is None:
            return 0
        return sum(s.bytes_moved for s in self.steps if self.phase_of(s) == "window")

    def phase_of(self, step: StepView) -> str:
        if step.started_at is None or self.writes_blocked_at is None:
            return "before"
        end = step.ended_at if step.ended_at is not None else step.started_at
        if end < self.writes_blocked_at:
            return "before"
        if self.window_ended_at is None or step.started_at < self.window_ended_at:
            return "window"
        return "after"


def read_run(report: dict[str, Any], events: Records | None = None, verify: dict[str, Any] | None = None) -> RunView:
    """The page's view of a run, from the JSON report (`orchestrator.report.build.build_report`), the journal and, for a
    lab run, the clients' report (`migrate lab verify --json`)."""
    run_id = str(report.get("run_id") or "")
    events = run_events(events, run_id or None) if events is not None else JournalView()
    started = events.started() or RunStarted()
    titles = {ev.step: ev.title for ev in events.starts()}
    results: dict[str, dict[str, Any]] = {ev.step: dict(ev.result) for ev in events.completions()}
    undo: dict[str, dict[str, float]] = {}
    for ev in events:
        if isinstance(ev, UndoStarted) and ev.step:
            undo.setdefault(ev.step, {})["start"] = ev.ts
        elif isinstance(ev, UndoCompleted | UndoFailed) and ev.step:
            undo.setdefault(ev.step, {})["end"] = ev.ts
    bytes_by_step = report.get("bytes_by_step") or {}
    steps = [
        StepView(
            name=str(s["name"]),
            title=titles.get(str(s["name"]), ""),
            state=str(s.get("state") or ""),
            started_at=s.get("started_at"),
            ended_at=s.get("ended_at"),
            duration=s.get("duration"),
            attempts=int(s.get("attempts") or 0),
            error=s.get("error"),
            bytes_moved=int(bytes_by_step.get(s["name"]) or 0),
            undo_started_at=undo.get(str(s["name"]), {}).get("start"),
            undo_ended_at=undo.get(str(s["name"]), {}).get("end"),
        )
        for s in report.get("steps") or []
    ]
    cutover = report.get("cutover") or {}
    blocked_at = _float(cutover.get("writes_blocked_at"))
    if blocked_at is None:  # a run rolled back inside the cut-over journaled the moment before it completed
        blocked_at = _saved_value(events, "cutover", "writes_blocked_at")
    flipped_at = _float(report.get("dns_flipped_at"))
    # The window ends at the commit: the front door's switch when the plan has one (DNS moves after), else DNS.
    window_end = _float(report.get("committed_at_door")) or flipped_at
    if blocked_at is not None and window_end is None:
        cutover_step = next((s for s in steps if s.name == "cutover"), None)
        window_end = cutover_step.undo_ended_at if cutover_step else None
    run_started = _float(report.get("started_at")) or 0.0
    run_ended = _float(report.get("ended_at")) or max(
        [t for s in steps for t in (s.ended_at, s.undo_ended_at) if t is not None] or [run_started]
    )
    write_block = _float(report.get("write_block_seconds"))
    if write_block is None and blocked_at is not None and window_end is not None:
        write_block = round(window_end - blocked_at, 3)
    view = RunView(
        run_id=run_id,
        plan_name=str(started.plan_name or Path(str(report.get("plan") or "plan")).stem),
        plan_path=str(report.get("plan") or started.plan_path),
        status=str(report.get("status") or "unknown"),
        started_at=run_started,
        ended_at=run_ended,
        duration=_float(report.get("duration")) or round(run_ended - run_started, 3),
        error=report.get("error"),
        rollback_reason=report.get("rollback_reason"),
        steps=steps,
        bytes_moved=int(report.get("bytes_moved") or 0),
        writes_blocked_at=blocked_at,
        window_ended_at=window_end,
        dns_flipped_at=flipped_at,
        write_block_seconds=write_block,
        max_write_block=_max_write_block(started.plan_text),
        checks=[],
        clients=read_clients(verify),
        dns=report.get("dns") if isinstance(report.get("dns"), dict) else None,
        rollback_reserve=report.get("rollback_reserve") if isinstance(report.get("rollback_reserve"), dict) else None,
    )
    return _with_checks(view, report, results)


def read_clients(verify: dict[str, Any] | None) -> ClientsView | None:
    """The clients' view from a `migrate lab verify --json` report (orchestrator.lab.verify.VerifyReport)."""
    if not verify:
        return None
    lost = verify.get("acknowledged_lost")
    if lost is None:
        counts = ("reviews_lost", "reviews_altered", "uploads_lost", "upload_rows_lost", "deletes_undone")
        lost = sum(int(verify.get(k) or 0) for k in counts)
    return ClientsView(
        host=str(verify.get("host") or "target"),
        longest_write_stall_s=_float(verify.get("longest_write_stall_s")),
        longest_ack_gap_s=_float(verify.get("longest_ack_gap_s")),
        write_attempts_failed=_int(verify.get("write_attempts_failed")),
        reads_failed=_int(verify.get("reads_failed")),
        reads_missing=_int(verify.get("reads_missing")),
        writes_pending_at_end=_int(verify.get("writes_pending_at_end")),
        reviews_acknowledged=int(verify.get("reviews_acknowledged") or 0),
        uploads_acknowledged=int(verify.get("uploads_acknowledged") or 0),
        acknowledged_lost=int(lost),
        error=verify.get("error"),
        checked_at=_float(verify.get("checked_at")),
        per_server=dict(verify.get("per_server") or {}),
        server_names=dict(verify.get("server_names") or {}),
    )


def _with_checks(view: RunView, report: dict[str, Any], results: dict[str, dict[str, Any]]) -> RunView:
    """Every check the run recorded, placed before, inside or after the window by when it was made."""
    checks: list[CheckView] = []
    by_name = {s.name: s for s in view.steps}

    def ended(step: str) -> float | None:
        return by_name[step].ended_at if step in by_name else None

    def add(name: str, step: str, passed: bool, detail: str, at: float | None) -> None:
        checks.append(CheckView(name, step, _phase(view, at), passed, detail, at))

    preflight = results.get("preflight")
    if preflight is not None:
        facts = []
        if preflight.get("major_version"):
            facts.append(f"database {preflight['major_version']} on both hosts")
        if isinstance(preflight.get("source_bytes"), int):
            facts.append(f"{_size(preflight['source_bytes'])} to copy")
        free = preflight.get("target_free")
        if isinstance(free, dict) and free:
            facts.append("target free: " + ", ".join(f"{k} {_size(int(v))}" for k, v in free.items()))
        add(
            "preflight: SSH host keys, rsync, privileges, versions, space, DNS token",
            "preflight",
            True,
            "; ".join(facts) or "all passed",
            ended("preflight"),
        )
    ttl = results.get("lower_ttl")
    if ttl is not None and ttl.get("lowered_to") is not None:
        originals = ttl.get("original_ttls") or {}
        was = sorted({int(o["ttl"]) for o in originals.values() if not o.get("proxied")})
        skipped = ttl.get("proxied_skipped") or []
        add(
            f"DNS TTL lowered to {ttl['lowered_to']} s and the old TTL waited out",
            "lower_ttl",
            True,
            f"was {', '.join(map(str, was))} s; waited {ttl.get('waited_seconds')} s"
            + (f"; proxied (automatic TTL), skipped: {', '.join(map(str, skipped))}" if skipped else ""),
            ended("lower_ttl"),
        )
    presync = results.get("db_presync")
    if presync is not None and isinstance(presync.get("rounds"), list):
        rounds = presync["rounds"]
        last = rounds[-1] if rounds else {}
        add(
            "datadir pre-sync converged" if presync.get("converged") else "datadir pre-sync did not converge",
            "db_presync",
            bool(presync.get("converged")),
            f"{len(rounds)} round(s); last moved {_size(int(last.get('bytes') or 0))} in {last.get('seconds')} s",
            ended("db_presync"),
        )
    seed = report.get("seed") or {}
    held = seed_hold_text(seed)
    if held:
        at = _float(seed.get("commits_blocked_at")) or ended("repl_seed")
        add("the seed's hot backup, the source serving throughout", "repl_seed", True, held, at)
    cutover = report.get("cutover") or {}
    if cutover.get("lock_attempts") is not None:
        add(
            "FLUSH TABLES WITH READ LOCK",
            "cutover",
            True,
            f"held after {cutover.get('lock_wait_seconds')} s in {cutover.get('lock_attempts')} attempt(s)",
            _float(cutover.get("lock_acquired_at")),
        )
    counts = report.get("row_counts") or {}
    if counts:
        add(
            "source row counts under the lock",
            "cutover",
            True,
            f"{len(counts)} table(s), {sum(int(v) for v in counts.values())} rows",
            _float(cutover.get("lock_acquired_at")),
        )
    if cutover.get("final_pass_seconds") is not None:
        add(
            "source database shut down cleanly, final datadir pass",
            "cutover",
            True,
            f"shutdown {cutover.get('shutdown_seconds')} s; final pass {cutover.get('final_pass_seconds')} s, "
            f"{_size(int(cutover.get('final_pass_bytes') or 0))}",
            ended("cutover"),
        )
    verify = results.get("verify_target")
    if verify is not None:
        at = ended("verify_target")
        for name, tries in (verify.get("health_tries") or {}).items():
            add(f"health check {name}", "verify_target", True, f"passed on try {tries}", at)
        rows = verify.get("row_counts")
        if isinstance(rows, dict):
            add(
                "row counts equal to the source's",
                "verify_target",
                True,
                f"{rows.get('compared')} of {rows.get('tables')} table(s) compared"
                + (f", checksums {rows['checksummed']}" if rows.get("checksummed") else ""),
                at,
            )
        for tree, differing in (verify.get("trees_differing_items") or {}).items():
            add(
                f"file tree {tree} equal on the target",
                "verify_target",
                differing == 0,
                "rsync --checksum --dry-run changes nothing" if differing == 0 else f"{differing} item(s) differ",
                at,
            )
    flip = results.get("dns_flip")
    if flip is not None:
        records = flip.get("records") or []
        # Read back before the commit (without a front door): it belongs to the window it closes.
        add(
            "DNS records read back",
            "dns_flip",
            True,
            f"{', '.join(map(str, records))} → {flip.get('new_content')}",
            view.dns_flipped_at - 1e-6 if view.dns_flipped_at else ended("dns_flip"),
        )
    audited = AuditResult.of(results.get("audit"))
    if results.get("audit") is not None and audited.status not in ("off", "not_needed"):
        add(
            "audit after the commit: every table, the target as migrated against the source",
            "audit",
            not audited.needs_attention,
            "; ".join(x for x in (audited.status, audited.cost(), audited.summary()) if x),
            ended("audit"),
        )
    finish = results.get("finish")
    if finish is not None:
        stopped = finish.get("source_services_stopped") or []
        add(
            "the source refuses writes",
            "finish",
            True,
            f"source {finish.get('source')}" + (f"; stopped: {', '.join(map(str, stopped))}" if stopped else ""),
            ended("finish"),
        )
    clients = view.clients
    if clients is not None:
        add(
            f"every acknowledged write on the {clients.host} (lab verify)",
            "lab",
            clients.error is None and clients.acknowledged_lost == 0,
            clients.error
            or f"{clients.reviews_acknowledged} reviews and {clients.uploads_acknowledged} uploads "
            f"acknowledged; {clients.acknowledged_lost} lost",
            clients.checked_at,
        )
    for step in view.steps:
        if step.error and step.state in ("failed", "undo_failed"):
            at = step.ended_at if step.state == "failed" else step.undo_ended_at
            add(
                f"{step.name} {'failed' if step.state == 'failed' else 'compensation failed'}",
                step.name,
                False,
                step.error,
                at,
            )
    checks.sort(key=lambda c: c.at if c.at is not None else math.inf)
    return replace(view, checks=checks)


def _phase(view: RunView, at: float | None) -> str:
    if at is None or view.writes_blocked_at is None or at < view.writes_blocked_at:
        return "before"
    if view.window_ended_at is None or at <= view.window_ended_at:
        return "window"
    return "after"


def _saved_value(events: JournalView, step: str, key: str) -> float | None:
    values = events.saved_values(step, key)
    return _float(values[-1]) if values else None


def _max_write_block(plan_text: str) -> float | None:
    """cutover.max_write_block as the run's plan set it (the plan text is journaled at the run's start)."""
    if not plan_text:
        return None
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    from orchestrator.plan.model import Cutover

    default = float(Cutover.model_fields["max_write_block"].default)
    try:
        data = YAML(typ="safe").load(plan_text)
    except YAMLError:
        return default
    cutover = data.get("cutover") if isinstance(data, dict) else None
    value = cutover.get("max_write_block") if isinstance(cutover, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# ------------------------------------------------------------------------------------------------------ formatting


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def _clock(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1000):03d}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f} s"
    if value < 120:
        return f"{value:.1f} s"
    minutes, seconds = divmod(value, 60)
    return f"{int(minutes)} min {seconds:02.0f} s"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


# ------------------------------------------------------------------------------------------------------- Markdown


def markdown_summary(report: dict[str, Any], events: Records | None = None) -> str:
    """The run as a Markdown table (step, start, end, duration), times in UTC, for a post-mortem."""
    return _markdown_of(read_run(report, events))


def _markdown_of(view: RunView) -> str:
    day = time.strftime("%Y-%m-%d", time.gmtime(view.started_at)) if view.started_at else ""
    head = f"**{_md(view.plan_name)}** — run `{view.run_id}` {view.status}, {day}, {_seconds(view.duration)}"
    facts = []
    if view.write_block_seconds is not None:
        facts.append(
            f"writes blocked {_seconds(view.write_block_seconds)}"
            + (f" (budget {view.max_write_block:g} s)" if view.max_write_block is not None else "")
            + (
                " until the commit at the front door"
                if any(s.name == "switch_traffic" and s.state == "done" for s in view.steps)
                else " until the DNS flip"
                if view.dns_flipped_at
                else " until the rollback"
            )
        )
    facts.append(f"{_size(view.bytes_moved)} moved, {_size(view.window_bytes)} of it while writes were blocked")
    lines = [head, "", "; ".join(facts) + ".", "", "| Step | Start (UTC) | End (UTC) | Duration |", "|---|---|---|---|"]
    for step in view.steps:
        if step.started_at is None:
            lines.append(f"| {_md(step.name)} (not run) | - | - | - |")
            continue
        mark = "" if step.state == "done" else f" ({_md(step.state)})"
        lines.append(
            f"| {_md(step.name)}{mark} | {_clock(step.started_at)} | {_clock(step.ended_at)} | "
            f"{_seconds(step.duration)} |"
        )
    for step in sorted((s for s in view.steps if s.undo_started_at), key=lambda s: s.undo_started_at or 0):
        duration = (step.undo_ended_at - step.undo_started_at) if step.undo_ended_at and step.undo_started_at else None
        lines.append(
            f"| undo {_md(step.name)} | {_clock(step.undo_started_at)} | {_clock(step.undo_ended_at)} | "
            f"{_seconds(duration)} |"
        )
    if view.writes_blocked_at is not None and view.window_ended_at is not None:
        lines.append(
            f"| **writes blocked** | {_clock(view.writes_blocked_at)} | {_clock(view.window_ended_at)} | "
            f"**{_seconds(view.write_block_seconds)}** |"
        )
    if view.error:
        lines += ["", f"Error: {_md(view.error)}"]
    return "\n".join(lines) + "\n"


def _md(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


# ----------------------------------------------------------------------------------------------------------- SVG

CHART_WIDTH = 1000
LABEL_WIDTH = 150
BYTES_WIDTH = 90
ROW_HEIGHT = 28
BAR_HEIGHT = 16
AXIS_HEIGHT = 34
COLOURS = {"before": "#2563eb", "window": "#d97706", "after": "#059669"}
FAILED_COLOUR = "#dc2626"
UNDO_COLOUR = "#6b7280"


def _nice_step(span: float, ticks: int = 8) -> float:
    raw = max(span, 1e-3) / ticks
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power  # pragma: no cover


def _tick_label(value: float, step: float) -> str:
    decimals = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    return f"+{value:.{decimals}f} s"


def _timeline_svg(view: RunView, *, element_id: str, begin: float, end: float, title: str, zoom: bool) -> str:
    """One row per step: a bar from its start to its end (and its compensation, if any), bytes on the right."""
    rows = [s for s in view.steps if not zoom or _overlaps(s, begin, end)]
    plot_x0, plot_x1 = LABEL_WIDTH, CHART_WIDTH - BYTES_WIDTH
    height = AXIS_HEIGHT + ROW_HEIGHT * len(rows) + 56
    span = max(end - begin, 1e-3)

    def x(ts: float) -> float:
        return plot_x0 + (min(max(ts, begin), end) - begin) / span * (plot_x1 - plot_x0)

    parts = [
        f'<svg id="{element_id}" class="timeline" viewBox="0 0 {CHART_WIDTH} {height}" role="img" '
        f'aria-label="{_e(title)}" xmlns="http://www.w3.org/2000/svg">',
        f'<defs><pattern id="{element_id}-undo" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#e5e7eb"/>'
        f'<line x1="0" y1="0" x2="0" y2="6" stroke="{UNDO_COLOUR}" stroke-width="3"/></pattern></defs>',
        f'<rect x="0" y="0" width="{CHART_WIDTH}" height="{height}" fill="#ffffff"/>',
    ]
    # Zebra rows first, so everything else draws over them.
    for i in range(len(rows)):
        if i % 2 == 0:
            y = AXIS_HEIGHT + i * ROW_HEIGHT
            parts.append(f'<rect x="0" y="{y}" width="{CHART_WIDTH}" height="{ROW_HEIGHT}" fill="#f8fafc"/>')
    bottom = AXIS_HEIGHT + ROW_HEIGHT * len(rows)
    # The downtime window, behind the bars.
    if view.writes_blocked_at is not None:
        w_end = view.window_ended_at if view.window_ended_at is not None else view.ended_at
        x0, x1 = x(view.writes_blocked_at), x(w_end)
        parts.append(
            f'<rect class="window" x="{x0:.1f}" y="{AXIS_HEIGHT - 6}" width="{max(x1 - x0, 2):.1f}" '
            f'height="{bottom - AXIS_HEIGHT + 12}" fill="#fde68a" fill-opacity="0.55" stroke="#d97706" '
            'stroke-width="1" stroke-dasharray="3 2"/>'
        )
    # Time axis.
    step = _nice_step(span)
    offset = begin - (view.writes_blocked_at if zoom and view.writes_blocked_at else view.started_at)
    first = math.ceil(offset / step) * step
    value = first
    while value <= offset + span + 1e-9:
        tx = plot_x0 + (value - offset) / span * (plot_x1 - plot_x0)
        parts.append(f'<line x1="{tx:.1f}" y1="{AXIS_HEIGHT - 4}" x2="{tx:.1f}" y2="{bottom}" stroke="#e2e8f0"/>')
        parts.append(
            f'<text x="{tx:.1f}" y="{AXIS_HEIGHT - 12}" class="tick" text-anchor="middle">'
            f"{_e(_tick_label(value, step))}</text>"
        )
        value += step
    # The bars.
    for i, s in enumerate(rows):
        y = AXIS_HEIGHT + i * ROW_HEIGHT
        mid = y + ROW_HEIGHT / 2
        parts.append(
            f'<text x="{LABEL_WIDTH - 10}" y="{mid + 4:.1f}" class="label" text-anchor="end">{_e(s.name)}</text>'
        )
        s_end = s.ended_at if s.ended_at is not None else view.ended_at
        visible = s.started_at is not None and not (s_end < begin or s.started_at > end)
        if s.started_at is not None and (visible or not zoom):
            bx0, bx1 = x(s.started_at), x(s_end)
            # A step that failed keeps its error after the rollback undid it: it stays red.
            colour = FAILED_COLOUR if s.error else COLOURS[view.phase_of(s)]
            tip = f"{s.name}: {_clock(s.started_at)} → {_clock(s_end)} ({_seconds(s.duration)}), {s.state}"
            if s.bytes_moved:
                tip += f", {_size(s.bytes_moved)}"
            parts.append(
                f'<rect class="step-bar" data-step="{_e(s.name)}" data-state="{_e(s.state)}" '
                f'data-visible="{"yes" if visible else "no"}" x="{bx0:.1f}" y="{mid - BAR_HEIGHT / 2:.1f}" '
                f'width="{max(bx1 - bx0, 3):.1f}" height="{BAR_HEIGHT}" rx="3" fill="{colour}">'
                f"<title>{_e(tip)}</title></rect>"
            )
            if visible:
                label = _seconds(s.duration) if s.duration is not None else ""
                inside = bx1 - bx0 > 70
                right_room = bx1 + 60 < plot_x1  # else the label goes left of the bar
                lx = (bx0 + bx1) / 2 if inside else (bx1 + 5 if right_room else bx0 - 5)
                anchor = "middle" if inside else ("start" if right_room else "end")
                cls = "bar-text" if inside else "bar-note"
                parts.append(
                    f'<text x="{lx:.1f}" y="{mid + 4:.1f}" class="{cls}" text-anchor="{anchor}">{_e(label)}</text>'
                )
        if s.undo_started_at is not None:
            u_end = s.undo_ended_at if s.undo_ended_at is not None else view.ended_at
            ux0, ux1 = x(s.undo_started_at), x(u_end)
            parts.append(
                f'<rect class="undo-bar" data-step="{_e(s.name)}" x="{ux0:.1f}" y="{mid - BAR_HEIGHT / 2 + 3:.1f}" '
                f'width="{max(ux1 - ux0, 3):.1f}" height="{BAR_HEIGHT - 6}" rx="2" fill="url(#{element_id}-undo)" '
                f'stroke="{UNDO_COLOUR}"><title>{_e(f"undo {s.name}: {_clock(s.undo_started_at)} → {_clock(u_end)}")}'
                "</title></rect>"
            )
        if s.bytes_moved:
            parts.append(
                f'<text x="{CHART_WIDTH - 8}" y="{mid + 4:.1f}" class="bytes" text-anchor="end">'
                f"{_e(_size(s.bytes_moved))}</text>"
            )
    # Markers over the bars: the window's edges, the DNS flip, the budget.
    legend_y = bottom + 18
    if view.writes_blocked_at is not None:
        bx = x(view.writes_blocked_at)
        parts.append(
            f'<line x1="{bx:.1f}" y1="{AXIS_HEIGHT - 6}" x2="{bx:.1f}" y2="{bottom + 6}" '
            'stroke="#b45309" stroke-width="1.5"/>'
        )
        parts.append(f'<text x="{bx:.1f}" y="{legend_y}" class="marker" text-anchor="end">writes blocked ▸</text>')
        if view.dns_flipped_at is not None and begin <= view.dns_flipped_at <= end:
            fx = x(view.dns_flipped_at)
            parts.append(
                f'<line x1="{fx:.1f}" y1="{AXIS_HEIGHT - 6}" x2="{fx:.1f}" y2="{bottom + 6}" '
                'stroke="#047857" stroke-width="1.5"/>'
            )
            if fx + 170 < CHART_WIDTH:
                flip_label = f'<text x="{fx + 4:.1f}" y="{legend_y}" class="marker ok">◂ DNS flipped (commit)</text>'
            else:
                flip_label = (
                    f'<text x="{fx - 4:.1f}" y="{legend_y + 15}" class="marker ok" text-anchor="end">'
                    "DNS flipped (commit) ▸</text>"
                )
            parts.append(flip_label)
        elif view.window_ended_at is not None and begin <= view.window_ended_at <= end:
            ux = x(view.window_ended_at)
            parts.append(
                f'<text x="{ux + 4:.1f}" y="{legend_y}" class="marker">◂ writes allowed again (rollback)</text>'
            )
        budget_at = view.writes_blocked_at + (view.max_write_block or 0.0)
        if zoom or view.max_write_block is None:
            pass  # the gauge under the zoomed chart shows the budget
        elif budget_at <= end:
            gx = x(budget_at)
            parts.append(
                f'<line class="budget-line" x1="{gx:.1f}" y1="{AXIS_HEIGHT - 6}" x2="{gx:.1f}" y2="{bottom + 6}" '
                'stroke="#dc2626" stroke-width="2" stroke-dasharray="6 4"/>'
            )
            parts.append(
                f'<text x="{gx - 4:.1f}" y="{AXIS_HEIGHT + 12}" class="marker bad" text-anchor="end">'
                f"budget {view.max_write_block:g} s</text>"
            )
        else:
            parts.append(
                f'<text class="budget-note" x="{plot_x1:.1f}" y="{legend_y + 30}" text-anchor="end">'
                f"the budget (cutover.max_write_block {view.max_write_block:g} s) would end at "
                f"+{budget_at - begin:.0f} s, off this chart →</text>"
            )
    parts.append("</svg>")
    return "".join(parts)


def _overlaps(step: StepView, begin: float, end: float) -> bool:
    spans = [(step.started_at, step.ended_at), (step.undo_started_at, step.undo_ended_at)]
    return any(a is not None and a <= end and (b is None or b >= begin) for a, b in spans)


def _budget_gauge(view: RunView) -> str:
    """How much of `cutover.max_write_block` the window used, split by the steps that ran inside it."""
    if view.writes_blocked_at is None or view.write_block_seconds is None or view.max_write_block is None:
        return ""
    budget = view.max_write_block
    used = view.write_block_seconds
    scale_to = max(budget, used)
    x0, x1 = LABEL_WIDTH, CHART_WIDTH - BYTES_WIDTH

    def x(seconds: float) -> float:
        return x0 + min(max(seconds, 0.0), scale_to) / scale_to * (x1 - x0)

    blocked = view.writes_blocked_at
    window_end = blocked + used
    parts = [
        f'<svg id="budget" class="gauge" viewBox="0 0 {CHART_WIDTH} 64" role="img" '
        'aria-label="the write-block budget" xmlns="http://www.w3.org/2000/svg">',
        f'<rect x="0" y="0" width="{CHART_WIDTH}" height="64" fill="#ffffff"/>',
        f'<text x="{LABEL_WIDTH - 10}" y="30" class="label" text-anchor="end">write block</text>',
        f'<rect x="{x0}" y="16" width="{x1 - x0}" height="20" rx="4" fill="#f1f5f9" stroke="#cbd5e1"/>',
    ]
    shades = ["#f59e0b", "#fbbf24", "#d97706", "#fcd34d", "#b45309"]
    for i, s in enumerate(s for s in view.steps if s.started_at is not None and view.phase_of(s) == "window"):
        start = max(s.started_at or blocked, blocked) - blocked
        end = min(s.ended_at if s.ended_at is not None else window_end, window_end) - blocked
        if end <= start:
            continue
        parts.append(
            f'<rect class="gauge-part" x="{x(start):.1f}" y="16" width="{max(x(end) - x(start), 1):.1f}" height="20" '
            f'fill="{shades[i % len(shades)]}"><title>{_e(f"{s.name}: {_seconds(end - start)}")}</title></rect>'
        )
    over = used > budget
    parts.append(
        f'<line class="budget-line" x1="{x(budget):.1f}" y1="8" x2="{x(budget):.1f}" y2="44" stroke="#dc2626" '
        'stroke-width="2" stroke-dasharray="6 4"/>'
    )
    parts.append(
        f'<text x="{x(budget) - 4:.1f}" y="58" class="marker bad" text-anchor="end">'
        f"budget: cutover.max_write_block = {budget:g} s</text>"
    )
    share = used / budget * 100 if budget else 0
    room = x(used) < x1 - 200
    parts.append(
        f'<text x="{x(used) + 6 if room else x(used) - 6:.1f}" y="30" class="{"marker bad" if over else "marker"}" '
        f'text-anchor="{"start" if room else "end"}">{_e(_seconds(used))} used ({share:.1f} %)</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------------- page

CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #eef2f7; color: #0f172a;
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1080px; margin: 0 auto; padding: 24px 24px 40px; }
header h1 { font-size: 22px; margin: 0 0 4px; }
header .sub { color: #475569; font-size: 13px; word-break: break-all; }
.status { display: inline-block; padding: 2px 10px; border-radius: 999px; font-size: 12px; font-weight: 600;
          vertical-align: middle; margin-left: 8px; color: #fff; background: #64748b; }
.status.completed { background: #059669; } .status.rolled_back { background: #d97706; }
.status.failed_after_commit, .status.rollback_failed { background: #dc2626; }
.tiles { display: grid; grid-template-columns: repeat(4, 1fr); gap: 12px; margin: 18px 0; }
.tile { background: #fff; border-radius: 10px; padding: 12px 14px; box-shadow: 0 1px 2px rgba(15,23,42,.08); }
.tile .k { color: #64748b; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.tile .v { font-size: 22px; font-weight: 650; margin-top: 2px; }
.tile .n { color: #475569; font-size: 12px; }
.tile.bad .v { color: #dc2626; } .tile.good .v { color: #047857; }
section { background: #fff; border-radius: 10px; padding: 14px 16px 16px; margin: 14px 0;
          box-shadow: 0 1px 2px rgba(15,23,42,.08); }
section h2 { font-size: 15px; margin: 0 0 10px; }
svg.timeline, svg.gauge { width: 100%; height: auto; display: block; }
svg text { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
svg .label { font-size: 12px; fill: #0f172a; } svg .tick { font-size: 11px; fill: #64748b; }
svg .bytes { font-size: 11px; fill: #334155; font-variant-numeric: tabular-nums; }
svg .bar-text { font-size: 11px; fill: #fff; font-weight: 600; } svg .bar-note { font-size: 11px; fill: #334155; }
svg .marker { font-size: 11px; fill: #b45309; font-weight: 600; } svg .marker.ok { fill: #047857; }
svg .marker.bad { fill: #dc2626; } svg .budget-note { font-size: 11px; fill: #dc2626; }
.legend { display: flex; gap: 16px; flex-wrap: wrap; font-size: 12px; color: #475569; margin-top: 8px; }
.legend i { display: inline-block; width: 12px; height: 12px; border-radius: 3px; margin-right: 5px;
            vertical-align: -2px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid #e2e8f0; vertical-align: top; }
th { color: #475569; font-weight: 600; font-size: 12px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.err { color: #b91c1c; word-break: break-word; }
tr.window td:first-child { box-shadow: inset 3px 0 #d97706; }
.phases { display: grid; grid-template-columns: repeat(3, 1fr); gap: 12px; }
.phase { border: 1px solid #e2e8f0; border-radius: 8px; padding: 10px 12px; }
.phase h3 { font-size: 13px; margin: 0 0 8px; }
.phase.window { background: #fffbeb; border-color: #fcd34d; }
.phases.clients { grid-template-columns: 1fr 1.4fr; align-items: start; }
.phase ul { list-style: none; margin: 0; padding: 0; }
.phase li { margin: 0 0 8px; padding-left: 20px; position: relative; word-break: break-word; }
.phase li::before { content: "✓"; position: absolute; left: 0; color: #059669; font-weight: 700; }
.phase li.fail::before { content: "✗"; color: #dc2626; }
.phase li .d { display: block; color: #64748b; font-size: 12px; }
.phase .none { color: #94a3b8; font-style: italic; }
.error { background: #fef2f2; border: 1px solid #fecaca; color: #991b1b; border-radius: 8px; padding: 10px 12px;
         margin: 12px 0; word-break: break-word; }
pre { background: #0f172a; color: #e2e8f0; padding: 12px; border-radius: 8px; overflow-x: auto; font-size: 12px; }
footer { color: #94a3b8; font-size: 12px; margin-top: 18px; }
"""


def render_html(view: RunView) -> str:
    """The whole page for one run (self-contained)."""
    title = f"{view.plan_name} — run {view.run_id}"
    status_class = view.status if view.status.replace("_", "").isalnum() else "unknown"
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(view.started_at)) if view.started_at else "-"
    body = [
        "<header>",
        f'<h1>{_e(view.plan_name)} <span class="status {_e(status_class)}">'
        f"{_e(view.status.replace('_', ' '))}</span></h1>",
        f'<div class="sub">run {_e(view.run_id)} · started {_e(started)} · plan {_e(view.plan_path)}</div>',
        "</header>",
    ]
    if view.error or view.rollback_reason:
        body.append(f'<div class="error"><b>Error:</b> {_e(view.error or view.rollback_reason)}</div>')
    body.append(_tiles(view))
    body.append(_timeline_section(view))
    body.append(_steps_table(view))
    body.append(_checks_section(view))
    body.append(_dns_section(view))
    if view.clients is not None:
        body.append(_clients_section(view.clients))
    body.append(
        '<section id="markdown"><h2>For the post-mortem (Markdown)</h2><pre>'
        + _e(_markdown_of(view))
        + "</pre></section>"
    )
    body.append(
        f"<footer>Written by migrate from report-{_e(view.run_id)}.json and the run's journal. Times in UTC.</footer>"
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head>"
        "<body><main>" + "\n".join(body) + "</main></body></html>\n"
    )


def _tiles(view: RunView) -> str:
    tiles = []
    budget = "budget not recorded" if view.max_write_block is None else f"budget {view.max_write_block:g} s"
    if view.write_block_seconds is not None:
        over = view.max_write_block is not None and view.write_block_seconds > view.max_write_block
        tiles.append(("Writes blocked", _seconds(view.write_block_seconds), budget, "bad" if over else "good"))
    else:
        tiles.append(("Writes blocked", "never", budget, ""))
    tiles.append(
        ("Whole run", _seconds(view.duration), f"{len([s for s in view.steps if s.started_at])} steps run", "")
    )
    tiles.append(("Bytes moved", _size(view.bytes_moved), f"{_size(view.window_bytes)} while writes were blocked", ""))
    clients = view.clients
    if clients is not None:
        lost = clients.acknowledged_lost
        tiles.append(
            (
                "Clients' longest write stall",
                _seconds(clients.longest_write_stall_s),
                f"{lost} acknowledged write(s) lost",
                "bad" if lost or clients.error else "good",
            )
        )
    else:
        door = any(s.name == "switch_traffic" and s.state == "done" for s in view.steps)
        committed = door or view.dns_flipped_at is not None
        flips = "DNS flipped at " + _clock(view.dns_flipped_at) if view.dns_flipped_at else "DNS not flipped"
        if door:
            flips = "at the front door; " + (flips if view.dns_flipped_at else "DNS pending")
        tiles.append(("Commit", "done" if committed else "no", flips, "good" if committed else ""))
    cells = "".join(
        f'<div class="tile {cls}"><div class="k">{_e(k)}</div><div class="v">{_e(v)}</div><div class="n">{_e(n)}</div>'
        "</div>"
        for k, v, n, cls in tiles
    )
    return f'<div class="tiles">{cells}</div>'


def _timeline_section(view: RunView) -> str:
    end = max(view.ended_at, view.started_at + 1e-3)
    parts = [
        '<section id="timeline-section"><h2>Timeline</h2>',
        _timeline_svg(
            view, element_id="timeline", begin=view.started_at, end=end, title="the steps of the run", zoom=False
        ),
        '<div class="legend">'
        f'<span><i style="background:{COLOURS["before"]}"></i>service live</span>'
        f'<span><i style="background:{COLOURS["window"]}"></i>writes blocked</span>'
        f'<span><i style="background:{COLOURS["after"]}"></i>after the flip</span>'
        f'<span><i style="background:{FAILED_COLOUR}"></i>failed</span>'
        f'<span><i style="background:#fde68a;border:1px dashed #d97706"></i>downtime window</span>'
        '<span><i style="background:#fff;border:2px dashed #dc2626"></i>budget (max_write_block)</span>'
        "</div>",
    ]
    if view.writes_blocked_at is not None:
        w_end = view.window_ended_at if view.window_ended_at is not None else view.ended_at
        pad = max((w_end - view.writes_blocked_at) * 0.04, 0.02)
        parts.append('<h2 style="margin-top:16px">Inside the window</h2>')
        parts.append(
            _timeline_svg(
                view,
                element_id="window-timeline",
                begin=view.writes_blocked_at - pad,
                end=w_end + pad,
                title="the steps inside the downtime window",
                zoom=True,
            )
        )
        parts.append(_budget_gauge(view))
    parts.append("</section>")
    return "".join(parts)


def _steps_table(view: RunView) -> str:
    rows = []
    for s in view.steps:
        phase = view.phase_of(s) if s.started_at is not None else ""
        rows.append(
            f'<tr class="{phase}"><td>{_e(s.name)}<div class="n" style="color:#64748b;font-size:12px">{_e(s.title)}'
            f'</div></td><td>{_e(s.state)}</td><td class="num">{_clock(s.started_at)}</td>'
            f'<td class="num">{_clock(s.ended_at)}</td><td class="num">{_e(_seconds(s.duration))}</td>'
            f'<td class="num">{_e(_size(s.bytes_moved)) if s.bytes_moved else ""}</td>'
            f'<td class="num">{s.attempts}</td><td class="err">{_e(s.error or "")}</td></tr>'
        )
    return (
        '<section id="steps"><h2>Steps</h2><table><thead><tr><th>step</th><th>state</th><th>start (UTC)</th>'
        "<th>end (UTC)</th><th>duration</th><th>bytes</th><th>tries</th><th>error</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></section>"
    )


def _dns_section(view: RunView) -> str:
    """Where every DNS record points (the run's last reading: its end reading when it made one), and the seconds
    the run kept back from its budget for the rollback, with how they were derived."""
    parts = ['<section id="dns"><h2>DNS records, and the rollback\'s reserve</h2>']
    dns = view.dns or {}
    if dns.get("records"):
        said = "read at the run's end" if dns.get("end") else "the run's last reading"
        rows = "".join(
            f'<tr class="{"ok" if r.get("points_at") != "other" else "fail"}"><td>{_e(name)}</td>'
            f'<td class="num">{_e(r.get("content"))}</td><td>{_e(r.get("points_at"))}</td></tr>'
            for name, records in dns["records"].items()
            for r in records
        )
        parts.append(
            f'<div class="sub">{_e(said)} · {_clock(_float(dns.get("at")))}</div>'
            "<table><thead><tr><th>record</th><th>content</th><th>points at</th></tr></thead><tbody>"
            + rows
            + "</tbody></table>"
        )
        if dns.get("problem"):
            parts.append(f'<div class="error"><b>Needs attention:</b> {_e(dns["problem"])}</div>')
    else:
        parts.append('<div class="none">the run did not read its records</div>')
    reserve = view.rollback_reserve or {}
    if reserve.get("seconds") is not None:
        parts.append(
            f'<p id="reserve">Rollback reserve: <b>{_e(_seconds(_float(reserve.get("seconds"))))}</b> '
            f"({_e(reserve.get('basis') or '')})</p>"
        )
    parts.append("</section>")
    return "".join(parts)


def _checks_section(view: RunView) -> str:
    columns = []
    for phase in PHASES:
        items = [c for c in view.checks if c.phase == phase]
        entries = "".join(
            f'<li class="{"ok" if c.passed else "fail"}" data-step="{_e(c.step)}">{_e(c.name)}'
            f'<span class="d">{_e(c.detail)}{" · " + _clock(c.at) if c.at else ""}</span></li>'
            for c in items
        )
        columns.append(
            f'<div class="phase {phase}" data-phase="{phase}"><h3>{_e(PHASE_TITLES[phase])}</h3>'
            + (f"<ul>{entries}</ul>" if entries else '<div class="none">none</div>')
            + "</div>"
        )
    return (
        '<section id="checks"><h2>Checks, and where they ran</h2><div class="phases">'
        + "".join(columns)
        + "</div></section>"
    )


def _clients_section(clients: ClientsView) -> str:
    def n(value: int | None) -> str:
        return "n/a" if value is None else str(value)

    rows = [
        ("acknowledged writes lost", str(clients.acknowledged_lost)),
        ("reviews / uploads acknowledged", f"{clients.reviews_acknowledged} / {clients.uploads_acknowledged}"),
        ("longest write stall", _seconds(clients.longest_write_stall_s)),
        ("longest gap between acknowledgements", _seconds(clients.longest_ack_gap_s)),
        ("failed write attempts (retried)", n(clients.write_attempts_failed)),
        ("failed reads", f"{n(clients.reads_failed)} ({n(clients.reads_missing)} missing)"),
        ("writes pending at the end", n(clients.writes_pending_at_end)),
    ]
    table = "".join(f'<tr><td>{_e(k)}</td><td class="num">{_e(v)}</td></tr>' for k, v in rows)
    servers = "".join(
        f"<tr><td>{_e(clients.server_names.get(address, '?'))} {_e(address)}</td>"
        + "".join(
            f'<td class="num">{_e(counts.get(key, 0))}</td>'
            for key in ("writes_acked", "uploads_acked", "reads_ok", "write_attempts_failed", "reads_failed")
        )
        + "</tr>"
        for address, counts in sorted(clients.per_server.items())
    )
    error = f'<div class="error">{_e(clients.error)}</div>' if clients.error else ""
    return (
        f'<section id="clients"><h2>What the clients saw (checked on the {_e(clients.host)})</h2>{error}'
        f'<div class="phases clients"><table><tbody>{table}</tbody></table>'
        "<table><thead><tr><th>served by</th><th>writes</th><th>uploads</th><th>reads ok</th><th>writes failed</th>"
        f"<th>reads failed</th></tr></thead><tbody>{servers}</tbody></table></div></section>"
    )


# ------------------------------------------------------------------------------------------------------ entry points


def read_journal(path: Path) -> list[dict[str, Any]]:
    """The journal's events (a torn last line ignored); [] when there is none."""
    if not path.exists():
        return []
    events: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def write_html(report_path: Path, clients: dict[str, Any] | None = None) -> Path:
    """Write `report-<id>.html` beside `report-<id>.json` (the journal beside it adds titles, checks, undo bars)
    and return its path. `clients`: a `migrate lab verify --json` report of the same run, if any."""
    report_path = Path(report_path)
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ReportError(f"{report_path}: cannot read the run report: {exc}") from None
    if not isinstance(report, dict) or not report.get("run_id"):
        raise ReportError(f"{report_path}: not a run report")
    events = read_journal(report_path.parent / JOURNAL_FILE)
    view = read_run(report, events, redact_obj(clients) if clients else None)
    page = render_html(view)
    out = report_path.with_suffix(".html")
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out


def write_report_and_page(report: dict[str, Any], directory: Path) -> Path:
    """The run's JSON report, and its page beside it; a page that cannot be drawn never costs the run its report."""
    path = write_report(report, directory)
    try:
        write_html(path)
    except (ReportError, OSError, ValueError) as exc:
        structlog.get_logger("migrate").warning("report page not written", report=str(path), error=str(exc))
    return path


def report_command(plan_path: Path, open_browser: bool, clients_path: Path | None = None) -> Path:
    """`migrate report PLAN [--open] [--clients FILE]`: the page of the plan's latest run (made from the journal
    when the run wrote no JSON report, e.g. after a crash); returns its path, opens it in a browser if asked."""
    from orchestrator.plan.loader import PlanError, load_plan

    try:
        plan = load_plan(Path(plan_path)).plan
    except PlanError as exc:
        raise ReportError(str(exc)) from None
    state_dir = Path(plan_path).resolve().parent / STATE_DIR / plan.name
    events = JournalView.of(read_journal(state_dir / JOURNAL_FILE))
    started = events.started()
    if started is None:
        raise ReportError(f"{plan_path}: no run recorded in {state_dir / JOURNAL_FILE}")
    run_id = started.run_id
    report_path = state_dir / f"report-{run_id}.json"
    if not report_path.exists():
        report_path = write_report(build_report(run_events(events, run_id)), state_dir)
    clients = None
    if clients_path is not None:
        try:
            clients = json.loads(Path(clients_path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ReportError(f"{clients_path}: cannot read the clients' report: {exc}") from None
    page = write_html(report_path, clients)
    if open_browser:
        webbrowser.open(page.resolve().as_uri())
    return page
