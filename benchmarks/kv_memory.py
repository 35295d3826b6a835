"""Memory per indexed block: the index's Python heap (tracemalloc, the block ids included)
for 1M blocks over 8, 64 and 256 workers, and the ratio to a bare ``set`` of the same ids.

    python benchmarks/kv_memory.py [--blocks N]
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc

import numpy as np
from _kv import fill, random_ids

from cacheon.kv.index import BlockIndex


def traced(build) -> tuple[object, int]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    value = build()
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return value, used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    args = parser.parse_args()
    print(f"{'workers':>8}{'blocks':>10}{'bytes/block':>13}{'set bytes/id':>14}{'ratio':>8}")
    for workers in (8, 64, 256):
        rng = np.random.default_rng(workers)

        def build(rng=rng, workers=workers) -> BlockIndex:
            index = BlockIndex(capacity_per_source=args.blocks)
            fill(index, workers, args.blocks, rng)
            return index

        index, used = traced(build)
        held = sum(index.blocks(("w", w)) for w in range(workers))
        distinct = len(index)
        baseline, set_used = traced(lambda rng=rng, n=distinct: set(random_ids(rng, n)))
        per_block, per_id = used / held, set_used / len(baseline)
        print(f"{workers:>8}{held:>10,}{per_block:>13.1f}{per_id:>14.1f}{per_block / per_id:>8.2f}")
        del index, baseline


if __name__ == "__main__":
    main()
