"""The page's view of a run: what the run report (JSON), the journal and the lab's clients' report say, read in one
place (`read_run`), so a change of the report's model changes this module only; and the few ways its values read as
text (sizes, clock times, durations, escaped for HTML).
"""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.engine.events import RunStarted, UndoCompleted, UndoFailed, UndoStarted
from orchestrator.engine.view import JournalView, Records
from orchestrator.report.build import run_events, seed_hold_text
from orchestrator.results import AuditResult

# Before, inside and after the downtime window (from writes blocked until DNS points at the target).
PHASES = ("before", "window", "after")
PHASE_TITLES = {
    "before": "Before the window (service live)",
    "window": "Inside the window (writes blocked)",
    "after": "After the DNS flip",
}


@dataclass(frozen=True)
class StepView:
    name: str
    title: str
    state: str
    started_at: float | None
    ended_at: float | None
    duration: float | None
    attempts: int
    error: str | None
    bytes_moved: int
    undo_started_at: float | None = None
    undo_ended_at: float | None = None


@dataclass(frozen=True)
class CheckView:
    """One check the run made: where it sits relative to the window, and what it found."""

    name: str
    step: str
    phase: str  # one of PHASES
    passed: bool
    detail: str
    at: float | None = None


@dataclass(frozen=True)
class ClientsView:
    """The lab's clients' experience of the move (from `migrate lab verify --json`)."""

    host: str
    longest_write_stall_s: float | None
    longest_ack_gap_s: float | None
    write_attempts_failed: int | None
    reads_failed: int | None
    reads_missing: int | None
    writes_pending_at_end: int | None
    reviews_acknowledged: int
    uploads_acknowledged: int
    acknowledged_lost: int
    error: str | None
    checked_at: float | None = None
    per_server: dict[str, dict[str, Any]] = field(default_factory=dict)
    server_names: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunView:
    run_id: str
    plan_name: str
    plan_path: str
    status: str
    started_at: float
    ended_at: float
    duration: float
    error: str | None
    rollback_reason: str | None
    steps: list[StepView]
    bytes_moved: int
    writes_blocked_at: float | None
    window_ended_at: float | None  # DNS flipped, or writes unblocked by the rollback
    dns_flipped_at: float | None
    write_block_seconds: float | None
    max_write_block: float | None  # None: the journal (which holds the plan) was not there
    checks: list[CheckView]
    clients: ClientsView | None = None
    # Where every DNS record pointed at the run's last reading (report["dns"]) and the rollback's reserve.
    dns: dict[str, Any] | None = None
    rollback_reserve: dict[str, Any] | None = None

    @property
    def window_bytes(self) -> int:
        if self.writes_blocked_at is None:
            return 0
        return sum(s.bytes_moved for s in self.steps if self.phase_of(s) == "window")

    def phase_of(self, step: StepView) -> str:
        if step.started_at is None or self.writes_blocked_at is None:
            return "before"
        end = step.ended_at if step.ended_at is not None else step.started_at
        if end < self.writes_blocked_at:
            return "before"
        if self.window_ended_at is None or step.started_at < self.window_ended_at:
            return "window"
        return "after"


