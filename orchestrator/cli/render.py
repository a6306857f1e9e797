"""How the command line draws the results of orchestrator/run: step tables, the dry-run, status and its watch.

Nothing user-supplied is ever read as console markup: every cell and line is plain `Text` or printed by consoles
made with markup off.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator import run
from orchestrator.output.console import render_live
from orchestrator.output.progress import clock_text
from orchestrator.run.watch import WatchView


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}m"


def rows_table(title: str, rows: list[run.StepRow]) -> Table:
    table = Table(title=Text(title), title_justify="left")
    for col in ("#", "step", "state", "duration", "note"):
        table.add_column(col)
    for row in rows:
        cells = (str(row.index), row.name + row.mark, row.state, fmt_duration(row.duration), row.note[:120])
        table.add_row(*(Text(cell) for cell in cells))
    return table


def print_description(out: Console, described: run.Description) -> None:
    out.print(Text.assemble((f"dry-run of plan '{described.plan_name}'", "bold"), f" ({described.plan_path}): "
                            "nothing will be changed"))  # fmt: skip
    for note in described.notes:
        out.print(note)
    for step in described.steps:
        flags = described.flags.get(step.name) or []
        line = Text.assemble("\n", (f"{step.index}. {step.title}", "bold"), f" ({step.name})")
        if flags:
            line.append("  " + "; ".join(flags), "yellow")
        out.print(line)
        for text in step.lines:
            out.print(f"   - {text}")
        for text in described.estimates.get(step.name, []):
            out.print(Text(f"   ~ {text}", "cyan"))
    if described.estimate_summary:
        out.print("")
        for text in described.estimate_summary:
            out.print(Text(text, "cyan"))
    hooks = "; ".join(f"{event}: {', '.join(names)}" for event, names in described.hooks.items())
    out.print("\nhooks: " + (hooks or "none"))


def status_lines(report: run.StatusReport) -> list[Text]:
    """Everything `migrate status` says below its table."""
    lines: list[Text] = []
    if report.state is not None and report.plan_changed:
        lines.append(Text("the plan file changed since this run began", "yellow"))
    left = report.ttl_wait_left()
    if left is not None:
        lines.append(Text(f"waiting out the old DNS TTL before the cut-over may begin: {clock_text(left)} left"))
    if report.holder is not None:
        lines.append(Text(f"running now: {report.holder.describe()}"))
    if report.interruption is not None:
        lines.extend(Text(line, "yellow") for line in report.interruption.lines())
    if report.postponed_by is not None:
        lines.append(Text(f"the cut-over is postponed while {report.postponed_by} exists: delete it to begin the "
                          "downtime"))  # fmt: skip
    if report.replication is not None:
        lines.append(Text(report.replication))
    reserve = report.rollback_reserve or {}
    if reserve.get("seconds") is not None:
        kept = f"rollback reserve: {reserve['seconds']:g} s kept back from the budget"
        lines.append(Text(f"{kept} ({reserve.get('basis')})"))
    if report.dns is not None:
        lines.append(Text(report.dns.line()))
    if report.dns_problem is not None:
        lines.append(Text(f"needs attention: {report.dns_problem}", "red"))
    if report.audit is not None:
        lines.append(Text(report.audit, "bold red" if report.audit.startswith("AUDIT") else "yellow"))
    for leftover in report.leftovers:
        # The next run of this plan (its preflight), or a rollback, ends them.
        lines.append(Text(leftover, "yellow"))
    lines.append(Text(f"next: {report.next_action}"))
    return lines


def print_status(out: Console, report: run.StatusReport) -> None:
    if report.state is None:
        out.print(f"plan '{report.plan_name}': no run yet")
    else:
        out.print(rows_table(f"run {report.state.run_id}: {report.state.status.value}", report.rows))
    for line in status_lines(report):
        out.print(line)


def watch_renderable(view: WatchView) -> RenderableType:
    """One look at a watched run, for a terminal (redrawn in place)."""
    report = view.report
    if report.state is None:
        return Text(f"plan '{report.plan_name}': no run yet; waiting for `migrate apply` to start one")
    table = rows_table(f"run {report.state.run_id}: {report.state.status.value}", report.rows)
    return Group(table, render_live(view.transfers, view.phase), *status_lines(report))


class PlainWatch:
    """`status --watch` when the output is not a terminal: one line per change (steps, phase, transfers)."""

    def __init__(self, out: Console) -> None:
        self.out = out
        self.states: dict[str, str] = {}
        self.last_phase = ""
        self.last_transfer: dict[str, float] = {}
        self.said_waiting = False

    def show(self, view: WatchView) -> None:
        stamp = time.strftime("%H:%M:%S")
        report = view.report
        if report.state is None:
            if not self.said_waiting:
                self.out.print(f"{stamp} plan '{report.plan_name}': no run yet; waiting for one to start")
                self.said_waiting = True
            return
        for row in report.rows:
            if self.states.get(row.name) != row.state:
                self.states[row.name] = row.state
                note = f" ({row.note})" if row.note else ""
                self.out.print(f"{stamp} step {row.index} {row.name}: {row.state}{note}")
        phase = view.phase.line()
        phase_key = phase.split(" · writes blocked")[0]  # a new line when the step or status changes, not each second
        if phase_key != self.last_phase:
            self.last_phase = phase_key
            self.out.print(f"{stamp} phase: {phase}")
        now = time.monotonic()
        for item in view.transfers:
            if now - self.last_transfer.get(item.id, -60.0) >= 5.0:
                self.last_transfer[item.id] = now
                self.out.print(f"{stamp} transfer {item.line()}")
        for line in view.log_lines:
            self.out.print(f"{stamp} log {line}")
        if view.ended:
            self.out.print(f"{stamp} run {report.state.run_id} ended: {report.state.status.value}; "
                           f"next: {report.next_action}")  # fmt: skip


def follow(out: Console, views: Iterable[WatchView], *, as_json: bool) -> WatchView | None:
    """Show each look at a watched run (redrawn on a terminal, as lines otherwise); the last one."""
    last = None
    if as_json:
        for last in views:
            doc = {
                **last.report.as_dict(),
                "phase": last.phase.line(),
                "transfers": [t.payload() for t in last.transfers],
            }
            out.file.write(json.dumps(doc, default=str) + "\n")
            out.file.flush()
    elif out.is_terminal:
        with Live(console=out, refresh_per_second=2, transient=False) as live:
            for last in views:
                live.update(watch_renderable(last))
    else:
        plain = PlainWatch(out)
        for last in views:
            plain.show(last)
    return last
