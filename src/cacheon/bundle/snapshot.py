"""A bundle read once into memory: what is scanned, digested, run, recorded and armed.

Reading a directory by path more than once lets whoever can write it swap a file between the
reads (the scan sees one kernel, the sandbox runs another, the record names the first). So a
bundle is read exactly once, through directory file descriptors: every directory is opened with
``O_DIRECTORY | O_NOFOLLOW`` relative to its parent's descriptor and every file with
``O_NOFOLLOW | O_NONBLOCK``, each checked with ``fstat`` against the entry it was listed as. Only
regular files with one link are read, within a per-file, total, count and depth bound; anything
else is kept as a refusal (a scan finding) and never opened. Every later step works on the bytes
held here, never on the path again.

The root itself may not be a symlink: the bundle is the directory named, not wherever a link
points at the moment it is read (a link above the root, in the path the user typed, is theirs).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from cacheon.errors import UsageError

BUNDLE_DOMAIN = b"cacheon.bundle.v1\x00"
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK = 1 << 16

Refusal = tuple[str, str, str]  # (relative path, rule, message): a scan finding about one entry


@dataclass(frozen=True)
class SnapshotLimits:
    """Past ``max_file_bytes`` a file is a finding (not read); past the others the tree is unusable."""

    max_file_bytes: int = 1 << 20
    max_total_bytes: int = 32 << 20
    max_entries: int = 512
    max_depth: int = 16


LIMITS = SnapshotLimits()


def digest_files(files: Mapping[str, bytes]) -> str:
    """sha256 over the domain, then for each file in sorted relative-path order (path parts compared
    one by one): len(path) path len(bytes) bytes, lengths as 8-byte big-endian."""
    h = hashlib.sha256(BUNDLE_DOMAIN)
    for rel in sorted(files, key=lambda r: r.split("/")):
        name, data = rel.encode("utf-8"), files[rel]
        h.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big") + data)
    return "sha256:" + h.hexdigest()


@dataclass(frozen=True)
class Snapshot:
    """Every regular file of a bundle (relative POSIX path → bytes), the directories walked and what
    was refused. ``digest`` is None when anything was refused: the bytes would not be the whole tree."""

    root: str  # where it was read from: for messages only, never read again
    files: Mapping[str, bytes]
    directories: tuple[str, ...] = ()
    refused: tuple[Refusal, ...] = ()
    digest: str | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))
        object.__setattr__(self, "digest", None if self.refused else digest_files(self.files))

    def require_digest(self) -> str:
        if self.digest is None:
            rel, rule, message = self.refused[0]
            raise UsageError(f"{self.root}: {rel} is refused ({rule}: {message}); the bundle has no digest")
        return self.digest

    def check(self, expected: str) -> None:
        """Refuse bytes whose digest is not ``expected`` (recomputed: the mapping is never trusted)."""
        actual = digest_files(self.files) if not self.refused else None
        if actual != expected:
            raise UsageError(f"{self.root}: content digest {actual} is not the admitted {expected}; refused")

    def refusal(self, rel: str) -> Refusal | None:
        """The refusal of ``rel`` or of a directory above it (what a manifest path goes through)."""
        for hit in self.refused:
            if rel == hit[0] or rel.startswith(hit[0] + "/"):
                return hit
        return None


def read_snapshot(root: str | os.PathLike[str], limits: SnapshotLimits = LIMITS) -> Snapshot:
    """Read the bundle at ``root`` once; unusable input (not a directory, a symlinked root, an
    unreadable entry, a tree past the bounds, an entry that changed while read) is a UsageError."""
    where = os.path.normpath(os.fspath(root))  # "link/" or "link/." would make the kernel follow "link"
    try:
        fd = os.open(where, DIR_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(where):
            raise UsageError(f"{where} is a symlink; name the bundle directory itself "
                             f"({os.path.realpath(where)})") from None
        raise UsageError(f"{where} is not a bundle directory") from None
    walk = _Walk(where, limits, os.fstat(fd).st_dev)
    try:
        walk.directory(fd, "", 0)
    finally:
        os.close(fd)
    return Snapshot(where, walk.files, tuple(walk.directories), tuple(walk.refused))


@dataclass
class _Walk:
    root: str
    limits: SnapshotLimits
    device: int  # the root's filesystem: a mount inside the bundle is not the bundle
    files: dict[str, bytes] = field(default_factory=dict)
    directories: list[str] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    entries: int = 0
    total: int = 0

    def fail(self, rel: str, why: str) -> UsageError:
        return UsageError(f"{self.root}: {rel or '.'}: {why}")

    def directory(self, fd: int, prefix: str, depth: int) -> None:
        if depth > self.limits.max_depth:
            raise self.fail(prefix.rstrip("/"), f"nested deeper than {self.limits.max_depth} directories; refused")
        for name in _names(fd, self, prefix):
            rel = prefix + name
            self.entries += 1
            if self.entries > self.limits.max_entries:
                raise self.fail("", f"more than {self.limits.max_entries} entries; refused")
            if not name.isprintable() or "\\" in name:
                self.refused.append((ascii(rel)[1:-1], "bad-filename", "name is not printable; not inspected"))
                continue
            listed = _lstat(fd, name, self, rel)
            if stat.S_ISLNK(listed.st_mode):
                self.refused.append((rel, "symlink", "symbolic link; not followed"))
            elif listed.st_dev != self.device:
                self.refused.append((rel, "mount-point", "on another filesystem (a mount); not entered or read"))
            elif stat.S_ISDIR(listed.st_mode):
                child = _open(fd, name, DIR_FLAGS, listed, self, rel)
                try:
                    self.directories.append(rel)
                    self.directory(child, rel + "/", depth + 1)
                finally:
                    os.close(child)
            elif not stat.S_ISREG(listed.st_mode):
                self.refused.append((rel, "special-file", "not a regular file or directory; not opened"))
            elif listed.st_nlink != 1:
                self.refused.append((rel, "hardlink", f"{listed.st_nlink} hard links; not read"))
            elif listed.st_size > self.limits.max_file_bytes:
                self.refused.append((rel, "oversized-file", f"larger than {self.limits.max_file_bytes} bytes; "
                                     "not inspected"))
            else:
                self.file(fd, name, listed, rel)

    def file(self, fd: int, name: str, listed: os.stat_result, rel: str) -> None:
        child = _open(fd, name, FILE_FLAGS, listed, self, rel)
        try:
            data = b"".join(_chunks(child, self.limits.max_file_bytes + 1, self, rel))
            after = os.fstat(child)
        finally:
            os.close(child)
        if len(data) > self.limits.max_file_bytes:
            self.refused.append((rel, "oversized-file", f"larger than {self.limits.max_file_bytes} bytes; "
                                 "not inspected"))
            return
        if len(data) != after.st_size or after.st_mtime_ns != listed.st_mtime_ns or after.st_nlink != 1:
            raise self.fail(rel, "changed while it was read; refused (read the bundle when nothing writes it)")
        self.total += len(data)
        if self.total > self.limits.max_total_bytes:
            raise self.fail("", f"holds more than {self.limits.max_total_bytes} bytes; refused")
        self.files[rel] = data


def _names(fd: int, walk: _Walk, prefix: str) -> list[str]:
    """The directory's names, sorted; listing stops past the entry bound (a directory of millions
    of names costs no more than the bound)."""
    names: list[str] = []
    room = walk.limits.max_entries - walk.entries
    try:
        with os.scandir(fd) as listing:
            for entry in listing:
                names.append(entry.name)
                if len(names) > room:
                    break
    except OSError as exc:
        raise walk.fail(prefix.rstrip("/"), f"cannot read the directory: {exc.strerror}") from None
    return sorted(names)


def _lstat(fd: int, name: str, walk: _Walk, rel: str) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError as exc:
        raise walk.fail(rel, f"cannot stat: {exc.strerror}") from None


def _open(fd: int, name: str, flags: int, listed: os.stat_result, walk: _Walk, rel: str) -> int:
    """Open ``name`` below ``fd`` without following a link, and insist it is the entry listed."""
    try:
        child = os.open(name, flags, dir_fd=fd)
    except OSError as exc:
        raise walk.fail(rel, f"changed while the bundle was read, or unreadable ({exc.strerror}); refused") from None
    opened = os.fstat(child)
    if (opened.st_dev, opened.st_ino, stat.S_IFMT(opened.st_mode)) != (
        listed.st_dev, listed.st_ino, stat.S_IFMT(listed.st_mode)
    ):
        os.close(child)
        raise walk.fail(rel, "was replaced while the bundle was read; refused")
    return child


def _chunks(fd: int, cap: int, walk: _Walk, rel: str) -> Iterator[bytes]:
    """At most ``cap`` bytes, in pieces (a file that grows past its stat size stops at the cap)."""
    left = cap
    while left > 0:
        try:
            piece = os.read(fd, min(_CHUNK, left))
        except OSError as exc:
            raise walk.fail(rel, f"cannot read: {exc.strerror}") from None
        if not piece:
            return
        left -= len(piece)
        yield piece


def materialise(snapshot: Snapshot, declared: tuple[str, ...], dest: Path) -> None:
    """Write ``declared`` files of ``snapshot`` (and only those) below the new directory ``dest``:
    from the snapshot's bytes, world-readable (the sandbox's uid reads them), each created with
    ``O_EXCL | O_NOFOLLOW`` below a directory descriptor so nothing already there is written through."""
    missing = [rel for rel in declared if rel not in snapshot.files]
    if missing:
        raise UsageError(f"{snapshot.root}: {missing[0]} is declared but not in the bundle's snapshot")
    os.mkdir(dest, 0o755)
    top = os.open(dest, DIR_FLAGS)
    try:
        for rel in declared:
            *parents, name = rel.split("/")
            fd = os.dup(top)
            try:
                for part in parents:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                    inner = os.open(part, DIR_FLAGS, dir_fd=fd)
                    os.close(fd)
                    fd = inner
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                              dir_fd=fd)
                with os.fdopen(out, "wb") as fh:
                    fh.write(snapshot.files[rel])
                    os.fchmod(fh.fileno(), 0o644)  # whatever the umask: the sandbox's uid reads it
            finally:
                os.close(fd)
    finally:
        os.close(top)
