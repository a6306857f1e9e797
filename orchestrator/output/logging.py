"""Logging: a human console on stderr and a JSON-lines file per run, both carrying run_id and step.

Every record passes through `redact` on its way out, so a secret that somehow reached a log call is still masked.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog
import structlog.tracebacks
from rich.console import Console

from orchestrator.engine.interrupt import Interrupted
from orchestrator.output.console import (
    FILE_EVERY,
    PLAIN_EVERY,
    ConsoleFilter,
    LiveConsoleHandler,
    PhaseSource,
    ThinProgress,
    flatten_progress,
)
from orchestrator.redaction import printable, redact, redact_obj


def _signals_pass(handler: logging.Handler) -> None:
    """A signal that lands while a record is written (the engine raises Interrupted from its handler) goes on to the
    engine: logging's own handleError would print it and swallow it, and the run would go on as if none came."""
    swallow = handler.handleError

    def handle_error(record: logging.LogRecord) -> None:
        failure = sys.exc_info()[1]
        if isinstance(failure, Interrupted):
            raise failure
        swallow(record)

    handler.handleError = handle_error  # type: ignore[method-assign]  # this handler's own, not the class's


_configured_file: logging.Handler | None = None
_live: LiveConsoleHandler | None = None


def _redact_processor(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    return redact_obj(event_dict)


def _redact_rendered(_logger: Any, _name: str, rendered: Any) -> Any:
    # Last in the chain, after tracebacks were rendered: whatever reached the text is masked too.
    return redact(rendered) if isinstance(rendered, str) else rendered


def _shared_processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact_processor,
    ]


def configure(*, verbose: bool = False, quiet: bool = False, output: str = "auto") -> None:
    """Console logging. Call once per process; `log_to_file` adds the run's JSON-lines file later.

    `output`: "live" (bars and a phase line; a terminal), "plain" (text lines), "json" (JSON lines), or "auto" (live
    on a terminal, plain otherwise). Warnings from libraries go to the run's log, never to the console.
    """
    global _live
    shared = _shared_processors()
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    logging.captureWarnings(True)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_migrate_console", False):
            root.removeHandler(handler)
            handler.close()
    if output == "auto":
        output = "live" if sys.stderr.isatty() else "plain"
    console: logging.Handler
    if output == "live":
        _live = LiveConsoleHandler(Console(stderr=True, markup=False, emoji=False, highlight=False))
        console = _live
    else:
        _live = None
        console = logging.StreamHandler(sys.stderr)
    _signals_pass(console)
    console._migrate_console = True  # type: ignore[union-attr]  # a marker attribute: ours, found again by name
    console.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                *_console_processors(output),
                _redact_rendered,
            ],
        )
    )
    console.addFilter(_NotDefects())
    console.addFilter(ConsoleFilter(None if output == "live" else PLAIN_EVERY))
    console.setLevel(logging.WARNING if quiet else (logging.DEBUG if verbose else logging.INFO))
    root.addHandler(console)
    root.setLevel(logging.DEBUG)
    for noisy in ("asyncssh", "httpx", "httpcore", "cloudflare"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _printable_values(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """What a record carries from outside (a hook's output, a host's error) reaches a terminal with its control
    characters escaped: the console renderer adds its own colours afterwards."""
    return {key: printable(value) if isinstance(value, str) else value for key, value in event_dict.items()}


def _console_processors(output: str) -> list[Any]:
    if output == "json":
        return [
            structlog.processors.ExceptionRenderer(structlog.tracebacks.ExceptionDictTransformer(show_locals=False)),
            structlog.processors.JSONRenderer(default=str),
        ]
    return [
        _drop_keys("run_id"),
        _short_time,
        *([] if output == "live" else [flatten_progress]),
        _printable_values,
        structlog.dev.ConsoleRenderer(
            colors=output == "live",
            pad_event_to=30,
            sort_keys=False,
            # Frame locals may hold a password (a connection's arguments): never render them.
            exception_formatter=structlog.dev.plain_traceback,
        ),
    ]


@contextmanager
def live_phase(source: PhaseSource | None) -> Iterator[None]:
    """While a run goes on: on a terminal, the live area (bars and the phase line from `source`) stays drawn."""
    live = _live
    if live is None:
        yield
        return
    live.start(source)
    try:
        yield
    finally:
        live.stop()


def log_to_file(path: Path) -> None:
    """Add (or move) the JSON-lines log of the current run."""
    global _configured_file
    root = logging.getLogger()
    if _configured_file is not None:
        root.removeHandler(_configured_file)
        _configured_file.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    _signals_pass(handler)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_shared_processors(),
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.ExceptionRenderer(
                    structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
                ),
                structlog.processors.JSONRenderer(default=str),
                _redact_rendered,
            ],
        )
    )
    handler.setLevel(logging.DEBUG)
    handler.addFilter(ThinProgress(FILE_EVERY))
    root.addHandler(handler)
    _configured_file = handler


@contextmanager
def live_paused() -> Iterator[None]:
    """The live area taken off the terminal meanwhile (a question to the operator), then drawn again."""
    live = _live
    if live is None or not live.running:
        yield
        return
    source = live.phase_source
    live.stop()
    try:
        yield
    finally:
        live.start(source)


def _drop_keys(*keys: str) -> Any:
    def processor(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        for key in keys:
            event_dict.pop(key, None)
        return event_dict

    return processor


def _short_time(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    # The console shows the wall-clock time of day; the JSON file keeps the full UTC timestamp.
    stamp = event_dict.pop("timestamp", None)
    if isinstance(stamp, str) and "T" in stamp:
        event_dict["timestamp"] = time.strftime("%H:%M:%S")
    return event_dict


def get_logger(**context: Any) -> Any:
    return structlog.get_logger("migrate").bind(**context)


DEFECT_LOGGER = "migrate.defect"


class _NotDefects(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != DEFECT_LOGGER


def record_defect(exc: BaseException) -> None:
    """A defect's traceback goes to the run's log only (no frame locals); the console gets one line from the caller.

    Through the standard library logger: with no run log open yet it goes nowhere (never to stdout or stderr)."""
    logger = logging.getLogger(DEFECT_LOGGER)
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())  # no "last resort" printing of the traceback on stderr
    logger.error("internal error", exc_info=exc)
