"""The command line meets bad input with one clear line, a documented exit code, no traceback, nothing changed."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator import exit_codes
from orchestrator.output import logging as mlog
from orchestrator.run import commands
from tests.conftest import ROOT, migrate
from tests.engine.world import PLAN, Result, World

EXAMPLE = ROOT / "plans" / "course-review.yaml"
# Rich markup, a closing tag that is an error to rich, an emoji code and a shortcode: printed as written, always.
HOSTILE = "y[red]z[/]w:100::smile:[bold]"


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
def test_usage_errors_are_one_line_and_exit_2(plan: Path, args: list[str], migrate_here: Callable[..., Result]) -> None:
    res = migrate_here(*[str(plan) if a == "PLAN" else a for a in args])
    assert res.returncode == exit_codes.BAD_INPUT, res
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr


def test_binary_env_file_is_bad_input(plan: Path, tmp_path: Path, migrate_here: Callable[..., Result]) -> None:
    env_file = tmp_path / "secrets.env"
    env_file.write_bytes(bytes(range(256)) * 4)
    res = migrate_here("apply", str(plan), "--yes", "--env-file", str(env_file))
    assert res.returncode == exit_codes.BAD_INPUT
    assert res.stderr.strip() == f"{env_file}: cannot read: not UTF-8 text"
    assert not (tmp_path / ".migrate").exists()


def test_env_file_with_a_bad_line_names_the_line(
    plan: Path, tmp_path: Path, migrate_here: Callable[..., Result]
) -> None:
    env_file = tmp_path / "secrets.env"
    env_file.write_text("# secrets\nCLOUDFLARE_API_TOKEN=abc\nthis is not an assignment\n")
    res = migrate_here("apply", str(plan), "--yes", "--env-file", str(env_file))
    assert res.returncode == exit_codes.BAD_INPUT
    assert res.stderr.strip() == f"{env_file}:3: expected KEY=VALUE"


def test_state_dir_that_is_a_file_is_bad_input(plan: Path, tmp_path: Path, migrate_here: Callable[..., Result]) -> None:
    not_a_dir = tmp_path / "state"
    not_a_dir.write_text("")
    secrets = {"COURSE_REVIEW_DB_PASSWORD": "pw-123456", "CLOUDFLARE_API_TOKEN": "tok-123456"}
    res = migrate_here("apply", str(plan), "--yes", "--state-dir", str(not_a_dir), env=secrets)
    assert res.returncode == exit_codes.BAD_INPUT, res
    assert res.stderr.strip().startswith("state directory: cannot use") and "Traceback" not in res.stderr


def test_missing_secret_stops_a_real_run_but_not_a_rehearsal(
    plan: Path, tmp_path: Path, migrate_here: Callable[..., Result]
) -> None:
    real = migrate_here("apply", str(plan), "--yes")
    assert real.returncode == exit_codes.BAD_INPUT
    assert real.stderr.strip().endswith("environment variable COURSE_REVIEW_DB_PASSWORD is not set")
    rehearsal = migrate_here("apply", str(plan), "--dry-run")
    assert rehearsal.returncode == exit_codes.OK, rehearsal.stderr
    assert "COURSE_REVIEW_DB_PASSWORD is not set: a real run would stop here (exit 2)" in rehearsal.stdout
    assert "DOWNTIME BEGINS" in rehearsal.stdout and "COMMIT POINT" in rehearsal.stdout
    assert not (tmp_path / ".migrate").exists(), "neither the run nor the rehearsal left state behind"


def closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_dry_run_with_a_host_out_of_reach_lists_its_steps_and_says_why_there_is_no_estimate(
    plan: Path, tmp_path: Path, migrate_here: Callable[..., Result]
) -> None:
    """The estimate asks the hosts; when one cannot be reached the dry-run is still the step list, with one line
    saying why the estimate is missing (no traceback), and `--no-estimate` asks no host at all."""
    port = closed_port()
    text = plan.read_text().replace("203.0.113.10", "127.0.0.1").replace("203.0.113.20", "127.0.0.9")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    text = text.replace("known_hosts: ~/.ssh/known_hosts", f"known_hosts: {known_hosts}")
    plan.write_text(text.replace("ssh_port: 22", f"ssh_port: {port}"))
    secrets = {"COURSE_REVIEW_DB_PASSWORD": "pw-123456", "CLOUDFLARE_API_TOKEN": "tok-123456"}
    res = migrate_here("apply", str(plan), "--dry-run", env=secrets)
    assert res.returncode == exit_codes.OK, res
    assert "DOWNTIME BEGINS" in res.stdout and "COMMIT POINT" in res.stdout
    missing = [line for line in res.stdout.splitlines() if line.startswith("estimate: not measured: ")]
    assert len(missing) == 1 and f"127.0.0.1:{port}" in missing[0], res.stdout
    assert "Traceback" not in res.stdout + res.stderr and "pw-123456" not in res.stdout + res.stderr
    offline = migrate_here("apply", str(plan), "--dry-run", "--no-estimate", env=secrets)
    assert offline.returncode == exit_codes.OK and "estimate" not in offline.stdout
    without_secrets = migrate_here("apply", str(plan), "--dry-run")
    assert "is not set (the hosts are not asked without it)" in without_secrets.stdout
    assert not (tmp_path / ".migrate").exists()


def test_rollback_without_a_run_changes_nothing(
    plan: Path, tmp_path: Path, migrate_here: Callable[..., Result]
) -> None:
    res = migrate_here("rollback", str(plan))
    assert res.returncode == exit_codes.OK
    assert "has no run: nothing to roll back" in res.stdout
    assert not (tmp_path / ".migrate").exists()


def test_status_json_without_a_run(plan: Path, migrate_here: Callable[..., Result]) -> None:
    res = migrate_here("status", str(plan), "--json")
    assert res.returncode == exit_codes.OK
    doc = json.loads(res.stdout)
    assert doc["run"] is None and doc["locked_by"] is None and "starts a new run" in doc["next"]


def test_a_plan_file_name_with_markup_and_emoji_codes_is_printed_as_written(
    tmp_path: Path, migrate_here: Callable[..., Result]
) -> None:
    plan = tmp_path / f"{HOSTILE}.yaml"  # `[/]` makes it a directory "y[red]z[" and a file "]w…"
    plan.parent.mkdir(parents=True)
    lines = PLAN.splitlines()
    plan.write_text("\n".join([*lines, *["#"] * (99 - len(lines)), "bogus_key: 1"]) + "\n")
    res = migrate("validate", str(plan))
    assert res.returncode == exit_codes.BAD_INPUT, res.stderr
    assert f"{plan}:100:" in res.stderr, res.stderr
    assert "\U0001f4af" not in res.stderr and "\U0001f604" not in res.stderr and "Traceback" not in res.stderr
    here = migrate_here("status", str(plan))  # the same console, without a second process start-up
    assert here.returncode == exit_codes.BAD_INPUT and f"{plan}:100:" in here.stderr


def test_dry_run_apply_and_status_print_user_text_as_written(world: World) -> None:
    """Paths, errors and table cells with `[red]`, `[/]`, `:100:` and `:smile:` reach the console unchanged."""
    hostile = world.root / HOSTILE
    hostile.mkdir(parents=True)
    world.dir = hostile
    dry = world.run("apply", str(world.plan), "--dry-run", HARNESS_WORLD=str(hostile))
    assert dry.returncode == exit_codes.OK, dry.stderr
    assert f"would create {hostile}/prepare.done" in dry.stdout
    failed = world.run("apply", str(world.plan), "--yes", HARNESS_WORLD=str(hostile), HARNESS_FAIL="start")
    assert failed.returncode == exit_codes.FAILED, failed.stderr
    assert f"start failed on purpose in {hostile}" in " ".join(failed.stdout.split()), failed.stdout
    status = world.run("status", str(world.plan))
    assert status.returncode == exit_codes.OK
    assert f"start failed on purpose in {hostile}"[:100] in " ".join(status.stdout.split())
    for text in (dry.stdout, dry.stderr, failed.stdout, failed.stderr, status.stdout):
        assert "\U0001f4af" not in text and "\U0001f604" not in text and "Traceback" not in text


def test_a_defect_prints_one_line_and_keeps_the_traceback_in_the_run_log(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        secret_in_a_frame = "frame-local-value-7731"  # noqa: F841 - a frame local that must never be rendered
        raise RuntimeError(f"boom {HOSTILE}")

    monkeypatch.setattr(commands, "_write_report", broken)
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.INTERNAL
    defect = [line for line in res.stderr.splitlines() if "internal error" in line]
    assert defect == [f"internal error (RuntimeError): boom {HOSTILE}; `migrate status` shows the run's state"]
    assert "Traceback" not in res.stderr and "frame-local-value" not in res.stderr + res.stdout
    (log,) = world.state_dir.glob("run-*.log.jsonl")
    for handler in mlog.logging.getLogger().handlers:
        handler.flush()
    text = log.read_text()
    assert "boom" in text and "RuntimeError" in text and "broken" in text, "the traceback is in the run's log"
    assert "frame-local-value" not in text, "never with frame locals"


@pytest.mark.parametrize(
    ("value", "problem"),
    [("10", "must be at least 30, got 10"), ("90000", "must be at most 86400, got 90000"),
     ("60.5", "expected a whole number"), ("true", "expected a whole number"), ("'60'", "expected a whole number")],
)  # fmt: skip
def test_a_bad_lower_ttl_to_is_one_line_naming_where(
    plan: Path, value: str, problem: str, migrate_here: Callable[..., Result]
) -> None:
    text = plan.read_text()
    assert "  lower_ttl_to: 60\n" in text
    plan.write_text(text.replace("  lower_ttl_to: 60\n", f"  lower_ttl_to: {value}\n"))
    line = 1 + plan.read_text().splitlines().index(f"  lower_ttl_to: {value}")
    res = migrate_here("validate", str(plan))
    assert res.returncode == exit_codes.BAD_INPUT, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{plan}:{line}:") and "dns.lower_ttl_to" in lines[0], res.stderr
    assert problem in lines[0], res.stderr


def test_a_negative_lower_ttl_wait_is_refused(plan: Path, migrate_here: Callable[..., Result]) -> None:
    plan.write_text(plan.read_text().replace("  lower_ttl_to: 60\n", "  lower_ttl_to: 60\n  lower_ttl_wait: -1\n"))
    res = migrate_here("validate", str(plan))
    assert res.returncode == exit_codes.BAD_INPUT and "dns.lower_ttl_wait" in res.stderr, res


def test_report_without_a_run_is_one_line_and_exit_2(plan: Path, migrate_here: Callable[..., Result]) -> None:
    res = migrate_here("report", str(plan))
    assert res.returncode == exit_codes.BAD_INPUT, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no run recorded" in lines[0], res.stderr
