"""The run report as a page, rendered by a real browser (Debian's headless Chromium).

The fixtures are what real lab runs wrote (`migrate apply` on the lab under `migrate lab load`, then `migrate lab
verify --json`): a completed run, and a run rolled back inside the window because its write-block budget was spent.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from orchestrator.report.html import ReportError, read_journal, render_html, report_command, write_html
from orchestrator.report.markdown import markdown_summary
from orchestrator.report.view import read_run

FIXTURES = Path(__file__).parent / "fixtures" / "report_html"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
WINDOW = (1200, 1400)
# The step bars' fills: service live (blue), writes blocked (amber).
LIVE_BLUE = (0x25, 0x63, 0xEB)
WINDOW_AMBER = (0xD9, 0x77, 0x06)


# --- a real browser ---------------------------------------------------------------------------------------------


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert Path(CHROMIUM).exists(), "chromium is needed (Makefile SYSTEM_PACKAGES)"
    command = [
        CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars", "--no-first-run",
        "--force-device-scale-factor=1", f"--user-data-dir={tmp_path / 'chromium-profile'}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}", *args, page.resolve().as_uri(),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def screenshot(tmp_path: Path, page: Path) -> Path:
    shot = tmp_path / "shot.png"
    chromium(tmp_path, page, f"--screenshot={shot}")
    assert shot.exists()
    return shot


def timeline_box(tmp_path: Path, page: Path) -> tuple[float, float, float, float]:
    """Where the browser laid out the timeline (left, top, width, height): a copy of the page with a probe script
    that writes it into the DOM, read back with --dump-dom (the page itself has no script)."""
    probe = tmp_path / "probe.html"
    script = (
        "<script>const r = document.getElementById('timeline').getBoundingClientRect();"
        "document.body.setAttribute('data-box', [r.left, r.top, r.width, r.height].join(','));</script>"
    )
    probe.write_text(page.read_text().replace("</body>", script + "</body>"))
    dom = chromium(tmp_path, probe, "--dump-dom").stdout
    found = re.search(r'data-box="([^"]+)"', dom)
    assert found, dom[:500]
    left, top, width, height = (float(v) for v in found.group(1).split(","))
    return left, top, width, height


def decode_png(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes) of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    channels = 4 if colour == 6 else 3
    stride = width * channels
    raw = zlib.decompress(idat)
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                corner = previous[i - channels] if i >= channels else 0
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        previous = line
        rgb = line if channels == 3 else bytearray(b for j, b in enumerate(line) if j % 4 != 3)
        rows.append(bytes(rgb))
    return width, height, rows


def pixels_in(rows: list[bytes], box: tuple[float, float, float, float]) -> list[tuple[int, int, int]]:
    left, top, width, height = (int(v) for v in box)
    found = []
    for row in rows[top : top + height]:
        for x in range(left, min(left + width, len(row) // 3)):
            found.append((row[3 * x], row[3 * x + 1], row[3 * x + 2]))
    return found


def near(colour: tuple[int, int, int], wanted: tuple[int, int, int], tolerance: int = 12) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(colour, wanted, strict=True))


class Dom(HTMLParser):
    """The elements of a page as (tag, attributes), in document order, and its text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def bars(self, svg_id: str, cls: str = "step-bar") -> list[dict[str, str]]:
        inside, found = False, []
        for tag, attrs in self.elements:
            if tag == "svg":
                inside = attrs.get("id") == svg_id
            elif inside and tag == "rect" and cls in attrs.get("class", "").split():
                found.append(attrs)
        return found


# --- fixtures ---------------------------------------------------------------------------------------------------


def run_copy(tmp_path: Path, name: str) -> Path:
    """A copy of a recorded run's state directory; returns its report-<id>.json."""
    directory = tmp_path / name
    shutil.copytree(FIXTURES / name, directory)
    return next(directory.glob("report-*.json"))


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


# --- the page in a browser --------------------------------------------------------------------------------------


