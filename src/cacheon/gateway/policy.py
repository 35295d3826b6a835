"""Routing policies: pick a worker for a token list and say why (``<policy>:<reason>``)."""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple, Protocol

from cacheon.gateway.config import GatewayConfig
from cacheon.gateway.prediction import NoPrediction, Reuse, chain_prior
from cacheon.gateway.workers import Worker, WorkerState
from cacheon.kv.feed import Source
from cacheon.kv.index import PrefixIndex
from cacheon.tokens.chains import ChainCache


class RouteReason(StrEnum):
    ROUND_ROBIN = "round_robin"
    PREFIX_HIT = "prefix_hit"
    FALLBACK_MISS = "fallback_miss"
    FALLBACK_SHALLOW = "fallback_shallow"
    FALLBACK_OVERLOAD = "fallback_overload"
    FALLBACK_NOT_READY = "fallback_not_ready"
    RETRY = "retry"  # the proxy's, after a worker failed


class Decision(NamedTuple):
    worker: Worker
    reason: RouteReason
    held: int  # prompt tokens the chosen worker holds (prefix policies)
    # ``held`` is the worker's cached tokens as its engine will report them (exact, READY workers)
    predicted: bool = False
    refused: NoPrediction | None = None  # why nothing was predicted for this request on this worker


class Policy(Protocol):
    """What the proxy asks of a routing policy and the fleet tells it."""

    name: str
    tokenizes: bool  # whether ``choose`` uses the prompt's tokens (the proxy skips tokenizing otherwise)
    attests: bool  # whether it routes on KV events, so workers must climb the attestation ladder

    def choose(self, workers: Sequence[Worker], tokens: Sequence[int] | None,
               reuse: Reuse | None = None) -> Decision: ...

    def forget(self, worker_id: str) -> None:
        """A worker left the pool: drop what the policy keeps about it."""


def least_loaded(workers: Sequence[Worker], turn: int = 0) -> Worker:
    """Fewest in flight; ties rotate with ``turn``, or a burst that finds every worker idle lands on one."""
    n = len(workers)
    return workers[min(range(n), key=lambda i: (workers[i].in_flight, (i - turn) % n))]


def _bounded(workers: Sequence[Worker], epsilon: float) -> set[str]:
    """Ids of workers within (1+ε)× the mean in-flight load (a floor of 1 keeps idle pools open)."""
    mean = sum(w.in_flight for w in workers) / len(workers)
    return {w.id for w in workers if w.in_flight <= (1 + epsilon) * max(mean, 1.0)}


class Prefix:
    """The choice shared by the prefix policies, given how much of the prompt each worker holds.

    A match counts only when it covers ``min_match_ratio`` of the prompt's whole units (blocks,
    chunks) and at least ``min_units``: routing a new conversation to whoever holds its short
    system prompt would pile new sessions onto one worker for little gain, the reason SGLang's
    own router has a cache threshold. Among counted matches under the load bound the deepest
    wins (ties: lower load); otherwise the least-loaded worker.
    """

    def __init__(self, epsilon: float, min_units: int, min_match_ratio: float) -> None:
        self.epsilon, self.min_units, self.min_match_ratio = epsilon, min_units, min_match_ratio
        self._turns = itertools.count()

    def needed(self, units: int) -> int:
        """Units a match must cover for a prompt of ``units`` whole units."""
        return max(self.min_units, math.ceil(self.min_match_ratio * units))

    def pick(self, workers: Sequence[Worker], held: dict[str, int], counted: set[str]) -> Decision:
        """``held``: prompt tokens each matching worker holds; ``counted``: those deep enough."""
        turn = next(self._turns)
        if not counted:
            reason = RouteReason.FALLBACK_SHALLOW if held else RouteReason.FALLBACK_MISS
            return Decision(least_loaded(workers, turn), reason, 0)
        allowed = _bounded(workers, self.epsilon)
        fit = [w for w in workers if w.id in counted and w.id in allowed]
        if not fit:
            bounded = [w for w in workers if w.id in allowed] or workers
            return Decision(least_loaded(bounded, turn), RouteReason.FALLBACK_OVERLOAD, 0)
        best = min(fit, key=lambda w: (-held[w.id], w.in_flight))
        return Decision(best, RouteReason.PREFIX_HIT, held[best.id])

    def forget(self, worker_id: str) -> None:
        return None


class RoundRobin:
    name = "rr"
    tokenizes = attests = False

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, workers: Sequence[Worker], tokens: Sequence[int] | None,
               reuse: Reuse | None = None) -> Decision:
        return Decision(workers[next(self._turn) % len(workers)], RouteReason.ROUND_ROBIN, 0)

    def forget(self, worker_id: str) -> None:
        return None


