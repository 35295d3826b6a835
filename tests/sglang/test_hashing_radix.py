"""Block-hash prediction against what a real RadixCache at the pin publishes.

The pin's RadixCache (with KV events on) inserts prompts that share a prefix and evicts a
branch; its events go through the pin's own KVEventBatch encoding, Cacheon's decoder and
index, and the predicted chains must match the published ids exactly.
"""

from __future__ import annotations

import importlib.metadata
import random
from array import array
from types import ModuleType

import msgspec
import pytest

from cacheon.kv.contracts import for_version
from cacheon.kv.hashing import page_hashes
from cacheon.kv.index import BlockIndex
from cacheon.kv.wire import WireDecoder, operations
from cacheon.runtime.pin import SGLANG_PIN
from tests.runtime.sglang_tier import import_or_skip


@pytest.fixture(scope="module")
def sglang_pin() -> dict[str, ModuleType]:
    modules = {
        name: import_or_skip(f"sglang.srt.{name}", "CACHEON_REQUIRE_SGLANG", "scripts/install_sglang_pin.sh")
        for name in ("mem_cache.radix_cache", "mem_cache.base_prefix_cache", "disaggregation.kv_events")
    }
    installed = importlib.metadata.version("sglang")
    if installed != SGLANG_PIN:
        pytest.fail(f"sglang {installed} is installed, the pin is {SGLANG_PIN}: hash claims bind to the pin")
    return modules


class _Allocator:
    """Where evicted KV slots go: the simulated cache needs somewhere to free them."""

    device = "cpu"

    def free(self, _value: object) -> None:
        return None


def _published(events: list, kind: str) -> list[int]:
    return [h for e in events if type(e).__name__ == kind for h in e.block_hashes]


@pytest.mark.parametrize("page_size", [1, 16])
def test_radix_cache_publishes_the_predicted_chain(sglang_pin: dict[str, ModuleType], page_size: int) -> None:
    radix = sglang_pin["mem_cache.radix_cache"]
    base = sglang_pin["mem_cache.base_prefix_cache"]
    kv = sglang_pin["disaggregation.kv_events"]
    cache = radix.RadixCache.create_simulated(
        mock_allocator=_Allocator(), page_size=page_size, enable_kv_cache_events=True
    )
    cache.take_events()  # the reset's AllBlocksCleared
    rng = random.Random(page_size)
    shared = [rng.randrange(150_000) for _ in range(3 * page_size + 1)]  # ends mid-page
    a = shared + [rng.randrange(150_000) for _ in range(4 * page_size)]
    b = shared + [rng.randrange(150_000) for _ in range(2 * page_size + 5)]
    cache.insert(base.InsertParams(key=radix.RadixKey(array("q", a))))
    cache.insert(base.InsertParams(key=radix.RadixKey(array("q", b))))  # splits a's node
    stored_events = cache.take_events()

    chain_a, chain_b = page_hashes(a, page_size), page_hashes(b, page_size)
    common = len(shared) // page_size
    assert chain_a[:common] == chain_b[:common] and chain_a[common] != chain_b[common]
    assert _published(stored_events, "BlockStored") == chain_a + chain_b[common:]
    parents = {e.block_hashes[0]: e.parent_block_hash for e in stored_events}
    assert parents[chain_b[common]] == chain_a[common - 1]

    # The pin's own wire encoding -> Cacheon's decoder -> index -> prefix of the predicted chain.
    index = BlockIndex()
    decoder = WireDecoder(for_version(SGLANG_PIN))
    encode = msgspec.msgpack.Encoder().encode
    payload = encode(kv.KVEventBatch(ts=0.0, events=stored_events, attn_dp_rank=0))
    index.apply("w", operations(decoder.decode(payload, 0).events)[0])
    assert index.longest_prefix(chain_b) == {"w": len(chain_b)}

    cache.evict(base.EvictParams(num_tokens=1))  # one leaf: the least recently used, a's tail
    removed_events = cache.take_events()
    assert _published(removed_events, "BlockRemoved") == chain_a[common:]
    payload = encode(kv.KVEventBatch(ts=0.0, events=removed_events, attn_dp_rank=0))
    index.apply("w", operations(decoder.decode(payload, 0).events)[0])
    assert index.longest_prefix(chain_a) == {"w": common}
    assert index.longest_prefix(chain_b) == {"w": len(chain_b)}
