"""`migrate rehearse PLAN`: know before you move, without changing either host.

What each pre-sync would move (rsync's own --dry-run --stats, as the steps run it), the database's size, the
predicted duration of each transfer at the measured (or limited) rate, and the predicted window part by part. The
estimate is saved beside the plan's journal (`estimate.json`), so the real run that follows can be held against it
(`compare`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql

from orchestrator import estimates, exit_codes
from orchestrator.engine.step import StepError
from orchestrator.redaction import redact
from orchestrator.run.policy import load_env, resolve_secrets, subject
from orchestrator.run.results import RunError
from orchestrator.runtime import Runtime
from orchestrator.transports import mysql
from orchestrator.transports.cloudflare import DnsError
from orchestrator.transports.ssh import TransportError

ESTIMATE_FILE = "estimate.json"


@dataclass(frozen=True)
class Rehearsal:
    plan_name: str
    estimate: estimates.Estimate
    saved_to: Path


def rehearse(plan_path: Path, *, env_file: Path | None = None, state_dir: Path | None = None) -> Rehearsal:
    """Measure the estimate on the plan's hosts (reads and rsync dry-runs only) and save it."""
    subj = subject(plan_path, state_dir=state_dir)
    load_env(env_file)
    resolve_secrets(subj.plan, plan_path)
    rt = Runtime(subj.plan, plan_path)
    try:
        estimate = estimates.estimate(rt)
    except (TransportError, StepError, mysql.DbError, pymysql.MySQLError, DnsError) as exc:
        raise RunError(exit_codes.FAILED, f"rehearsal: {redact(str(exc))}") from None
    finally:
        rt.close()
    subj.state_dir.mkdir(parents=True, exist_ok=True)
    saved = subj.state_dir / ESTIMATE_FILE
    saved.write_text(json.dumps(estimate.as_dict(), indent=2) + "\n")
    return Rehearsal(subj.plan.name, estimate, saved)


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def lines(rehearsal: Rehearsal) -> list[str]:
    """The estimate as an operator reads it."""
    est = rehearsal.estimate
    out = [f"rate: {_size(est.rate_bytes_per_second)}/s ({est.rate_basis})"]
    if est.database_bytes is not None:
        out.append(f"database: {_size(est.database_bytes)} of tables and indexes (information_schema)")
    for t in est.transfers:
        out.append(
            f"{t.step} {t.name}: {_size(t.bytes)} in {t.files} files to move (of {_size(t.total_size)}),"
            f" about {t.predicted_seconds:.1f} s (comparison {t.scan_seconds:.1f} s)"
        )
    out.append(f"predicted window: {est.window_seconds:.1f} s")
    out += [f"  {part.name}: {part.seconds:.2f} s ({part.basis})" for part in est.window]
    out.append(f"saved: {rehearsal.saved_to}")
    return out


def estimate_beside(state_dir: Path, report: dict[str, Any]) -> dict[str, Any]:
    """The last rehearsal's estimate beside what the run did (bytes per step, the window), or {} without one."""
    saved = state_dir / ESTIMATE_FILE
    try:
        estimate = json.loads(saved.read_text())
    except (OSError, ValueError):
        return {}
    lines = compare(estimate, report.get("bytes_by_step") or {})
    predicted, blocked = estimate.get("window_seconds"), report.get("write_block_seconds")
    if predicted and blocked:
        lines.append(
            f"window: predicted {predicted:.2f} s, writes blocked {blocked:.2f} s"
            f" ({(predicted - blocked) / blocked * 100:+.1f} %)"
        )
    when = estimate.get("measured_at")
    heading = "estimate of the rehearsal" + (f" at {when}" if when else "") + " beside this run:"
    return {"estimate": estimate, "lines": [heading, *(f"  {line}" for line in lines)]}


def compare(estimate: dict[str, Any], moved: dict[str, int]) -> list[str]:
    """The estimate beside what a run moved ({step: bytes}): one line per step, with the error in percent."""
    predicted: dict[str, int] = {}
    for transfer in estimate.get("transfers", []):
        predicted[transfer["step"]] = predicted.get(transfer["step"], 0) + int(transfer["bytes"])
    out = []
    for step, bytes_predicted in predicted.items():
        actual = moved.get(step)
        if actual is None:
            continue
        error = (bytes_predicted - actual) / actual * 100 if actual else (0.0 if bytes_predicted == 0 else 100.0)
        out.append(f"{step}: estimated {bytes_predicted} bytes, moved {actual} ({error:+.1f} %)")
    return out
