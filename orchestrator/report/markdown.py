"""The run as a Markdown table (step, start, end, duration; times in UTC), to paste into a post-mortem."""

from __future__ import annotations

import time
from typing import Any

from orchestrator.engine.view import Records
from orchestrator.report.view import RunView, clock_text, read_run, seconds_text, size_text


def markdown_summary(report: dict[str, Any], events: Records | None = None) -> str:
    """The run as a Markdown table (step, start, end, duration), times in UTC, for a post-mortem."""
    return markdown_of(read_run(report, events))


def markdown_of(view: RunView) -> str:
    day = time.strftime("%Y-%m-%d", time.gmtime(view.started_at)) if view.started_at else ""
    head = f"**{_md(view.plan_name)}** — run `{view.run_id}` {view.status}, {day}, {seconds_text(view.duration)}"
    facts = []
    if view.write_block_seconds is not None:
        facts.append(
            f"writes blocked {seconds_text(view.write_block_seconds)}"
            + (f" (budget {view.max_write_block:g} s)" if view.max_write_block is not None else "")
            + (
                " until the commit at the front door"
                if any(s.name == "switch_traffic" and s.state == "done" for s in view.steps)
                else " until the DNS flip"
                if view.dns_flipped_at
                else " until the rollback"
            )
        )
    facts.append(f"{size_text(view.bytes_moved)} moved, {size_text(view.window_bytes)} of it while writes were blocked")
    lines = [head, "", "; ".join(facts) + ".", "", "| Step | Start (UTC) | End (UTC) | Duration |", "|---|---|---|---|"]
    for step in view.steps:
        if step.started_at is None:
            lines.append(f"| {_md(step.name)} (not run) | - | - | - |")
            continue
        mark = "" if step.state == "done" else f" ({_md(step.state)})"
        lines.append(
            f"| {_md(step.name)}{mark} | {clock_text(step.started_at)} | {clock_text(step.ended_at)} | "
            f"{seconds_text(step.duration)} |"
        )
    for step in sorted((s for s in view.steps if s.undo_started_at), key=lambda s: s.undo_started_at or 0):
        duration = (step.undo_ended_at - step.undo_started_at) if step.undo_ended_at and step.undo_started_at else None
        lines.append(
            f"| undo {_md(step.name)} | {clock_text(step.undo_started_at)} | {clock_text(step.undo_ended_at)} | "
            f"{seconds_text(duration)} |"
        )
    if view.writes_blocked_at is not None and view.window_ended_at is not None:
        lines.append(
            f"| **writes blocked** | {clock_text(view.writes_blocked_at)} | {clock_text(view.window_ended_at)} | "
            f"**{seconds_text(view.write_block_seconds)}** |"
        )
    if view.error:
        lines += ["", f"Error: {_md(view.error)}"]
    return "\n".join(lines) + "\n"


def _md(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")
