"""Predict the block ids SGLang publishes for a token list (unsalted, default event format).

SGLang hashes page i as SHA-256(digest of page i-1, absent for page 0 || each token as
4-byte little-endian u32) and publishes the digest's first 8 bytes as a signed big-endian
int64 (``get_hash_str`` + ``hash_str_to_int64`` at the pin). Only full pages are predicted:
a paged radix cache stores page-aligned keys, so a trailing partial page is never a block.

Multi-turn chat re-sends its history, so a prompt built from cached pieces (``Tokens``) has its
chain continued from the cached chain of its longest already-hashed piece prefix (``ChainCache``):
at page size 1 an 8k-token prompt is 8k SHA-256 calls, which alone would exceed the routing budget.
A prompt that extends an earlier one (the next turn of a chat) resumes from that prompt's ``Stem``
instead, so its cost follows the new text, not the whole history.
"""

from __future__ import annotations

import array
import hashlib
import itertools
import struct
import sys
from collections.abc import Sequence

from cacheon.gateway.lru import BoundedLRU

_U32 = next(code for code in "IL" if array.array(code).itemsize == 4)

Segment = tuple[int, ...]


STEM_DEPTH = 64  # a stem this deep starts over flat: bounds what a chain of stems keeps alive


class Stem:
    """The leading segments of an earlier prompt and, per page size, the chain's nodes through them.

    A prompt that starts with these segments resumes from here. Each stem keeps only the segments
    (and nodes) it adds to its parent's: copying the whole history into every turn's stem would
    leave long tuples for the garbage collector's next young pass to traverse, tens of them at
    once, which measured as millisecond pauses on the routing path. A stem's text covers its
    ancestors' segments, so the text-weighted LRU that holds stems also bounds what they keep alive.
    """

    __slots__ = ("chains", "count", "depth", "own", "parent")

    def __init__(self, parent: Stem | None, own: tuple[Segment, ...]) -> None:
        if parent is not None and parent.depth >= STEM_DEPTH:
            parent, own = None, parent.segments() + own
        self.parent, self.own = parent, own
        self.count = len(own) + (parent.count if parent else 0)
        self.depth = parent.depth + 1 if parent else 0
        self.chains: dict[int, tuple[_Node, ...]] = {}  # page size -> the nodes of ``own``

    def lineage(self) -> list[Stem]:
        """This stem and its ancestors, nearest first."""
        stems, stem = [], self
        while stem is not None:
            stems.append(stem)
            stem = stem.parent
        return stems

    def segments(self) -> tuple[Segment, ...]:
        """Every segment from the prompt's start."""
        return tuple(itertools.chain.from_iterable(s.own for s in reversed(self.lineage())))

    def nodes(self, page_size: int) -> list[_Node] | None:
        """Every node from the chain's root, or None when a stem on the way was not hashed at this size."""
        parts = [s.chains.get(page_size) for s in self.lineage()]
        return None if None in parts else list(itertools.chain.from_iterable(reversed(parts)))  # type: ignore[arg-type]


class Tokens(list[int]):
    """Token ids joined from cached pieces; ``segments`` lets hashing reuse their chains.

    The list is the concatenation of ``segments`` and must not be changed afterwards. ``stem``:
    an earlier prompt's leading segments that are also this one's; ``mark``: this prompt's own
    leading segments, to be remembered for the next prompt that extends it.
    """

    __slots__ = ("mark", "segments", "stem")

    def __init__(self, segments: Sequence[Segment], stem: Stem | None = None, mark: Stem | None = None) -> None:
        super().__init__(itertools.chain.from_iterable(segments))
        self.segments = tuple(segments)
        self.stem, self.mark = stem, mark


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


_NODE_KEYS = itertools.count(1)


# The chain state after a run of segments, enough to continue it: (key, digest, tail, blocks).
# key: unique in the process, never reused; children are keyed by it (stems carry nodes across
# caches). digest: of the last full page, b"" before the first. tail: u32 bytes of the tokens after
# the last full page. blocks: ids of the pages this node's segment completed. A plain tuple of
# atoms, because the garbage collector stops tracking those after one look (never class instances).
_Node = tuple[int, bytes, bytes, tuple[int, ...]]
KEY, DIGEST, TAIL, BLOCKS = range(4)


class ChainCache:
    """Block-id chains of segment runs, as a trie of (page size, parent node, segment) -> node.

    Exact: a node is a pure function of its parent's state and its segment's ids.
    """

    _ROOT: _Node = (0, b"", b"", ())

    def __init__(self, max_entries: int = 1 << 16, max_weight: int = 1 << 22) -> None:
        self._nodes: BoundedLRU[_Node] = BoundedLRU(max_entries, max_weight)
        self.hits = self.misses = 0

    def clear(self) -> None:
        """Forget every chain (a benchmark's cold start)."""
        self._nodes.clear()

    def page_hashes(self, segments: Sequence[Segment], page_size: int, stem: Stem | None = None,
                    mark: Stem | None = None) -> list[int]:
        """The chain of the segments' concatenation, hashing only segments not seen after this prefix.

        Starts from ``stem``'s nodes when it has them for this page size (its segments must lead
        ``segments``); records the nodes of ``mark`` and of any stem on the way that lacks them.
        """
        nodes: list[_Node] = []
        start = 0
        if stem is not None and (known := stem.nodes(page_size)) is not None:
            nodes, start = known, stem.count
        node = nodes[-1] if nodes else self._ROOT
        lineage = [*(stem.lineage() if stem else ()), *((mark,) if mark else ())]
        record = {s.count: s for s in lineage if page_size not in s.chains}
        for i in range(start, len(segments)):
            segment = segments[i]
            key = (page_size, node[KEY], segment)
            child = self._nodes.get(key)
            if child is None:
                self.misses += 1
                child = self._extend(node, segment, 4 * page_size)
                self._nodes.put(key, child, len(segment) + len(child[BLOCKS]))
            else:
                self.hits += 1
            nodes.append(child)
            node = child
            if (done := record.get(i + 1)) is not None:
                done.chains[page_size] = tuple(nodes[i + 1 - len(done.own) :])
        return list(itertools.chain.from_iterable(n[BLOCKS] for n in nodes))

    def _extend(self, node: _Node, segment: Segment, step: int) -> _Node:
        data = node[TAIL] + _u32_bytes(segment)
        full = len(data) - len(data) % step
        blocks, digest = _chain(data[:full], step, node[DIGEST])
        return next(_NODE_KEYS), digest, data[full:], tuple(blocks)


CHAINS = ChainCache()


def page_hashes(tokens: Sequence[int], page_size: int) -> list[int]:
    """The chain of block ids for ``tokens``' full pages, as SGLang's radix cache publishes them."""
    if page_size < 1:
        raise ValueError(f"page size must be >= 1, got {page_size}")
    if isinstance(tokens, Tokens):
        return CHAINS.page_hashes(tokens.segments, page_size, tokens.stem, tokens.mark)
    return _chain(_u32_bytes(tokens), 4 * page_size, b"")[0]
