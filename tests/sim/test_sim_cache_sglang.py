"""The simulator's builtin prefix cache against SGLang's own RadixCache at the pin: the same pages
stored (ids, parents, tokens) and the same hits for the same prompts.

Evictions are not compared: the pin evicts whole leaf nodes (a node can span many pages) after an
insert, the builtin evicts single leaf pages before one, so under pressure they drop different pages.
"""

from __future__ import annotations

import random

import pytest

from cacheon.sim.cache import PrefixCache
from tests.runtime.sglang_tier import import_or_skip


@pytest.mark.parametrize("page_size", [1, 4])
def test_builtin_cache_matches_sglang_radix_cache(page_size: int) -> None:
    import_or_skip("sglang.srt.mem_cache.radix_cache", "CACHEON_REQUIRE_SGLANG", "scripts/install_sglang_pin.sh")
    from cacheon.sim.radix import SglangPrefixCache

    ours, theirs = PrefixCache(page_size, 1 << 16), SglangPrefixCache(page_size, 1 << 16)
    rng = random.Random(page_size)
    systems = [[rng.randrange(50_000) for _ in range(rng.randrange(8, 40))] for _ in range(3)]
    for step in range(60):
        prompt = rng.choice(systems) + [rng.randrange(50_000) for _ in range(rng.randrange(1, 30))]
        assert ours.match(prompt) == theirs.match(prompt), step
        got_ours, got_theirs = ours.insert(prompt), theirs.insert(prompt)
        assert got_ours == got_theirs, step  # stored pages (ids, parents, tokens); nothing evicted
    assert len(ours) == len(theirs) > 60
