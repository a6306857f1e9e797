"""Secrets: resolved from the environment or a file only when needed, and redacted from every output.

Every resolved value is registered with `orchestrator.redaction`; the logging pipeline, the journal writer, hook
environments and error messages pass text through `redact` so a secret can never reach a log, a journal, a report or
the terminal. The names of every variable loaded from `--env-file` or named by a secret reference are remembered too:
hooks never inherit them (unless the plan's `hooks.pass_env` names them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.plan.model import Plan, SecretRef
from orchestrator.redaction import MASK, redact, redact_obj, register

__all__ = [
    "MASK",
    "EnvFileError",
    "SecretError",
    "hook_environment",
    "load_env_file",
    "redact",
    "redact_obj",
    "register",
    "resolve",
    "resolve_all",
    "secret_refs",
    "withheld_names",
]

# Variables that hold, or may hold, a secret: loaded from --env-file, or named by a secret reference.
_withheld: set[str] = set()


class SecretError(Exception):
    """A referenced secret is missing; the message names the reference, never a value."""


class EnvFileError(Exception):
    """The --env-file cannot be used; the message is one line naming the file (and line)."""


def resolve(ref: SecretRef, base_dir: Path | None = None, env: dict[str, str] | None = None) -> str:
    environ = os.environ if env is None else env
    if ref.env is not None:
        _withheld.add(ref.env)
        value = environ.get(ref.env)
        if value is None or value == "":
            raise SecretError(f"environment variable {ref.env} is not set")
    else:
        assert ref.file is not None
        path = Path(os.path.expanduser(ref.file))
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        try:
            value = path.read_text().splitlines()[0].strip() if path.read_text() else ""
        except OSError as exc:
            raise SecretError(f"secret file {path} cannot be read: {exc.strerror}") from None
        if not value:
            raise SecretError(f"secret file {path} is empty")
    register(value)
    return value


def secret_refs(obj: Any, path: str = "") -> Iterator[tuple[str, SecretRef]]:
    """Every secret reference inside a plan (or part of one), with its field path."""
    if isinstance(obj, SecretRef):
        yield path, obj
    elif hasattr(type(obj), "model_fields"):
        for name in type(obj).model_fields:
            yield from secret_refs(getattr(obj, name), f"{path}.{name}" if path else name)
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from secret_refs(item, f"{path}[{i}]")


def resolve_all(plan: Plan, plan_path: Path) -> None:
    """Every referenced secret must be there before anything changes anywhere (and is registered for redaction).

    Raises SecretError with the plan file and the field path of the first missing one.
    """
    for _field_path, ref in secret_refs(plan):
        if ref.env is not None:
            _withheld.add(ref.env)
    for field_path, ref in secret_refs(plan):
        try:
            resolve(ref, plan_path.parent)
        except SecretError as exc:
            raise SecretError(f"{plan_path}: {field_path}: {exc}") from None


def load_env_file(env_file: Path | None) -> list[str]:
    """Load KEY=VALUE lines into the environment; returns the names loaded (all withheld from hooks)."""
    if env_file is None:
        return []
    try:
        lines = env_file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EnvFileError(f"{env_file}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise EnvFileError(f"{env_file}: cannot read: not UTF-8 text") from None
    values: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not key.strip().isidentifier():
            raise EnvFileError(f"{env_file}:{number}: expected KEY=VALUE")
        values[key.strip()] = value.strip().strip("'\"")
    # Only after the whole file parsed: a bad line changes nothing.
    for key, value in values.items():
        os.environ[key] = value
        _withheld.add(key)
    return list(values)


def withheld_names() -> set[str]:
    return set(_withheld)


def hook_environment(pass_env: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """The environment hooks inherit: this process's, minus every variable from --env-file or a secret reference
    (unless named in `pass_env`) and minus any value that holds a resolved secret."""
    allowed = set(pass_env)
    withheld = _withheld - allowed
    return {k: v for k, v in os.environ.items() if k not in withheld and (k in allowed or redact(v) == v)}
