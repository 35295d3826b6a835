"""Bundle-relative paths: the one place that decides what may name a file inside a bundle."""

from __future__ import annotations

import stat
from pathlib import Path, PurePosixPath

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


def resolve_file(root: Path, rel: PurePosixPath, where: str) -> Path:
    """The regular file at ``root/rel``; no component may be a symlink (symlinks escape bundles)."""
    current = root
    for part in rel.parts:
        current = current / part
        try:
            mode = current.lstat().st_mode
        except FileNotFoundError:
            raise UsageError(f"{where}: {rel} does not exist in bundle {root}") from None
        if stat.S_ISLNK(mode):
            raise UsageError(f"{where}: {rel} goes through a symlink ({current.relative_to(root)})")
    if not stat.S_ISREG(current.lstat().st_mode):
        raise UsageError(f"{where}: {rel} is not a regular file")
    return current


def walk_files(root: Path) -> list[PurePosixPath]:
    """Every entry below ``root`` but directories, as sorted relative paths, symlinks included (not followed)."""
    found: list[PurePosixPath] = []
    for path in sorted(root.rglob("*")):
        rel = PurePosixPath(path.relative_to(root).as_posix())
        if path.is_symlink() or not path.is_dir():
            found.append(rel)
    return found
