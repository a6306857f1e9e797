"""Interruptions (SIGINT, SIGTERM, SIGHUP) acted on only at safe points.

A signal never lands between a journal write and the in-memory state that follows it: while the engine records a
transition (`recording()`), a signal is only noted, and acted on once the record is both durable and in memory. While
a step or a hook works (`interruptible()`), a signal stops that work at once by raising `Interrupted` — the journal
then says exactly what was done. Anywhere else (the engine between two journaled actions) it is noted and the engine
acts on it at its next safe point (`raise_if_pending()`).

Once the run is committed (`finish_forward`), signals are only noted: the target serves, rolling back is no longer
what an interruption means, and the run finishes forward.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(Exception):
    """SIGINT/SIGTERM/SIGHUP: treated as a failure of the current step (roll back before the commit point)."""


class Interruptions:
    def __init__(self) -> None:
        self.received: list[int] = []
        self.reported = 0  # how many of `received` the engine has logged
        self.pending: int | None = None
        self.finish_forward = False
        self._recording = 0
        self._interruptible = 0
        self._previous: dict[int, Any] = {}

    # --------------------------------------------------------------- handlers
    def install(self, signals: Sequence[int] = SIGNALS) -> None:
        for signum in signals:
            self._previous[signum] = signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signum)
        # No logging here: a handler runs between any two bytecodes, perhaps inside the logging machinery itself.
        if self.finish_forward:
            return
        self.pending = signum
        if self._interruptible and not self._recording:
            self._act()

    def unreported(self) -> list[str]:
        """Names of the signals received since the last call (for the log, at a safe point)."""
        new, self.reported = self.received[self.reported :], len(self.received)
        return [signal.Signals(s).name for s in new]

    def _act(self) -> None:
        signum, self.pending = self.pending, None
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}" if signum else "interrupted")

    # ---------------------------------------------------------------- regions
    @contextmanager
    def recording(self) -> Iterator[None]:
        """A journal write and the in-memory state that follows it: never split by a signal."""
        self._recording += 1
        try:
            yield
        finally:
            self._recording -= 1
        if not self._recording and self._interruptible and self.pending is not None and not self.finish_forward:
            self._act()

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """A step's or a hook's work: a signal stops it at once."""
        if self.pending is not None and not self.finish_forward and not self._recording:
            self._act()
        self._interruptible += 1
        try:
            yield
        finally:
            self._interruptible -= 1

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """Work an interruption must not stop (a rollback restoring the service): signals are only noted."""
        saved, self._interruptible = self._interruptible, 0
        try:
            yield
        finally:
            self._interruptible = saved

    def raise_if_pending(self) -> None:
        """A safe point: between journaled actions."""
        if self.pending is not None and not self.finish_forward and not self._recording:
            self._act()
