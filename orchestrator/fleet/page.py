"""The fleet's page: one self-contained HTML file with every plan's figures and timeline side by side.

Each plan's part is the run page's own data and drawings (orchestrator/report/html.py: `read_run` over the
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
from orchestrator.report.html import (
    CSS,
    RunView,
    _clients_section,
    _e,
    _seconds,
    _tiles,
    _timeline_svg,
    read_journal,
    read_run,
)
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
        window = _seconds(view.write_block_seconds) if view and view.write_block_seconds is not None else "-"
        budget = f"{view.max_write_block:g} s" if view and view.max_write_block is not None else "-"
        clients = view.clients if view else None
        stall = _seconds(clients.longest_write_stall_s) if clients else "-"
        lost = str(clients.acknowledged_lost) if clients else "-"
        cells = [line.name, str(line.wave), line.source_host, line.storage or "-", line.state, window, budget, stall,
                 lost, line.next_action]  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    head = ["plan", "wave", "source host", "storage", "state", "writes blocked", "budget", "clients' longest stall",
            "acknowledged lost", "next"]  # fmt: skip
    cards = []
    for line in status.plans:
        view = views.get(line.name)
        if view is None:
            cards.append(f'<div class="card"><h2>{_e(line.name)}</h2><p>not started</p></div>')
            continue
        end = max(view.ended_at, view.started_at + 1e-3)
        timeline = _timeline_svg(
            view, element_id=f"timeline-{_e(line.name)}", begin=view.started_at, end=end, title=line.name, zoom=False
        )
        clients_html = _clients_section(view.clients) if view.clients is not None else ""
        error = f'<div class="error">{_e(view.error or view.rollback_reason)}</div>' if view.error else ""
        cards.append(
            f'<div class="card" id="plan-{_e(line.name)}"><h2>{_e(line.name)} '
            f'<span class="status {_e(view.status)}">{_e(view.status.replace("_", " "))}</span></h2>'
            f'<div class="sub">run {_e(view.run_id)} · {_e(view.plan_path)}</div>{error}'
            f"{_tiles(view)}{timeline}{clients_html}</div>"
        )
    stopped = f'<div class="error"><b>Stopped:</b> {_e(status.stopped)}</div>' if status.stopped else ""
    written = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    body = (
        f'<header><h1>fleet {_e(loaded.fleet.name)}</h1><div class="sub">{len(status.plans)} plans · '
        f"{_e(loaded.path)} · written {_e(written)}</div></header>{stopped}"
        '<section id="plans"><table><thead><tr>' + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead>"
        "<tbody>" + "".join(rows) + "</tbody></table></section>"
        '<section class="grid">' + "".join(cards) + "</section>"
        "<footer>Written by migrate from each plan's journal and run report. Times in UTC.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>fleet {_e(loaded.fleet.name)}</title><style>{CSS}{FLEET_CSS}</style></head>"
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
