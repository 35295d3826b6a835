"""Errors that mean "the user gave us something unusable" (exit 1, no traceback)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class CacheonError(Exception):
    """A user-facing error: the CLI prints the message and exits with ``exit_code``."""

    exit_code = 1


class UsageError(CacheonError):
    """Bad input: a missing file, a malformed manifest, an unknown name."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'verify'?"`` for the closest of ``choices`` to a mistyped ``word``, else ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
