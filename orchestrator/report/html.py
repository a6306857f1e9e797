"""The run report as a page, and as a Markdown table to paste into a post-mortem.

`write_html(report_path)` reads a run's `report-<id>.json` and the journal beside it and writes
`report-<id>.html` next to them: one self-contained file (inline CSS, inline SVG, no script, nothing fetched) with
a timeline of the steps (the downtime window highlighted, the bytes each step moved, the write-block budget
`cutover.max_write_block`), the checks that ran before, inside and after the window, and, for a lab run, what the
clients saw (longest stall, failed requests), from a `migrate lab verify --json` report.

Everything the page shows goes through `read_run` (view.py), the one place that knows the JSON report's and the
journal's shapes; the drawings are svg.py's, the Markdown summary markdown.py's. Every piece of text that comes from
the run (plan name, paths, errors, health check names) is HTML-escaped.
"""

from __future__ import annotations

import json
import time
import webbrowser
from pathlib import Path
from typing import Any

import structlog

from orchestrator.engine.view import JournalView
from orchestrator.report.build import build_report, run_events, write_report
from orchestrator.report.markdown import markdown_of
from orchestrator.report.svg import COLOURS, FAILED_COLOUR, budget_gauge, timeline_svg
from orchestrator.report.view import (
    PHASE_TITLES,
    PHASES,
    ClientsView,
    RunView,
    as_float,
    clock_text,
    escape,
    read_run,
    seconds_text,
    size_text,
)
from orchestrator.secrets import redact_obj

JOURNAL_FILE = "journal.jsonl"
STATE_DIR = ".migrate"


class ReportError(Exception):
    """No report can be made (no run recorded for this plan, unreadable files): one line for the operator."""


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
        f'<h1>{escape(view.plan_name)} <span class="status {escape(status_class)}">'
        f"{escape(view.status.replace('_', ' '))}</span></h1>",
        f'<div class="sub">run {escape(view.run_id)} · started {escape(started)} · plan {escape(view.plan_path)}</div>',
        "</header>",
    ]
    if view.error or view.rollback_reason:
        body.append(f'<div class="error"><b>Error:</b> {escape(view.error or view.rollback_reason)}</div>')
    body.append(tiles(view))
    body.append(_timeline_section(view))
    body.append(_steps_table(view))
    body.append(_checks_section(view))
    body.append(_dns_section(view))
    if view.clients is not None:
        body.append(clients_section(view.clients))
    body.append(
        '<section id="markdown"><h2>For the post-mortem (Markdown)</h2><pre>'
        + escape(markdown_of(view))
        + "</pre></section>"
    )
    body.append(
        f"<footer>Written by migrate from report-{escape(view.run_id)}.json and the run's journal. "
        "Times in UTC.</footer>"
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head>"
        "<body><main>" + "\n".join(body) + "</main></body></html>\n"
    )


def tiles(view: RunView) -> str:
    cards = []
    budget = "budget not recorded" if view.max_write_block is None else f"budget {view.max_write_block:g} s"
    if view.write_block_seconds is not None:
        over = view.max_write_block is not None and view.write_block_seconds > view.max_write_block
        cards.append(("Writes blocked", seconds_text(view.write_block_seconds), budget, "bad" if over else "good"))
    else:
        cards.append(("Writes blocked", "never", budget, ""))
    cards.append(
        ("Whole run", seconds_text(view.duration), f"{len([s for s in view.steps if s.started_at])} steps run", "")
    )
    cards.append(
        ("Bytes moved", size_text(view.bytes_moved), f"{size_text(view.window_bytes)} while writes were blocked", "")
    )
    clients = view.clients
    if clients is not None:
        lost = clients.acknowledged_lost
        cards.append(
            (
                "Clients' longest write stall",
                seconds_text(clients.longest_write_stall_s),
                f"{lost} acknowledged write(s) lost",
                "bad" if lost or clients.error else "good",
            )
        )
    else:
        door = any(s.name == "switch_traffic" and s.state == "done" for s in view.steps)
        committed = door or view.dns_flipped_at is not None
        flips = "DNS flipped at " + clock_text(view.dns_flipped_at) if view.dns_flipped_at else "DNS not flipped"
        if door:
            flips = "at the front door; " + (flips if view.dns_flipped_at else "DNS pending")
        cards.append(("Commit", "done" if committed else "no", flips, "good" if committed else ""))
    cells = "".join(
        f'<div class="tile {cls}"><div class="k">{escape(k)}</div><div class="v">{escape(v)}</div>'
        f'<div class="n">{escape(n)}</div></div>'
        for k, v, n, cls in cards
    )
    return f'<div class="tiles">{cells}</div>'


