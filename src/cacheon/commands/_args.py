"""Argument types and help shared by every command, so a bad value is refused the same way everywhere.

A negative timeout, a zero count or port 70000 is a usage error (exit 1, before anything runs),
never a verdict: ``type=positive_float`` makes argparse refuse it with the parser's usage line.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

MAX_PORT = 65535


def _number(parse: Callable[[str], float], kind: str, text: str) -> float:
    try:
        return parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None


def positive_int(text: str) -> int:
    """A count, a size or a rank count: 1 or more."""
    value = int(_number(int, "a whole number", text))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """A count where 0 means "none" or "no limit" (the option's help says which)."""
    value = int(_number(int, "a whole number", text))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_float(text: str) -> float:
    """A timeout or an interval in seconds: more than 0 (and finite)."""
    value = _number(float, "a number", text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A delay where 0 means none."""
    value = _number(float, "a number", text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of 0 or more, got {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port to bind or dial: 1 to 65535."""
    value = int(_number(int, "a port number", text))
    if not 1 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"must be a TCP port from 1 to {MAX_PORT}, got {value}")
    return value


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the text already says it or there is none to show
    (a flag, an option whose absence means something its help explains)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        nothing = default is None or isinstance(default, bool) or default is argparse.SUPPRESS or default in ([], ())
        if action.option_strings and not nothing and "default" not in text.lower():
            text += " (default: %(default)s)"
        return text
