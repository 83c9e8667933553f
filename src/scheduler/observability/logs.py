"""The process's log format: ``text`` (the default) or ``json`` (``SCHEDULER_LOG_FORMAT``).

``json`` writes one JSON object a line, with stable fields a collector can index:
``time`` (UTC, ISO 8601, milliseconds), ``level``, ``logger``, ``message``, and where they
exist ``event_id`` (the scheduled event being dispatched, or an ``extra={"event_id": ...}``),
``replica`` (the heartbeat id of the service whose code logs), ``trace_id`` and ``span_id`` (the current span,
when tracing is on), ``exception`` (the formatted traceback, still one line).

Both formats redact secrets from everything they write: the password of a connection string
(URL or libpq keywords), bearer tokens, JSON Web Tokens, and ``password=`` / ``token=`` /
``secret=`` / ``api_key=`` values. Logging a secret stays a bug; this is the net under it.
Standard library only; OpenTelemetry is consulted only if something already imported it.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

from scheduler.observability.observer import current_event_id, current_replica

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MASK = "***"

_REDACTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host (SQLAlchemy and libpq URLs, AMQP, Redis, HTTP basic auth)
    (re.compile(r"(?P<lead>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@?#]*):[^\s@/?#]*@"), rf"\g<lead>:{MASK}@"),
    # Authorization: Bearer <token> (and Basic)
    (re.compile(r"(?i)\b(?P<lead>(?:bearer|basic)\s+)[A-Za-z0-9\-._~+/]+=*"), rf"\g<lead>{MASK}"),
    # a JSON Web Token anywhere (three base64url parts, the first a JSON header)
    (re.compile(r"\beyJ[A-Za-z0-9_\-]*\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*"), MASK),
    # key=value and key: value (libpq conninfo, query strings, settings dumps)
    (re.compile(r"(?i)(?P<lead>\b[\w\-]*(?:password|passwd|pwd|secret|token|api[_\-]?key)[\"']?\s*[=:]\s*)"
                r"(?:'[^']*'|\"[^\"]*\"|[^\s&,;'\"}]+)"), rf"\g<lead>{MASK}"),
)


def redact(text: str) -> str:
    """``text`` with every secret it seems to hold replaced by ``***``."""
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFormatter(logging.Formatter):
    """The text format, with secrets redacted."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object a line (see the module docstring for the fields)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        event_id = getattr(record, "event_id", None) or current_event_id.get()
        if event_id:
            entry["event_id"] = str(event_id)
        replica = getattr(record, "replica", None) or current_replica.get()
        if replica:
            entry["replica"] = str(replica)
        entry.update(_trace_fields())
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack"] = redact(self.formatStack(record.stack_info))
        # ensure_ascii: one line whatever the message holds (a newline is \n in JSON)
        return json.dumps(entry, default=str)


def _trace_fields() -> dict[str, str]:
    """The current span's ids, if tracing has imported OpenTelemetry (never imported here)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return {}
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``log_format`` (``text`` or ``json``)."""
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return RedactingFormatter(TEXT_FORMAT)
    raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")


def configure_logging(level: int, log_format: str = "text") -> None:
    """The root logger writes to stderr in ``log_format`` at ``level``. Like ``basicConfig``
    (which it calls), it leaves a root logger that already has handlers alone (an embedding
    application's, pytest's)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=level, handlers=[handler])