def read_run(report: dict[str, Any], events: Records | None = None, verify: dict[str, Any] | None = None) -> RunView:
    """The page's view of a run, from the JSON report (`orchestrator.report.build.build_report`), the journal and, for a
    lab run, the clients' report (`migrate lab verify --json`)."""
    run_id = str(report.get("run_id") or "")
    events = run_events(events, run_id or None) if events is not None else JournalView()
    started = events.started() or RunStarted()
    titles = {ev.step: ev.title for ev in events.starts()}
    results: dict[str, dict[str, Any]] = {ev.step: dict(ev.result) for ev in events.completions()}
    undo: dict[str, dict[str, float]] = {}
    for ev in events:
        if isinstance(ev, UndoStarted) and ev.step:
            undo.setdefault(ev.step, {})["start"] = ev.ts
        elif isinstance(ev, UndoCompleted | UndoFailed) and ev.step:
            undo.setdefault(ev.step, {})["end"] = ev.ts
    bytes_by_step = report.get("bytes_by_step") or {}
    steps = [
        StepView(
            name=str(s["name"]),
            title=titles.get(str(s["name"]), ""),
            state=str(s.get("state") or ""),
            started_at=s.get("started_at"),
            ended_at=s.get("ended_at"),
            duration=s.get("duration"),
            attempts=int(s.get("attempts") or 0),
            error=s.get("error"),
            bytes_moved=int(bytes_by_step.get(s["name"]) or 0),
            undo_started_at=undo.get(str(s["name"]), {}).get("start"),
            undo_ended_at=undo.get(str(s["name"]), {}).get("end"),
        )
        for s in report.get("steps") or []
    ]
    cutover = report.get("cutover") or {}
    blocked_at = as_float(cutover.get("writes_blocked_at"))
    if blocked_at is None:  # a run rolled back inside the cut-over journaled the moment before it completed
        blocked_at = _saved_value(events, "cutover", "writes_blocked_at")
    flipped_at = as_float(report.get("dns_flipped_at"))
    # The window ends at the commit: the front door's switch when the plan has one (DNS moves after), else DNS.
    window_end = as_float(report.get("committed_at_door")) or flipped_at
    if blocked_at is not None and window_end is None:
        cutover_step = next((s for s in steps if s.name == "cutover"), None)
        window_end = cutover_step.undo_ended_at if cutover_step else None
    run_started = as_float(report.get("started_at")) or 0.0
    run_ended = as_float(report.get("ended_at")) or max(
        [t for s in steps for t in (s.ended_at, s.undo_ended_at) if t is not None] or [run_started]
    )
    write_block = as_float(report.get("write_block_seconds"))
    if write_block is None and blocked_at is not None and window_end is not None:
        write_block = round(window_end - blocked_at, 3)
    view = RunView(
        run_id=run_id,
        plan_name=str(started.plan_name or Path(str(report.get("plan") or "plan")).stem),
        plan_path=str(report.get("plan") or started.plan_path),
        status=str(report.get("status") or "unknown"),
        started_at=run_started,
        ended_at=run_ended,
        duration=as_float(report.get("duration")) or round(run_ended - run_started, 3),
        error=report.get("error"),
        rollback_reason=report.get("rollback_reason"),
        steps=steps,
        bytes_moved=int(report.get("bytes_moved") or 0),
        writes_blocked_at=blocked_at,
        window_ended_at=window_end,
        dns_flipped_at=flipped_at,
        write_block_seconds=write_block,
        max_write_block=_max_write_block(started.plan_text),
        checks=[],
        clients=read_clients(verify),
        dns=report.get("dns") if isinstance(report.get("dns"), dict) else None,
        rollback_reserve=report.get("rollback_reserve") if isinstance(report.get("rollback_reserve"), dict) else None,
    )
    return _with_checks(view, report, results)


def read_clients(verify: dict[str, Any] | None) -> ClientsView | None:
    """The clients' view from a `migrate lab verify --json` report (migrate_lab.verify.VerifyReport)."""
    if not verify:
        return None
    lost = verify.get("acknowledged_lost")
    if lost is None:
        counts = ("reviews_lost", "reviews_altered", "uploads_lost", "upload_rows_lost", "deletes_undone")
        lost = sum(int(verify.get(k) or 0) for k in counts)
    return ClientsView(
        host=str(verify.get("host") or "target"),
        longest_write_stall_s=as_float(verify.get("longest_write_stall_s")),
        longest_ack_gap_s=as_float(verify.get("longest_ack_gap_s")),
        write_attempts_failed=_int(verify.get("write_attempts_failed")),
        reads_failed=_int(verify.get("reads_failed")),
        reads_missing=_int(verify.get("reads_missing")),
        writes_pending_at_end=_int(verify.get("writes_pending_at_end")),
        reviews_acknowledged=int(verify.get("reviews_acknowledged") or 0),
        uploads_acknowledged=int(verify.get("uploads_acknowledged") or 0),
        acknowledged_lost=int(lost),
        error=verify.get("error"),
        checked_at=as_float(verify.get("checked_at")),
        per_server=dict(verify.get("per_server") or {}),
        server_names=dict(verify.get("server_names") or {}),
    )


