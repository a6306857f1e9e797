"""What the operator's console shows of the log: live bars and a phase line on a terminal, plain lines otherwise.

Three console handlers, one per kind of output (`logging.configure` picks one):
- `LiveConsoleHandler` (a terminal): log lines scroll above a live area that holds one bar per transfer (bytes,
  files, rate, ETA, bandwidth limit) and the phase line (step, writes blocked against the budget, the TTL wait,
  replication lag). A finished transfer leaves one summary line.
- plain text or JSON lines (not a terminal, or `--json`): the same records as lines, transfer updates thinned to one
  every `PLAIN_EVERY` seconds per transfer (and the last), never an escape code.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from orchestrator.output.progress import (
    LAG_KEY,
    PROGRESS_KEY,
    SUPERSEDED_EVENTS,
    TRANSFER_EVENT,
    Phase,
    TransferProgress,
    clock_text,
    size_text,
)

PLAIN_EVERY = 5.0  # seconds between two plain lines of one transfer
FILE_EVERY = 2.0  # seconds between two records of one transfer in the run's log (`status --watch` reads them)
PhaseSource = Callable[[float | None], Phase | None]  # given the latest lag, the run's phase now


def event_of(record: logging.LogRecord) -> dict[str, Any] | None:
    """The structlog event dict a record carries (None for a record from a library's own logger)."""
    return record.msg if isinstance(record.msg, dict) else None


class ThinProgress(logging.Filter):
    """One transfer update every `every` seconds per transfer (always its first and its last); other records pass."""

    def __init__(self, every: float | None) -> None:
        super().__init__()
        self.every = every
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        event = event_of(record)
        if event is None or event.get("event") != TRANSFER_EVENT or self.every is None:
            return True
        payload = event.get(PROGRESS_KEY) or {}
        key, now = str(payload.get("id")), time.monotonic()
        if payload.get("state") == "done" or now - self._last.get(key, -self.every) >= self.every:
            self._last[key] = now
            return True
        return False


class ConsoleFilter(ThinProgress):
    """Keeps off the console: superseded records, library warnings and the event loop's own reports of a library
    callback that failed (asyncssh tearing down a connection that was refused: a traceback that says nothing an
    operator can act on; the run's log has them all) and, for line output, all but one transfer update every `every`
    seconds."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name in ("py.warnings", "asyncio"):
            return False
        event = event_of(record)
        if event is not None and event.get("event") in SUPERSEDED_EVENTS:
            return False
        return super().filter(record)


def flatten_progress(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """For plain text: a transfer update as one readable line instead of a nested payload."""
    payload = event_dict.get(PROGRESS_KEY)
    if event_dict.get("event") == TRANSFER_EVENT and isinstance(payload, dict):
        event_dict.pop(PROGRESS_KEY)
        event_dict["event"] = "transfer " + TransferProgress.of(payload).line()
    return event_dict


def transfer_row(table: Table, item: TransferProgress) -> None:
    files = ""
    if item.files_done is not None:
        files = f"{item.files_done}" + (f"/{item.files_total}" if item.files_total else "") + " files"
    total = f" / ~{size_text(item.total)}" if item.total else ""
    rate = f"{size_text(int(item.rate))}/s" if item.rate is not None else "—"
    limit = f"limited to {item.throttle}/s" if item.throttle else ""
    table.add_row(
        Text(item.id),
        ProgressBar(total=100, completed=item.pct, width=30),
        Text(f"{item.pct:>3}%"),
        Text(size_text(item.bytes) + total),
        Text(files),
        Text(rate),
        Text(f"ETA {item.eta_text()}"),
        Text(limit),
    )


def render_live(transfers: list[TransferProgress], phase: Phase | None) -> RenderableType:
    parts: list[RenderableType] = []
    if transfers:
        table = Table.grid(padding=(0, 1))
        for _ in range(8):
            table.add_column()
        for item in transfers:
            transfer_row(table, item)
        parts.append(table)
    if phase is not None:
        parts.append(Text(phase.line(), style="bold"))
    return Group(*parts)


class LiveConsoleHandler(logging.Handler):
    """A terminal: log lines above, bars and the phase line below, redrawn a few times a second."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console
        self.transfers: dict[str, TransferProgress] = {}
        self.lag: float | None = None
        self.phase_source: PhaseSource | None = None
        self._lock_live = threading.Lock()
        self._live: Live | None = None

    @property
    def running(self) -> bool:
        return self._live is not None

    def _renderable(self) -> RenderableType:
        phase = None
        if self.phase_source is not None:
            try:
                phase = self.phase_source(self.lag)
            except Exception:  # the picture must never break the run; the next refresh tries again
                phase = None
        return render_live(list(self.transfers.values()), phase)

    def start(self, phase_source: PhaseSource | None) -> None:
        with self._lock_live:
            self.phase_source = phase_source
            if self._live is None:
                self._live = Live(
                    get_renderable=self._renderable, console=self.console, refresh_per_second=4, transient=True
                )
                self._live.start()

    def stop(self) -> None:
        with self._lock_live:
            if self._live is not None:
                self._live.stop()
                self._live = None
            self.phase_source = None
            self.transfers.clear()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            event = event_of(record)
            if event is not None and isinstance(event.get(LAG_KEY), int | float):
                self.lag = float(event[LAG_KEY])
            if event is not None and event.get("event") == TRANSFER_EVENT:
                self._transfer(TransferProgress.of(event.get(PROGRESS_KEY) or {}, step=event.get("step")))
                return
            self.console.print(Text.from_ansi(self.format(record)))
        except Exception:
            self.handleError(record)

    def _transfer(self, item: TransferProgress) -> None:
        if item.state != "done":
            self.transfers[item.id] = item
            if self._live is None:
                self.start(self.phase_source)
            return
        self.transfers.pop(item.id, None)
        files = f", {item.files_done} files" if item.files_done is not None else ""
        self.console.print(Text(f"  ✓ {item.id}: {size_text(item.bytes)}{files} in {clock_text(item.elapsed)}"))

    def close(self) -> None:
        self.stop()
        super().close()
