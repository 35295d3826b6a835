"""Where a command writes: never over something that exists unless told, never into a directory that is not there.

A mistyped ``--out`` that silently creates ``dist/relase/`` or replaces yesterday's archive loses work;
both are refused in one line before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from cacheon.errors import UsageError


def existing_parent(path: Path, option: str = "--out") -> Path:
    """``path``'s directory, which must exist: a missing one is a typo more often than a wish."""
    if not path.parent.is_dir():
        raise UsageError(f"{option} {path}: directory {path.parent} does not exist (create it first)")
    return path.parent


def new_path(path: Path, *, force: bool = False, option: str = "--out") -> Path:
    """``path`` may be written: its directory exists, and it does not (or ``force``, and it is a file)."""
    existing_parent(path, option)
    if path.is_dir():
        raise UsageError(f"{option} {path} is a directory")
    if path.exists() and not force:
        raise UsageError(f"{option} {path} exists; add --force to replace it")
    return path


@contextlib.contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; renamed onto ``path`` only when the block succeeds, so
    an interrupted or failed write leaves what was there before (or nothing)."""
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
        temporary.chmod(0o644)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
