"""Text that came from the candidate's process: bounded and made safe to show before it is ever printed.

Exception messages, tracebacks, captured output and every string of every message are the
candidate's words. Every character that is not plainly visible (terminal escapes, carriage
returns, bidi overrides, unassigned and private-use code points) is escaped so a candidate cannot
repaint the verifier's report or terminal, texts are bounded, and reasons are cut to one line.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from cacheon.printable import escape_controls
from cacheon.verify.messages import TEXT_CHARS

MAX_REASON = 400
T = TypeVar("T")


def bounded(text: str, limit: int = TEXT_CHARS) -> str:
    """At most ``limit`` characters: the head and the tail, the middle cut (the type of an
    exception is at the start of its text, a traceback's last line at the end)."""
    if len(text) <= limit:
        return text
    half = (limit - 1) // 2
    return text[:half] + "…" + text[len(text) - (limit - 1 - half):]


def escaped(value: T) -> T:
    """A message from the child with every string in it (map keys too) escaped; bytes untouched.
    Applied to each message as it is decoded, so no text of the child's reaches the parent raw."""
    result: object = value
    if isinstance(value, str):
        result = escape_controls(value, keep_newlines=True)
    elif isinstance(value, msgspec.Struct):
        result = msgspec.structs.replace(value, **{f: escaped(getattr(value, f)) for f in value.__struct_fields__})
    elif isinstance(value, list):
        result = [escaped(v) for v in value]
    elif isinstance(value, dict):
        result = {escaped(k): escaped(v) for k, v in value.items()}
    return result  # type: ignore[return-value]  # the same type in, the same type out


def last_line(text: str) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


def one_line(text: str) -> str:
    """The last non-empty line, escaped and bounded: what a report's reason may quote."""
    line = escape_controls(last_line(text))
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 1] + "…"


def describe(exc: BaseException) -> str:
    """``Type: message`` for any exception, even one whose ``__str__`` itself raises; bounded to
    what a message's text field may carry."""
    name = type(exc).__name__
    try:
        message = str(exc)
    except BaseException:  # the candidate's own __str__ can do anything
        message = "(its message could not be read)"
    return bounded(f"{name}: {message}" if message else name)
