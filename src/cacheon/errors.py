"""Errors that mean "the user gave us something unusable" (exit 1, no traceback)."""


class CacheonError(Exception):
    """A user-facing error: the CLI prints the message and exits with ``exit_code``."""

    exit_code = 1


class UsageError(CacheonError):
    """Bad input: a missing file, a malformed manifest, an unknown name."""
