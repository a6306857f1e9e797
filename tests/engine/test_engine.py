"""The engine through the real command line, in-process, with file-based steps: forward, rollback, resume, gates,
hooks, secrets. A `Crash` (tests/engine/harness.py) stands in for kill -9: the journal is left exactly as a killed
process leaves it. The real-process cases (kill -9, a live lock holder, a real signal) are in test_processes.py.
"""

from __future__ import annotations

import pytest

from orchestrator import exit_codes
from tests.engine import harness
from tests.engine.harness import STEP_NAMES, file_steps
from tests.engine.world import CRASHED, PLAN, SECRET, World, crash_before


def test_forward_runs_every_step_once_and_completes(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.actions() == [f"run {n}" for n in STEP_NAMES]
    assert world.effects() == set(STEP_NAMES)
    assert world.status_json()["run"]["status"] == "completed"
    again = world.run("apply", str(world.plan), "--yes")
    assert again.returncode == exit_codes.OK
    assert "nothing to do" in again.stdout
    assert world.actions() == [f"run {n}" for n in STEP_NAMES]


def test_failure_runs_compensations_in_reverse(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes", HARNESS_FAIL="start")
    assert res.returncode == exit_codes.FAILED
    assert "start failed on purpose" in res.stderr
    assert world.actions() == [
        "run prepare",
        "run copy",
        "run cutover",
        "run start",
        "undo start",
        "undo cutover",
        "undo copy",
        "undo prepare",
    ]
    assert world.effects() == set()
    assert world.status_json()["run"]["status"] == "rolled_back"
    # A new apply after a rollback starts a fresh run and keeps the old journal in history.
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK
    assert len(list((world.state_dir / "history").glob("*.journal.jsonl"))) == 1


@pytest.mark.parametrize("step", STEP_NAMES)
def test_kill9_at_step_boundary_resumes_without_redoing_finished_steps(
    world: World, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with crash_before(monkeypatch, "step_started", step):
        assert world.run("apply", str(world.plan), "--yes").returncode == CRASHED
    done_before = STEP_NAMES[: STEP_NAMES.index(step)]
    assert world.effects() == set(done_before)
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    assert "resuming" in res.stdout
    assert world.actions() == [f"run {n}" for n in STEP_NAMES], "each step ran exactly once"
    assert world.effects() == set(STEP_NAMES)


@pytest.mark.parametrize("step", STEP_NAMES)
def test_kill9_inside_a_step_reenters_it_from_its_start(world: World, step: str) -> None:
    assert world.run("apply", str(world.plan), "--yes", HARNESS_CRASH_INSIDE=step).returncode == CRASHED
    assert world.status_json()["run"]["steps"][STEP_NAMES.index(step)]["state"] == "running"
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    expected = [f"run {n}" for n in STEP_NAMES]
    expected.insert(STEP_NAMES.index(step), f"run {step}")  # the interrupted step is re-entered from its start
    assert world.actions() == expected
    assert world.effects() == set(STEP_NAMES)
    # The journal shows the interrupted step started twice: once before the kill, once on resume.
    starts = [e["step"] for e in world.journal() if e["event"] == "step_started"]
    assert starts.count(step) == 2


def test_resumed_step_whose_effect_is_in_place_is_not_run_again(world: World) -> None:
    assert world.run("apply", str(world.plan), "--yes", HARNESS_CRASH_INSIDE="copy").returncode == CRASHED
    (world.dir / "copy.done").write_text("done")  # the step's effect landed just before the crash
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.actions().count("run copy") == 1


def test_interrupted_rollback_resumes(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes", HARNESS_FAIL="start", HARNESS_CRASH_UNDO="copy")
    assert res.returncode == CRASHED
    assert world.status_json()["run"]["status"] == "rolling_back"
    res = world.run("rollback", str(world.plan))
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.actions() == [
        "run prepare",
        "run copy",
        "run cutover",
        "run start",
        "undo start",
        "undo cutover",
        "undo copy",  # killed inside this undo
        "undo copy",
        "undo prepare",  # resumed: the interrupted undo again, then the rest; none repeated
    ]
    assert world.effects() == set()
    assert world.status_json()["run"]["status"] == "rolled_back"


def test_apply_on_an_interrupted_rollback_finishes_the_rollback(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes", HARNESS_FAIL="cutover", HARNESS_CRASH_UNDO="copy")
    assert res.returncode == CRASHED
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.FAILED
    assert "unfinished rollback" in res.stdout
    assert world.effects() == set()


def test_dry_run_changes_nothing_and_never_touches_a_real_journal(world: World) -> None:
    res = world.run("apply", str(world.plan), "--dry-run")
    assert res.returncode == exit_codes.OK, res.stderr
    assert "would create" in res.stdout and "DOWNTIME BEGINS" in res.stdout and "COMMIT POINT" in res.stdout
    assert world.actions() == [] and world.effects() == set()
    assert not (world.state_dir / "journal.jsonl").exists()
    # With a real, unfinished run: the dry-run leaves its journal byte for byte as it was.
    assert world.run("apply", str(world.plan), "--yes", HARNESS_CRASH_INSIDE="cutover").returncode == CRASHED
    before = (world.state_dir / "journal.jsonl").read_bytes()
    actions = world.actions()
    res = world.run("apply", str(world.plan), "--dry-run")
    assert res.returncode == exit_codes.OK, res.stderr
    assert "unfinished" in res.stdout
    assert (world.state_dir / "journal.jsonl").read_bytes() == before
    assert world.actions() == actions, "the dry-run ran no step"
    assert not list(world.dir.glob("hook-env-*-dry-run*")), "nor any hook"


def test_dry_run_and_run_describe_the_same_steps(world: World) -> None:
    """One path: the dry-run lists the steps the engine runs, in the order it runs them, with their flags."""
    res = world.run("apply", str(world.plan), "--dry-run")
    listed = [line.split("(")[-1].rstrip(")") for line in res.stdout.splitlines() if line[:1].isdigit()]
    listed = [name.split(")")[0] for name in listed]
    assert listed == STEP_NAMES
    assert world.run("apply", str(world.plan), "--yes").returncode == exit_codes.OK
    assert [e["step"] for e in world.journal() if e["event"] == "step_started"] == STEP_NAMES


def test_changed_plan_refuses_resume_unless_forced(world: World) -> None:
    assert world.run("apply", str(world.plan), "--yes", HARNESS_CRASH_INSIDE="copy").returncode == CRASHED
    world.plan.write_text(PLAN.replace("records: [www.example.test]", "records: [api.example.test]"))
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.REFUSED
    assert "plan changed" in res.stderr and "api.example.test" in res.stderr and "www.example.test" in res.stderr
    res = world.run("apply", str(world.plan), "--yes", "--force")
    assert res.returncode == exit_codes.OK, res.stderr


def test_confirmation_gate_stops_before_the_downtime(world: World) -> None:
    res = world.run("apply", str(world.plan))  # no --yes and no terminal: not confirmed
    assert res.returncode == exit_codes.REFUSED
    assert world.actions() == ["run prepare", "run copy"]
    assert "--yes" in res.stderr
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK
    assert world.actions() == [f"run {n}" for n in STEP_NAMES]


def test_failing_before_hook_aborts_and_rolls_back_with_documented_environment(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes", HARNESS_HOOK_FAIL="cutover")
    assert res.returncode == exit_codes.FAILED
    assert "hook before-step" in res.stderr and "exited 7" in res.stderr
    assert "run cutover" not in world.actions()
    assert world.effects() == set()
    env = dict(line.split("=", 1) for line in (world.dir / "hook-env-before-step-copy").read_text().splitlines())
    assert env["MIGRATE_EVENT"] == "before-step"
    assert env["MIGRATE_STEP"] == "copy" and env["MIGRATE_STEP_INDEX"] == "2" and env["MIGRATE_STEP_COUNT"] == "6"
    assert env["MIGRATE_PLAN_NAME"] == "harness" and env["MIGRATE_DRY_RUN"] == "0"
    assert env["MIGRATE_RUN_ID"] and float(env["MIGRATE_ELAPSED_SECONDS"]) >= 0
    assert env["MIGRATE_JOURNAL"].endswith("journal.jsonl")


def test_failure_after_commit_point_is_not_rolled_back_automatically(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes", HARNESS_FAIL="finish")
    assert res.returncode == exit_codes.NEEDS_ATTENTION
    assert not any(a.startswith("undo") for a in world.actions())
    assert world.status_json()["run"]["status"] == "failed_after_commit"
    res = world.run("rollback", str(world.plan))
    assert res.returncode == exit_codes.REFUSED
    assert "--discard-target-writes" in res.stderr
    res = world.run("apply", str(world.plan), "--yes")  # resume forward: only the failed step again
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.actions().count("run finish") == 2 and world.actions().count("run flip") == 1


def test_rollback_after_commit_with_discard_target_writes(world: World) -> None:
    assert world.run("apply", str(world.plan), "--yes").returncode == exit_codes.OK
    res = world.run("rollback", str(world.plan), "--discard-target-writes", "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.effects() == set()


def test_planted_secret_never_reaches_any_output(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes", "-v", HARNESS_LEAK="cutover")
    assert res.returncode == exit_codes.FAILED
    assert SECRET not in res.stdout and SECRET not in res.stderr
    assert "***" in res.stderr
    files = [p for p in world.root.rglob("*") if p.is_file()]
    assert any(p.name.startswith("run-") for p in files), "the run's JSON log exists"
    assert any(p.name.startswith("hook-fullenv-") for p in files), "hooks dumped their whole environment"
    for path in files:
        assert SECRET not in path.read_text(errors="replace"), path
    status = world.run("status", str(world.plan))
    assert SECRET not in status.stdout + status.stderr


def test_missing_secret_is_bad_input_and_changes_nothing(world: World) -> None:
    env_without = {"HARNESS_TOKEN": ""}
    res = world.run("apply", str(world.plan), "--yes", **env_without)
    assert res.returncode == exit_codes.BAD_INPUT
    assert res.stderr.strip().count("\n") == 0 and "HARNESS_TOKEN" in res.stderr
    assert world.actions() == [] and not world.state_dir.exists()


def test_a_step_that_commits_midway_is_finished_forward_not_rolled_back(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes", HARNESS_COMMIT_FAIL="start")
    assert res.returncode == exit_codes.NEEDS_ATTENTION, res.stderr
    assert not any(a.startswith("undo") for a in world.actions())
    assert world.status_json()["run"]["status"] == "failed_after_commit"
    assert [e["reason"] for e in world.journal() if e["event"] == "committed"] == ["part of the effect is visible"]
    res = world.run("apply", str(world.plan), "--yes", HARNESS_COMMIT_FAIL="start")
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.effects() == set(STEP_NAMES)


def test_resuming_a_started_downtime_step_does_not_ask_again(world: World) -> None:
    assert world.run("apply", str(world.plan), "--yes", HARNESS_CRASH_INSIDE="cutover").returncode == CRASHED
    res = world.run("apply", str(world.plan))  # no --yes and no terminal: the gate would decline
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.effects() == set(STEP_NAMES)


def test_hooks_never_see_an_env_file_variable_or_a_secret_unless_the_plan_passes_it(world: World) -> None:
    env_file = world.root / "secrets.env"
    unreferenced = "planted-unreferenced-secret-4417"
    env_file.write_text(
        f"UNRELATED_DB_PASSWORD={unreferenced}\nHARNESS_TOKEN={SECRET}\nSHARED_SETTING=visible-to-hooks\n"
    )
    world.plan.write_text(PLAN + "hooks:\n  pass_env: [SHARED_SETTING]\n")
    res = world.run("apply", str(world.plan), "--yes", "--env-file", str(env_file), HARNESS_TOKEN="")
    assert res.returncode == exit_codes.OK, res.stderr
    dumps = sorted(world.dir.glob("hook-fullenv-*"))
    assert len(dumps) >= 2 * len(STEP_NAMES), "every hook dumped its environment"
    for dump in dumps:
        text = dump.read_text()
        assert unreferenced not in text and SECRET not in text, dump.name
        names = {line.split("=", 1)[0] for line in text.splitlines()}
        assert "UNRELATED_DB_PASSWORD" not in names and "HARNESS_TOKEN" not in names, dump.name
        assert "SHARED_SETTING=visible-to-hooks" in text.splitlines(), "a variable the plan names is passed"
        assert "PATH" in names and "MIGRATE_EVENT" in names, "the rest of the environment and MIGRATE_* reach hooks"


def _without_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The steps as a newer version builds them: one step fewer than the journal of a run it takes over lists."""
    monkeypatch.setattr(harness, "file_steps", lambda plan: [s for s in file_steps(plan) if s.name != "start"])


def test_a_run_whose_journal_lists_a_step_the_mode_runs_no_more_resumes_without_it(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Older versions ran start_target in the replicate mode (it did nothing there) and journaled it in the run's step
    # list. A newer version resumes such a run with the steps its mode holds now: the journal's extra step, pending,
    # is left alone, and the run completes.
    with crash_before(monkeypatch, "step_started", "start"):
        assert world.run("apply", str(world.plan), "--yes").returncode == CRASHED
    _without_start(monkeypatch)
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.actions() == [f"run {n}" for n in STEP_NAMES if n != "start"]
    assert world.status_json()["run"]["status"] == "completed"


def test_a_run_whose_journal_lists_a_step_the_mode_runs_no_more_rolls_back_without_it(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same older journal, the extra step done (its effect a no-op in that mode): a rollback undoes the steps the
    # mode holds now, newest first, and leaves the extra one's record as it was.
    with crash_before(monkeypatch, "step_started", "flip"):
        assert world.run("apply", str(world.plan), "--yes").returncode == CRASHED
    _without_start(monkeypatch)
    res = world.run("rollback", str(world.plan))
    assert res.returncode == exit_codes.OK, res.stderr
    assert [a for a in world.actions() if a.startswith("undo")] == ["undo cutover", "undo copy", "undo prepare"]
    assert world.status_json()["run"]["status"] == "rolled_back"


def test_a_save_without_its_own_fsync_is_in_the_journal_a_resume_reads(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ctx.save(..., sync=False)` writes its record with no fsync of its own (the next record's flushes it) and
    a run killed right after still finds the value when it resumes."""
    from orchestrator.engine import journal

    synced: list[str] = []
    original = journal.Journal._persist

    def persist(self: journal.Journal, record: dict[str, object], **how: object) -> None:
        original(self, record, **how)  # type: ignore[arg-type]
        if self.path is not None and how.get("sync", True):
            synced.append(str(record.get("key") or record.get("event")))

    with monkeypatch.context() as patch:
        patch.setattr(journal.Journal, "_persist", persist)
        crashed = world.run("apply", str(world.plan), "--yes", HARNESS_SAVE_UNSYNCED="prepare",
                            HARNESS_CRASH_INSIDE="prepare")  # fmt: skip
    assert crashed.returncode == CRASHED
    assert "unsynced" not in synced and "started" in synced
    res = world.run("apply", str(world.plan), "--yes", HARNESS_SAVE_UNSYNCED="prepare")
    assert res.returncode == exit_codes.OK, res.stderr
    assert "found unsynced prepare" in world.actions()


# ------------------------------------------------------------------- a commit sent elsewhere (a one-way door)


def test_a_commit_made_elsewhere_before_the_failure_is_finished_forward_at_once(world: World) -> None:
    """The commit point sent its commit to a host, which made it, and the answer was lost (a signal, a dropped
    connection): nothing is undone (the target serves), the run is journaled committed and finished at once."""
    res = world.run("apply", str(world.plan), "--yes", HARNESS_REMOTE_COMMIT="flip", HARNESS_REMOTE_MAKES_IT="1")
    assert res.returncode == exit_codes.OK, res.stderr
    assert not [a for a in world.actions() if a.startswith("undo")], world.actions()
    assert world.actions()[-4:] == ["run flip", "settle flip", "run flip", "run finish"]
    assert world.status_json()["run"]["status"] == "completed"


def test_a_commit_sent_and_not_made_is_cancelled_before_the_rollback(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes", HARNESS_REMOTE_COMMIT="flip")
    assert res.returncode == exit_codes.FAILED, res.stderr
    actions = world.actions()
    assert actions[actions.index("settle flip") + 1 :] == [f"undo {n}" for n in reversed(STEP_NAMES[:5])]
    assert (world.dir / harness.REMOTE_CANCELLED).exists()
    assert world.status_json()["run"]["status"] == "rolled_back"


def test_a_commit_that_cannot_be_settled_undoes_nothing_and_apply_finishes_it(world: World) -> None:
    res = world.run(
        "apply", str(world.plan), "--yes", HARNESS_REMOTE_COMMIT="flip", HARNESS_REMOTE_MAKES_IT="1",
        HARNESS_SETTLE_UNKNOWN="flip",
    )  # fmt: skip
    assert res.returncode == exit_codes.NEEDS_ATTENTION, res.stderr
    assert not [a for a in world.actions() if a.startswith("undo")], world.actions()
    assert "`migrate apply`" in world.status_json()["next"]
    # `migrate rollback` settles first too: committed, so it undoes nothing and points at apply.
    back = world.run("rollback", str(world.plan), "--yes")
    assert back.returncode == exit_codes.NEEDS_ATTENTION, back
    assert not [a for a in world.actions() if a.startswith("undo")], world.actions()
    status = world.status_json()
    assert "`migrate apply`" in status["next"] and "rollback" not in status["next"]
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.OK, res.stderr
    assert world.status_json()["run"]["status"] == "completed"


def test_a_refused_compensation_stops_the_rollback_there(world: World) -> None:
    res = world.run("apply", str(world.plan), "--yes", HARNESS_FAIL="flip", HARNESS_UNDO_REFUSE="start")
    assert res.returncode == exit_codes.NEEDS_ATTENTION, res.stderr
    assert [a for a in world.actions() if a.startswith("undo")] == ["undo flip", "undo start"]
    assert world.effects() == {"prepare", "copy", "cutover", "start"}


def test_a_failing_hooks_output_reaches_the_terminal_with_its_control_characters_escaped(world: World) -> None:
    """A hook's output is text from outside: an escape sequence in it (a window title set, the screen cleared) is
    shown escaped, never sent to the operator's terminal raw."""
    hook = world.hooks / "before-step"
    hook.write_text("#!/bin/sh\nprintf '\\033]0;owned\\007\\033[2Jno\\n' >&2\nexit 7\n")
    res = world.run("apply", str(world.plan), "--yes")
    assert res.returncode == exit_codes.FAILED
    assert "\x1b" not in res.stderr and "\x07" not in res.stderr
    assert "\\x1b]0;owned\\x07\\x1b[2Jno" in res.stderr, res.stderr
