"""Predict the block ids SGLang publishes for a token list (unsalted, default event format).

SGLang hashes page i as SHA-256(digest of page i-1, absent for page 0 || each token as
4-byte little-endian u32) and publishes the digest's first 8 bytes as a signed big-endian
int64 (``get_hash_str`` + ``hash_str_to_int64`` at the pin). Only full pages are predicted:
a paged radix cache stores page-aligned keys, so a trailing partial page is never a block.

Multi-turn chat re-sends its history, so a prompt built from cached pieces (``Tokens``) has its
chain continued from the cached chain of its longest already-hashed piece prefix (``ChainCache``):
at page size 1 an 8k-token prompt is 8k SHA-256 calls, which alone would exceed the routing budget.
"""

from __future__ import annotations

import array
import hashlib
import itertools
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from cacheon.gateway.lru import BoundedLRU

_U32 = next(code for code in "IL" if array.array(code).itemsize == 4)

Segment = tuple[int, ...]


class Tokens(list[int]):
    """Token ids joined from cached pieces; ``segments`` lets hashing reuse their chains.

    The list is the concatenation of ``segments`` and must not be changed afterwards.
    """

    __slots__ = ("segments",)

    def __init__(self, segments: Sequence[Segment]) -> None:
        super().__init__(itertools.chain.from_iterable(segments))
        self.segments = tuple(segments)


def _u32_bytes(tokens: Sequence[int]) -> bytes:
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


def _chain(data: bytes, step: int, prior: bytes) -> tuple[list[int], bytes]:
    """Block ids of ``data``'s whole ``step``-byte pages chained after ``prior``, and the last digest."""
    digests = []
    for offset in range(0, len(data) - len(data) % step, step):
        prior = hashlib.sha256(prior + data[offset : offset + step]).digest()
        digests.append(prior[:8])
    return list(struct.unpack(f">{len(digests)}q", b"".join(digests))), prior


@dataclass(frozen=True)
class _Node:
    """The chain state after a run of segments: enough to continue it with the next segment."""

    key: int  # unique, never reused: children are keyed by it
    digest: bytes  # digest of the last full page, b"" before the first
    tail: bytes  # u32 bytes of the tokens after the last full page
    blocks: tuple[int, ...]  # block ids of the pages completed by this node's segment


class ChainCache:
    """Block-id chains of segment runs, as a trie of (page size, parent node, segment) -> node.

    Exact: a node is a pure function of its parent's state and its segment's ids.
    """

    _ROOT = _Node(0, b"", b"", ())

    def __init__(self, max_entries: int = 1 << 16, max_weight: int = 1 << 22) -> None:
        self._nodes: BoundedLRU[_Node] = BoundedLRU(max_entries, max_weight)
        self._keys = itertools.count(1)
        self.hits = self.misses = 0

    def clear(self) -> None:
        """Forget every chain (a benchmark's cold start)."""
        self._nodes.clear()

    def page_hashes(self, segments: Sequence[Segment], page_size: int) -> list[int]:
        """The chain of the segments' concatenation, hashing only segments not seen after this prefix."""
        node, out = self._ROOT, []
        for segment in segments:
            key = (page_size, node.key, segment)
            child = self._nodes.get(key)
            if child is None:
                self.misses += 1
                child = self._extend(node, segment, 4 * page_size)
                self._nodes.put(key, child, len(segment) + len(child.blocks))
            else:
                self.hits += 1
            out.extend(child.blocks)
            node = child
        return out

    def _extend(self, node: _Node, segment: Segment, step: int) -> _Node:
        data = node.tail + _u32_bytes(segment)
        full = len(data) - len(data) % step
        blocks, digest = _chain(data[:full], step, node.digest)
        return _Node(next(self._keys), digest, data[full:], tuple(blocks))


CHAINS = ChainCache()


def page_hashes(tokens: Sequence[int], page_size: int) -> list[int]:
    """The chain of block ids for ``tokens``' full pages, as SGLang's radix cache publishes them."""
    if page_size < 1:
        raise ValueError(f"page size must be >= 1, got {page_size}")
    if isinstance(tokens, Tokens):
        return CHAINS.page_hashes(tokens.segments, page_size)
    return _chain(_u32_bytes(tokens), 4 * page_size, b"")[0]
