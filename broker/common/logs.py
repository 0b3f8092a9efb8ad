"""structlog set-up for a broker process: every event carries the broker id.

Events go to stderr (``cluster up`` points it at DATA_DIR/broker-N/broker.log). A log
on a full disk must not take the broker down with it: a line that cannot be written is
dropped and counted (``log_lines_dropped`` in the broker's stats), never raised into
the code that logged it.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog


class _TolerantStream:
    """stderr whose failed writes (ENOSPC, EIO) are counted, not raised."""

    dropped = 0

    def write(self, text: str) -> int:
        try:
            return sys.stderr.write(text)
        except OSError:
            _TolerantStream.dropped += 1
            return 0

    def flush(self) -> None:
        try:
            sys.stderr.flush()
        except OSError:
            _TolerantStream.dropped += 1


_TOLERANT_STDERR = _TolerantStream()


def log_lines_dropped() -> int:
    """Log lines lost to a failing log file since the process started."""
    return _TolerantStream.dropped


def write_fatal_line(line: str) -> None:
    """One line straight to the stderr descriptor, unbuffered: when the log file is on a
    full disk, whatever part of it the disk still takes is this line."""
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        _TolerantStream.dropped += 1


def configure_logging(
    broker_id: int, *, level: str = "info", fmt: str = "console"
) -> structlog.BoundLogger:
    renderer = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=_TOLERANT_STDERR),
        cache_logger_on_first_use=True,
    )
    return structlog.get_logger("minibroker").bind(broker_id=broker_id)
