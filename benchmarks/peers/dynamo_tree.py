"""Dynamo's ``RadixTree`` (PyPI ``ai-dynamo-runtime``) on the KV benchmarks' workloads: the peer side.

Run by benchmarks/kv_query.py, kv_ingest.py and kv_memory.py with ``--peer dynamo``, in the peer's
own venv (``benchmarks/peers/install.sh`` puts it in .peers/ai-dynamo-runtime), never imported by
Cacheon. It rebuilds the same workload from the same seed (``_chains``), prints one JSON object on
stdout with its timings, its answers (for the caller's cross-check) and the workload's digest.

How Dynamo is fed, from Python: ``RadixTree.apply_event(worker_id, bytes)`` takes one JSON
``KvCacheEvent`` (``{"event_id", "data": {"stored": {"parent_hash", "blocks": [{"block_hash",
"tokens_hash"}]}} | {"removed": {"block_hashes"}} | "cleared"}``) with unsigned 64-bit hashes, and
``find_matches(hashes)`` walks the tree by each block's ``tokens_hash``. Every block id in these
workloads is unique to its position in its chain, so the chain's ids serve as both hashes: both
indexes are queried with the very same list of ids, and neither query hashes tokens.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _chains import CHAIN, digest, last_chains, prompt_chains, queries, rss_bytes, steps, unsigned
from dynamo.llm import RadixTree


def stored(event_id: int, ids: list[int], parent: int | None) -> bytes:
    blocks = [{"block_hash": unsigned(h), "tokens_hash": unsigned(h)} for h in ids]
    parent_hash = None if parent is None else unsigned(parent)
    data = {"stored": {"parent_hash": parent_hash, "blocks": blocks}}
    return json.dumps({"event_id": event_id, "data": data}).encode()


def removed(event_id: int, ids: list[int]) -> bytes:
    data = {"removed": {"block_hashes": [unsigned(h) for h in ids]}}
    return json.dumps({"event_id": event_id, "data": data}).encode()


def answer(tree: RadixTree, chain: list[int]) -> dict[int, int]:
    return {worker: depth for (worker, _rank), depth in tree.find_matches([unsigned(h) for h in chain]).scores.items()}


def query(args: argparse.Namespace) -> dict:
    tree, kept = RadixTree(), []
    for n, (worker, chain) in enumerate(prompt_chains(args.workers, args.blocks, args.seed)):
        tree.apply_event(worker, stored(n, chain, None))
        if len(kept) < 256:
            kept.append(chain)
    full, mixed = queries(kept, args.queries, args.seed)
    out: dict = {"digest": digest(kept)}
    for name, chains in (("full", full), ("mixed", mixed)):
        encoded = [[unsigned(h) for h in chain] for chain in chains]  # the ids as Dynamo takes them, untimed
        times, answers = [], []
        for hashes in encoded:
            start = time.perf_counter()
            scores = tree.find_matches(hashes).scores
            times.append((time.perf_counter() - start) * 1e6)
            answers.append(sorted((worker, depth) for (worker, _rank), depth in scores.items()))
        out[name] = {"us": times, "answers": answers}
    return out


def events(args: argparse.Namespace) -> Iterator[tuple[int, bytes]]:
    """The workload's steps as Dynamo events, in the order the wire carries them (removals first)."""
    event_id = 0
    for step in steps(args.workers, args.batches, args.stores, args.removes, args.seed):
        if args.wire == "coalesced":
            if step.removed:
                yield step.worker, removed(event_id, step.removed)
            yield step.worker, stored(event_id + 1, step.stored, None)
            event_id += 2
            continue
        for h in step.removed:
            yield step.worker, removed(event_id, [h])
            event_id += 1
        parent = None
        for h in step.stored:
            yield step.worker, stored(event_id, [h], parent)
            parent, event_id = h, event_id + 1


def ingest(args: argparse.Namespace) -> dict:
    workload = list(steps(args.workers, args.batches, args.stores, args.removes, args.seed))
    encoded = list(events(args))  # decoded by Dynamo inside apply_event: that is part of its ingest
    tree = RadixTree()
    start = time.perf_counter()
    for worker, event in encoded:
        tree.apply_event(worker, event)
    tree.find_matches([1])  # queued behind every event: a barrier
    seconds = time.perf_counter() - start
    probes = last_chains(workload)
    return {"seconds": seconds, "block_events": args.batches * (args.stores + args.removes), "calls": len(encoded),
            "answers": [sorted(answer(tree, chain).items()) for chain in probes],
            "digest": digest(s.stored + s.removed for s in workload)}


def memory(args: argparse.Namespace) -> dict:
    """RSS growth of this process while the tree takes ``blocks`` blocks, the events streamed.

    A dry pass first generates and encodes every event without applying it, so the interpreter's
    allocator already holds the memory those transient objects need; the measured pass regenerates
    the same events and applies them, and the RSS delta is then what the tree keeps (its own
    thread's allocations included: RSS is the whole process).
    """
    def chains() -> Iterator[tuple[int, bytes]]:
        for n, (worker, chain) in enumerate(prompt_chains(args.workers, args.blocks, args.seed)):
            yield worker, stored(n, chain, None)

    tree = RadixTree()
    tree.find_matches([1])  # the tree's thread is up before the baseline
    for _ in chains():
        pass
    gc.collect()
    before = rss_bytes()
    for worker, event in chains():
        tree.apply_event(worker, event)
    tree.find_matches([1])
    gc.collect()
    used = rss_bytes() - before
    held = (args.blocks // CHAIN) * CHAIN
    return {"bytes": used, "held": held}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("query", "ingest", "memory"))
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=8000)
    parser.add_argument("--stores", type=int, default=128)
    parser.add_argument("--removes", type=int, default=32)
    parser.add_argument("--wire", choices=("per-page", "coalesced"), default="per-page")
    args = parser.parse_args()
    print(json.dumps({"query": query, "ingest": ingest, "memory": memory}[args.mode](args)))


if __name__ == "__main__":
    main()
