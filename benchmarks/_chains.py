"""The KV benchmarks' workloads as plain data, from a seed, and the RSS probe: standard library only.

Both sides of a peer comparison build from here: the Cacheon index in the project's venv and
Dynamo's ``RadixTree`` in its own venv (``benchmarks/peers/dynamo_tree.py``), so the same seed
gives both the same chains, queries and events, and ``digest`` proves it.

Block ids are SGLang's: signed 64-bit. Dynamo takes them unsigned (``unsigned``).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

CHAIN = 512  # blocks per prompt chain


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.getrandbits(64) - (1 << 63) for _ in range(n)]


def unsigned(block_id: int) -> int:
    return block_id & 0xFFFF_FFFF_FFFF_FFFF


def prompt_chains(workers: int, blocks: int, seed: int) -> Iterator[tuple[int, list[int]]]:
    """``blocks`` ids over ``workers`` as (worker, 512-block prompt chain), chain n on worker n mod workers;
    every fourth chain shares its first half with the one before (a common system prompt)."""
    rng = random.Random(seed)
    previous: list[int] = []
    for n in range(blocks // CHAIN):
        chain = random_ids(rng, CHAIN)
        if n % 4 == 3:
            chain[: CHAIN // 2] = previous[: CHAIN // 2]
        yield n % workers, chain
        previous = chain


def queries(chains: list[list[int]], count: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """``full``: stored chains, the worst case (every block held); ``mixed``: a third full, a third
    diverging at a random depth, a third missing at once. Their own random stream: ids drawn from the
    chains' stream would repeat stored ids, and mid-chain ids at a query's head are no real prompt."""
    rng = random.Random(f"queries/{seed}")
    full = [chains[q % len(chains)] for q in range(count)]
    mixed = []
    for q in range(count):
        cut = [CHAIN, rng.randrange(1, CHAIN), 0][q % 3]
        mixed.append(chains[q % len(chains)][:cut] + random_ids(rng, CHAIN - cut))
    return full, mixed


@dataclass(frozen=True)
class Step:
    """One scheduler step of one worker: a fresh prefill's pages (a chain from no parent), and the
    evicted pages: the leaf end of the chain this worker stored in its previous step, as SGLang's
    radix cache evicts leaves first."""

    worker: int
    stored: list[int]
    removed: list[int]


def steps(workers: int, batches: int, stores: int, removes: int, seed: int) -> Iterator[Step]:
    rng = random.Random(seed)
    last: dict[int, list[int]] = {}
    for b in range(batches):
        worker = b % workers
        stored = random_ids(rng, stores)
        previous = last.get(worker, [])
        yield Step(worker, stored, previous[: len(previous) - removes - 1 : -1] if previous else [])
        last[worker] = stored


def digest(parts: Iterable[Iterable[int]]) -> str:
    """A short digest of id sequences: two processes that built the same workload print the same one."""
    h = hashlib.sha256()
    for part in parts:
        h.update(b"|".join(b"%d" % x for x in part))
        h.update(b";")
    return h.hexdigest()[:16]


def last_chains(workload: Iterable[Step], per_worker: int = 2) -> list[list[int]]:
    """Each worker's last ``per_worker`` stored chains, by worker: after ingest, the last is held whole
    and the one before it less its evicted leaves. What both indexes are asked to cross-check ingest."""
    seen: dict[int, list[list[int]]] = {}
    for step in workload:
        seen.setdefault(step.worker, []).append(step.stored)
        del seen[step.worker][:-per_worker]
    return [chain for _, chains in sorted(seen.items()) for chain in chains]


def rss_bytes() -> int:
    """This process's resident set now (Linux), the measure both sides of the memory comparison use."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
