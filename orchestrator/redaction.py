"""Redaction: every secret value `migrate` resolved is masked in every text it writes.

Neutral on purpose (no plan, no domain): the engine, the journal, the logs and the transports mask through it, and
`orchestrator.secrets` registers each value it resolves.
"""

from __future__ import annotations

import threading
from typing import Any, overload

MASK = "***"
_known: set[str] = set()
_lock = threading.Lock()


def register(value: str) -> None:
    # Very short values would mask innocent text everywhere; they are still never logged on purpose.
    if value and len(value) >= 4:
        with _lock:
            _known.add(value)


def redact(text: str) -> str:
    if not _known:
        return text
    with _lock:
        values = sorted(_known, key=len, reverse=True)
    for value in values:
        if value in text:
            text = text.replace(value, MASK)
    return text


def printable(text: str) -> str:
    """Text from outside (a hook's output, a host's error) made safe for a terminal: every control character but a
    newline or a tab shown as an escape (\\x1b…), so no escape sequence sets a window title, clears the screen or
    hides what follows."""
    return "".join(
        ch if ch in "\n\t" or not (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0) else f"\\x{ord(ch):02x}" for ch in text
    )


@overload
def redact_obj(obj: str) -> str: ...
@overload
def redact_obj(obj: dict[str, Any]) -> dict[str, Any]: ...
@overload
def redact_obj(obj: object) -> object: ...
def redact_obj(obj: object) -> object:
    """Redact every string inside a JSON-like structure."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {k: redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact_obj(v) for v in obj]
    return obj
