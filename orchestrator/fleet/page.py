"""The fleet's page: one self-contained HTML file with every plan's figures and timeline side by side.

Each plan's part is the run page's own data and drawings (orchestrator/report/: `read_run` over the
run's report and journal, its tiles, timeline and clients' table); the fleet adds the summary table on top.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from orchestrator.engine.view import JournalView
from orchestrator.fleet.loader import FleetMember, LoadedFleet
from orchestrator.fleet.status import FleetStatus, fleet_status
from orchestrator.report.build import build_report, run_events
from orchestrator.report.html import CSS, clients_section, read_journal, tiles
from orchestrator.report.svg import timeline_svg
from orchestrator.report.view import RunView, escape, read_run, seconds_text
from orchestrator.secrets import redact_obj

PAGE_FILE = "fleet.html"
FLEET_CSS = """
main{max-width:none;margin:0 16px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:16px}
.card{border:1px solid #e5e7eb;border-radius:8px;padding:12px}
.card h2{margin-top:0}
"""


def plan_view(member: FleetMember, clients: dict[str, Any] | None) -> RunView | None:
    """The run page's view of the plan's latest run, or None when it never ran."""
    events = JournalView.of(read_journal(member.journal_path))
    started = events.started()
    if started is None:
        return None
    run_id = started.run_id
    report_path = member.state_dir / f"report-{run_id}.json"
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError):
        report = build_report(run_events(events, run_id))  # a run still going, or one that crashed
    return read_run(report, events, redact_obj(clients) if clients else None)


def read_clients_dir(directory: Path | None, name: str) -> dict[str, Any] | None:
    """`<dir>/<plan name>.json`: the plan's `migrate lab verify --json` report, when given."""
    if directory is None:
        return None
    try:
        return json.loads((directory / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


def render(loaded: LoadedFleet, status: FleetStatus, views: dict[str, RunView | None]) -> str:
    rows = []
    for line in status.plans:
        view = views.get(line.name)
        window = seconds_text(view.write_block_seconds) if view and view.write_block_seconds is not None else "-"
        budget = f"{view.max_write_block:g} s" if view and view.max_write_block is not None else "-"
        clients = view.clients if view else None
        stall = seconds_text(clients.longest_write_stall_s) if clients else "-"
        lost = str(clients.acknowledged_lost) if clients else "-"
        cells = [line.name, str(line.wave), line.source_host, line.storage or "-", line.state, window, budget, stall,
                 lost, line.next_action]  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    head = ["plan", "wave", "source host", "storage", "state", "writes blocked", "budget", "clients' longest stall",
            "acknowledged lost", "next"]  # fmt: skip
    cards = []
    for line in status.plans:
        view = views.get(line.name)
        if view is None:
            cards.append(f'<div class="card"><h2>{escape(line.name)}</h2><p>not started</p></div>')
            continue
        end = max(view.ended_at, view.started_at + 1e-3)
        timeline = timeline_svg(
            view,
            element_id=f"timeline-{escape(line.name)}",
            begin=view.started_at,
            end=end,
            title=line.name,
            zoom=False,
        )
        clients_html = clients_section(view.clients) if view.clients is not None else ""
        error = f'<div class="error">{escape(view.error or view.rollback_reason)}</div>' if view.error else ""
        cards.append(
            f'<div class="card" id="plan-{escape(line.name)}"><h2>{escape(line.name)} '
            f'<span class="status {escape(view.status)}">{escape(view.status.replace("_", " "))}</span></h2>'
            f'<div class="sub">run {escape(view.run_id)} · {escape(view.plan_path)}</div>{error}'
            f"{tiles(view)}{timeline}{clients_html}</div>"
        )
    stopped = f'<div class="error"><b>Stopped:</b> {escape(status.stopped)}</div>' if status.stopped else ""
    written = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    body = (
        f'<header><h1>fleet {escape(loaded.fleet.name)}</h1><div class="sub">{len(status.plans)} plans · '
        f"{escape(loaded.path)} · written {escape(written)}</div></header>{stopped}"
        '<section id="plans"><table><thead><tr>' + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr></thead>"
        "<tbody>" + "".join(rows) + "</tbody></table></section>"
        '<section class="grid">' + "".join(cards) + "</section>"
        "<footer>Written by migrate from each plan's journal and run report. Times in UTC.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>fleet {escape(loaded.fleet.name)}</title><style>{CSS}{FLEET_CSS}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )


def write_page(loaded: LoadedFleet, clients_dir: Path | None = None) -> Path:
    status = fleet_status(loaded)
    views = {m.name: plan_view(m, read_clients_dir(clients_dir, m.name)) for m in loaded.members}
    page = loaded.state_dir / PAGE_FILE
    page.parent.mkdir(parents=True, exist_ok=True)
    tmp = page.with_name(page.name + ".tmp")
    tmp.write_text(render(loaded, status, views), encoding="utf-8")
    tmp.replace(page)
    return page
