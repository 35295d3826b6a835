"""Query: longest cached prefix of a 512-block chain against 8, 64 and 256 workers holding
1M indexed blocks; p50/p99 latency, and the ratio to 512 bare ``dict.get`` calls on a dict of
the same 1M ids in the same run (the floor of any per-block Python lookup).

`full`: chains a worker holds entirely (the worst case: 512 lookups). `mixed`: a third full,
a third diverging at a random depth, a third missing at once.

``--peer dynamo``: the same chains and queries also go to Dynamo's ``RadixTree`` (its Python
bindings, in its own venv: benchmarks/peers/install.sh), timed the same way (one Python call per
query), and every answer (the prefix depth per worker) must be the same in both indexes.

    python benchmarks/kv_query.py [--blocks N] [--queries N] [--workers 64] [--peer dynamo]
"""

from __future__ import annotations

import argparse
import random
import time

from _chains import digest, queries, random_ids
from _kv import INDEXES, answers, crosscheck, fill, index_option
from _peers import dynamo, failed


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--workers", type=int, action="append", help="worker counts (default: 8, 64, 256)")
    parser.add_argument("--peer", choices=("dynamo",), help="also run Dynamo's RadixTree on the same queries")
    index_option(parser)
    args = parser.parse_args()
    print(
        f"{'workers':>8} {'index':<8}{'full p50':>10}{'full p99':>10}{'mixed p50':>11}{'mixed p99':>11}"
        f"{'floor p50':>11}{'full/floor':>12}   (us)"
    )
    wrong_total = 0
    for workers in args.workers or (8, 64, 256):
        index = INDEXES[args.index](capacity_per_source=args.blocks)
        chains = fill(index, workers, args.blocks, workers, keep=256)
        full, mixed = queries(chains, args.queries, workers)
        rng = random.Random(f"floor/{workers}")
        floor_map = dict.fromkeys(h for chain in chains for h in chain)
        floor_map.update(dict.fromkeys(random_ids(rng, args.blocks - len(floor_map))))
        ours = {name: [timed(index.longest_prefix, chain) for chain in qs] for name, qs in (("full", full),
                                                                                             ("mixed", mixed))}
        floor = [timed(bare_lookups, chain, floor_map.get)[0] for chain in full]
        (f50, f99), (m50, m99), (b50, _) = (percentiles([us for us, _ in ours["full"]]),
                                            percentiles([us for us, _ in ours["mixed"]]), percentiles(floor))
        print(f"{workers:>8} {args.index:<8}{f50:>10.1f}{f99:>10.1f}{m50:>11.1f}{m99:>11.1f}{b50:>11.1f}"
              f"{f50 / b50:>12.2f}", flush=True)
        if args.peer:
            peer = dynamo("query", workers=workers, seed=workers, blocks=args.blocks, queries=args.queries)
            if peer["digest"] != digest(chains):
                failed("the Dynamo side built a different workload (digest mismatch)")
            (d50, d99), (e50, e99) = percentiles(peer["full"]["us"]), percentiles(peer["mixed"]["us"])
            wrong = sum(crosscheck(f"{workers} workers {name}", [a for _, a in ours[name]], peer[name]["answers"])
                        for name in ("full", "mixed"))
            wrong_total += wrong
            print(f"{workers:>8} {'dynamo':<8}{d50:>10.1f}{d99:>10.1f}{e50:>11.1f}{e99:>11.1f}"
                  f"{'':>11}{'':>12}   cacheon/dynamo p50 full {f50 / d50:.2f} mixed {m50 / e50:.2f}; "
                  f"{2 * args.queries - wrong}/{2 * args.queries} answers agree", flush=True)
    if wrong_total:
        failed(f"{wrong_total} answers differ between Cacheon's index and Dynamo's RadixTree")


def timed(fn, *args) -> tuple[list[float], list]:
    """Microseconds of one call, and its answer (pairs, for the peer cross-check)."""
    start = time.perf_counter()
    found = fn(*args)
    return (time.perf_counter() - start) * 1e6, answers(found) if isinstance(found, dict) else None


def bare_lookups(chain: list[int], get) -> None:
    for h in chain:
        get(h)


if __name__ == "__main__":
    main()
