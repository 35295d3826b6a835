"""Text that came from the candidate's process: made safe to show before it is ever printed.

Exception messages, tracebacks and captured output are the candidate's words. Control characters
(terminal escapes, carriage returns, bidi overrides) are escaped so a candidate cannot repaint the
verifier's report, and reasons are cut to one line.
"""

from __future__ import annotations

import unicodedata

MAX_REASON = 400


def escape_controls(text: str, keep_newlines: bool = False) -> str:
    """Every control or format character as a visible escape (``\\x1b``, ``\\u202e``)."""
    out = []
    for ch in text:
        if ch == "\n" and keep_newlines:
            out.append(ch)
        elif ch == "\t":
            out.append("    ")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def last_line(text: str) -> str:
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


def one_line(text: str) -> str:
    """The last non-empty line, escaped and bounded: what a report's reason may quote."""
    line = escape_controls(last_line(text))
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 1] + "…"


def describe(exc: BaseException) -> str:
    """``Type: message`` for any exception, even one whose ``__str__`` itself raises."""
    name = type(exc).__name__
    try:
        message = str(exc)
    except BaseException:  # the candidate's own __str__ can do anything
        message = "(its message could not be read)"
    return f"{name}: {message}" if message else name
