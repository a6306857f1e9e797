"""Hooks: the operator's executables, fired at named events with a documented environment.

A hook for event E is any executable file in the hooks directory named `E` or starting with `E.` or `E-`
(e.g. `on-failure.slack`, `before-cutover-maintenance-page`), run in name order.
A failing or timed-out `before-*` hook aborts the migration (which then rolls back); the others only warn.

Environment every hook receives:
  MIGRATE_EVENT            the event name
  MIGRATE_PLAN             path of the plan file
  MIGRATE_PLAN_NAME        the plan's name
  MIGRATE_RUN_ID           the run's id
  MIGRATE_STEP             the step concerned ("" for run-level events)
  MIGRATE_STEP_INDEX       1-based position of the step, MIGRATE_STEP_COUNT the number of steps
  MIGRATE_DRY_RUN          "1" in a dry-run, else "0"
  MIGRATE_ELAPSED_SECONDS  seconds since the run began
  MIGRATE_STATE            the run's status (running, rolling_back, rolled_back, completed, ...)
  MIGRATE_ERROR            the failure, on on-failure and on-rollback (redacted)
  MIGRATE_JOURNAL          path of the run's journal
and `base_env`, the environment the composition root allows (the process's, minus every secret-bearing variable).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.redaction import printable, redact

EVENTS = (
    "on-start",
    "on-resume",
    "before-step",
    "after-step",
    "before-cutover",
    "on-success",
    "on-failure",
    "on-rollback",
)


class HookFailed(Exception):
    """A `before-*` hook failed: the migration must not go on."""


@dataclass
class HookResult:
    path: Path
    exit_status: int | None  # None: timed out
    output: str


class HookRunner:
    def __init__(
        self,
        directory: Path | None,
        *,
        timeout: float,
        base_env: Mapping[str, str],
        log: Any,
        passed: Collection[str] = (),
    ) -> None:
        self.directory = directory
        self.timeout = timeout
        self.base_env = dict(base_env)
        self.log = log
        # Names the plan lets through even though their values are secrets (hooks.pass_env).
        self.passed = frozenset(passed)

    def hooks_for(self, event: str) -> list[Path]:
        if self.directory is None or not self.directory.is_dir():
            return []
        found = []
        for path in sorted(self.directory.iterdir()):
            name = path.name
            if not (name == event or name.startswith(event + ".") or name.startswith(event + "-")):
                continue
            if path.is_file() and os.access(path, os.X_OK):
                found.append(path)
        return found

    def fire(self, event: str, **env: str) -> list[HookResult]:
        """Run every hook of `event`. Raises HookFailed when a `before-*` hook fails."""
        results = []
        for path in self.hooks_for(event):
            # Hooks get the documented MIGRATE_* variables and `base_env`, never a secret `migrate` holds.
            inherited = {k: v for k, v in self.base_env.items() if k in self.passed or redact(v) == v}
            full_env = {**inherited, **env, "MIGRATE_EVENT": event}
            full_env = {k: redact(v) if k == "MIGRATE_ERROR" else v for k, v in full_env.items()}
            try:
                proc = subprocess.run(
                    [str(path)],
                    env=full_env,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=self.timeout,
                    start_new_session=True,
                )
                result = HookResult(path, proc.returncode, redact((proc.stdout + proc.stderr).strip())[-2000:])
            except subprocess.TimeoutExpired as exc:
                out = (exc.stdout or b"") + (exc.stderr or b"")
                text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
                result = HookResult(path, None, redact(text.strip())[-2000:])
            except OSError as exc:
                result = HookResult(path, 126, f"cannot execute: {exc.strerror}")
            results.append(result)
            ok = result.exit_status == 0
            self.log.log(
                20 if ok else 30,
                "hook",
                hook=path.name,
                hook_event=event,
                exit_status=result.exit_status,
                output=result.output or None,
            )
            if not ok and event.startswith("before-"):
                why = "timed out" if result.exit_status is None else f"exited {result.exit_status}"
                said = printable(result.output[-300:]) if result.output else ""
                raise HookFailed(f"hook {path.name} ({event}) {why}" + (f": {said}" if said else ""))
        return results
