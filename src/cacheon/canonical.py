"""Canonical JSON (RFC 8785, the JSON Canonicalization Scheme) and domain-separated digests.

Every digest Cacheon publishes (slot catalog, bundle, identity, release, ledger record) is sha256
over ``domain || 0x00 || canonical bytes`` so that two kinds of object can never share a digest.
The canonical bytes are RFC 8785's, so anyone can recompute a digest with any JCS implementation;
the ``rfc8785`` library is the oracle the tests hold these bytes to (tests/unit/test_canonical.py).

Cacheon's JSON has no floats (a float's text is not stable across producers, so every fractional
value is a string), and for that subset JCS is: keys sorted by their UTF-16 code units, no
whitespace, strings with only ``"``, ``\\`` and the C0 controls escaped, integers within
+-(2^53 - 1), UTF-8. That is the standard library's encoder with the JCS key order, so the
encoder needs no dependency: it runs inside every SGLang server process (the plugin digests the
slot catalog and the runtime identity), whose environments are locked
(scripts/engines/releases.toml).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

MAX_INTEGER = 2**53 - 1  # JCS writes numbers as IEEE doubles: beyond this an integer is not exact


def canonical_json(value: Any) -> bytes:
    """RFC 8785 bytes of ``value``; ``TypeError`` for what JCS cannot say exactly in Cacheon's JSON
    (floats, non-string keys, integers beyond +-(2^53 - 1), lone surrogates, types JSON lacks)."""
    try:
        return json.dumps(_ordered(value), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except (ValueError, UnicodeError, RecursionError) as exc:
        raise TypeError(f"not canonical JSON: {exc}") from None


def digest(domain: str, value: Any) -> str:
    """``sha256:<hex>`` over the domain string and the canonical JSON of ``value``."""
    h = hashlib.sha256()
    h.update(domain.encode("utf-8") + b"\x00")
    h.update(canonical_json(value))
    return "sha256:" + h.hexdigest()


def _ordered(value: Any) -> Any:
    """``value`` with every object's keys in JCS order (UTF-16 code units), checked as it goes."""
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"canonical JSON keys must be strings, got {key!r}")
        return {key: _ordered(value[key]) for key in sorted(value, key=_utf16)}
    if isinstance(value, (list, tuple)):
        return [_ordered(item) for item in value]
    if isinstance(value, float):
        raise TypeError(f"floats are not canonical; encode {value!r} as a string")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INTEGER:
        raise TypeError(f"integer {value} is beyond JCS's exact range (+-(2^53 - 1)); encode it as a string")
    return value


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")
