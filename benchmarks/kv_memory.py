"""Memory per indexed block: the index's Python heap (tracemalloc, the block ids included)
for 1M blocks over 8, 64 and 256 workers, and the ratio to a bare ``set`` of the same ids.

``--peer dynamo``: also each index's process RSS growth, measured the same way for both in a fresh
process each (Cacheon's: this script with ``--rss``; Dynamo's ``RadixTree``: benchmarks/peers/
dynamo_tree.py in its own venv): a dry pass generates the same chains without storing them (the
allocator then already holds what the transient objects need), then the RSS before and after
storing them, with a collection on both sides. RSS is what the operator pays; tracemalloc sees only
the Python heap, which is all of Cacheon's index and none of Dynamo's.

    python benchmarks/kv_memory.py [--blocks N] [--workers 64] [--peer dynamo]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import tracemalloc

from _chains import prompt_chains, random_ids, rss_bytes
from _kv import INDEXES, fill, index_option
from _peers import dynamo, failed

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


def rss_growth(workers: int, blocks: int, implementation: str) -> dict[str, int]:
    """This process's RSS growth while the index takes the chains (the ``--rss`` child)."""
    for _ in prompt_chains(workers, blocks, workers):  # the dry pass
        pass
    index = INDEXES[implementation](capacity_per_source=blocks)
    gc.collect()
    before = rss_bytes()
    fill(index, workers, blocks, workers)
    gc.collect()
    return {"bytes": rss_bytes() - before, "held": sum(index.blocks(("w", w)) for w in range(workers))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, action="append", help="worker counts (default: 8, 64, 256)")
    parser.add_argument("--peer", choices=("dynamo",), help="also the RSS growth of Cacheon's index and Dynamo's")
    parser.add_argument("--rss", type=int, metavar="WORKERS",
                        help="measure only this process's RSS growth for WORKERS and print it as JSON (the child)")
    index_option(parser)
    args = parser.parse_args()
    if args.rss:
        print(json.dumps(rss_growth(args.rss, args.blocks, args.index)))
        return
    print(f"{'workers':>8}{'blocks':>10}{'bytes/block':>13}{'set bytes/id':>14}{'ratio':>8}"
          + (f"{'RSS cacheon':>13}{'RSS dynamo':>12}{'ratio':>8}" if args.peer else ""))
    for workers in args.workers or (8, 64, 256):
        def build(workers=workers) -> BlockIndex:
            index = INDEXES[args.index](capacity_per_source=args.blocks)
            fill(index, workers, args.blocks, workers)
            return index

        index, used = traced(build)
        held = sum(index.blocks(("w", w)) for w in range(workers))
        distinct = len(index)
        del index
        rng = random.Random(f"set/{workers}")
        baseline, set_used = traced(lambda rng=rng, n=distinct: set(random_ids(rng, n)))
        per_block, per_id = used / held, set_used / len(baseline)
        del baseline
        line = f"{workers:>8}{held:>10,}{per_block:>13.1f}{per_id:>14.1f}{per_block / per_id:>8.2f}"
        if args.peer:
            child = subprocess.run([sys.executable, __file__, "--rss", str(workers), "--blocks", str(args.blocks),
                                    "--index", args.index],
                                   capture_output=True, text=True, check=True)
            ours = json.loads(child.stdout)
            theirs = dynamo("memory", workers=workers, seed=workers, blocks=args.blocks)
            if theirs["held"] != ours["held"]:
                failed(f"the indexes hold different block counts: {ours['held']} vs {theirs['held']}")
            a, b = ours["bytes"] / ours["held"], theirs["bytes"] / theirs["held"]
            line += f"{a:>13.1f}{b:>12.1f}{a / b:>8.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
