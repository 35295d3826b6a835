"""Bundle content digest: what exactly was verified, independent of where it sits on disk.

The canonical bytes are defined by :func:`cacheon.bundle.snapshot.digest_files`; this is the
by-path convenience for code that has no snapshot in hand (tests, tools).
"""

from __future__ import annotations

from pathlib import Path

from cacheon.bundle.snapshot import read_snapshot


def bundle_digest(bundle_dir: Path) -> str:
    """The digest of the bundle at ``bundle_dir``, read once; UsageError when any entry is refused
    (a link, a special file, a hard link, an oversized file, a name that is not text)."""
    return read_snapshot(bundle_dir).require_digest()
