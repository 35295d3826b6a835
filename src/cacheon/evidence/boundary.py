"""Files in and out of the evidence layer: reads that an adversary may have written (bounded in size,
canonical, decoded into typed structs), and writes that a reader never sees half done.

Release envelopes, SBOMs and ledger checkpoints arrive from elsewhere. Each is read with a size
bound checked before the bytes are read, decoded by msgspec (which refuses invalid UTF-8 and
stops at deep nesting), compared with its canonical re-encoding where the format is ours (so
duplicate keys, which JSON parsers resolve differently, and any reformatting are refused), and
only then converted into a typed struct. Every failure is a :class:`Malformed` with one line.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from cacheon.canonical import canonical_json
from cacheon.printable import escape_controls

T = TypeVar("T")


class Malformed(Exception):
    """The file is not what it claims to be; ``str(exc)`` is one line naming the file."""


def open_regular(path: Path) -> int:
    """A read-only descriptor of the regular file at ``path``; anything else is refused before a byte is read.

    The open never blocks and never follows a link (``O_NONBLOCK | O_NOFOLLOW``: a FIFO put where a
    file belongs would otherwise hang the open until someone writes to it, and then feed the
    reader whatever they stream), and ``fstat`` on the descriptor itself decides: what is checked
    is what is read, with no window between a check by name and the open.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise Malformed(f"missing {_name(path)}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Malformed(f"{_name(path)} is a symlink, not a regular file") from None
        try:  # a socket refuses the open itself (ENXIO): name what is there
            mode = os.lstat(path).st_mode
        except OSError:
            mode = stat.S_IFREG
        if not stat.S_ISREG(mode):
            raise Malformed(f"{_name(path)} is {_kind(mode)}, not a regular file") from None
        raise Malformed(f"cannot read {_name(path)}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise Malformed(f"{_name(path)} is {_kind(mode)}, not a regular file")
    return fd


def is_regular(path: Path) -> bool:
    """Whether ``path`` itself (never a link's target) is a regular file."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_bounded(path: Path, limit: int) -> bytes:
    """The file's bytes, refusing anything that is not a regular file or is over ``limit`` bytes."""
    with os.fdopen(open_regular(path), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise Malformed(f"{_name(path)} is {size} bytes, over the {limit}-byte limit for this file")
        raw = fh.read(limit + 1)
    if len(raw) > limit:  # grew while being read
        raise Malformed(f"{_name(path)} is over the {limit}-byte limit for this file")
    return raw


def sha256_regular(path: Path, size: int) -> str:
    """``sha256:<hex>`` of the regular file at ``path``, which must hold exactly ``size`` bytes (checked
    before any byte is hashed, and again at the end: a file that grows meanwhile is refused)."""
    with os.fdopen(open_regular(path), "rb") as fh:
        actual = os.fstat(fh.fileno()).st_size
        if actual != size:
            raise Malformed(f"{_name(path)}: {actual} bytes, the descriptor says {size}")
        sha, read = hashlib.sha256(), 0
        while chunk := fh.read(min(1 << 20, size + 1 - read)):
            sha.update(chunk)
            read += len(chunk)
    if read != size:
        raise Malformed(f"{_name(path)} changed size while it was read")
    return "sha256:" + sha.hexdigest()


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a plain file"


def _name(path: Path) -> str:
    return escape_controls(path.name)


MAX_DEPTH = 64  # arrays and objects within one another; a release statement nests 7, a report a dozen


def decode_json(raw: bytes, kind: type[T], what: str, *, canonical: bool) -> T:
    """Decode ``raw`` straight into ``kind`` (no untyped copy of a large document is ever built); with
    ``canonical``, the bytes must be the canonical form of what was decoded."""
    try:
        value = msgspec.json.decode(raw, type=kind, strict=True)
    except msgspec.ValidationError as exc:
        raise Malformed(f"{what}: {_first_line(exc)}") from None
    except msgspec.DecodeError as exc:
        raise Malformed(f"{what} is not JSON: {_first_line(exc)}") from None
    except RecursionError:
        raise Malformed(f"{what} is nested too deeply") from None
    builtins = msgspec.to_builtins(value)
    check_depth(builtins, what)
    if canonical:
        try:
            same = canonical_json(builtins) == raw
        except TypeError as exc:
            raise Malformed(f"{what} is not canonical JSON: {_first_line(exc)}") from None
        if not same:
            raise Malformed(
                f"{what} is not in canonical form (whitespace, key order or a duplicate key: "
                "it was not written by cacheon, or it was edited)"
            )
    return value


def convert(value: Any, kind: type[T], what: str) -> T:
    """Typed conversion of already-decoded JSON (depth-bounded first); the message names the offending path."""
    check_depth(value, what)
    try:
        return msgspec.convert(value, kind, strict=True)
    except msgspec.ValidationError as exc:
        raise Malformed(f"{what}: {_first_line(exc)}") from None


def check_depth(value: Any, what: str, limit: int = MAX_DEPTH) -> None:
    """Refuse a value nested deeper than ``limit``, without recursing (so no depth can overflow the check)."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth >= limit:
            raise Malformed(f"{what} is nested more than {limit} levels deep")
        pending.extend((child, depth + 1) for child in children)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename): old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
