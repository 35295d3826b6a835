"""Routing policies: pick a worker for a token list and say why (``<policy>:<reason>``)."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence

from cacheon.gateway.hashing import page_hashes
from cacheon.gateway.index import BlockIndex
from cacheon.gateway.workers import READY, Worker

Decision = tuple[Worker, str, int]  # worker, reason, matched blocks (prefix policies)


def least_loaded(workers: Sequence[Worker]) -> Worker:
    return min(workers, key=lambda w: w.in_flight)


def _bounded(workers: Sequence[Worker], epsilon: float) -> set[str]:
    """Ids of workers within (1+ε)× the mean in-flight load (a floor of 1 keeps idle pools open)."""
    mean = sum(w.in_flight for w in workers) / len(workers)
    return {w.id for w in workers if w.in_flight <= (1 + epsilon) * max(mean, 1.0)}


def _best(depths: dict[str, int], workers: Sequence[Worker], epsilon: float, min_depth: int) -> Decision:
    """Deepest match among workers under the load bound, ties by least load; else least loaded."""
    allowed = _bounded(workers, epsilon)
    hits = [w for w in workers if depths.get(w.id, 0) >= min_depth]
    if not hits:
        return least_loaded(workers), "fallback_miss" if not depths else "fallback_shallow", 0
    fit = [w for w in hits if w.id in allowed]
    if not fit:
        return least_loaded([w for w in workers if w.id in allowed] or workers), "fallback_overload", 0
    best = min(fit, key=lambda w: (-depths[w.id], w.in_flight))
    return best, "prefix_hit", depths[best.id]


class RoundRobin:
    name = "rr"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, workers: Sequence[Worker], tokens: Sequence[int] | None) -> Decision:
        return workers[next(self._turn) % len(workers)], "round_robin", 0


class Exact:
    """Longest cached prefix from the KV index, on attested (READY) workers only."""

    name = "exact"

    def __init__(self, index: BlockIndex, epsilon: float, min_prefix_blocks: int) -> None:
        self.index, self.epsilon, self.min_depth = index, epsilon, min_prefix_blocks

    def choose(self, workers: Sequence[Worker], tokens: Sequence[int] | None) -> Decision:
        ready = [w for w in workers if w.state == READY and w.discovery is not None]
        if not ready or tokens is None:
            return least_loaded(workers), "fallback_not_ready", 0
        # One hash chain and one index query per page size in the pool (usually one).
        by_size: dict[int, set[str]] = {}
        for w in ready:
            by_size.setdefault(w.discovery.page_size, set()).add(w.id)  # type: ignore[union-attr]
        depths: dict[str, int] = {}
        for size, ids in by_size.items():
            for (source, _rank), depth in self.index.longest_prefix(page_hashes(tokens, size)).items():
                if source in ids and depth > depths.get(source, 0):
                    depths[source] = depth
        return _best(depths, ready, self.epsilon, self.min_depth)


class Approx:
    """For workers without KV events: a trie of the token prefixes routed to each worker.

    Nodes are chunks of ``chunk`` tokens keyed by their chain (parent key, chunk), so a lookup
    walks the prompt once; the whole trie is LRU-bounded to ``max_entries`` nodes, like the
    cache-aware policy of SGLang's own router (which keeps a character tree per worker).
    """

    name = "approx"

    def __init__(self, epsilon: float, min_prefix_blocks: int, max_entries: int, chunk: int = 16) -> None:
        self.epsilon, self.min_depth, self.max_entries, self.chunk = epsilon, min_prefix_blocks, max_entries, chunk
        self._nodes: OrderedDict[int, set[str]] = OrderedDict()

    def _keys(self, tokens: Sequence[int]) -> list[int]:
        keys, key = [], 0
        for start in range(0, len(tokens) - len(tokens) % self.chunk, self.chunk):
            key = hash((key, tuple(tokens[start : start + self.chunk])))
            keys.append(key)
        return keys

    def choose(self, workers: Sequence[Worker], tokens: Sequence[int] | None) -> Decision:
        if tokens is None:
            return least_loaded(workers), "fallback_miss", 0
        keys = self._keys(tokens)
        depths: dict[str, int] = {}
        alive = {w.id for w in workers}
        for depth, key in enumerate(keys, 1):
            holders = self._nodes.get(key)
            if not holders or not holders & alive:
                break
            self._nodes.move_to_end(key)
            for wid in holders & alive:
                depths[wid] = depth
            alive &= holders
        worker, reason, depth = _best(depths, workers, self.epsilon, self.min_depth)
        for key in keys:
            self._nodes.setdefault(key, set()).add(worker.id)
            self._nodes.move_to_end(key)
        while len(self._nodes) > self.max_entries:
            self._nodes.popitem(last=False)
        return worker, reason, depth

    def forget(self, worker_id: str) -> None:
        for holders in self._nodes.values():
            holders.discard(worker_id)
