"""The command line meets bad input with one clear line, a documented exit code, no traceback, nothing changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import exit_codes

ROOT = Path(__file__).resolve().parents[1]
MIGRATE = Path(sys.executable).with_name("migrate")
EXAMPLE = ROOT / "plans" / "course-review.yaml"


def migrate(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("COURSE_REVIEW_DB_PASSWORD", "CLOUDFLARE_API_TOKEN")}
    return subprocess.run(
        [str(MIGRATE), *args], capture_output=True, text=True, timeout=60, cwd=cwd, env={**base, **(env or {})},
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.fixture
def plan(tmp_path: Path) -> Path:
    copy = tmp_path / "plan.yaml"
    copy.write_text(EXAMPLE.read_text())
    return copy


@pytest.mark.parametrize(
    "args",
    [
        ["nosuchcmd"],
        ["validate"],
        ["validate", "PLAN", "--bogus"],
        ["apply", "PLAN", "--yes=maybe"],
        ["status", "PLAN", "--json", "extra"],
        ["lab", "bogus"],
    ],
)
def test_usage_errors_are_one_line_and_exit_2(plan: Path, args: list[str]) -> None:
    res = migrate(*[str(plan) if a == "PLAN" else a for a in args])
    assert res.returncode == exit_codes.BAD_INPUT, res
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr


def test_binary_env_file_is_bad_input(plan: Path, tmp_path: Path) -> None:
    env_file = tmp_path / "secrets.env"
    env_file.write_bytes(bytes(range(256)) * 4)
    res = migrate("apply", str(plan), "--yes", "--env-file", str(env_file))
    assert res.returncode == exit_codes.BAD_INPUT
    assert res.stderr.strip() == f"{env_file}: cannot read: not UTF-8 text"
    assert not (tmp_path / ".migrate").exists()


def test_env_file_with_a_bad_line_names_the_line(plan: Path, tmp_path: Path) -> None:
    env_file = tmp_path / "secrets.env"
    env_file.write_text("# secrets\nCLOUDFLARE_API_TOKEN=abc\nthis is not an assignment\n")
    res = migrate("apply", str(plan), "--yes", "--env-file", str(env_file))
    assert res.returncode == exit_codes.BAD_INPUT
    assert res.stderr.strip() == f"{env_file}:3: expected KEY=VALUE"


def test_state_dir_that_is_a_file_is_bad_input(plan: Path, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "state"
    not_a_dir.write_text("")
    secrets = {"COURSE_REVIEW_DB_PASSWORD": "pw-123456", "CLOUDFLARE_API_TOKEN": "tok-123456"}
    res = migrate("apply", str(plan), "--yes", "--state-dir", str(not_a_dir), env=secrets)
    assert res.returncode == exit_codes.BAD_INPUT, res
    assert res.stderr.strip().startswith("state directory: cannot use") and "Traceback" not in res.stderr


def test_missing_secret_stops_a_real_run_but_not_a_rehearsal(plan: Path, tmp_path: Path) -> None:
    real = migrate("apply", str(plan), "--yes")
    assert real.returncode == exit_codes.BAD_INPUT
    assert real.stderr.strip().endswith("environment variable COURSE_REVIEW_DB_PASSWORD is not set")
    rehearsal = migrate("apply", str(plan), "--dry-run")
    assert rehearsal.returncode == exit_codes.OK, rehearsal.stderr
    assert "COURSE_REVIEW_DB_PASSWORD is not set: a real run would stop here (exit 2)" in rehearsal.stdout
    assert "DOWNTIME BEGINS" in rehearsal.stdout and "COMMIT POINT" in rehearsal.stdout
    assert not (tmp_path / ".migrate").exists(), "neither the run nor the rehearsal left state behind"


def test_rollback_without_a_run_changes_nothing(plan: Path, tmp_path: Path) -> None:
    res = migrate("rollback", str(plan))
    assert res.returncode == exit_codes.OK
    assert "has no run: nothing to roll back" in res.stdout
    assert not (tmp_path / ".migrate").exists()


def test_status_json_without_a_run(plan: Path) -> None:
    res = migrate("status", str(plan), "--json")
    assert res.returncode == exit_codes.OK
    doc = json.loads(res.stdout)
    assert doc["run"] is None and doc["locked_by"] is None and "starts a new run" in doc["next"]
