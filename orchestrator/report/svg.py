"""The page's drawings, inline SVG: the timeline of the steps (the downtime window highlighted, the bytes each step
moved, undo bars) and the gauge of the write-block budget (`cutover.max_write_block`) the window used.
"""

from __future__ import annotations

import math

from orchestrator.report.view import RunView, StepView, clock_text, escape, seconds_text, size_text

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


def timeline_svg(view: RunView, *, element_id: str, begin: float, end: float, title: str, zoom: bool) -> str:
    """One row per step: a bar from its start to its end (and its compensation, if any), bytes on the right."""
    rows = [s for s in view.steps if not zoom or _overlaps(s, begin, end)]
    plot_x0, plot_x1 = LABEL_WIDTH, CHART_WIDTH - BYTES_WIDTH
    height = AXIS_HEIGHT + ROW_HEIGHT * len(rows) + 56
    span = max(end - begin, 1e-3)

    def x(ts: float) -> float:
        return plot_x0 + (min(max(ts, begin), end) - begin) / span * (plot_x1 - plot_x0)

    parts = [
        f'<svg id="{element_id}" class="timeline" viewBox="0 0 {CHART_WIDTH} {height}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
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
            f"{escape(_tick_label(value, step))}</text>"
        )
        value += step
    # The bars.
    for i, s in enumerate(rows):
        y = AXIS_HEIGHT + i * ROW_HEIGHT
        mid = y + ROW_HEIGHT / 2
        parts.append(
            f'<text x="{LABEL_WIDTH - 10}" y="{mid + 4:.1f}" class="label" text-anchor="end">{escape(s.name)}</text>'
        )
        s_end = s.ended_at if s.ended_at is not None else view.ended_at
        visible = s.started_at is not None and not (s_end < begin or s.started_at > end)
        if s.started_at is not None and (visible or not zoom):
            bx0, bx1 = x(s.started_at), x(s_end)
            # A step that failed keeps its error after the rollback undid it: it stays red.
            colour = FAILED_COLOUR if s.error else COLOURS[view.phase_of(s)]
            tip = f"{s.name}: {clock_text(s.started_at)} → {clock_text(s_end)} ({seconds_text(s.duration)}), {s.state}"
            if s.bytes_moved:
                tip += f", {size_text(s.bytes_moved)}"
            parts.append(
                f'<rect class="step-bar" data-step="{escape(s.name)}" data-state="{escape(s.state)}" '
                f'data-visible="{"yes" if visible else "no"}" x="{bx0:.1f}" y="{mid - BAR_HEIGHT / 2:.1f}" '
                f'width="{max(bx1 - bx0, 3):.1f}" height="{BAR_HEIGHT}" rx="3" fill="{colour}">'
                f"<title>{escape(tip)}</title></rect>"
            )
            if visible:
                label = seconds_text(s.duration) if s.duration is not None else ""
                inside = bx1 - bx0 > 70
                right_room = bx1 + 60 < plot_x1  # else the label goes left of the bar
                lx = (bx0 + bx1) / 2 if inside else (bx1 + 5 if right_room else bx0 - 5)
                anchor = "middle" if inside else ("start" if right_room else "end")
                cls = "bar-text" if inside else "bar-note"
                parts.append(
                    f'<text x="{lx:.1f}" y="{mid + 4:.1f}" class="{cls}" text-anchor="{anchor}">{escape(label)}</text>'
                )
        if s.undo_started_at is not None:
            u_end = s.undo_ended_at if s.undo_ended_at is not None else view.ended_at
            ux0, ux1 = x(s.undo_started_at), x(u_end)
            parts.append(
                f'<rect class="undo-bar" data-step="{escape(s.name)}" x="{ux0:.1f}" y="{mid - BAR_HEIGHT / 2 + 3:.1f}" '
                f'width="{max(ux1 - ux0, 3):.1f}" height="{BAR_HEIGHT - 6}" rx="2" fill="url(#{element_id}-undo)" '
                f'stroke="{UNDO_COLOUR}"><title>'
                f"{escape(f'undo {s.name}: {clock_text(s.undo_started_at)} → {clock_text(u_end)}')}</title></rect>"
            )
        if s.bytes_moved:
            parts.append(
                f'<text x="{CHART_WIDTH - 8}" y="{mid + 4:.1f}" class="bytes" text-anchor="end">'
                f"{escape(size_text(s.bytes_moved))}</text>"
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


def budget_gauge(view: RunView) -> str:
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
            f'fill="{shades[i % len(shades)]}"><title>{escape(f"{s.name}: {seconds_text(end - start)}")}</title></rect>'
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
        f'text-anchor="{"start" if room else "end"}">{escape(seconds_text(used))} used ({share:.1f} %)</text>'
    )
    parts.append("</svg>")
    return "".join(parts)
