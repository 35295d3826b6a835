"""Ingest: decode + index of SGLang KV-event batches, block events/s on one core, as a ratio to a
raw ``msgspec.msgpack.decode`` of the same bytes in the same run.

Workload: every release shape, one scheduler step per batch (a 2048-token prefill = 128 pages of
16 tokens, plus 32 evicted pages), 64 workers, each bounded to 16k blocks (~1M indexed).
``per-page`` is 0.5.13.post1's wire (one BlockStored per page, tagged arrays); ``coalesced`` is
0.5.23's (consecutive pages merged into one event, tagged maps).

    python benchmarks/kv_ingest.py [--batches N]
"""

from __future__ import annotations

import argparse
import time

import msgspec
import numpy as np
from _kv import random_ids

from cacheon.kv.contracts import for_version
from cacheon.kv.index import BlockIndex
from cacheon.kv.wire import WireDecoder, operations

WORKERS, STORES, REMOVES, PAGE = 64, 128, 32, 16


def payloads(version: str, batches: int, rng: np.random.Generator) -> tuple[list[bytes], int]:
    """Encoded batches shaped as ``version`` publishes them, and their block-event count."""
    maps = for_version(version).encoding == "tagged-map"
    out, previous = [], random_ids(rng, REMOVES)
    for _ in range(batches):
        ids = random_ids(rng, STORES)
        tokens = rng.integers(0, 150_000, size=STORES * PAGE).tolist()
        if maps:  # coalesced: one store, one removal per step
            events = [
                {"type": "BlockRemoved", "block_hashes": previous[:REMOVES], "medium": "GPU"},
                {
                    "type": "BlockStored",
                    "block_hashes": ids,
                    "parent_block_hash": None,
                    "token_ids": tokens,
                    "block_size": PAGE,
                    "lora_id": None,
                    "medium": "GPU",
                },
            ]
        else:  # one event per page
            events = [["BlockRemoved", [h], "GPU"] for h in previous[:REMOVES]]
            parent = None
            for i, h in enumerate(ids):
                events.append(["BlockStored", [h], parent, tokens[i * PAGE : (i + 1) * PAGE], PAGE, None, "GPU"])
                parent = h
        out.append(msgspec.msgpack.encode([time.time(), events, 0]))
        previous = ids
    return out, batches * (STORES + REMOVES)


def best_times(repeats: int, *fns) -> list[float]:
    """The fastest of ``repeats`` runs of each function, interleaved so both see the same load."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'wire':<28}{'block events/s':>16}{'raw decode/s':>16}{'ratio':>8}")
    for version, label in (("0.5.13.post1", "per-page (0.5.13.post1)"), ("0.5.23", "coalesced (0.5.23)")):
        data, block_events = payloads(version, args.batches, rng)
        decoder = WireDecoder(for_version(version))

        def raw(data: list[bytes] = data) -> None:
            decode = msgspec.msgpack.decode
            for p in data:
                decode(p)

        def ingest(data: list[bytes] = data, decoder: WireDecoder = decoder) -> None:
            index = BlockIndex(capacity_per_source=16_384)
            for i, p in enumerate(data):
                index.apply(("w", i % WORKERS), operations(decoder.decode(p, 0).events)[0])

        raw_s, ingest_s = best_times(5, raw, ingest)
        print(f"{label:<28}{block_events / ingest_s:>16,.0f}{block_events / raw_s:>16,.0f}{raw_s / ingest_s:>8.2f}")


if __name__ == "__main__":
    main()
