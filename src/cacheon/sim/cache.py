"""The simulator's prefix cache: page-granular radix tree with LRU leaf eviction and a capacity.

Shaped like SGLang's paged ``RadixCache``: keys are full pages, a page is only evictable once it
has no cached children, and every insert or eviction is reported page by page, in SGLang's own hash
chain, for the publisher to group into ``BlockStored`` / ``BlockRemoved`` events as the chosen release does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from cacheon.kv.hashing import page_hashes

Hasher = Callable[[Sequence[int], int], list[int]]  # tokens, page size -> block ids


@dataclass(frozen=True)
class StoredPage:
    block_hash: int
    parent: int | None
    tokens: tuple[int, ...]


class SimCache(Protocol):
    """What the simulated worker needs of a prefix cache (``PrefixCache``, ``SglangPrefixCache``)."""

    def __len__(self) -> int: ...

    def match(self, tokens: Sequence[int]) -> int: ...

    def insert(self, tokens: Sequence[int]) -> tuple[list[StoredPage], list[int]]: ...

    def clear(self) -> None: ...


class PrefixCache:
    """At most ``capacity_tokens`` tokens in full pages of ``page_size``; ``hasher`` is SGLang's chain
    (a chain cache's, when the tokens come from a tokenization profile)."""

    def __init__(self, page_size: int, capacity_tokens: int, hasher: Hasher = page_hashes) -> None:
        if capacity_tokens < page_size:
            raise ValueError("capacity must hold at least one page")
        self.page_size, self._hashes = page_size, hasher
        self.capacity_pages = capacity_tokens // page_size
        self._parent: dict[int, int | None] = {}
        self._children: dict[int, int] = {}
        self._leaves: OrderedDict[int, None] = OrderedDict()  # LRU order, oldest first

    def __len__(self) -> int:
        return len(self._parent)

    def match(self, tokens: Sequence[int], touch: bool = True) -> int:
        """How many leading tokens are cached; ``touch`` refreshes the matched path's LRU order, as a hit does."""
        hits = 0
        for h in self._hashes(tokens, self.page_size):
            if h not in self._parent:
                break
            hits += 1
            if touch and h in self._leaves:
                self._leaves.move_to_end(h)
        return hits * self.page_size

    def insert(self, tokens: Sequence[int]) -> tuple[list[StoredPage], list[int]]:
        """Cache ``tokens``' full pages; returns the pages newly stored and the ids evicted."""
        stored: list[StoredPage] = []
        evicted: list[int] = []
        parent: int | None = None
        chain = self._hashes(tokens, self.page_size)
        path: set[int] = set()  # the pages before this one: never evicted to make room for their own continuation
        for i, h in enumerate(chain):
            if h not in self._parent:
                evicted += self._make_room(protect=path)
                if len(self._parent) >= self.capacity_pages:
                    break
                self._parent[h] = parent
                self._children[h] = 0
                if parent is not None:
                    self._children[parent] += 1
                    self._leaves.pop(parent, None)
                self._leaves[h] = None
                page = tokens[i * self.page_size : (i + 1) * self.page_size]
                stored.append(StoredPage(h, parent, tuple(page)))
            elif h in self._leaves:
                self._leaves.move_to_end(h)
            parent = h
            path.add(h)
        return stored, evicted

    def clear(self) -> None:
        self._parent.clear()
        self._children.clear()
        self._leaves.clear()

    def _make_room(self, protect: set[int]) -> list[int]:
        out = []
        while len(self._parent) >= self.capacity_pages:
            victim = next((h for h in self._leaves if h not in protect), None)
            if victim is None:
                break
            del self._leaves[victim]
            parent = self._parent.pop(victim)
            del self._children[victim]
            out.append(victim)
            if parent is not None:
                self._children[parent] -= 1
                if self._children[parent] == 0:
                    self._leaves[parent] = None
                    self._leaves.move_to_end(parent, last=False)
        return out
