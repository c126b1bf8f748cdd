"""structlog set-up: one canonical line per decode step, plus a summary line.

Configured once per process by :func:`configure` (or for one block by
:func:`configured`). Lines go to stderr (JSON when stderr is not a TTY, the console
renderer when it is) at ``console_level`` and above, and every line, whatever its level,
to ``json_file`` when one is given. Tests read lines with
``structlog.testing.capture_logs()``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import uuid
from collections.abc import Iterator, MutableMapping
from typing import IO, Any

import structlog

_LEVELS = logging.getLevelNamesMapping()


class _JsonFileSink:
    """Processor that writes every event to a JSON-lines file, then passes it on."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        self.fh.write(json.dumps(dict(event), default=str) + "\n")
        self.fh.flush()
        return event


class _ConsoleFilter:
    def __init__(self, level: int) -> None:
        self.level = level

    def __call__(self, logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if _LEVELS.get(method.upper(), logging.INFO) < self.level:
            raise structlog.DropEvent
        return event


def configure(console_level: str = "warning", json_file: IO[str] | None = None) -> None:
    """Set the processors for the whole process (call once, from the entry point)."""
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if json_file is not None:
        processors.append(_JsonFileSink(json_file))
    processors.append(_ConsoleFilter(_LEVELS[console_level.upper()]))
    if sys.stderr.isatty():
        processors.append(structlog.dev.ConsoleRenderer())
    else:
        processors.append(structlog.processors.JSONRenderer())
    structlog.configure(
        processors=processors,
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


@contextlib.contextmanager
def configured(console_level: str = "warning", json_file: IO[str] | None = None) -> Iterator[None]:
    """:func:`configure` for the length of a block, then the previous set-up again.

    The CLI writes its JSON lines to a file that is closed (and renamed) when the run
    ends; a sink left configured after that would fail on the next log line.
    """
    previous = structlog.get_config() if structlog.is_configured() else None
    configure(console_level, json_file)
    try:
        yield
    finally:
        if previous is None:
            structlog.reset_defaults()
        else:
            structlog.configure(**previous)


def run_logger(**bound: Any) -> structlog.typing.FilteringBoundLogger:
    """A logger bound to a fresh ``run_id`` (and whatever else is given).

    If the application has not configured structlog, the default set-up here shows
    warnings and errors only, so a library user is not flooded with step lines.
    """
    if not structlog.is_configured():
        configure()
    return structlog.get_logger("flashspec").bind(run_id=uuid.uuid4().hex[:12], **bound)  # type: ignore[no-any-return]
