"""Hash chains of prompts built from cached pieces, without re-hashing what is known.

Multi-turn chat re-sends its history, so a prompt built from cached pieces (``Tokens``) has its
chain continued from the cached chain of its longest already-hashed piece prefix (``ChainCache``):
at page size 1 an 8k-token prompt is 8k SHA-256 calls, which alone would exceed the routing budget.
A prompt that extends an earlier one (the next turn of a chat) resumes from that prompt's ``Stem``
instead, so its cost follows the new text, not the whole history.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Final

from cacheon.kv.hashing import chain, page_hashes, u32_bytes
from cacheon.tokens.lru import BoundedLRU

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
    parent: Stem | None
    own: tuple[Segment, ...]
    count: int
    depth: int
    chains: dict[int, tuple[_Node, ...]]  # page size -> the nodes of ``own``

    def __init__(self, parent: Stem | None, own: tuple[Segment, ...]) -> None:
        if parent is not None and parent.depth >= STEM_DEPTH:
            own = parent.segments() + own
            parent = None
        self.parent, self.own = parent, own
        self.count = len(own) + (parent.count if parent else 0)
        self.depth = parent.depth + 1 if parent else 0
        self.chains = {}

    def lineage(self) -> list[Stem]:
        """This stem and its ancestors, nearest first."""
        stems: list[Stem] = []
        stem: Stem | None = self
        while stem is not None:
            stems.append(stem)
            stem = stem.parent
        return stems

    def segments(self) -> tuple[Segment, ...]:
        """Every segment from the prompt's start."""
        return tuple(itertools.chain.from_iterable(s.own for s in reversed(self.lineage())))

    def nodes(self, page_size: int) -> list[_Node] | None:
        """Every node from the chain's root, or None when a stem on the way was not hashed at this size."""
        parts = []
        for stem in self.lineage():
            part = stem.chains.get(page_size)
            if part is None:
                return None
            parts.append(part)
        return list(itertools.chain.from_iterable(reversed(parts)))


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


_NODE_KEYS = itertools.count(1)


# The chain state after a run of segments, enough to continue it: (key, digest, tail, blocks).
# key: unique in the process, never reused; children are keyed by it (stems carry nodes across
# caches). digest: of the last full page, b"" before the first. tail: u32 bytes of the tokens after
# the last full page. blocks: ids of the pages this node's segment completed. A plain tuple of
# atoms, because the garbage collector stops tracking those after one look (never class instances).
_Node = tuple[int, bytes, bytes, tuple[int, ...]]
KEY: Final = 0
DIGEST: Final = 1
TAIL: Final = 2
BLOCKS: Final = 3


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
                    mark: Stem | None = None, prior: bytes = b"") -> list[int]:
        """The chain of the segments' concatenation, hashing only segments not seen after this prefix.

        Starts from ``stem``'s nodes when it has them for this page size (its segments must lead
        ``segments``); records the nodes of ``mark`` and of any stem on the way that lacks them.
        ``prior``: a seed digest the chain starts from (a salt's); stems hold unseeded chains only.
        """
        nodes: list[_Node] = []
        start = 0
        if prior:
            stem = mark = None
        elif stem is not None and (known := stem.nodes(page_size)) is not None:
            nodes, start = known, stem.count
        node = nodes[-1] if nodes else self._root(prior)
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

    def _root(self, prior: bytes) -> _Node:
        """The node a chain starts from: the empty root, or one per seed digest (kept in the same LRU)."""
        if not prior:
            return self._ROOT
        root = self._nodes.get(("seed", prior))
        if root is None:
            root = (next(_NODE_KEYS), prior, b"", ())
            self._nodes.put(("seed", prior), root, 1)
        return root

    def _extend(self, node: _Node, segment: Segment, step: int) -> _Node:
        data = node[TAIL] + u32_bytes(segment)
        full = len(data) - len(data) % step
        blocks, digest = chain(data[:full], step, node[DIGEST])
        return next(_NODE_KEYS), digest, data[full:], tuple(blocks)

    def chain(self, tokens: Sequence[int], page_size: int, prior: bytes = b"") -> list[int]:
        """``page_hashes(tokens, page_size, prior)``, continued from cached segments where ``tokens`` carries them."""
        if page_size < 1:
            raise ValueError(f"page size must be >= 1, got {page_size}")
        if isinstance(tokens, Tokens):
            return self.page_hashes(tokens.segments, page_size, tokens.stem, tokens.mark, prior)
        return page_hashes(tokens, page_size, prior)
