"""Query: longest cached prefix of a 512-block chain against 8, 64 and 256 workers holding
1M indexed blocks; p50/p99 latency, and the ratio to 512 bare ``dict.get`` calls on a dict of
the same 1M ids in the same run (the floor of any per-block Python lookup).

`full`: chains a worker holds entirely (the worst case: 512 lookups). `mixed`: a third full,
a third diverging at a random depth, a third missing at once.

    python benchmarks/kv_query.py [--blocks N] [--queries N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _kv import CHAIN, fill, random_ids

from cacheon.kv.index import BlockIndex


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=2000)
    args = parser.parse_args()
    print(
        f"{'workers':>8}{'full p50':>10}{'full p99':>10}{'mixed p50':>11}{'mixed p99':>11}"
        f"{'floor p50':>11}{'full/floor':>12}   (us)"
    )
    for workers in (8, 64, 256):
        rng = np.random.default_rng(workers)
        index = BlockIndex(capacity_per_source=args.blocks)
        chains = fill(index, workers, args.blocks, rng, keep=256)
        mixed = []
        for q in range(args.queries):
            cut = [CHAIN, int(rng.integers(1, CHAIN)), 0][q % 3]
            mixed.append(chains[q % len(chains)][:cut] + random_ids(rng, CHAIN - cut))
        floor_map = dict.fromkeys(h for chain in chains for h in chain)
        floor_map.update(dict.fromkeys(random_ids(rng, args.blocks - len(floor_map))))
        full = [timed(index.longest_prefix, chains[q % len(chains)]) for q in range(args.queries)]
        partial = [timed(index.longest_prefix, chain) for chain in mixed]
        floor = [timed(bare_lookups, chains[q % len(chains)], floor_map.get) for q in range(args.queries)]
        (f50, f99), (m50, m99), (b50, _) = percentiles(full), percentiles(partial), percentiles(floor)
        print(f"{workers:>8}{f50:>10.1f}{f99:>10.1f}{m50:>11.1f}{m99:>11.1f}{b50:>11.1f}{f50 / b50:>12.2f}")


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - start) * 1e6


def bare_lookups(chain: list[int], get) -> None:
    for h in chain:
        get(h)


if __name__ == "__main__":
    main()
