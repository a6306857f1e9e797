"""`migrate rehearse PLAN`: know before you move, without changing either host.

What each pre-sync would move (rsync's own --dry-run --stats, as the steps run it), the database's size, the
predicted duration of each transfer at the measured (or limited) rate, and the predicted window part by part. The
estimate is saved beside the plan's journal (`estimate.json`), so the real run that follows can be held against it
(`compare`).
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator import exit_codes
from orchestrator.database.protocol import DatabaseError
from orchestrator.engine.journal import RunStatus
from orchestrator.engine.step import StepError
from orchestrator.plan.model import Plan
from orchestrator.redaction import redact
from orchestrator.run.policy import load_env, resolve_secrets, state_dir_of, subject
from orchestrator.run.results import RunError
from orchestrator.runtime import Runtime
from orchestrator.services import estimates
from orchestrator.services.estimates import size_text
from orchestrator.steps.modes import mode_named
from orchestrator.transports.dns import DnsError
from orchestrator.transports.ssh import TransportError

ESTIMATE_FILE = "estimate.json"
REHEARSAL_FILE = "rehearsal.json"


@dataclass(frozen=True)
class Rehearsal:
    plan_name: str
    estimate: estimates.Estimate
    saved_to: Path
    mode_reason: str | None = None  # why `auto` became the mode estimated


def rehearse(plan_path: Path, *, env_file: Path | None = None, state_dir: Path | None = None) -> Rehearsal:
    """Measure the estimate on the plan's hosts (reads and rsync dry-runs only), for the mode the run would use
    (`auto` resolved by the run's own read-only probe), and save it."""
    subj = subject(plan_path, state_dir=state_dir)
    load_env(env_file)
    resolve_secrets(subj.plan, plan_path)
    rt = Runtime(subj.plan, plan_path)
    try:
        mode, reason = resolve_mode(rt)
        estimate = estimates.estimate(rt, mode_named(mode), last_rehearsal(subj.state_dir))
    except (TransportError, StepError, DatabaseError, DnsError) as exc:
        raise RunError(exit_codes.FAILED, f"rehearsal: {redact(str(exc))}") from None
    finally:
        rt.close()
    subj.state_dir.mkdir(parents=True, exist_ok=True)
    saved = subj.state_dir / ESTIMATE_FILE
    saved.write_text(json.dumps(estimate.as_dict(), indent=2) + "\n")
    return Rehearsal(subj.plan.name, estimate, saved, reason)


def resolve_mode(rt: Runtime) -> tuple[str, str | None]:
    """The cut-over mode the run would use and, for `auto`, why: the run's own read-only probe of both servers
    (compose.resolve_mode), so the estimate is of the mode the run will take."""
    from orchestrator.plan.model import static_mode
    from orchestrator.steps.repl_common import engine_requirements, mode_reason, probe_replication

    plan = rt.plan
    mode = static_mode(plan)
    if mode != "auto":
        return mode, None if plan.cutover.mode != "auto" else mode_reason(mode, ["no replication section"], "auto")
    problems = probe_replication(rt)
    mode = "shutdown" if problems else "replicate"
    return mode, mode_reason(mode, problems, "auto", engine_requirements(plan.database.engine))


def last_rehearsal(state_dir: Path) -> dict[str, Any] | None:
    """What the last `migrate rehearse --for-real` of the plan measured (rehearsal.json), None without one."""
    try:
        saved = json.loads((state_dir / REHEARSAL_FILE).read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


@dataclass(frozen=True)
class DryRunEstimate:
    """What `apply --dry-run` measured: the mode the run would use (auto resolved by the same read-only probe a
    run makes), and the estimate for it."""

    mode: str
    mode_reason: str | None
    estimate: estimates.Estimate


def dry_run_estimate(plan: Plan, plan_path: Path) -> DryRunEstimate:
    """The read-only estimate `migrate rehearse` makes, for the dry-run: nothing saved, no retries (a host out of
    reach is said at once, not retried for minutes). Raises what the hosts raise; the dry-run says it in one line."""
    quick = plan.model_copy(update={"retry": plan.retry.model_copy(update={"attempts": 1})})
    rt = Runtime(quick, plan_path)
    try:
        mode, reason = resolve_mode(rt)
        rehearsed = last_rehearsal(state_dir_of(plan_path, plan, None))
        return DryRunEstimate(mode, reason, estimates.estimate(rt, mode_named(mode), rehearsed))
    finally:
        rt.close()


def lines(rehearsal: Rehearsal) -> list[str]:
    """The estimate as an operator reads it."""
    est = rehearsal.estimate
    out = [f"rate: {size_text(est.rate_bytes_per_second)}/s ({est.rate_basis})"]
    if est.database_bytes is not None:
        out.append(f"database: {size_text(est.database_bytes)} of tables and indexes (information_schema)")
    for t in est.transfers:
        out.append(
            f"{t.step} {t.name}: {size_text(t.bytes)} in {t.files} files to move (of {size_text(t.total_size)}),"
            f" about {t.predicted_seconds:.1f} s (comparison {t.scan_seconds:.1f} s)"
        )
    out += [f"{part.step}: {part.name} about {part.seconds:.1f} s ({part.basis})" for part in est.before]
    out.append(f"predicted window ({est.mode} mode): {est.window_seconds:.2f} s")
    if rehearsal.mode_reason:
        out.append(f"  mode: {rehearsal.mode_reason}")
    out += [f"  {part.name}: {part.seconds:.2f} s ({part.basis}){estimates.beside_text(part)}" for part in est.window]
    out.append(f"saved: {rehearsal.saved_to}")
    return out


def estimate_beside(state_dir: Path, report: dict[str, Any]) -> dict[str, Any]:
    """The last rehearsal's estimate beside what the run did (bytes per step, the window), or {} without one."""
    found: dict[str, Any] = {}
    lines: list[str] = []
    blocked = report.get("write_block_seconds")
    for key, name in ((ESTIMATE_FILE, "estimate"), (REHEARSAL_FILE, "rehearsal")):
        try:
            saved = json.loads((state_dir / key).read_text())
        except (OSError, ValueError):
            continue
        found[name] = saved
        when = saved.get("measured_at")
        lines.append(f"{'estimate' if name == 'estimate' else 'rehearsal --for-real'} of {when} beside this run:")
        if name == "estimate":
            lines += [f"  {line}" for line in compare(saved, report.get("bytes_by_step") or {})]
        predicted = saved.get("window_seconds")
        if predicted and blocked:
            error = (predicted - blocked) / blocked * 100
            mode = f", the {saved['mode']} mode" if saved.get("mode") else ""
            lines.append(
                f"  window: predicted {predicted:.2f} s, writes blocked {blocked:.2f} s ({error:+.1f} %{mode})"
            )
            lines += [f"    {line}" for line in compare_parts(saved.get("window") or [], report.get("window_parts"))]
    return {**found, "lines": lines} if found else {}


def compare_parts(predicted: list[dict[str, Any]], real: dict[str, float] | None) -> list[str]:
    """Each step's predicted share of the window beside its share in the run's report (window_parts)."""
    if not real:
        return []
    by_step: dict[str, float] = {}
    for part in predicted:
        if part.get("step"):
            by_step[part["step"]] = by_step.get(part["step"], 0.0) + float(part.get("seconds") or 0.0)
    steps = [step for step in real if step in by_step or (not step.startswith("switch: ") and step != "between steps")]
    steps += [step for step in by_step if step not in real]
    return [f"{step}: predicted {by_step.get(step, 0.0):.2f} s, took {real.get(step, 0.0):.2f} s" for step in steps]


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


# --- the rehearsal for real: everything up to the window, on the real target ----------------------------------

WARM_SUFFIX = ".rehearsal-warm"


@dataclass(frozen=True)
class Performed:
    """What the rehearsal did for real: each stage's seconds (or its failure), the window predicted from them."""

    plan_name: str
    stages: dict[str, float]
    window: list[estimates.WindowPart]
    failures: list[str]
    target_left: str  # "warm" or "clean"

    @property
    def window_seconds(self) -> float:
        return estimates.window_span(self.window)

    def lines(self) -> list[str]:
        out = [f"{stage}: {seconds:.2f} s" for stage, seconds in self.stages.items()]
        out.append(f"predicted window: {self.window_seconds:.2f} s")
        out += [
            f"  {part.name}: {part.seconds:.2f} s ({part.basis}){estimates.beside_text(part)}" for part in self.window
        ]
        out += [f"FAILED: {failure}" for failure in self.failures]
        out.append(f"target left {self.target_left}")
        return out


def _context(rt: Runtime, step: Any, outputs: dict[str, Any] | None = None) -> Any:
    from orchestrator.engine.step import StepContext
    from orchestrator.output import logging as mlog

    return StepContext(run_id="rehearsal", step=step.name, dry_run=False, rt=rt, log=mlog.get_logger(),
                       _outputs=outputs or {})  # fmt: skip


def _timed(stages: dict[str, float], name: str, action: Any) -> Any:
    started = time.monotonic()
    try:
        return action()
    finally:
        stages[name] = round(time.monotonic() - started, 3)


def rehearse_for_real(
    plan_path: Path, *, clean: bool = False, env_file: Path | None = None, state_dir: Path | None = None
) -> Performed:
    """Preflight, the target prepared, the pre-syncs for real, the deltas timed again while the source stays live,
    the target started fenced on a copy of its warm datadir and its health checked, the DNS records read; then the
    target stopped and left warm (the pre-synced data kept for the real run) or clean. The source is only read."""
    from orchestrator.plan.model import static_mode
    from orchestrator.results import DbPresyncResult
    from orchestrator.steps.common import RESOLVED_DATADIRS
    from orchestrator.steps.db_presync import DbPresync
    from orchestrator.steps.files_presync import FilesPresync
    from orchestrator.steps.preflight import Preflight
    from orchestrator.steps.prepare_target import PrepareTarget
    from orchestrator.steps.start_target import StartTarget
    from orchestrator.steps.verify_target import VerifyTarget

    subj = subject(plan_path, state_dir=state_dir)
    existing = subj.saved_state()
    if existing is not None and existing.status not in (RunStatus.COMPLETED, RunStatus.ROLLED_BACK):
        raise RunError(
            exit_codes.REFUSED,
            f"run {existing.run_id} of this plan is unfinished ({existing.status.value}): a rehearsal would stop the"
            " target it is working on; finish it (`migrate apply`) or roll it back first",
        )
    load_env(env_file)
    resolve_secrets(subj.plan, plan_path)
    plan = subj.plan
    rt = Runtime(plan, plan_path)
    stages: dict[str, float] = {}
    failures: list[str] = []
    window: list[estimates.WindowPart] = []
    datadir = warm = ""
    started_target = prepared = stopped = False
    mode: str = plan.cutover.mode
    # The steps as a run without a journal would see them: the declared mode, an unresolved auto as shutdown's.
    steps_mode = mode_named("replicate" if static_mode(plan) == "replicate" else "shutdown")
    try:
        mode, _reason = resolve_mode(rt)
        figures = _timed(stages, "preflight", lambda: Preflight(mode=steps_mode).run(_context(rt, Preflight()))) or {}
        # The target's datadir as preflight resolved it (a /var/lib/mysql link to another disk: the directory it
        # points at): the warm copy is moved aside and put back beside it, the link never renamed.
        real = (figures.get(RESOLVED_DATADIRS) or {}).get("target") or plan.database.target.datadir.rstrip("/")
        datadir, warm = shlex.quote(real), shlex.quote(real + WARM_SUFFIX)
        outputs = {"preflight": figures}
        _timed(stages, "prepare_target", lambda: PrepareTarget().run(_context(rt, PrepareTarget(), outputs)))
        # Past the preflight (DNS still points at the source: the target is not live) and the target's stop.
        prepared = True
        _timed(stages, "files_presync", lambda: FilesPresync().run(_context(rt, FilesPresync(), outputs)))
        db_result = DbPresyncResult.of(
            _timed(stages, "db_presync", lambda: DbPresync().run(_context(rt, DbPresync(), outputs)))
        )
        # The uploads' delta as the window would copy it, timed with the source live (its writes continue).
        _timed(stages, "uploads delta", lambda: FilesPresync().run(_context(rt, FilesPresync())))
        started_target = True  # from here on, the finally puts the warm datadir back
        _timed(stages, "copy of the warm datadir", lambda: rt.target.run(
            f"rm -rf {warm} && mv {datadir} {warm} && cp -a {warm} {datadir}", timeout=3600))  # fmt: skip
        _timed(stages, "target start (fenced)", lambda: StartTarget(mode=steps_mode).run(_context(rt, StartTarget())))
        _tries, health_failures = _timed(
            stages, "health checks", lambda: VerifyTarget(mode=steps_mode).health(_context(rt, VerifyTarget()))
        )
        failures += health_failures
        _timed(stages, "DNS read", lambda: _read_records(rt))
        # The target's clean shutdown of a copy of the same data: what the source's shutdown in the window costs.
        _timed(stages, "target stop", lambda: StartTarget(mode=steps_mode).undo(_context(rt, StartTarget())))
        stopped = True
        rounds = db_result.rounds
        rate = rounds[0].bytes / rounds[0].seconds if rounds and rounds[0].seconds > 0 else 0.0
        measured = {"stages": stages, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        # Where a full scan would be the uploads' final pass (no change tracker), the second pass stands for it.
        second_pass = [estimates.TransferEstimate("files_presync", "uploads", 0, 0, 0, stages["uploads delta"], 0.0)]
        units = estimates.with_rehearsal(estimates.measure_units(rt, mode_named(mode), second_pass, rate), measured)
        window = estimates.predict_window(
            second_pass, units, plan_shape=estimates.PlanShape.of(plan), mode=mode_named(mode)
        )
    except (TransportError, StepError, DatabaseError, DnsError) as exc:
        failures.append(redact(str(exc)))
    finally:
        try:
            if started_target:
                if not stopped:
                    StartTarget(mode=steps_mode).undo(_context(rt, StartTarget()))
                # The copy the database ran on goes; the untouched warm copy takes its place (or goes too).
                restore = f"rm -rf {datadir} && mv {warm} {datadir}"
                rt.target.run(restore + (f" && find {datadir} -mindepth 1 -delete" if clean else ""), timeout=3600)
            if clean and prepared:
                for tree in plan.files:
                    rt.target.run(f"find -H {shlex.quote(tree.target)} -mindepth 1 -delete", timeout=3600)
                rt.target.run(f"find {datadir} -mindepth 1 -delete 2>/dev/null; true", timeout=3600)
        except (TransportError, StepError) as exc:
            failures.append(f"leaving the target {'clean' if clean else 'warm'}: {redact(str(exc))}")
        finally:
            rt.close()
    performed = Performed(plan.name, stages, window, failures, "clean" if clean else "warm")
    if window and not failures:
        subj.state_dir.mkdir(parents=True, exist_ok=True)
        saved = {
            "mode": mode,
            "stages": stages,
            "window": [asdict(part) for part in window],
            "window_seconds": performed.window_seconds,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (subj.state_dir / REHEARSAL_FILE).write_text(json.dumps(saved, indent=2) + "\n")
    return performed


def _read_records(rt: Runtime) -> None:
    plan = rt.plan
    zone = rt.dns.zone_id(plan.dns.zone)
    for name in plan.dns.records:
        rt.dns.find_records(zone, name, plan.dns.type)
