"""The engine knows nothing of the domain: importing it loads no plan model, no pydantic, no step or transport."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = (
    "pydantic",
    "ruamel",
    "orchestrator.plan",
    "orchestrator.secrets",
    "orchestrator.steps",
    "orchestrator.transports",
    "orchestrator.runtime",
    "orchestrator.report.build",
    "migrate_lab",
    "pymysql",
    "asyncssh",
    "cloudflare",
)


def test_importing_the_engine_loads_no_domain_module() -> None:
    code = "import sys, orchestrator.engine.machine; print('\\n'.join(sorted(sys.modules)))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    loaded = res.stdout.split()
    assert "orchestrator.engine.machine" in loaded
    leaked = [name for name in loaded if name.split(".")[0] in FORBIDDEN or name.startswith(FORBIDDEN)]
    assert leaked == []