def test_completed_lab_run_page_draws_one_bar_per_step_in_chromium(tmp_path: Path) -> None:
    report_path = run_copy(tmp_path, "completed")
    report = load(report_path)
    clients = load(report_path.parent / "verify-target.json")
    page = write_html(report_path, clients)
    assert page == report_path.with_suffix(".html") and page.exists()

    text = page.read_text()
    # Self-contained: nothing to fetch (the SVG namespace is a name, not a request).
    assert not re.search(r"<(script|link|img|iframe)\b|\b(src|href)=|@import|url\((?!#)", text)

    dom = Dom(chromium(tmp_path, page, "--dump-dom").stdout)
    bars = dom.bars("timeline")
    assert [b["data-step"] for b in bars] == [s["name"] for s in report["steps"]]
    # The bars follow the run: each starts where (or after) the one before it does.
    starts = [float(b["x"]) for b in bars]
    assert starts == sorted(starts) and starts[-1] > starts[0]
    # The downtime window and the budget are drawn; the bytes of each step are written beside its bar.
    assert any(tag == "rect" and "window" in a.get("class", "") for tag, a in dom.elements)
    assert any("budget-line" in a.get("class", "") for _, a in dom.elements)
    page_text = " ".join(dom.text)
    for step, moved in report["bytes_by_step"].items():
        assert moved > 0 and step in page_text
    assert "61.4 MiB" in page_text  # db_presync's 64364279 bytes
    # The clients' view from `lab verify --json`.
    assert f"{clients['longest_write_stall_s']:.2f} s" in page_text
    assert "acknowledged writes lost" in page_text

    width, height, rows = decode_png(screenshot(tmp_path, page))
    assert (width, height) == WINDOW
    box = timeline_box(tmp_path, page)
    assert box[2] > 600 and box[3] > 200 and box[1] + box[3] <= height, box
    inside = pixels_in(rows, box)
    assert len(set(inside)) > 20, "the timeline area is blank"
    blue = sum(1 for p in inside if near(p, LIVE_BLUE))
    amber = sum(1 for p in inside if near(p, WINDOW_AMBER))
    assert blue > 500 and amber > 500, (blue, amber)


def test_rolled_back_run_shows_the_failed_step_and_the_compensations(tmp_path: Path) -> None:
    report_path = run_copy(tmp_path, "rolled_back")
    report = load(report_path)
    page = write_html(report_path)
    dom = Dom(chromium(tmp_path, page, "--dump-dom").stdout)
    started = [s["name"] for s in report["steps"] if s["started_at"] is not None]
    assert [b["data-step"] for b in dom.bars("timeline")] == started
    undone = [b["data-step"] for b in dom.bars("timeline", "undo-bar")]
    assert set(undone) == set(started)  # every step that ran was compensated, newest first
    failed = [b for b in dom.bars("timeline") if b.get("fill") == "#dc2626"]
    assert [b["data-step"] for b in failed] == ["files_final"]
    text = " ".join(dom.text)
    assert "more than cutover.max_write_block 1.5 s" in text
    assert "budget 1.5 s" in text  # read from the plan the run journaled


def test_everything_from_the_run_is_escaped(tmp_path: Path) -> None:
    report_path = run_copy(tmp_path, "completed")
    report = load(report_path)
    hostile = "<script>document.title='owned'</script><img src=x onerror=alert(1)>"
    report["plan"] = f"/srv/{hostile}/plan.yaml"
    report["error"] = f"step failed: {hostile}"
    report["steps"][3]["error"] = hostile
    report_path.write_text(json.dumps(report))
    journal = report_path.parent / "journal.jsonl"
    events = read_journal(journal)
    events[0]["plan_name"] = f"name {hostile}"
    journal.write_text("".join(json.dumps(e) + "\n" for e in events))
    clients = load(report_path.parent / "verify-target.json")
    clients["error"] = hostile
    clients["server_names"] = {address: hostile for address in clients["per_server"]}

    page = write_html(report_path, clients)
    text = page.read_text()
    assert hostile not in text and "&lt;script&gt;" in text
    rendered = chromium(tmp_path, page, "--dump-dom").stdout
    dom = Dom(rendered)
    assert not [tag for tag, _ in dom.elements if tag in ("script", "img")]
    title = re.search(r"<title>(.*?)</title>", rendered, re.S)
    assert title and title.group(1).startswith("name &lt;script&gt;"), title  # no script ran to change it
    assert hostile in " ".join(dom.text)  # shown as text


# --- the Markdown summary and the command -----------------------------------------------------------------------


def test_markdown_summary_is_the_seed_table_of_steps(tmp_path: Path) -> None:
    report_path = run_copy(tmp_path, "completed")
    report = load(report_path)
    summary = markdown_summary(report, read_journal(report_path.parent / "journal.jsonl"))
    lines = summary.splitlines()
    header = lines.index("| Step | Start (UTC) | End (UTC) | Duration |")
    assert lines[header + 1] == "|---|---|---|---|"
    rows = [line.split(" | ") for line in lines[header + 2 :] if line.startswith("| ")]
    assert [r[0].removeprefix("| ") for r in rows[: len(report["steps"])]] == [s["name"] for s in report["steps"]]
    first = report["steps"][0]
    assert rows[0][3] == f"{first['duration']:.2f} s |"
    assert rows[-1][0] == "| **writes blocked**" and rows[-1][3] == f"**{report['write_block_seconds']:.2f} s** |"
    assert "course-review-lab" in lines[0] and "(budget 60 s)" in summary
    # Without the journal the budget is not known, so it is not claimed.
    assert "budget" not in markdown_summary(report)


def test_report_command_makes_the_page_of_the_latest_run_even_without_a_json_report(tmp_path: Path) -> None:
    events = read_journal(FIXTURES / "completed" / "journal.jsonl")
    plan = tmp_path / "plan.yaml"
    plan.write_text(events[0]["plan_text"])
    state_dir = tmp_path / ".migrate" / "course-review-lab"
    state_dir.mkdir(parents=True)
    shutil.copy(FIXTURES / "completed" / "journal.jsonl", state_dir / "journal.jsonl")

    page = report_command(plan, open_browser=False, clients_path=FIXTURES / "completed" / "verify-target.json")
    run_id = events[0]["run_id"]
    assert page == state_dir / f"report-{run_id}.html"
    assert (state_dir / f"report-{run_id}.json").exists()  # rebuilt from the journal
    dom = Dom(page.read_text())
    assert len(dom.bars("timeline")) == 10


