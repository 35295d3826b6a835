"""Bundle content digest: what exactly was verified, independent of where it sits on disk."""

from __future__ import annotations

import hashlib
from pathlib import Path

from cacheon.bundle.paths import walk_files
from cacheon.errors import UsageError

BUNDLE_DOMAIN = b"cacheon.bundle.v1\x00"


def bundle_digest(bundle_dir: Path) -> str:
    """sha256 over the domain, then for each file in sorted relative-path order: len(path) path
    len(bytes) bytes (lengths as 8-byte big-endian). Every file counts, bytecode included (which the
    scan refuses): the digest names exactly what is there. Symlinks are refused: their meaning
    depends on the host."""
    root = Path(bundle_dir)
    h = hashlib.sha256(BUNDLE_DOMAIN)
    for rel in walk_files(root):
        path = root / rel
        if path.is_symlink():
            raise UsageError(f"{root}: {rel} is a symlink; bundles may not contain links")
        name = rel.as_posix().encode("utf-8")
        data = path.read_bytes()
        h.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big") + data)
    return "sha256:" + h.hexdigest()
