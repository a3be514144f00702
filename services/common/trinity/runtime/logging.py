"""Structured JSON logs: every service logs events (`log.info("weights.published", version=7)`)."""

from __future__ import annotations

import logging
import os
import sys

import structlog

_configured = False

REDACTED = "[redacted]"
_SECRET_KEYS = frozenset({"token", "auth_token", "authorization", "api_key", "password"})


class RedactSecrets:
    """Masks the configured bearer token wherever it appears in an event (message, fields, rendered traceback)
    and any field named like a credential: a token in a log is a token given to whoever reads the logs."""

    def __init__(self, secrets: list[str]) -> None:
        self._secrets = [s for s in secrets if s]

    def _scrub(self, value: object) -> object:
        if isinstance(value, str):
            for secret in self._secrets:
                value = value.replace(secret, REDACTED)
        return value

    def __call__(self, _logger: object, _method: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
        return {k: REDACTED if k.lower() in _SECRET_KEYS else self._scrub(v) for k, v in event.items()}


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
    redact = RedactSecrets([os.environ.get("TRINITY_AUTH_TOKEN", "")])
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, redact, structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(service=service)
    if not _configured:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                processors=[
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info,
                    redact,
                    structlog.processors.JSONRenderer(),
                ],
                foreign_pre_chain=shared,
            )
        )
        root = logging.getLogger()
        root.handlers[:] = [handler]
        root.setLevel(max(numeric, logging.INFO))
        _configured = True


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
