"""The simulator's prefix cache backed by SGLang's own ``RadixCache`` (the pin, when importable).

Same interface as :class:`cacheon.sim.cache.PrefixCache`; the stores and evictions are the ones
the pin's radix tree makes, read from its own KV-event queue. Importing the pin pulls torch
(seconds), so the simulator only does it when asked (``--prefix-cache sglang``).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from cacheon.errors import UsageError
from cacheon.sim.cache import StoredPage


class _Allocator:
    """Where evicted KV slots go in a simulated RadixCache: nowhere."""

    device = "cpu"

    def free(self, _value: object) -> None:
        return None


class SglangPrefixCache:
    """The pin's ``RadixCache.create_simulated`` with KV events on and a capacity in tokens."""

    def __init__(self, page_size: int, capacity_tokens: int) -> None:
        try:
            from sglang.srt.mem_cache import base_prefix_cache, radix_cache
        except ImportError as exc:
            raise UsageError(f"--prefix-cache sglang needs the pinned SGLang importable: {exc}") from None
        self._base, self._radix = base_prefix_cache, radix_cache
        self.page_size, self.capacity_tokens = page_size, capacity_tokens
        self._cache = radix_cache.RadixCache.create_simulated(
            mock_allocator=_Allocator(), page_size=page_size, enable_kv_cache_events=True
        )
        self._cache.take_events()  # the reset's AllBlocksCleared

    def __len__(self) -> int:
        return int(self._cache.evictable_size()) // self.page_size

    def _key(self, tokens: Sequence[int]) -> object:
        return self._radix.RadixKey(array("q", tokens))

    def match(self, tokens: Sequence[int]) -> int:
        result = self._cache.match_prefix(self._base.MatchPrefixParams(key=self._key(tokens)))
        return len(result.device_indices)

    def insert(self, tokens: Sequence[int]) -> tuple[list[StoredPage], list[int]]:
        full = len(tokens) - len(tokens) % self.page_size
        self._cache.insert(self._base.InsertParams(key=self._key(tokens[:full])))
        excess = self._cache.evictable_size() - self.capacity_tokens
        if excess > 0:
            self._cache.evict(self._base.EvictParams(num_tokens=excess))
        stored: list[StoredPage] = []
        evicted: list[int] = []
        for ev in self._cache.take_events():
            kind = type(ev).__name__
            if kind == "BlockStored":
                parent = ev.parent_block_hash
                for i, h in enumerate(ev.block_hashes):
                    page = ev.token_ids[i * self.page_size : (i + 1) * self.page_size]
                    stored.append(StoredPage(h, parent, tuple(page)))
                    parent = h
            elif kind == "BlockRemoved":
                evicted += ev.block_hashes
        return stored, evicted

    def clear(self) -> None:
        self._cache.reset()
        self._cache.take_events()
