"""Structured JSON logs: every service logs events (`log.info("weights.published", version=7)`)."""

from __future__ import annotations

import logging
import os
import sys

import structlog

_configured = False


def configure_logging(service: str, level: str | None = None) -> None:
    """Route structlog and stdlib logging to one JSON-lines stream on stderr.

    Idempotent so that tests and the CLI can both call it.
    """
    global _configured
    level_name = (level or os.environ.get("TRINITY_LOG_LEVEL", "INFO")).upper()
    numeric = logging.getLevelNamesMapping().get(level_name, logging.INFO)
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(service=service)
    if not _configured:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            structlog.stdlib.ProcessorFormatter(processor=structlog.processors.JSONRenderer(), foreign_pre_chain=shared)
        )
        root = logging.getLogger()
        root.handlers[:] = [handler]
        root.setLevel(max(numeric, logging.INFO))
        _configured = True


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
