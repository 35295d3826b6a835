"""Shared workload for the KV-event benchmarks: random block ids and a filled index."""

from __future__ import annotations

import numpy as np

from cacheon.kv.index import BlockIndex

CHAIN = 512  # blocks per prompt chain


def random_ids(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64).tolist()


def fill(index: BlockIndex, workers: int, blocks: int, rng: np.random.Generator, keep: int = 0) -> list[list[int]]:
    """Store ``blocks`` ids over ``workers`` as 512-block prompt chains; every fourth chain shares
    its first half with the one before (a common system prompt). Returns the first ``keep``."""
    kept: list[list[int]] = []
    previous: list[int] = []
    for n in range(blocks // CHAIN):
        chain = random_ids(rng, CHAIN)
        if n % 4 == 3:
            chain[: CHAIN // 2] = previous[: CHAIN // 2]
        index.apply(("w", n % workers), [("store", chain)])
        if len(kept) < keep:
            kept.append(chain)
        previous = chain
    return kept