class Exact(Prefix):
    """Longest cached prefix from the KV index, on attested (READY) workers only."""

    name = "exact"
    tokenizes = attests = True

    def __init__(self, index: PrefixIndex[Source], chains: ChainCache, epsilon: float, min_prefix_blocks: int,
                 min_match_ratio: float) -> None:
        super().__init__(epsilon, min_prefix_blocks, min_match_ratio)
        self.index, self.chains = index, chains

    def choose(self, workers: Sequence[Worker], tokens: Sequence[int] | None,
               reuse: Reuse | None = None) -> Decision:
        """``reuse``: the engine's cap on what it reuses of this prompt and its namespace (none: all of it)."""
        ready = [(w, w.discovery) for w in workers if w.state == WorkerState.READY and w.discovery is not None]
        if not ready or tokens is None:
            return Decision(least_loaded(workers, next(self._turns)), RouteReason.FALLBACK_NOT_READY, 0)
        reuse = reuse or Reuse(len(tokens))
        # One hash chain and one index query per (page size, chain seed) in the pool (usually one).
        groups: dict[tuple[int, bytes], set[str]] = {}
        refused: dict[str, NoPrediction] = {}
        for w, found in ready:
            prior = chain_prior(w.contract_id or "", reuse)
            if isinstance(prior, NoPrediction):
                refused[w.id] = prior
            else:
                groups.setdefault((found.page_size, prior), set()).add(w.id)
        held: dict[str, int] = {}
        counted: set[str] = set()
        for (size, prior), ids in groups.items():
            needed = self.needed(len(tokens) // size)
            chain = self.chains.chain(tokens, size, prior)[: reuse.limit // size]
            for (source, _rank), depth in self.index.longest_prefix(chain).items():
                if source in ids and depth * size > held.get(source, 0):
                    held[source] = depth * size
                    if depth >= needed:
                        counted.add(source)
        chosen = self.pick([w for w, _ in ready], held, counted)
        wid = chosen.worker.id
        return chosen._replace(held=held.get(wid, 0), predicted=wid not in refused, refused=refused.get(wid))


class Approx(Prefix):
    """For workers without KV events: a trie of the token prefixes routed to each worker.

    Nodes are chunks of ``chunk`` tokens keyed by their chain (parent key, chunk), so a lookup
    walks the prompt once; the whole trie is LRU-bounded to ``max_entries`` nodes, like the
    cache-aware policy of SGLang's own router (which keeps a character tree per worker).
    """

    name = "approx"
    tokenizes = True
    attests = False

    def __init__(self, epsilon: float, min_prefix_blocks: int, min_match_ratio: float, max_entries: int,
                 chunk: int = 16) -> None:
        super().__init__(epsilon, min_prefix_blocks, min_match_ratio)
        self.max_entries, self.chunk = max_entries, chunk
        self._nodes: OrderedDict[int, set[str]] = OrderedDict()

    def _keys(self, tokens: Sequence[int]) -> list[int]:
        keys, key = [], 0
        for start in range(0, len(tokens) - len(tokens) % self.chunk, self.chunk):
            key = hash((key, tuple(tokens[start : start + self.chunk])))
            keys.append(key)
        return keys

    def choose(self, workers: Sequence[Worker], tokens: Sequence[int] | None,
               reuse: Reuse | None = None) -> Decision:
        if tokens is None:
            return Decision(least_loaded(workers, next(self._turns)), RouteReason.FALLBACK_MISS, 0)
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
        needed = self.needed(len(keys))
        decision = self.pick(workers, {w: d * self.chunk for w, d in depths.items()},
                             {w for w, d in depths.items() if d >= needed})
        for key in keys:
            self._nodes.setdefault(key, set()).add(decision.worker.id)
            self._nodes.move_to_end(key)
        while len(self._nodes) > self.max_entries:
            self._nodes.popitem(last=False)
        return decision

    def forget(self, worker_id: str) -> None:
        for holders in self._nodes.values():
            holders.discard(worker_id)


def make_policy(cfg: GatewayConfig, index: PrefixIndex[Source], chains: ChainCache) -> Policy:
    """The configured policy, with the gateway's index and chain cache."""
    if cfg.policy == "rr":
        return RoundRobin()
    if cfg.policy == "exact":
        return Exact(index, chains, cfg.load_epsilon, cfg.min_prefix_blocks, cfg.min_match_ratio)
    return Approx(cfg.load_epsilon, cfg.min_prefix_blocks, cfg.min_match_ratio, cfg.approx_max_entries)
