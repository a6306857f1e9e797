"""Secrets never reach the console or the run's JSON log, even inside a rendered traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from pathlib import Path
from orchestrator import logging as mlog, secrets
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
