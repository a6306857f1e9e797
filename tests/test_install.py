"""What a fresh install gives a user: a console with nothing but migrate's own lines whatever the libraries warn
about, `migrate --version`, a wheel without the lab, and one line saying how to get the lab where it is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from orchestrator import exit_codes
from tests.conftest import MIGRATE, ROOT, SECRET_ENV

EXAMPLE = ROOT / "plans" / "course-review.yaml"
# Raises, at the first `import asyncssh`, the warning cryptography 47 and later raise there (DSA deprecated), whatever
# the installed cryptography does: the console must stay quiet on the newest releases' behaviour, not only the lock's.
NOISY_CRYPTOGRAPHY = """
import builtins, warnings
from cryptography.utils import CryptographyDeprecationWarning
_import = builtins.__import__
_raised = []
def _noisy(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    if name == "asyncssh" and not _raised:
        _raised.append(name)
        warnings.warn("DSA is deprecated and support will be removed in a future release. Use a more modern "
                      "signature algorithm.", CryptographyDeprecationWarning, stacklevel=2)
    return module
builtins.__import__ = _noisy
"""


def run_migrate(
    *args: str, extra_path: Path | None = None, python: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV and k != "PYTHONWARNINGS"}
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [str(python), "-m", "orchestrator.cli.commands"] if python else [str(MIGRATE)]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL, check=False
    )


@pytest.fixture
def noisy(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NOISY_CRYPTOGRAPHY)
    return site


def test_the_planted_warning_reaches_stderr_without_the_filter(noisy: Path) -> None:
    """The guard below can fail: asyncssh imported without migrate's filter prints the planted warning."""
    env = {**os.environ, "PYTHONPATH": str(noisy)}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run(
        [sys.executable, "-c", "import asyncssh"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert "DSA is deprecated" in done.stderr


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--help"], exit_codes.OK),
        (["--version", "-v"], exit_codes.OK),
        (["schema"], exit_codes.OK),
        (["validate", str(EXAMPLE)], exit_codes.OK),
        (["status", str(EXAMPLE), "--state-dir", "STATE"], exit_codes.OK),
    ],
)
def test_library_warnings_never_reach_the_console(noisy: Path, tmp_path: Path, args: list[str], code: int) -> None:
    args = [str(tmp_path / "state") if a == "STATE" else a for a in args]
    done = run_migrate(*args, extra_path=noisy)
    assert done.returncode == code, done
    assert "Warning" not in done.stderr and "warnings.warn" not in done.stderr, done.stderr
    assert done.stderr == "", done.stderr


def test_version_names_the_package_and_with_v_what_it_runs_on() -> None:
    short = run_migrate("--version")
    assert short.returncode == exit_codes.OK and short.stderr == ""
    assert short.stdout.strip().splitlines() == [f"migrate {_distribution_version()}"]
    long = run_migrate("--version", "-v").stdout
    for name in ("python", "asyncssh", "cloudflare", "pymysql", "psycopg", "temporalio"):
        assert any(line.startswith(f"{name} ") and "not installed" not in line for line in long.splitlines()), long


def _distribution_version() -> str:
    from importlib import metadata

    return metadata.version("migrate")


def test_the_help_says_what_the_tool_does_today() -> None:
    text = " ".join(run_migrate("--help").stdout.split())
    assert "PostgreSQL" in text and "seconds of downtime" not in text


def test_without_the_lab_migrate_lab_says_in_one_line_how_to_get_it(tmp_path: Path) -> None:
    """The product's wheel has no lab: `migrate lab ...` there answers one line, exit 2, no traceback."""
    site = tmp_path / "nolab"
    site.mkdir()
    # A python where migrate_lab cannot be imported, as after `pip install migrate` alone.
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['migrate_lab'] = None\n")
    done = run_migrate("lab", "up", "--dir", str(tmp_path / "lab"), extra_path=site, python=Path(sys.executable))
    assert done.returncode == exit_codes.BAD_INPUT, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install ./lab" in lines[0], done.stderr
    assert not (tmp_path / "lab").exists()


def test_the_products_wheel_holds_the_orchestrator_only(tmp_path: Path) -> None:
    """`pip install migrate` installs no lab module: the wheel built from pyproject.toml, read back."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "orchestrator", source / "orchestrator", ignore=shutil.ignore_patterns("__pycache__"))
    # The lab as it sits in the repository, beside the product: it must not be picked up.
    shutil.copytree(ROOT / "lab", source / "lab", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        cwd=source, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("migrate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("orchestrator/engine/") for n in names)
    assert not [n for n in names if "lab" in n.split("/")[0] or n.startswith("migrate_lab")], names
