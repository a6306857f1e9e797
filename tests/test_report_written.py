"""The run's JSON report and its page are written together when a run ends; a page that cannot be drawn never costs
the run its JSON report (report.write_report writes the JSON alone, report_html.write_report_and_page both)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.report import html as report_html
from orchestrator.report.build import write_report
from orchestrator.report.html import ReportError, write_report_and_page

FIXTURE = Path(__file__).parent / "fixtures" / "report_html" / "completed"


def _run_dir(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    shutil.copy(FIXTURE / "journal.jsonl", tmp_path / "journal.jsonl")
    report = json.loads(next(FIXTURE.glob("report-*.json")).read_text())
    return tmp_path, report


def test_the_report_and_its_page_are_written_side_by_side(tmp_path: Path) -> None:
    directory, report = _run_dir(tmp_path)
    path = write_report_and_page(report, directory)
    assert json.loads(path.read_text())["run_id"] == report["run_id"]
    page = path.with_suffix(".html")
    assert page.exists() and str(report["run_id"]) in page.read_text()


def test_a_page_that_cannot_be_drawn_leaves_the_json_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory, report = _run_dir(tmp_path)

    def broken(_path: Path, _clients: object = None) -> Path:
        raise ReportError("cannot draw")

    monkeypatch.setattr(report_html, "write_html", broken)
    path = write_report_and_page(report, directory)
    assert path.exists() and not path.with_suffix(".html").exists()


def test_the_json_report_alone_draws_no_page(tmp_path: Path) -> None:
    directory, report = _run_dir(tmp_path)
    path = write_report(report, directory)
    assert path.exists() and not path.with_suffix(".html").exists()
