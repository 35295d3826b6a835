"""The Cacheon side of the KV benchmarks' workloads (``_chains``): a filled index, answers, the cross-check."""

from __future__ import annotations

import argparse
import sys

from _chains import prompt_chains

from cacheon.kv.index import BlockIndex, ReferenceBlockIndex

# ``--index``: the native index the gateway runs, or the pure-Python reference it is tested against.
INDEXES: dict[str, type] = {"native": BlockIndex, "reference": ReferenceBlockIndex}


def index_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index", choices=sorted(INDEXES), default="native",
                        help="which implementation of the block index (default: native, the one the gateway runs)")


def fill(index: BlockIndex, workers: int, blocks: int, seed: int, keep: int = 0) -> list[list[int]]:
    """Store ``blocks`` ids over ``workers`` as ``_chains.prompt_chains``; returns the first ``keep`` chains."""
    kept: list[list[int]] = []
    for worker, chain in prompt_chains(workers, blocks, seed):
        index.apply(("w", worker), [("store", chain, None)])
        if len(kept) < keep:
            kept.append(chain)
    return kept


def answers(found: dict) -> list[tuple[int, int]]:
    """A ``longest_prefix`` answer as (worker, depth) pairs, the shape the peer reports."""
    return sorted((source[1], depth) for source, depth in found.items())


def crosscheck(what: str, ours: list[list[tuple[int, int]]], theirs: list[list[list[int]]]) -> int:
    """Answers that differ between the indexes; prints the first few. Any difference is a failed benchmark."""
    wrong = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != [tuple(x) for x in b]]
    for i in wrong[:3]:
        print(f"  {what} answer {i} differs: cacheon {ours[i]} dynamo {theirs[i]}", file=sys.stderr)
    return len(wrong)
