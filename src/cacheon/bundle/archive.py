"""Deterministic bundle archives and their safe extraction.

``write_archive`` produces byte-identical ``.tar.gz`` files for identical content (sorted members,
zeroed times and owners, fixed modes, no gzip name/mtime). ``extract_archive`` trusts nothing in
the archive: it enforces member/size limits, accepts only regular files and directories, and writes
each file itself below the destination (never ``tarfile.extractall``).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cacheon.bundle.digest import bundle_digest
from cacheon.bundle.manifest import load_manifest
from cacheon.bundle.paths import check_relative, is_cache, walk_files
from cacheon.errors import UsageError

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")


@dataclass(frozen=True)
class ArchiveLimits:
    max_members: int = 512
    max_file_bytes: int = 8 * 1024 * 1024
    max_total_bytes: int = 32 * 1024 * 1024


def write_archive(bundle_dir: Path, out: Path) -> str:
    """Write ``out`` from a valid bundle and return the bundle content digest."""
    root = Path(bundle_dir)
    load_manifest(root)
    digest = bundle_digest(root)  # refuses symlinks
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for rel in walk_files(root):
            data = (root / rel).read_bytes()
            info = tarfile.TarInfo(rel.as_posix())
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        gz.write(buf.getvalue())
    return digest


def extract_archive(archive: Path, dest: Path, limits: ArchiveLimits = ArchiveLimits()) -> None:
    """Extract into the (empty) ``dest`` directory under ``limits``; raise UsageError on anything odd."""
    dest = Path(dest).resolve()
    total = members = 0
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            for info in tar:
                members += 1
                if members > limits.max_members:
                    raise UsageError(f"{archive}: more than {limits.max_members} members")
                rel = check_relative(info.name.rstrip("/"), f"{archive}: member")
                if info.isdir() or is_cache(rel):
                    continue  # caches are not content: never unpacked, so never loaded
                if not info.isreg():
                    raise UsageError(f"{archive}: member {info.name!r} is a link or special file; refused")
                if info.size > limits.max_file_bytes:
                    limit = limits.max_file_bytes
                    raise UsageError(f"{archive}: member {info.name!r} is {info.size} bytes (limit {limit})")
                total += info.size
                if total > limits.max_total_bytes:
                    raise UsageError(f"{archive}: content exceeds {limits.max_total_bytes} bytes")
                target = (dest / rel).resolve()
                if dest not in target.parents:
                    raise UsageError(f"{archive}: member {info.name!r} would land outside the bundle")
                source = tar.extractfile(info)
                assert source is not None  # a regular member always has a file object
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("xb") as fh:
                    fh.write(source.read(limits.max_file_bytes + 1)[: info.size])
    except FileExistsError as exc:
        raise UsageError(f"{archive}: duplicate member {exc.filename}") from None
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UsageError(f"{archive}: not a readable .tar.gz bundle archive ({exc})") from None


@contextlib.contextmanager
def open_bundle(path: Path) -> Iterator[Path]:
    """Yield a bundle directory for ``path``: the directory itself, or a private extraction of an archive."""
    path = Path(path)
    if path.is_dir():
        yield path
        return
    if not path.exists():
        raise UsageError(f"{path} does not exist")
    if not path.name.endswith(ARCHIVE_SUFFIXES):
        raise UsageError(f"{path} is neither a bundle directory nor a .tar.gz/.tgz archive")
    with tempfile.TemporaryDirectory(prefix="cacheon-bundle-") as tmp:
        extract_archive(path, Path(tmp))
        yield Path(tmp)
