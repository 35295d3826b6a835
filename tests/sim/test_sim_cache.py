"""The simulator's builtin prefix cache."""

from __future__ import annotations

from cacheon.kv.hashing import page_hashes
from cacheon.sim.cache import PrefixCache


def test_sim_cache_publishes_sglang_chain_and_evicts_lru_leaves() -> None:
    cache = PrefixCache(page_size=2, capacity_tokens=8)
    stored, evicted = cache.insert([1, 2, 3, 4, 5])
    assert [p.block_hash for p in stored] == page_hashes([1, 2, 3, 4], 2) and not evicted
    assert stored[1].parent == stored[0].block_hash and stored[1].tokens == (3, 4)
    cache.insert([7, 8])
    assert cache.match([1, 2, 3, 4, 9]) == 4  # touched: now more recent than [7, 8]
    stored, evicted = cache.insert([9, 9, 9, 9])
    # Capacity 4 pages: the least recently used leaf ([7, 8]) goes first, never a page on the new path.
    assert evicted == page_hashes([7, 8], 2)
    assert len(cache) == 4 and cache.match([1, 2, 3, 4]) == 4


def test_a_prompt_longer_than_the_cache_never_evicts_its_own_path() -> None:
    """Capacity 3 pages, a 4-page prompt: its third page is the only leaf once the cache is full, and it is the
    fourth page's parent. Evicting it would store a page whose parent is gone; the insert stops there instead."""
    cache = PrefixCache(page_size=1, capacity_tokens=3)
    stored, evicted = cache.insert([1, 2, 3, 4])
    assert [p.block_hash for p in stored] == page_hashes([1, 2, 3], 1) and evicted == []
    assert len(cache) == 3 and cache.match([1, 2, 3, 4]) == 3
    # Full, and a second long prompt: room is made from the first prompt's pages, leaf by leaf, never from its own.
    stored, evicted = cache.insert([5, 6, 7, 8])
    assert [p.block_hash for p in stored] == page_hashes([5, 6, 7], 1)
    assert evicted == page_hashes([1, 2, 3], 1)[::-1]
    assert cache.match([5, 6, 7, 8]) == 3 and cache.match([1]) == 0