def _with_checks(view: RunView, report: dict[str, Any], results: dict[str, dict[str, Any]]) -> RunView:
    """Every check the run recorded, placed before, inside or after the window by when it was made."""
    checks: list[CheckView] = []
    by_name = {s.name: s for s in view.steps}

    def ended(step: str) -> float | None:
        return by_name[step].ended_at if step in by_name else None

    def add(name: str, step: str, passed: bool, detail: str, at: float | None) -> None:
        checks.append(CheckView(name, step, _phase(view, at), passed, detail, at))

    preflight = results.get("preflight")
    if preflight is not None:
        facts = []
        if preflight.get("major_version"):
            facts.append(f"database {preflight['major_version']} on both hosts")
        if isinstance(preflight.get("source_bytes"), int):
            facts.append(f"{size_text(preflight['source_bytes'])} to copy")
        free = preflight.get("target_free")
        if isinstance(free, dict) and free:
            facts.append("target free: " + ", ".join(f"{k} {size_text(int(v))}" for k, v in free.items()))
        add(
            "preflight: SSH host keys, rsync, privileges, versions, space, DNS token",
            "preflight",
            True,
            "; ".join(facts) or "all passed",
            ended("preflight"),
        )
    ttl = results.get("lower_ttl")
    if ttl is not None and ttl.get("lowered_to") is not None:
        originals = ttl.get("original_ttls") or {}
        was = sorted({int(o["ttl"]) for o in originals.values() if not o.get("proxied")})
        skipped = ttl.get("proxied_skipped") or []
        add(
            f"DNS TTL lowered to {ttl['lowered_to']} s and the old TTL waited out",
            "lower_ttl",
            True,
            f"was {', '.join(map(str, was))} s; waited {ttl.get('waited_seconds')} s"
            + (f"; proxied (automatic TTL), skipped: {', '.join(map(str, skipped))}" if skipped else ""),
            ended("lower_ttl"),
        )
    presync = results.get("db_presync")
    if presync is not None and isinstance(presync.get("rounds"), list):
        rounds = presync["rounds"]
        last = rounds[-1] if rounds else {}
        add(
            "datadir pre-sync converged" if presync.get("converged") else "datadir pre-sync did not converge",
            "db_presync",
            bool(presync.get("converged")),
            f"{len(rounds)} round(s); last moved {size_text(int(last.get('bytes') or 0))} in {last.get('seconds')} s",
            ended("db_presync"),
        )
    seed = report.get("seed") or {}
    held = seed_hold_text(seed)
    if held:
        at = as_float(seed.get("commits_blocked_at")) or ended("repl_seed")
        add("the seed's hot backup, the source serving throughout", "repl_seed", True, held, at)
    cutover = report.get("cutover") or {}
    if cutover.get("lock_attempts") is not None:
        add(
            str(cutover.get("fence") or "FLUSH TABLES WITH READ LOCK"),
            "cutover",
            True,
            f"held after {cutover.get('lock_wait_seconds')} s in {cutover.get('lock_attempts')} attempt(s)",
            as_float(cutover.get("lock_acquired_at")),
        )
    counts = report.get("row_counts") or {}
    if counts:
        add(
            "source row counts under the lock",
            "cutover",
            True,
            f"{len(counts)} table(s), {sum(int(v) for v in counts.values())} rows",
            as_float(cutover.get("lock_acquired_at")),
        )
    if cutover.get("final_pass_seconds") is not None:
        add(
            "source database shut down cleanly, final datadir pass",
            "cutover",
            True,
            f"shutdown {cutover.get('shutdown_seconds')} s; final pass {cutover.get('final_pass_seconds')} s, "
            f"{size_text(int(cutover.get('final_pass_bytes') or 0))}",
            ended("cutover"),
        )
    verify = results.get("verify_target")
    if verify is not None:
        at = ended("verify_target")
        for name, tries in (verify.get("health_tries") or {}).items():
            add(f"health check {name}", "verify_target", True, f"passed on try {tries}", at)
        rows = verify.get("row_counts")
        if isinstance(rows, dict):
            add(
                "row counts equal to the source's",
                "verify_target",
                True,
                f"{rows.get('compared')} of {rows.get('tables')} table(s) compared"
                + (f", checksums {rows['checksummed']}" if rows.get("checksummed") else ""),
                at,
            )
        for tree, differing in (verify.get("trees_differing_items") or {}).items():
            add(
                f"file tree {tree} equal on the target",
                "verify_target",
                differing == 0,
                "rsync --checksum --dry-run changes nothing" if differing == 0 else f"{differing} item(s) differ",
                at,
            )
    flip = results.get("dns_flip")
    if flip is not None:
        records = flip.get("records") or []
        # Read back before the commit (without a front door): it belongs to the window it closes.
        add(
            "DNS records read back",
            "dns_flip",
            True,
            f"{', '.join(map(str, records))} → {flip.get('new_content')}",
            view.dns_flipped_at - 1e-6 if view.dns_flipped_at else ended("dns_flip"),
        )
    audited = AuditResult.of(results.get("audit"))
    if results.get("audit") is not None and audited.status not in ("off", "not_needed"):
        add(
            "audit after the commit: every table, the target as migrated against the source",
            "audit",
            not audited.needs_attention,
            "; ".join(x for x in (audited.status, audited.cost(), audited.summary()) if x),
            ended("audit"),
        )
    finish = results.get("finish")
    if finish is not None:
        stopped = finish.get("source_services_stopped") or []
        add(
            "the source refuses writes",
            "finish",
            True,
            f"source {finish.get('source')}" + (f"; stopped: {', '.join(map(str, stopped))}" if stopped else ""),
            ended("finish"),
        )
    clients = view.clients
    if clients is not None:
        add(
            f"every acknowledged write on the {clients.host} (lab verify)",
            "lab",
            clients.error is None and clients.acknowledged_lost == 0,
            clients.error
            or f"{clients.reviews_acknowledged} reviews and {clients.uploads_acknowledged} uploads "
            f"acknowledged; {clients.acknowledged_lost} lost",
            clients.checked_at,
        )
    for step in view.steps:
        if step.error and step.state in ("failed", "undo_failed"):
            at = step.ended_at if step.state == "failed" else step.undo_ended_at
            add(
                f"{step.name} {'failed' if step.state == 'failed' else 'compensation failed'}",
                step.name,
                False,
                step.error,
                at,
            )
    checks.sort(key=lambda c: c.at if c.at is not None else math.inf)
    return replace(view, checks=checks)


def _phase(view: RunView, at: float | None) -> str:
    if at is None or view.writes_blocked_at is None or at < view.writes_blocked_at:
        return "before"
    if view.window_ended_at is None or at <= view.window_ended_at:
        return "window"
    return "after"


def _saved_value(events: JournalView, step: str, key: str) -> float | None:
    values = events.saved_values(step, key)
    return as_float(values[-1]) if values else None


def _max_write_block(plan_text: str) -> float | None:
    """cutover.max_write_block as the run's plan set it (the plan text is journaled at the run's start)."""
    if not plan_text:
        return None
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    from orchestrator.plan.model import Cutover

    default = float(Cutover.model_fields["max_write_block"].default)
    try:
        data = YAML(typ="safe").load(plan_text)
    except YAMLError:
        return default
    cutover = data.get("cutover") if isinstance(data, dict) else None
    value = cutover.get("max_write_block") if isinstance(cutover, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def as_float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# ------------------------------------------------------------------------------------------------------ formatting


def size_text(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def clock_text(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1000):03d}"


def seconds_text(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f} s"
    if value < 120:
        return f"{value:.1f} s"
    minutes, seconds = divmod(value, 60)
    return f"{int(minutes)} min {seconds:02.0f} s"


def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)
