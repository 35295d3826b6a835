"""Predict the block ids SGLang publishes for a token list (unsalted, default event format).

SGLang hashes page i as SHA-256(digest of page i-1, absent for page 0 || each token as
4-byte little-endian u32) and publishes the digest's first 8 bytes as a signed big-endian
int64 (``get_hash_str`` + ``hash_str_to_int64`` at the pin). Only full pages are predicted:
a paged radix cache stores page-aligned keys, so a trailing partial page is never a block.
"""

from __future__ import annotations

import hashlib
import operator
import struct
from collections.abc import Sequence

_U32_MAX = 2**32 - 1


def page_hashes(tokens: Sequence[int], page_size: int) -> list[int]:
    """The chain of block ids for ``tokens``' full pages, as SGLang's radix cache publishes them."""
    if page_size < 1:
        raise ValueError(f"page size must be >= 1, got {page_size}")
    try:
        ids = [operator.index(t) for t in tokens]
    except TypeError as exc:
        raise ValueError(f"token ids must be integers: {exc}") from None
    if any(not 0 <= t <= _U32_MAX for t in ids):
        raise ValueError("token ids must be in [0, 2**32): SGLang hashes them as u32")
    full = len(ids) - len(ids) % page_size
    data = struct.pack(f"<{full}I", *ids[:full])
    step = 4 * page_size
    out = []
    prior = b""
    for offset in range(0, len(data), step):
        prior = hashlib.sha256(prior + data[offset : offset + step]).digest()
        out.append(int.from_bytes(prior[:8], "big", signed=True))
    return out
