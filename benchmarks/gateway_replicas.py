"""What replicas do not share costs: one exact gateway vs two replicas behind an alternating client.

Replicas share the KV index (each subscribes to every worker's publisher, so they hold the same
blocks) but not the in-flight load: each knows only its own requests in flight, so the load bound
and least-loaded ties see half the picture. Same run, same trace (the demo's chat-with-a-document
sessions, shared system prompts), fresh simulated workers per configuration; reports the workers'
prefix-cache hit rate and max/mean requests per worker, with ranges over ``--runs``.

    python benchmarks/gateway_replicas.py [--workers 4] [--sessions 24] [--turns 4] [--runs 3]
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

from cacheon.sim.demo import conversations, replay
from cacheon.sim.launch import GatewayProcess, SimProcess
from cacheon.sim.tokenizer import write_profile

PAGE, DELAY_MS = 4, 50


def measure(replicas: int, workers: int, sessions: list, tmp: Path, profile: tuple[Path, Path]) -> tuple[float, float]:
    with ExitStack() as stack:
        sims = [SimProcess(stack, tmp, profile, "0.5.13.post1", page_size=PAGE, delay_ms=DELAY_MS, replay=True)
                for _ in range(workers)]
        for s in sims:
            s.ready()
        urls = [s.url for s in sims]
        gateways = [GatewayProcess(stack, tmp, profile, "exact", [{"url": u} for u in urls]) for _ in range(replicas)]
        for gw in gateways:
            gw.settled(urls)
        served = replay([gw.url for gw in gateways], sessions)
        load = Counter(r.worker for r in served)
        counts = [load.get(u, 0) for u in urls]
        hit = sum(r.cached_tokens for r in served) / max(sum(r.prompt_tokens for r in served), 1)
        return hit, max(counts) / (sum(counts) / len(counts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    sessions = conversations(args.sessions, args.turns)
    results: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        profile = write_profile(Path(tmp) / "tok")
        for run in range(args.runs):
            for replicas in (1, 2) if run % 2 == 0 else (2, 1):  # alternate the order between runs
                results[replicas].append(measure(replicas, args.workers, sessions, Path(tmp), profile))
                hit, spread = results[replicas][-1]
                print(f"run {run}: {replicas} gateway(s): hit rate {hit:.3f}, max/mean load {spread:.2f}", flush=True)
    print(f"\n{args.workers} workers, {args.sessions} sessions x {args.turns} turns, page {PAGE}, "
          f"{DELAY_MS} ms/request, {args.runs} runs (exact policy)")
    print(f"{'':<22}{'hit rate':>16}{'max/mean load':>18}")
    for replicas, rows in results.items():
        hits, spreads = [h for h, _ in rows], [s for _, s in rows]
        label = "one gateway" if replicas == 1 else "two replicas (alt.)"
        print(f"{label:<22}{min(hits):>8.3f}-{max(hits):.3f}{min(spreads):>12.2f}-{max(spreads):.2f}")


if __name__ == "__main__":
    main()
