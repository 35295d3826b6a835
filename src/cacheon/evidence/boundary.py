"""Files in and out of the evidence layer: reads that an adversary may have written (bounded in size,
canonical, decoded into typed structs), and writes that a reader never sees half done.

Release envelopes, SBOMs and ledger checkpoints arrive from elsewhere. Each is read with a size
bound checked before the bytes are read, decoded by msgspec (which refuses invalid UTF-8 and
stops at deep nesting), compared with its canonical re-encoding where the format is ours (so
duplicate keys, which JSON parsers resolve differently, and any reformatting are refused), and
only then converted into a typed struct. Every failure is a :class:`Malformed` with one line.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from cacheon.canonical import canonical_json

T = TypeVar("T")


class Malformed(Exception):
    """The file is not what it claims to be; ``str(exc)`` is one line naming the file."""


def read_bounded(path: Path, limit: int) -> bytes:
    """The file's bytes, refusing anything that is not a regular file or is over ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise Malformed(f"missing {path.name}") from None
    except OSError as exc:
        raise Malformed(f"cannot read {path.name}: {exc.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise Malformed(f"{path.name} is not a regular file")
    with os.fdopen(fd, "rb") as fh:
        if info.st_size > limit:
            raise Malformed(f"{path.name} is {info.st_size} bytes, over the {limit}-byte limit for this file")
        raw = fh.read(limit + 1)
    if len(raw) > limit:  # grew while being read
        raise Malformed(f"{path.name} is over the {limit}-byte limit for this file")
    return raw


def decode_json(raw: bytes, kind: type[T], what: str, *, canonical: bool) -> T:
    """Decode ``raw`` into ``kind``; with ``canonical``, the bytes must be their canonical form."""
    value = _untyped(raw, what)
    if canonical:
        try:
            same = canonical_json(value) == raw
        except (TypeError, RecursionError) as exc:
            raise Malformed(f"{what} is not canonical JSON: {_first_line(exc)}") from None
        if not same:
            raise Malformed(
                f"{what} is not in canonical form (whitespace, key order or a duplicate key: "
                "it was not written by cacheon, or it was edited)"
            )
    return convert(value, kind, what)


def convert(value: Any, kind: type[T], what: str) -> T:
    """Typed conversion of already-decoded JSON; the message names the offending path."""
    try:
        return msgspec.convert(value, kind, strict=True)
    except msgspec.ValidationError as exc:
        raise Malformed(f"{what}: {_first_line(exc)}") from None
    except RecursionError:
        raise Malformed(f"{what} is nested too deeply") from None


def _untyped(raw: bytes, what: str) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise Malformed(f"{what} is not JSON: {_first_line(exc)}") from None
    except RecursionError:
        raise Malformed(f"{what} is nested too deeply") from None


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