def test_report_command_without_a_run_says_so(tmp_path: Path) -> None:
    events = read_journal(FIXTURES / "completed" / "journal.jsonl")
    plan = tmp_path / "plan.yaml"
    plan.write_text(events[0]["plan_text"])
    with pytest.raises(ReportError, match="no run recorded"):
        report_command(plan, open_browser=False)
    assert not (tmp_path / ".migrate").exists() or not any((tmp_path / ".migrate").rglob("*.html"))


# --- from a run made now, on the lab ----------------------------------------------------------------------------


@pytest.mark.lab
def test_page_of_a_lab_run_under_load(lab: Any, tmp_path: Path) -> None:
    """`migrate apply` on the lab while clients write through DNS, `lab verify`, then `migrate report`'s function:
    the page has one bar per step of that run and the clients' view, and the browser draws the timeline."""
    import signal
    import sys

    from migrate_lab.verify import main_verify
    from tests.test_e2e import migrate_apply, outcome, plan_copy, plan_name, restore_source_live

    restore_source_live(lab)
    load_dir = tmp_path / "load"
    load = subprocess.Popen(
        [sys.executable, "-m", "migrate_lab.load", "--lab", str(lab.path), "--duration", "60", "--rate", "10",
         "--clients", "2", "--dns-ttl", "1", "--out", str(load_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        plan = plan_copy(lab, "page", {})
        result = migrate_apply(lab, plan)
        assert result.returncode == 0, outcome(result)
    finally:
        load.send_signal(signal.SIGTERM)
        load.wait(timeout=60)
    try:
        verify = main_verify(lab, host="target", load_dir=load_dir)
        page = report_command(plan, open_browser=False, clients_path=load_dir / "verify-target.json")
        assert page.parent == plan.parent / ".migrate" / plan_name(plan)
        report = load_json(page.with_suffix(".json"))
        rendered = chromium(tmp_path, page, "--dump-dom").stdout
        _, _, rows = decode_png(screenshot(tmp_path, page))
        box = timeline_box(tmp_path, page)
    finally:
        restore_source_live(lab)
    assert report["status"] == "completed"
    dom = Dom(rendered)
    assert [b["data-step"] for b in dom.bars("timeline")] == [s["name"] for s in report["steps"]]
    assert f"{verify.reviews_acknowledged} reviews" in " ".join(dom.text)
    inside = pixels_in(rows, box)
    assert sum(1 for p in inside if near(p, LIVE_BLUE)) > 500 and sum(1 for p in inside if near(p, WINDOW_AMBER)) > 500


def load_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_the_seeds_hold_on_the_sources_commits_is_a_check_before_the_window() -> None:
    """What the replicate mode's hot backup cost the live source (from the report's `seed`): a passed check placed
    before the window, saying how long its commits and DDL were held."""
    report = {
        "run_id": "r1", "status": "completed", "started_at": 100.0, "ended_at": 200.0, "duration": 100.0,
        "steps": [
            {"name": "repl_seed", "state": "done", "started_at": 110.0, "ended_at": 130.0, "duration": 20.0},
            {"name": "repl_switch", "state": "done", "started_at": 150.0, "ended_at": 150.1, "duration": 0.1},
        ],
        "cutover": {"writes_blocked_at": 150.0}, "dns_flipped_at": 150.2, "write_block_seconds": 0.2,
        "seed": {"commits_blocked_seconds": 0.012, "ddl_blocked_seconds": 0.02, "commits_blocked_at": 128.5},
    }  # fmt: skip
    view = read_run(report)
    held = [c for c in view.checks if c.step == "repl_seed"]
    assert len(held) == 1 and held[0].passed, view.checks
    assert "commits 0.012 s" in held[0].detail and "DDL 0.020 s" in held[0].detail
    assert view.phase_of(view.steps[0]) == "before" and held[0].phase == "before"
    assert "hot backup, the source serving throughout" in render_html(view)


def test_the_checks_name_the_engines_own_checksum_and_older_journals_read_as_mariadbs() -> None:
    from orchestrator.report.build import checks_where

    audit = {"status": "equal", "method": "figures", "tables": 2, "reason": None}
    postgres = checks_where({"audit": {**audit, "checksum_name": "a sum of every row's hashtext"}})
    assert [c["check"] for c in postgres if c["where"] == "after"] == [
        "row counts and a sum of every row's hashtext of every table: the target's snapshot at the commit against "
        "the stopped source"
    ]
    older = checks_where({"audit": audit})
    assert "row counts and CHECKSUM TABLE of every table" in older[-1]["check"]
