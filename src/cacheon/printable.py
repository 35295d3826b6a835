"""Text from an input an adversary may have written, made safe to print.

Every character that is not plainly visible (terminal escapes, carriage returns, bidi overrides,
unassigned and private-use code points) becomes a visible escape, so a value read from a file or a
process can never erase a line of the report it appears in, or draw one of its own. What is kept
is named, not what is refused. Shared by every layer that prints what it did not write.
"""

from __future__ import annotations

import unicodedata

_PLAIN = frozenset("LMNPS")  # the Unicode major categories of visible text


def escape_controls(text: str, keep_newlines: bool = False) -> str:
    """Every character that is not plain text as a visible escape (``\\x1b``, ``\\u202e``): plain is
    a letter, mark, number, punctuation, symbol or space separator, anything else (controls,
    format and bidi characters, surrogates, private-use and unassigned code points, line and
    paragraph separators) is escaped."""
    out = []
    for ch in text:
        if ch == "\n" and keep_newlines:
            out.append(ch)
        elif ch == "\t":
            out.append("    ")
        elif not _plain(ch):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def _plain(ch: str) -> bool:
    category = unicodedata.category(ch)
    return category[0] in _PLAIN or category == "Zs"
