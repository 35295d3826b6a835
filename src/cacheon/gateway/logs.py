"""The gateway's logs through ``logging``: one line per record, as text or as JSON.

Structured fields ride on a record as ``extra={"fields": {...}}``; the text format appends them
as ``key=value``, the JSON format puts them beside ``ts``, ``level``, ``logger`` and ``message``.
Loggers: ``cacheon.access`` (one line per request), ``cacheon.gateway`` (workers, start-up),
``cacheon.kv`` (gaps, replays, resyncs).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import logging
import sys
import threading
import time
from typing import Any, Literal

import msgspec

LogFormat = Literal["text", "json"]
LEVELS = ("debug", "info", "warning", "error")
FLUSH_S = 0.2  # the longest an INFO line waits in the buffer
_json = msgspec.json.Encoder(enc_hook=str)
_QUOTED = frozenset(' ="\n')
# Every logger that writes from inside the gateway: its own, and aiohttp's and asyncio's (their
# tracebacks, e.g. a request the HTTP parser refused, go through the same formatter as the rest).
ROUTED = ("cacheon", "aiohttp", "asyncio")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, dict) else {}


def _text_value(value: Any) -> str:
    if isinstance(value, str):
        return value if value and _QUOTED.isdisjoint(value) else _json.encode(value).decode()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return _json.encode(value).decode()


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
        return _json.encode(out).decode()


class _Buffered(logging.StreamHandler[Any]):
    """Lines into a block buffer, written every FLUSH_S (and at once from WARNING up, and at exit).

    A write per request was measured at ~0.09 ms of the proxy's added latency on the 2-core VM
    (benchmarks/gateway_proxy.py); buffered, the access log costs its formatting only.
    """

    def __init__(self) -> None:
        raw = getattr(sys.stderr, "buffer", None)
        self._wrapper = None if raw is None else io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
        super().__init__(self._wrapper or sys.stderr)
        self._stopped = threading.Event()
        threading.Thread(target=self._flusher, daemon=True, name="log-flush").start()

    def flush(self) -> None:  # StreamHandler calls this after every record: only WARNING and up go out now
        pass

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        if record.levelno >= logging.WARNING:
            self.write_out()

    def write_out(self) -> None:
        self.acquire()
        try:
            with contextlib.suppress(ValueError, OSError):  # stderr closed under us: nothing to write to
                self.stream.flush()
        finally:
            self.release()

    def _flusher(self) -> None:
        while not self._stopped.wait(FLUSH_S):
            self.write_out()

    def close(self) -> None:
        self._stopped.set()
        self.write_out()
        if self._wrapper is not None:  # leave stderr itself open (a collected wrapper would close it)
            with contextlib.suppress(ValueError):
                self._wrapper.detach()
        super().close()


_handler: _Buffered | None = None


def configure(level: str = "info", fmt: LogFormat = "text") -> None:
    """Send the records of every logger in ``ROUTED`` at ``level`` and above to stderr in ``fmt``."""
    global _handler
    stop()
    # The logging HOWTO's optimisations: no caller lookup (a stack walk per record), no thread,
    # process or multiprocessing names; the access line carries what it needs in its fields.
    logging._srcfile = None  # the documented switch for findCaller
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    _handler = _Buffered()
    _handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    for name in ROUTED:
        logger = logging.getLogger(name)
        logger.handlers[:] = [_handler]
        logger.setLevel(level.upper())
        logger.propagate = False


@atexit.register
def stop() -> None:
    """Write out what is buffered (at exit, or before configuring again)."""
    global _handler
    if _handler is not None:
        _handler.close()
        _handler = None
