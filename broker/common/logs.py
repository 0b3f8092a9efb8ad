"""structlog set-up for a broker process: every event carries the broker id."""

from __future__ import annotations

import logging
import sys

import structlog


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
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    return structlog.get_logger("minibroker").bind(broker_id=broker_id)
