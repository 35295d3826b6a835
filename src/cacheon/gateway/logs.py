"""The gateway's logs through ``logging``: one line per record, as text or as JSON.

Structured fields ride on a record as ``extra={"fields": {...}}``; the text format appends them
as ``key=value``, the JSON format puts them beside ``ts``, ``level``, ``logger`` and ``message``.
Loggers: ``cacheon.access`` (one line per request), ``cacheon.gateway`` (workers, start-up),
``cacheon.kv`` (gaps, replays, resyncs).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Literal

LogFormat = Literal["text", "json"]
LEVELS = ("debug", "info", "warning", "error")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, dict) else {}


def _text_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return json.dumps(text) if not text or any(c in text for c in ' ="') else text


class TextFormatter(logging.Formatter):
    """``2026-12-01T10:00:00.123Z INFO cacheon.access message key=value ...``"""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"{stamp}.{int(record.msecs):03d}Z {record.levelname} {record.name} {record.getMessage()}"
        extra = " ".join(f"{k}={_text_value(v)}" for k, v in _fields(record).items() if v is not None)
        if extra:
            line += " " + extra
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (Unix seconds), ``level``, ``logger``, ``message``, the fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": round(record.created, 6), "level": record.levelname.lower(),
                               "logger": record.name, "message": record.getMessage()}
        out.update(_fields(record))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, separators=(",", ":"), default=str)


def configure(level: str = "info", fmt: LogFormat = "text") -> None:
    """Send every ``cacheon`` logger's records at ``level`` and above to stderr in ``fmt``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("cacheon")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
