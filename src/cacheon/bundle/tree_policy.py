"""Tree admission policy: what may sit in a bundle directory.

A bundle is reviewable text that the manifest vouches for. Binaries and precompiled kernels
cannot be reviewed or scanned, undeclared files are not what the manifest (and so the digest
a reviewer signs off) describes, and symlinks mean different things on different hosts. The
policy reads nothing itself: it judges a :class:`~cacheon.bundle.snapshot.Snapshot` (read once,
never following a link, opening nothing but regular files) and hands its Python sources on to
the AST policy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from cacheon.bundle.paths import BYTECODE_DIRS, is_bytecode
from cacheon.bundle.snapshot import LIMITS, Snapshot

TreeHit = tuple[str, str, str]  # (relative path, rule, message)

MAX_FILE_BYTES = LIMITS.max_file_bytes
#: refusals of what is a regular file, only one the snapshot would not read
REGULAR_REFUSALS = frozenset({"oversized-file", "hardlink"})
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
    "special-file": "a FIFO, socket or device node (never opened)",
    "mount-point": "a directory or file on another filesystem than the bundle's root (a mount; never entered or read)",
    "hardlink": "a regular file with more than one hard link (another name, maybe outside the bundle, shares it)",
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


def scan_tree(snapshot: Snapshot, declared: Iterable[str]) -> TreeScan:
    """Apply the tree policy to every entry of ``snapshot``: its refusals (links, special files,
    hard links, oversized files, names that are not text) are findings, and so is bytecode (a
    ``__pycache__`` directory once, its contents not inspected; a ``*.pyc`` anywhere else)."""
    wanted = {PurePosixPath(p).as_posix() for p in declared}
    out = TreeScan()
    out.hits.extend(snapshot.refused)
    caches: list[str] = []
    for directory in snapshot.directories:  # walk order: a directory comes before what is inside it
        if PurePosixPath(directory).name in BYTECODE_DIRS and not _below(directory, caches):
            caches.append(directory)
            out.hits.append((directory, "bytecode", "a bytecode cache directory; remove it (not inspected)"))
    # a refused regular file (too big, hard-linked) was still there: counted, and not "missing"
    seen = {rel for rel, rule, _ in snapshot.refused if rule in REGULAR_REFUSALS}
    out.files = len(seen)
    for rel in sorted(snapshot.files):
        if _below(rel, caches):
            continue
        if is_bytecode(PurePosixPath(rel)):
            out.hits.append((rel, "bytecode", "compiled Python; ship the source only"))
            continue
        seen.add(rel)
        out.files += 1
        _check_file(snapshot.files[rel], rel, rel in wanted, out)
    out.hits.extend((rel, "missing-file", "declared but not a regular file") for rel in sorted(wanted - seen))
    return out


def _below(rel: str, directories: Iterable[str]) -> bool:
    return any(rel.startswith(d + "/") for d in directories)


def _check_file(data: bytes, rel: str, declared: bool, out: TreeScan) -> None:
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
    if b"\0" in data or not _is_utf8(data):
        out.hits.append((rel, "binary-file", "content is not UTF-8 text"))
    elif suffix in PYTHON_SUFFIXES:
        out.sources.append((rel, data))


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
