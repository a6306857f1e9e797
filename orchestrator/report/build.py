"""The run report: what each step did and when, the bytes moved, and how long writes were blocked.

Built from the journal's events alone (the journal is the run's truth), so it can be made during the run (the
finish step's figures), after it by the command line, or for a crashed run from what was recorded.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from orchestrator.engine.journal import RunState
from orchestrator.engine.view import JournalView, Records
from orchestrator.results import (
    AuditResult,
    CatchupResult,
    CutoverResult,
    DbFinalResult,
    DbPresyncResult,
    DnsFlipResult,
    FilesResult,
    FinishResult,
    SeedResult,
    SwitchResult,
    SwitchTrafficResult,
    VerifyResult,
    result_of,
)
from orchestrator.secrets import redact_obj
from orchestrator.services import dns_where
from orchestrator.window import RESERVE_KEY


def run_events(events: Records, run_id: str | None = None) -> JournalView:
    """The events of one run (the last one, or `run_id`'s) out of a journal that may hold several."""
    return JournalView.of(events).run(run_id)


def build_report(events: Records, *, now: float | None = None) -> dict[str, Any]:
    """The report of the (last) run recorded in `events`. `now` closes a step still running (the caller)."""
    run = run_events(events)
    state = run.state()
    if state is None:
        return {"run_id": None, "status": "no run", "steps": []}
    now = time.time() if now is None else now
    steps: list[dict[str, Any]] = []
    bytes_by_step: dict[str, int] = {}
    for name, rec in state.steps.items():
        ended = rec.ended_at if rec.ended_at is not None else (now if rec.started_at is not None else None)
        steps.append(
            {
                "name": name,
                "state": rec.state.value,
                "started_at": rec.started_at,
                "ended_at": ended,
                "duration": round(ended - rec.started_at, 3) if ended and rec.started_at else None,
                "attempts": rec.attempts,
                "error": rec.error,
            }
        )
        moved = result_of(name, rec.result).bytes_moved()
        if moved:
            bytes_by_step[name] = moved
    outputs = {name: rec.result for name, rec in state.steps.items() if rec.result}
    cutover = CutoverResult.of(outputs.get("cutover"))
    final_pass = DbFinalResult.of(outputs.get("db_final"))
    flip = DnsFlipResult.of(outputs.get("dns_flip"))
    switch = SwitchResult.of(outputs.get("repl_switch"))
    door = SwitchTrafficResult.of(outputs.get("switch_traffic"))
    blocked_at = cutover.writes_blocked_at or switch.writes_blocked_at
    flipped_at = flip.flipped_at
    # The window ends at the commit: the front door's switch (writes flow through it), else the DNS flip.
    window_end = door.writes_flow_at or flipped_at
    verify = VerifyResult.of(outputs.get("verify_target")).journal() if "verify_target" in outputs else {}
    audit = AuditResult.of(outputs.get("audit"))
    report: dict[str, Any] = {
        "run_id": state.run_id,
        "plan": state.plan_path,
        "status": state.status.value,
        "started_at": state.started_at,
        "ended_at": state.ended_at,
        "duration": round((state.ended_at or now) - state.started_at, 3),
        "error": state.error,
        "rollback_reason": state.rollback_reason,
        "steps": steps,
        "bytes_moved": sum(bytes_by_step.values()),
        "bytes_by_step": bytes_by_step,
        "replicate": switch.journal() if "repl_switch" in outputs else None,
        "seed": seed_report(outputs),
        "cutover": {
            "mode": cutover.mode,
            "mode_reason": cutover.mode_reason,
            "lock_attempts": cutover.lock_attempts,
            "lock_wait_seconds": cutover.lock_wait_seconds,
            "writes_blocked_at": blocked_at,
            "lock_acquired_at": cutover.lock_acquired_at,
            "shutdown_seconds": cutover.shutdown_seconds,
            "final_pass_seconds": final_pass.final_pass_seconds,
            "final_pass_bytes": final_pass.final_pass_bytes if "db_final" in outputs else None,
            "binlog": cutover.binlog.journal() if cutover.binlog else None,
        },
        "dns_flipped_at": flipped_at,
        "committed_at_door": door.writes_flow_at,
        # Writes were held from the fence until clients could reach the target: through the source's front door
        # once it forwards (the DNS flip comes after), else through DNS.
        "write_block_seconds": round(window_end - blocked_at, 3) if blocked_at and window_end else None,
        "window_parts": window_parts(steps, blocked_at, window_end, switch if "repl_switch" in outputs else None),
        "window_round_trips": window_round_trips(steps, blocked_at, window_end, outputs),
        # The source's row counts as the after-commit audit read them (older journals: under the cut-over's lock).
        "row_counts": audit.row_counts if audit.row_counts is not None else cutover.row_counts,
        "audit": audit.journal() if "audit" in outputs else None,
        "verification": verify,
        "final_pass_trees": final_pass_trees(outputs),
        # Shutdown mode: the files the final datadir pass reads, read into each host's page cache before the window.
        "datadir_cache_warm": DbPresyncResult.of(outputs.get("db_presync")).cache_warm or None,
        "checks": checks_where(outputs),
        "peak_rss_mib": FinishResult.of(outputs.get("finish")).peak_rss_mib,
        "reverse_replication": FinishResult.of(outputs.get("finish")).reverse_replication,
        "dns": dns_report(run, state),
        "rollback_reserve": reserve_report(run),
    }
    return redact_obj(report)


def window_round_trips(
    steps: list[dict[str, Any]], blocked_at: float | None, window_end: float | None, outputs: dict[str, Any]
) -> dict[str, dict[str, int]]:
    """The round trips each step inside the window made, by kind (what finish journaled: the counts of the
    process that finished the run; a step that ran before a crash and resume is not counted)."""
    counted = FinishResult.of(outputs.get("finish")).round_trips or {}
    if not (blocked_at and window_end):
        return {}
    inside = [
        s["name"]
        for s in steps
        if s.get("started_at") is not None and s.get("ended_at") is not None
        and s["ended_at"] > blocked_at and s["started_at"] < window_end
    ]  # fmt: skip
    return {name: counted[name] for name in inside if counted.get(name)}


def window_parts(
    steps: list[dict[str, Any]], blocked_at: float | None, flipped_at: float | None, switch: SwitchResult | None
) -> dict[str, float]:
    """Where the window's seconds went: each step's share of [writes blocked, DNS flipped] (the step that blocks
    writes counts from the block), what the engine spent between steps (the window's time no step covered: steps
    that ran side by side overlap, so their shares may add up to more than the window), and the replicate switch's
    own parts."""
    if not (blocked_at and flipped_at and flipped_at > blocked_at):
        return {}
    parts: dict[str, float] = {}
    spans: list[tuple[float, float]] = []
    for step in steps:
        start, end = step.get("started_at"), step.get("ended_at")
        if start is None or end is None:
            continue
        begin, stop = max(start, blocked_at), min(end, flipped_at)
        if stop > begin:
            parts[step["name"]] = round(stop - begin, 3)
            spans.append((begin, stop))
    covered, reach = 0.0, blocked_at
    for begin, stop in sorted(spans):
        covered += max(0.0, stop - max(begin, reach))
        reach = max(reach, stop)
    parts["between steps"] = round(max(0.0, flipped_at - blocked_at - covered), 3)
    if switch is not None:
        for name, value in (
            ("switch: journal and front door (hold, drain)", switch.hold_seconds),
            (
                "switch: journal, then hold, drain, fence and the database's stop (one command on the source)"
                if switch.stopped_in_first_command
                else "switch: journal, then hold, drain and fence (one command on the source)",
                switch.hold_and_fence_seconds,
            ),
            ("switch: read_only", switch.read_only_seconds),
            ("switch: fence", switch.fence_seconds),
            ("switch: replica's wait", switch.wait_seconds),
            ("switch: promotion", switch.promote_seconds),
            ("switch: health checks (side by side with the above)", switch.health_seconds),
        ):
            if value is not None:
                parts[name] = value
    return parts


def seed_report(outputs: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The replicate mode's seed: what its hot backup cost the live source (commits and DDL held back)."""
    if "repl_seed" not in outputs:
        return None
    seed = SeedResult.of(outputs["repl_seed"])
    return {
        "bytes": seed.bytes,
        "stream_seconds": seed.stream_seconds,
        "commits_blocked_seconds": seed.commits_blocked_seconds,
        "commits_blocked_at": seed.commits_blocked_at,
        "ddl_blocked_seconds": seed.ddl_blocked_seconds,
        "backup_stages": seed.backup_stages,
    }


def seed_hold_text(seed: dict[str, Any]) -> str | None:
    """What the seed's hot backup held back on the live source, in words (the text report and the run's page)."""
    if seed.get("commits_blocked_seconds") is None:
        return None
    return (
        f"the backup held the source's commits {float(seed['commits_blocked_seconds']):.3f} s (BLOCK_COMMIT until "
        f"unlocked) and its DDL {float(seed.get('ddl_blocked_seconds') or 0):.3f} s"
    )


def dns_report(events: Records, state: RunState) -> dict[str, Any] | None:
    """Where every record pointed at the run's last journaled reading (its end reading, when it made one), and
    whether that is a problem (split, or at the host that does not serve)."""
    reading = dns_where.journaled(events)
    if reading is None:
        return None
    return {**reading.as_dict(), "problem": dns_where.end_problem(events, state)}


def reserve_report(events: Records) -> dict[str, Any] | None:
    """The seconds kept back from the budget for the rollback's own work, and how they were derived."""
    found = [v for v in JournalView.of(events).saved_values(None, RESERVE_KEY) if isinstance(v, dict)]
    return found[-1] if found else None


def final_pass_trees(outputs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per tree: how the final pass inside the window worked (only the tracked changes, or a full scan and why)."""
    final = FilesResult.of(outputs.get("files_final"))
    return {
        name: {
            "mode": t.mode,
            "paths_listed": t.listed,
            "files_copied": t.files,
            "deleted": t.deleted,
            "bytes": t.bytes,
            "seconds": t.seconds,
            "fallback_reason": t.fallback_reason,
            "tree_entries": t.entries,
            "route": t.route,
        }
        for name, t in final.trees.items()
    }


def checks_where(outputs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Which verification ran where: before the window (source live), inside it (writes blocked), after it."""
    checks: list[dict[str, Any]] = []
    presync = FilesResult.of(outputs.get("files_presync"))
    for name, t in presync.trees.items():
        if t.compared is not None:
            checks.append({"check": f"tree {name}: every file's checksum", "where": "before",
                           "differing": t.compared.differing, "seconds": t.compared.seconds})  # fmt: skip
    catchup = CatchupResult.of(outputs.get("repl_catchup"))
    if catchup.health_tries:
        checks.append({"check": "health checks", "where": "before", "passed": sorted(catchup.health_tries),
                       "seconds": catchup.health_seconds})  # fmt: skip
    if "verify_target" in outputs:
        verify = VerifyResult.of(outputs["verify_target"])
        for name, scope in (verify.trees_verified or {}).items():
            checks.append({"check": f"tree {name}: checksums of {scope}", "where": "inside",
                           "differing": (verify.trees_differing_items or {}).get(name)})  # fmt: skip
        if verify.health_tries:
            checks.append({"check": "health checks", "where": "inside", "passed": sorted(verify.health_tries)})
        # Journals written before the audit existed compared every table inside the window.
        if verify.row_counts:
            checks.append({"check": "row counts of every table", "where": "inside",
                           "tables": verify.row_counts.tables})  # fmt: skip
        if verify.checksums:
            checks.append({"check": "CHECKSUM TABLE of every table", "where": "inside",
                           "tables": verify.checksums.tables})  # fmt: skip
    if "db_final" in outputs:
        final = DbFinalResult.of(outputs["db_final"])
        if final.verified_files is not None:
            what = f"datadir: checksums of the {final.verified_files} file(s) the final pass copied, on both hosts"
            checks.append({"check": what, "where": "inside", "differing": 0, "seconds": final.verify_seconds})
    cutover = CutoverResult.of(outputs.get("cutover"))
    if "cutover" in outputs and cutover.binlog is not None:
        checks.append({"check": "source binary log position under the lock (a resume re-proves it)", "where": "inside"})
    if "audit" in outputs:
        audit = AuditResult.of(outputs["audit"])
        if audit.status not in ("off", "not_needed") and audit.method == "chunks":
            checks.append({"check": "checksums of every table in primary-key chunks: the target's snapshot at the "
                           "promotion against the read-only source at its final position", "where": "after",
                           "status": audit.status, "tables": audit.tables, "chunks": audit.chunks,
                           "rows": audit.rows, "differing": len(audit.differences), "reason": audit.reason,
                           "seconds": audit.seconds})  # fmt: skip
        elif audit.status not in ("off", "not_needed"):
            checksum = audit.checksum_name or "CHECKSUM TABLE"
            checks.append({"check": f"row counts and {checksum} of every table: the target's snapshot at the "
                           "commit against the stopped source", "where": "after", "status": audit.status,
                           "tables": audit.tables, "differing": len(audit.differences), "reason": audit.reason,
                           "seconds": audit.seconds})  # fmt: skip
    return checks


def _when(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1000):03d}" if ts else "-"


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def render_report(report: dict[str, Any]) -> str:
    """A human summary of `build_report`'s result (times in UTC)."""
    lines = [f"run {report.get('run_id')}: {report.get('status')} in {report.get('duration')} s"]
    if report.get("error"):
        lines.append(f"  error: {report['error']}")
    lines.append(f"  {'step':<15} {'state':<12} {'start':>12} {'end':>12} {'seconds':>9}")
    for step in report.get("steps", []):
        duration = step.get("duration")
        lines.append(
            f"  {step['name']:<15} {step['state']:<12} {_when(step.get('started_at')):>12} "
            f"{_when(step.get('ended_at')):>12} {'' if duration is None else f'{duration:.2f}':>9}"
        )
    moved = report.get("bytes_moved") or 0
    per_step = ", ".join(f"{k} {_size(v)}" for k, v in (report.get("bytes_by_step") or {}).items())
    lines.append(f"  bytes moved: {_size(moved)}" + (f" ({per_step})" if per_step else ""))
    cut = report.get("cutover") or {}
    if cut.get("mode"):
        lines.append(
            f"  cut-over mode: {cut['mode']}; lock after {cut.get('lock_wait_seconds')} s in "
            f"{cut.get('lock_attempts')} attempt(s); source shutdown {cut.get('shutdown_seconds')} s; "
            f"final datadir pass {cut.get('final_pass_seconds')} s ({_size(cut.get('final_pass_bytes') or 0)})"
        )
    if report.get("write_block_seconds") is not None:
        door = report.get("committed_at_door")
        flipped = report.get("dns_flipped_at")
        end = f"committed at the front door {_when(door)}" if door else f"DNS flipped {_when(flipped)}"
        blocked = _when(cut.get("writes_blocked_at"))
        lines.append(f"  writes blocked {blocked} → {end}: {report['write_block_seconds']:.2f} s")
        if door:
            lines.append("  DNS flipped after the window: " + (f"{_when(flipped)}" if flipped else "not yet (pending)"))
    seed = report.get("seed") or {}
    held = seed_hold_text(seed)
    if held:
        lines.append(f"  seed: {held}; its copy took {seed.get('stream_seconds')} s while the source served")
    parts = report.get("window_parts") or {}
    if parts:
        lines.append("  inside the window: " + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in parts.items()))
    trips = report.get("window_round_trips") or {}
    if trips:
        lines.append(
            "  round trips inside the window: "
            + "; ".join(
                f"{step} " + ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
                for step, kinds in trips.items()
            )
        )
    warm = report.get("datadir_cache_warm") or {}
    if warm:
        lines.append("  datadir read into the page cache before the window: "
                     + ", ".join(f"{host} {what}" for host, what in warm.items()))  # fmt: skip
    for name, tree in (report.get("final_pass_trees") or {}).items():
        if tree.get("mode") == "tracked":
            deleted = f" ({tree['deleted']} deleted on the target)" if tree.get("deleted") else ""
            listed = tree.get("paths_listed")
            route = " through the rsync daemon opened before the window" if tree.get("route") == "daemon" else ""
            lines.append(f"  tree {name}: final pass handled only the {listed} tracked path(s){deleted}{route}")
        elif tree.get("mode"):
            lines.append(f"  tree {name}: final pass scanned the whole tree: {tree.get('fallback_reason')}")
    for check in report.get("checks") or []:
        status = f" [{check['status']}]" if check.get("status") else ""
        lines.append(f"  check {check['where']:<6} the window: {check['check']}{status}")
    audited = AuditResult.of(report.get("audit"))
    if report.get("audit") and audited.cost():
        lines.append(f"  audit: {audited.status}: {audited.cost()}")
    if report.get("audit") and audited.summary():
        lines.append(f"  {audited.summary()}")
    if report.get("peak_rss_mib") is not None:
        lines.append(f"  orchestrator peak RSS: {report['peak_rss_mib']} MiB")
    kept = (report.get("reverse_replication") or {}).get("kept_until")
    if kept:
        until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(kept)))
        lines.append(
            f"  reverse replication kept until {until} (replication.keep_reverse): `migrate rollback PLAN` moves "
            "back through it losing nothing, `migrate status PLAN` shows its lag, `migrate finish PLAN` ends it now"
        )
    reserve = report.get("rollback_reserve") or {}
    if reserve.get("seconds") is not None:
        lines.append(f"  rollback reserve: {reserve['seconds']:g} s ({reserve.get('basis', '')})")
    dns = report.get("dns") or {}
    if dns.get("records"):
        where = ", ".join(
            f"{name} → " + " + ".join(f"{r['content']} ({r['points_at']})" for r in records)
            for name, records in dns["records"].items()
        )
        said = "at the run's end" if dns.get("end") else "at the run's last reading"
        lines.append(f"  DNS {said} ({_when(dns.get('at'))}): {where}")
        if dns.get("problem"):
            lines.append(f"  needs attention: {dns['problem']}")
    counts = report.get("row_counts") or {}
    if counts:
        lines.append(f"  tables verified: {len(counts)} ({sum(counts.values())} rows at the cut-over)")
    return "\n".join(lines)


def write_report(report: dict[str, Any], directory: Path) -> Path:
    """`<directory>/report-<run id>.json`, written atomically (`report_html.write_report_and_page` adds its page)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"report-{report.get('run_id')}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str))
    tmp.replace(path)
    return path
