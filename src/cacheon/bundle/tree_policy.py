"""Tree admission policy: what may sit in a bundle directory.

A bundle is reviewable text that the manifest vouches for. Binaries and precompiled kernels
cannot be reviewed or scanned, undeclared files are not what the manifest (and so the digest
a reviewer signs off) describes, and symlinks mean different things on different hosts. The walk
never follows a link and never opens anything but regular files; it hands the Python sources on
to the AST policy.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from cacheon.bundle.paths import BYTECODE_DIRS, is_bytecode
from cacheon.errors import UsageError

TreeHit = tuple[str, str, str]  # (relative path, rule, message)

MAX_FILE_BYTES = 1 << 20
PYTHON_SUFFIXES = frozenset({".py", ".pyw"})
PRECOMPILED_SUFFIXES = frozenset({".cubin", ".fatbin", ".hsaco", ".ptx"})
BINARY_SUFFIXES = frozenset({
    ".a", ".bin", ".dll", ".dylib", ".egg", ".exe", ".npy", ".npz", ".o", ".pickle", ".pkl", ".pt",
    ".pth", ".pyd", ".safetensors", ".so", ".whl", ".zip",
})  # fmt: skip
# Undeclared files that are allowed: the usual metadata at the bundle root, as text.
_METADATA = re.compile(r"(readme|licen[cs]e|notice|changelog)([-_][a-z0-9]+)?(\.(md|rst|txt))?", re.I)

RULES: dict[str, str] = {
    "symlink": "a symbolic link (never followed)",
    "special-file": "a FIFO, socket or device node",
    "bad-filename": "a file name that is not printable text or holds a backslash",
    "undeclared-file": "a file the manifest does not declare (root README/LICENSE/NOTICE/CHANGELOG excepted)",
    "missing-file": "a declared file that is not a regular file in the bundle",
    "binary-file": "binary content (NUL bytes, not UTF-8) or a binary extension (.so, .pt, .pkl, .npy, ...)",
    "precompiled-artifact": "a precompiled GPU kernel (.ptx, .cubin, .fatbin, .hsaco): not reviewable source",
    "oversized-file": f"a file over {MAX_FILE_BYTES} bytes",
    "bytecode": "compiled Python (a __pycache__ directory, *.pyc, *.pyo): not reviewable, and it could run "
    "instead of the scanned source",
}


@dataclass
class TreeScan:
    """What the walk found: tree findings, the Python sources to parse, and how many files it read."""

    hits: list[TreeHit] = field(default_factory=list)
    sources: list[tuple[str, bytes]] = field(default_factory=list)
    files: int = 0


def scan_tree(root: str | os.PathLike[str], declared: Iterable[str]) -> TreeScan:
    """Walk ``root`` (without following links) and apply the tree policy to every entry.

    Bytecode (``__pycache__``, ``*.pyc``) is a finding, never skipped. Unreadable directories or
    files are unusable input (:class:`UsageError`), not findings.
    """
    wanted = {PurePosixPath(p).as_posix() for p in declared}
    seen: set[str] = set()
    out = TreeScan()
    stack = [(os.fspath(root), "")]
    while stack:
        directory, prefix = stack.pop()
        for entry in _entries(directory, prefix):
            rel = prefix + entry.name
            if not entry.name.isprintable() or "\\" in entry.name:
                out.hits.append((ascii(rel)[1:-1], "bad-filename", "name is not printable; not inspected"))
            elif entry.is_symlink():
                out.hits.append((rel, "symlink", "symbolic link; not followed"))
            elif entry.is_dir(follow_symlinks=False):
                if entry.name in BYTECODE_DIRS:
                    out.hits.append((rel, "bytecode", "a bytecode cache directory; remove it (not inspected)"))
                else:
                    stack.append((entry.path, rel + "/"))
            elif not entry.is_file(follow_symlinks=False):
                out.hits.append((rel, "special-file", "not a regular file or directory"))
            elif is_bytecode(PurePosixPath(rel)):
                out.hits.append((rel, "bytecode", "compiled Python; ship the source only"))
            else:
                seen.add(rel)
                out.files += 1
                _check_file(entry.path, rel, rel in wanted, out)
    out.hits.extend((rel, "missing-file", "declared but not a regular file") for rel in sorted(wanted - seen))
    return out


def _entries(directory: str, prefix: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise UsageError(f"cannot read bundle directory {prefix or '.'}: {exc.strerror}") from None


def _check_file(path: str, rel: str, declared: bool, out: TreeScan) -> None:
    name = PurePosixPath(rel).name
    suffix = PurePosixPath(name).suffix.lower()
    if not declared and ("/" in rel or not _METADATA.fullmatch(name)):
        out.hits.append((rel, "undeclared-file", "not declared by the manifest"))
    if suffix in PRECOMPILED_SUFFIXES:
        out.hits.append((rel, "precompiled-artifact", f"{suffix} is a precompiled kernel, not source"))
        return
    if suffix in BINARY_SUFFIXES:
        out.hits.append((rel, "binary-file", f"{suffix} files are binaries"))
        return
    data = _read(path, rel)
    if len(data) > MAX_FILE_BYTES:
        out.hits.append((rel, "oversized-file", f"larger than {MAX_FILE_BYTES} bytes; not inspected"))
    elif b"\0" in data or not _is_utf8(data):
        out.hits.append((rel, "binary-file", "content is not UTF-8 text"))
    elif suffix in PYTHON_SUFFIXES:
        out.sources.append((rel, data))


def _read(path: str, rel: str) -> bytes:
    """At most one byte past the size limit; O_NOFOLLOW so a swapped-in link is refused, not read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            return fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read bundle file {rel}: {exc.strerror}") from None


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
