"""Predict the block ids SGLang publishes for a token list (default event format).

SGLang hashes page i as SHA-256(digest of page i-1, absent for page 0 || each token as
4-byte little-endian u32) and publishes the digest's first 8 bytes as a signed big-endian
int64 (``get_hash_str`` + ``hash_str_to_int64`` at the pin). Only full pages are predicted:
a paged radix cache stores page-aligned keys, so a trailing partial page is never a block.
From 0.5.18 a salted request's chain starts from a seed digest instead of nothing
(``salt_seed``; ``mem_cache/utils.py:compute_node_event_hash_values``), the same in every
release since (docs/sglang-hashing-facts.md). Pure functions; ``cacheon.tokens.chains`` caches
chains of prompts built from cached pieces.
"""

from __future__ import annotations

import array
import hashlib
import struct
import sys
from collections.abc import Sequence

_U32 = next(code for code in "IL" if array.array(code).itemsize == 4)


def u32_bytes(tokens: Sequence[int]) -> bytes:
    """Tokens as little-endian u32 bytes; ``array`` converts and range-checks them at C speed."""
    try:
        ids = array.array(_U32, tokens if isinstance(tokens, list | tuple) else list(tokens))
    except TypeError as exc:
        raise ValueError(f"token ids must be integers: {exc}") from None
    except OverflowError:
        raise ValueError("token ids must be in [0, 2**32): SGLang hashes them as u32") from None
    if sys.byteorder == "big":
        ids.byteswap()
    return ids.tobytes()


def chain(data: bytes, step: int, prior: bytes) -> tuple[list[int], bytes]:
    """Block ids of ``data``'s whole ``step``-byte pages chained after ``prior``, and the last digest."""
    digests = []
    for offset in range(0, len(data) - len(data) % step, step):
        prior = hashlib.sha256(prior + data[offset : offset + step]).digest()
        digests.append(prior[:8])
    return list(struct.unpack(f">{len(digests)}q", b"".join(digests))), prior


def page_hashes(tokens: Sequence[int], page_size: int, prior: bytes = b"") -> list[int]:
    """The chain of block ids for ``tokens``' full pages, as SGLang's radix cache publishes them;
    ``prior``: the digest the first page chains after (a salt's seed), none by default."""
    if page_size < 1:
        raise ValueError(f"page size must be >= 1, got {page_size}")
    return chain(u32_bytes(tokens), 4 * page_size, prior)[0]


SALT_SEED_TAG = b"sglang-cache-salt-v1\0"


def salt_seed(salt: str) -> bytes:
    """The digest a salted chain starts from (0.5.18 and later): SHA-256(tag || salt as UTF-8)."""
    return hashlib.sha256(SALT_SEED_TAG + salt.encode("utf-8")).digest()
