"""Secrets: resolved from the environment or a file only when needed, and redacted from every output.

Every resolved value is registered here; the logging pipeline, the journal writer, hook environments and error
messages pass text through `redact` so a secret can never reach a log, a journal, a report or the terminal.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from orchestrator.plan.model import SecretRef

MASK = "***"
_known: set[str] = set()
_lock = threading.Lock()


class SecretError(Exception):
    """A referenced secret is missing; the message names the reference, never a value."""


def register(value: str) -> None:
    # Very short values would mask innocent text everywhere; they are still never logged on purpose.
    if value and len(value) >= 4:
        with _lock:
            _known.add(value)


def resolve(ref: SecretRef, base_dir: Path | None = None, env: dict[str, str] | None = None) -> str:
    environ = os.environ if env is None else env
    if ref.env is not None:
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


def redact(text: str) -> str:
    if not _known:
        return text
    with _lock:
        values = sorted(_known, key=len, reverse=True)
    for value in values:
        if value in text:
            text = text.replace(value, MASK)
    return text


def redact_obj(obj: object) -> object:
    """Redact every string inside a JSON-like structure."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact_obj(v) for v in obj]
    return obj
