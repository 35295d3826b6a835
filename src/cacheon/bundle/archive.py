"""Deterministic bundle archives and their safe extraction.

``write_archive`` produces byte-identical ``.tar.gz`` files for identical content (sorted members,
zeroed times and owners, fixed modes, no gzip name/mtime). ``extract_archive`` trusts nothing in
the archive: before ``tarfile`` reads a header, one streaming pass over the decompressed bytes
bounds every header (pax and GNU long-name extensions at 64 KiB), every member's size, the member
count and the decompressed total, so a header or gzip bomb is refused in a few MiB of memory.
Then it accepts only regular files and directories, refuses bytecode, and writes each file
itself below the destination (never ``tarfile.extractall``).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cacheon.bundle.manifest import load_manifest
from cacheon.bundle.paths import check_relative, is_bytecode
from cacheon.bundle.snapshot import Snapshot, read_snapshot
from cacheon.errors import UsageError

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")


BLOCK = 512
#: pax extended ('x', global 'g') and GNU long-name/long-link ('L', 'K') headers: data tarfile
#: reads whole into memory before it looks at the member, so each is bounded first
EXTENSION_TYPES = {b"x": "pax", b"g": "pax global", b"L": "GNU long-name", b"K": "GNU long-link"}
MEMBER_TYPES = {tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE}


@dataclass(frozen=True)
class ArchiveLimits:
    max_members: int = 512
    max_file_bytes: int = 8 * 1024 * 1024
    max_total_bytes: int = 32 * 1024 * 1024
    max_header_bytes: int = 64 * 1024
    #: decompressed bytes beyond the content: headers, extension headers and padding
    max_overhead_bytes: int = 8 * 1024 * 1024


def write_archive(bundle: Path | Snapshot, out: Path) -> str:
    """Write ``out`` from a valid bundle snapshot (a path is read into one first) and return its
    content digest: the archive holds exactly the bytes that were digested."""
    snapshot = bundle if isinstance(bundle, Snapshot) else read_snapshot(bundle)
    load_manifest(snapshot)
    digest = snapshot.require_digest()  # refuses links, special files, ...
    names = sorted(snapshot.files, key=lambda r: r.split("/"))
    bytecode = [rel for rel in names if is_bytecode(PurePosixPath(rel))]
    if bytecode:
        raise UsageError(f"{snapshot.root}: {bytecode[0]} is bytecode; remove every __pycache__/*.pyc before "
                         "packaging")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for rel in names:
            data = snapshot.files[rel]
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        gz.write(buf.getvalue())
    return digest


class _Stream:
    """The archive's decompressed bytes, read in bounded pieces and counted against a cap."""

    def __init__(self, raw: gzip.GzipFile, cap: int, archive: Path) -> None:
        self.raw, self.cap, self.archive, self.read_bytes = raw, cap, archive, 0

    def read(self, n: int) -> bytes:
        data = self.raw.read(n)
        self.read_bytes += len(data)
        if self.read_bytes > self.cap:
            raise UsageError(f"{self.archive}: decompresses to more than {self.cap} bytes; refused")
        return data

    def skip(self, n: int) -> None:
        while n > 0:
            got = len(self.read(min(n, 1 << 16)))
            if not got:
                raise UsageError(f"{self.archive}: truncated member data")
            n -= got


def _number(field: bytes, archive: Path) -> int:
    """A tar numeric field: octal text, or GNU base-256 (high bit of the first byte set)."""
    if field[:1] and field[0] & 0x80:
        if field[0] != 0x80:
            raise UsageError(f"{archive}: a negative or oversized size field; refused")
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise UsageError(f"{archive}: a header with an unreadable size field; refused") from None


def _pax_size(data: bytes) -> int | None:
    """The ``size`` record of a pax extended header, which overrides the next header's size field."""
    for record in data.split(b"\n"):
        _, _, pair = record.partition(b" ")
        key, sep, value = pair.partition(b"=")
        if sep and key == b"size":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def check_headers(archive: Path, limits: ArchiveLimits = ArchiveLimits()) -> None:
    """One streaming pass over the decompressed archive, before tarfile parses any of it: every
    header bounded, member types and sizes checked, the decompressed total capped."""
    cap = limits.max_total_bytes + limits.max_overhead_bytes
    headers = 0
    try:
        with gzip.open(archive, "rb") as raw:
            stream = _Stream(raw, cap, archive)
            next_size: int | None = None
            while True:
                block = stream.read(BLOCK)
                if len(block) < BLOCK or block == b"\0" * BLOCK:
                    return  # end of archive (or a short tail tarfile reports itself)
                headers += 1
                if headers > 3 * limits.max_members:
                    raise UsageError(f"{archive}: more than {3 * limits.max_members} headers; refused")
                kind, size = block[156:157], _number(block[124:136], archive)
                if next_size is not None:
                    size, next_size = next_size, None
                if kind in EXTENSION_TYPES:
                    if size > limits.max_header_bytes:
                        raise UsageError(f"{archive}: a {EXTENSION_TYPES[kind]} header of {size} bytes "
                                         f"(limit {limits.max_header_bytes}); refused")
                    data = stream.read(size)
                    stream.skip(-size % BLOCK)
                    if kind == b"x":
                        next_size = _pax_size(data)
                    continue
                if kind not in MEMBER_TYPES:
                    raise UsageError(f"{archive}: a member of type {kind!r} is a link or special file; refused")
                if size > limits.max_file_bytes:
                    raise UsageError(f"{archive}: a member of {size} bytes (limit {limits.max_file_bytes}); refused")
                stream.skip(size + (-size % BLOCK))
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise UsageError(f"{archive}: not a readable .tar.gz bundle archive ({exc})") from None


def extract_archive(archive: Path, dest: Path, limits: ArchiveLimits = ArchiveLimits()) -> None:
    """Extract into the (empty) ``dest`` directory under ``limits``; raise UsageError on anything odd."""
    dest = Path(dest).resolve()
    check_headers(archive, limits)
    total = members = 0
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            for info in tar:
                members += 1
                if members > limits.max_members:
                    raise UsageError(f"{archive}: more than {limits.max_members} members")
                rel = check_relative(info.name.rstrip("/"), f"{archive}: member")
                if is_bytecode(rel):
                    raise UsageError(f"{archive}: member {info.name!r} is bytecode; refused (ship sources only)")
                if info.isdir():
                    continue
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
