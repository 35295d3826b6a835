"""Canonical JSON (RFC 8785, the JSON Canonicalization Scheme) and domain-separated digests.

Every digest Cacheon publishes (slot catalog, bundle, identity, release, ledger record) is sha256
over ``domain || 0x00 || canonical bytes`` so that two kinds of object can never share a digest.
The canonical bytes are RFC 8785's, written by the ``rfc8785`` library, so anyone can recompute a
digest with any JCS implementation. Cacheon adds one restriction: no floats (a float's text is
not stable across producers, so every fractional value is a string).
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


def canonical_json(value: Any) -> bytes:
    """RFC 8785 bytes of ``value``; ``TypeError`` for what JCS cannot say exactly (floats, non-string
    keys, integers beyond +-2^53, lone surrogates, types JSON lacks)."""
    _reject_floats(value)
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, UnicodeError, ValueError, RecursionError) as exc:
        raise TypeError(f"not canonical JSON: {exc}") from None


def digest(domain: str, value: Any) -> str:
    """``sha256:<hex>`` over the domain string and the canonical JSON of ``value``."""
    h = hashlib.sha256()
    h.update(domain.encode("utf-8") + b"\x00")
    h.update(canonical_json(value))
    return "sha256:" + h.hexdigest()


def _reject_floats(value: Any) -> None:
    pending = [value]
    while pending:  # iterative: a deep value is refused by the encoder, never by a RecursionError here
        item = pending.pop()
        if isinstance(item, float):
            raise TypeError(f"floats are not canonical; encode {item!r} as a string")
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