def _timeline_section(view: RunView) -> str:
    end = max(view.ended_at, view.started_at + 1e-3)
    parts = [
        '<section id="timeline-section"><h2>Timeline</h2>',
        timeline_svg(
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
            timeline_svg(
                view,
                element_id="window-timeline",
                begin=view.writes_blocked_at - pad,
                end=w_end + pad,
                title="the steps inside the downtime window",
                zoom=True,
            )
        )
        parts.append(budget_gauge(view))
    parts.append("</section>")
    return "".join(parts)


def _steps_table(view: RunView) -> str:
    rows = []
    for s in view.steps:
        phase = view.phase_of(s) if s.started_at is not None else ""
        rows.append(
            f'<tr class="{phase}"><td>{escape(s.name)}<div class="n" style="color:#64748b;font-size:12px">'
            f'{escape(s.title)}</div></td><td>{escape(s.state)}</td><td class="num">{clock_text(s.started_at)}</td>'
            f'<td class="num">{clock_text(s.ended_at)}</td><td class="num">{escape(seconds_text(s.duration))}</td>'
            f'<td class="num">{escape(size_text(s.bytes_moved)) if s.bytes_moved else ""}</td>'
            f'<td class="num">{s.attempts}</td><td class="err">{escape(s.error or "")}</td></tr>'
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
            f'<tr class="{"ok" if r.get("points_at") != "other" else "fail"}"><td>{escape(name)}</td>'
            f'<td class="num">{escape(r.get("content"))}</td><td>{escape(r.get("points_at"))}</td></tr>'
            for name, records in dns["records"].items()
            for r in records
        )
        parts.append(
            f'<div class="sub">{escape(said)} · {clock_text(as_float(dns.get("at")))}</div>'
            "<table><thead><tr><th>record</th><th>content</th><th>points at</th></tr></thead><tbody>"
            + rows
            + "</tbody></table>"
        )
        if dns.get("problem"):
            parts.append(f'<div class="error"><b>Needs attention:</b> {escape(dns["problem"])}</div>')
    else:
        parts.append('<div class="none">the run did not read its records</div>')
    reserve = view.rollback_reserve or {}
    if reserve.get("seconds") is not None:
        parts.append(
            f'<p id="reserve">Rollback reserve: <b>{escape(seconds_text(as_float(reserve.get("seconds"))))}</b> '
            f"({escape(reserve.get('basis') or '')})</p>"
        )
    parts.append("</section>")
    return "".join(parts)


def _checks_section(view: RunView) -> str:
    columns = []
    for phase in PHASES:
        items = [c for c in view.checks if c.phase == phase]
        entries = "".join(
            f'<li class="{"ok" if c.passed else "fail"}" data-step="{escape(c.step)}">{escape(c.name)}'
            f'<span class="d">{escape(c.detail)}{" · " + clock_text(c.at) if c.at else ""}</span></li>'
            for c in items
        )
        columns.append(
            f'<div class="phase {phase}" data-phase="{phase}"><h3>{escape(PHASE_TITLES[phase])}</h3>'
            + (f"<ul>{entries}</ul>" if entries else '<div class="none">none</div>')
            + "</div>"
        )
    return (
        '<section id="checks"><h2>Checks, and where they ran</h2><div class="phases">'
        + "".join(columns)
        + "</div></section>"
    )


def clients_section(clients: ClientsView) -> str:
    def n(value: int | None) -> str:
        return "n/a" if value is None else str(value)

    rows = [
        ("acknowledged writes lost", str(clients.acknowledged_lost)),
        ("reviews / uploads acknowledged", f"{clients.reviews_acknowledged} / {clients.uploads_acknowledged}"),
        ("longest write stall", seconds_text(clients.longest_write_stall_s)),
        ("longest gap between acknowledgements", seconds_text(clients.longest_ack_gap_s)),
        ("failed write attempts (retried)", n(clients.write_attempts_failed)),
        ("failed reads", f"{n(clients.reads_failed)} ({n(clients.reads_missing)} missing)"),
        ("writes pending at the end", n(clients.writes_pending_at_end)),
    ]
    table = "".join(f'<tr><td>{escape(k)}</td><td class="num">{escape(v)}</td></tr>' for k, v in rows)
    servers = "".join(
        f"<tr><td>{escape(clients.server_names.get(address, '?'))} {escape(address)}</td>"
        + "".join(
            f'<td class="num">{escape(counts.get(key, 0))}</td>'
            for key in ("writes_acked", "uploads_acked", "reads_ok", "write_attempts_failed", "reads_failed")
        )
        + "</tr>"
        for address, counts in sorted(clients.per_server.items())
    )
    error = f'<div class="error">{escape(clients.error)}</div>' if clients.error else ""
    return (
        f'<section id="clients"><h2>What the clients saw (checked on the {escape(clients.host)})</h2>{error}'
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
