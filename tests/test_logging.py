"""Secrets never reach the console or the run's JSON log, even inside a rendered traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from pathlib import Path
from orchestrator import secrets
from orchestrator.output import logging as mlog
mlog.configure(verbose=True)
mlog.log_to_file(Path(sys.argv[1]))
secrets.register("hunter2-planted-password")

def connect(password):
    raise ConnectionError("access denied for user migrate")

try:
    connect("hunter2-planted-password")
except ConnectionError as exc:
    mlog.get_logger(step="cutover").error("failure detail", exc_info=exc, note="pw hunter2-planted-password")
"""


def test_tracebacks_never_show_a_secret_held_in_a_frame(tmp_path: Path) -> None:
    log_file = tmp_path / "run.log.jsonl"
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(log_file)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "access denied for user migrate" in res.stderr and "access denied" in log_file.read_text()
    for text in (res.stdout, res.stderr, log_file.read_text()):
        assert "hunter2-planted-password" not in text
    assert "pw ***" in res.stderr


DEFECT_SCRIPT = """
import sys
from pathlib import Path
from orchestrator.output import logging as mlog
mlog.configure(verbose=True)
if len(sys.argv) > 1:
    mlog.log_to_file(Path(sys.argv[1]))

def broken(plan_text):
    raise KeyError("[red]defect[/] :100:")

try:
    broken("frame-local-plan-text-5521")
except KeyError as exc:
    mlog.record_defect(exc)
"""


def test_a_defect_traceback_goes_to_the_run_log_only_without_frame_locals(tmp_path: Path) -> None:
    log_file = tmp_path / "run.log.jsonl"
    res = subprocess.run(
        [sys.executable, "-c", DEFECT_SCRIPT, str(log_file)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == "" and res.stderr == "", "nothing of the defect on the console"
    text = log_file.read_text()
    assert "Traceback" in text or "frames" in text
    assert "broken" in text and "defect" in text
    assert "frame-local-plan-text" not in text
    # Without a run log yet, the traceback goes nowhere (never to the console).
    bare = subprocess.run([sys.executable, "-c", DEFECT_SCRIPT], capture_output=True, text=True, timeout=60)
    assert bare.returncode == 0 and bare.stdout == "" and bare.stderr == ""


def test_a_signal_landing_while_a_record_is_written_reaches_the_engine() -> None:
    """The engine's signal handler raises Interrupted wherever the main thread is: inside a log call, logging's own
    handleError would print it and swallow it, and a run signalled inside its window would go on to the commit."""
    import logging as std_logging

    import pytest

    from orchestrator.engine.interrupt import Interrupted
    from orchestrator.output import logging as log_setup

    class Signalled(std_logging.Handler):
        def emit(self, record: std_logging.LogRecord) -> None:
            raise Interrupted("interrupted by SIGTERM")

    handler = Signalled()
    log_setup._signals_pass(handler)
    logger = std_logging.getLogger("migrate-test-signal")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with pytest.raises(Interrupted):
            logger.warning("a record")
    finally:
        logger.removeHandler(handler)
