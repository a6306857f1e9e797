"""What the lifecycle commands return: the command line renders these and maps them to exit codes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from orchestrator.engine.journal import RunState
from orchestrator.engine.lock import Holder
from orchestrator.engine.machine import StepPlan
from orchestrator.services.dns_where import Reading


class RunError(Exception):
    """A command stops before (or instead of) acting: one line for the operator and the documented exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ApplyEnd(StrEnum):
    COMPLETED = "completed"
    NOTHING_TO_DO = "nothing_to_do"  # the run had completed before
    ROLLED_BACK = "rolled_back"
    DECLINED = "declined"
    NEEDS_ATTENTION = "needs_attention"


@dataclass(frozen=True)
class StepRow:
    index: int
    name: str
    mark: str  # " (commit point)", " (downtime begins)" or ""
    state: str
    duration: float | None
    note: str
    error: str | None = None


@dataclass
class ApplyResult:
    end: ApplyEnd
    run_id: str | None
    rows: list[StepRow] = field(default_factory=list)
    next_action: str = ""
    report_text: str | None = None
    report_path: Path | None = None
    message: str | None = None


@dataclass
class RollbackResult:
    rolled_back: bool  # False: a compensation failed (needs attention)
    run_id: str | None
    message: str
    rows: list[StepRow] = field(default_factory=list)
    next_action: str = ""


@dataclass
class Description:
    plan_name: str
    plan_path: Path
    notes: list[str]
    steps: list[StepPlan]
    flags: dict[str, list[str]]  # step name -> what the operator should know (downtime, postpone, commit point)
    hooks: dict[str, list[str]]
    # The read-only estimate (apply --dry-run, unless --no-estimate): lines per step, the summary (or the one line
    # saying why there is none), and the figures as data.
    estimates: dict[str, list[str]] = field(default_factory=dict)
    estimate_summary: list[str] = field(default_factory=list)
    estimate_data: dict[str, Any] | None = None


@dataclass
class Interruption:
    """A run that stopped without finishing, with nobody holding its lock (killed, or its machine died)."""

    blocked_since: float | None  # when writes were blocked (journaled), None if they are not blocked now
    blocked_by: str | None  # the step in whose window writes are blocked
    budget: float
    budget_left: float | None
    resume_would: str
    headline: str = "interrupted: the run stopped without finishing and no process holds its lock"
    # The DNS records as last read by the run (journaled): {"at": ts, "records": {name: [contents]}}; `migrate
    # status` shows them (live when it can) for every run, interrupted or not.
    dns_now: dict[str, Any] | None = None
    guard: str | None = None  # what the guard on the source will do (or did)

    def lines(self, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        lines = [self.headline]
        if self.blocked_by is not None and self.blocked_since is None:
            lines.append(f"writes may be blocked now: step {self.blocked_by} had begun the downtime")
        elif self.blocked_since is not None:
            when = time.strftime("%H:%M:%S", time.localtime(self.blocked_since))
            lines.append(
                f"writes blocked now: since {when} ({now - self.blocked_since:.0f} s), by step {self.blocked_by}; "
                "neither rolled back nor committed"
            )
        if self.budget_left is not None:
            left = (
                f"{self.budget_left:.1f} s left" if self.budget_left > 0 else f"spent ({-self.budget_left:.1f} s over)"
            )
            lines.append(f"write budget (cutover.max_write_block {self.budget:g} s): {left}")
        if self.guard:
            lines.append(self.guard)
        lines.append(f"a resume now would {self.resume_would}")
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {
            "writes_blocked_since": self.blocked_since,
            "blocked_by": self.blocked_by,
            "max_write_block": self.budget,
            "budget_left": self.budget_left,
            "resume_would": self.resume_would,
            "dns_now": self.dns_now,
            "guard": self.guard,
        }


@dataclass
class StatusReport:
    plan_name: str
    state: RunState | None
    rows: list[StepRow]
    plan_changed: bool
    holder: Holder | None
    postponed_by: Path | None
    next_action: str
    interruption: Interruption | None
    ttl_wait_until: float | None = None  # the cut-over may begin then (the lower_ttl step's wait)
    replication: str | None = None  # the replica's lag, read live while a replica step runs
    dns: Reading | None = None  # where every DNS record points (live, or the run's last journaled reading)
    dns_problem: str | None = None  # the records split, or at the host that does not serve
    # The seconds the run kept back from its budget for the rollback, and how they were derived (journaled).
    rollback_reserve: dict[str, Any] | None = None
    audit: str | None = None  # the after-commit audit, when it did not prove the data equal
    # What earlier runs of this plan left on the hosts (orchestrator/services/owned.py), read live: one line each.
    leftovers: list[str] = field(default_factory=list)

    def ttl_wait_left(self, now: float | None = None) -> float | None:
        left = None if self.ttl_wait_until is None else self.ttl_wait_until - (time.time() if now is None else now)
        return left if left is not None and left > 0 else None

    def as_dict(self) -> dict[str, Any]:
        left = self.ttl_wait_left()
        doc: dict[str, Any] = {
            "run": None,
            "next": self.next_action,
            "locked_by": self.holder.__dict__ if self.holder else None,
            "interrupted": self.interruption.as_dict() if self.interruption else None,
            "dns_ttl_wait_seconds_left": None if left is None else round(left, 1),
            "replication": self.replication,
            "dns": self.dns.as_dict() if self.dns is not None else None,
            "dns_problem": self.dns_problem,
            "rollback_reserve": self.rollback_reserve,
            "audit": self.audit,
            "left_by_other_runs": self.leftovers,
        }
        if self.state is not None:
            doc["run"] = {
                "run_id": self.state.run_id,
                "status": self.state.status.value,
                "committed": self.state.committed,
                "started_at": self.state.started_at,
                "ended_at": self.state.ended_at,
                "error": self.state.error,
                "steps": [
                    {"name": r.name, "state": r.state, "duration": r.duration, "error": r.note} for r in self.rows
                ],
            }
        return doc
