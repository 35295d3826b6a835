"""Canonical JSON and domain-separated digests.

Every digest Cacheon publishes (slot catalog, bundle, identity, release) is sha256 over
``domain || 0x00 || canonical bytes`` so that two kinds of object can never share a digest.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8, no floats (a float's text is not canonical)."""
    _reject_floats(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def digest(domain: str, value: Any) -> str:
    """``sha256:<hex>`` over the domain string and the canonical JSON of ``value``."""
    h = hashlib.sha256()
    h.update(domain.encode("utf-8") + b"\x00")
    h.update(canonical_json(value))
    return "sha256:" + h.hexdigest()


def _reject_floats(value: Any) -> None:
    if isinstance(value, float):
        raise TypeError(f"floats are not canonical; encode {value!r} as a string")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"canonical JSON keys must be strings, got {k!r}")
            _reject_floats(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _reject_floats(v)
