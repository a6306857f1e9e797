"""Where the plan's health checks run (`when`), without a lab: the replicate mode runs them against the fenced
replica before the window and only the cheap ones again inside it; the shutdown mode runs every one inside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.plan.loader import load_plan
from orchestrator.plan.model import static_mode
from orchestrator.services.health import BEFORE, INSIDE, check_label, checks_for
from tests.test_plan import SMALL_PLAN, error_of, write

CHECKS = """\
health:
  checks:
    - {kind: http, name: app, url: "http://203.0.113.20/healthz"}
    - {kind: sql, name: rows exist, query: "SELECT EXISTS(SELECT 1 FROM shop.orders)", expect: "1", when: both}
    - {kind: sql, name: all rows readable, query: "SELECT COUNT(*) >= 0 FROM shop.orders", when: before}
    - {kind: tcp, name: port, host: 203.0.113.20, port: 443, when: window}
"""


def test_when_says_where_each_check_runs_in_the_replicate_mode_and_the_shutdown_mode_runs_them_all_inside(
    tmp_path: Path,
) -> None:
    health = load_plan(write(tmp_path, SMALL_PLAN + CHECKS)).plan.health
    labels = lambda checks: [check_label(c) for c in checks]  # noqa: E731
    assert health.checks[0].when == "both"  # the default: before the window and again right before DNS moves
    assert labels(checks_for(health, BEFORE, replicate=True)) == ["app", "rows exist", "all rows readable"]
    assert labels(checks_for(health, INSIDE, replicate=True)) == ["app", "rows exist", "port"]
    # The shutdown mode's target starts inside the window: nothing can run before it, and nothing is skipped.
    assert checks_for(health, BEFORE, replicate=False) == []
    assert labels(checks_for(health, INSIDE, replicate=False)) == ["app", "rows exist", "all rows readable", "port"]


def test_an_unknown_when_is_one_line_with_its_place(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL_PLAN + CHECKS.replace("when: window", "when: later"))
    message = str(error_of(path))
    assert message.startswith(f"{path}:") and "health.checks[3].when" in message, message


def test_auto_is_the_default_and_without_a_replication_section_it_can_only_be_shutdown(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, SMALL_PLAN)).plan
    assert plan.cutover.mode == "auto" and plan.replication is None
    assert static_mode(plan) == "shutdown"


def test_a_run_of_an_auto_plan_without_replication_is_shutdown_without_asking_the_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.run import compose

    def _no_servers(*_: object) -> object:
        raise AssertionError("the servers were asked")

    monkeypatch.setattr(compose, "runtime_factory", _no_servers)
    path = write(tmp_path, SMALL_PLAN)
    resolved = compose.resolve_mode(load_plan(path).plan, path, tmp_path / "journal.jsonl", probe=True)
    assert resolved.cutover.mode == "shutdown"


def test_preflight_says_the_mode_the_author_wrote_not_the_one_the_run_resolved(tmp_path: Path) -> None:
    """A plan left to the default (auto) and resolved to shutdown is still 'chosen by auto' in preflight's line."""
    import structlog

    from orchestrator.engine.step import StepContext
    from orchestrator.steps.repl_common import declared_mode, mode_reason

    class Rt:
        plan = load_plan(write(tmp_path, SMALL_PLAN)).plan.model_copy()

    def context(text: str | None) -> StepContext:
        events = [{"event": "run_started", "plan_text": text}] if text is not None else []
        return StepContext(run_id="t", step="preflight", dry_run=False, rt=Rt(), log=structlog.get_logger("t"),
                           _history=lambda: events)  # fmt: skip

    assert declared_mode(context(SMALL_PLAN)) == "auto"
    written = SMALL_PLAN.replace("  max_write_block: 60\n", "  max_write_block: 60\n  mode: shutdown\n")
    assert declared_mode(context(written)) == "shutdown"
    assert declared_mode(context(None)) == "auto"  # no journal: the plan the run has
    line = mode_reason("shutdown", ["the plan has no replication section (user, password)"], "auto")
    assert line == (
        "shutdown (chosen by 'auto'): replication is not possible here: the plan has no replication section "
        "(user, password)"
    )
