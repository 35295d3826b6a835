"""Bundle-relative paths: the one place that decides what may name a file inside a bundle."""

from __future__ import annotations

from pathlib import PurePosixPath

from cacheon.errors import UsageError

#: bytecode: not reviewable, and what Python would run instead of the scanned source. A bundle
#: holding any is refused by the scan, by packaging and by archive extraction (never skipped).
BYTECODE_DIRS = frozenset({"__pycache__"})
BYTECODE_SUFFIXES = (".pyc", ".pyo")


def is_bytecode(rel: PurePosixPath) -> bool:
    return any(part in BYTECODE_DIRS for part in rel.parts) or rel.name.endswith(BYTECODE_SUFFIXES)


def check_relative(text: str, where: str) -> PurePosixPath:
    """Reject absolute paths, ``..``, backslashes and empty parts; return the normalised path."""
    if not text or "\\" in text or "\x00" in text:
        raise UsageError(f"{where}: {text!r} is not a bundle-relative POSIX path")
    rel = PurePosixPath(text)
    if rel.is_absolute():
        raise UsageError(f"{where}: {text!r} is absolute; paths must stay inside the bundle")
    if ".." in rel.parts:
        raise UsageError(f"{where}: {text!r} escapes the bundle ('..' is not allowed)")
    if not rel.parts:
        raise UsageError(f"{where}: {text!r} names no file")
    return rel
