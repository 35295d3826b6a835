"""Routing policies: pick a worker for a token list and say why (``<policy>:<reason>``).

A policy sees each worker as a ``Candidate``, a frozen copy taken when the request is routed: it
cannot change a worker, and what it reads cannot change under it. Policies are chosen by name from
``POLICIES``.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

from cacheon.gateway.config import GatewayConfig
from cacheon.gateway.prediction import NoPrediction, Reuse, chain_prior
from cacheon.gateway.workers import Discovery, Worker, WorkerState
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


class Candidate(NamedTuple):
    """One worker as a policy sees it when a request is routed (a tuple: cheaper to make than a frozen
    dataclass, measured ~110 µs against ~30 µs for 64 workers on a loaded 2-core box)."""

    id: str
    in_flight: int = 0
    state: WorkerState = WorkerState.PENDING
    discovery: Discovery | None = None
    contract_id: str | None = None


def snapshot(workers: Iterable[Worker], new: Callable[..., Any] = tuple.__new__) -> list[Candidate]:
    """Each worker as a ``Candidate`` now (``tuple.__new__`` skips the generated constructor's Python
    frame: a third of the cost, paid for every worker on every request)."""
    return [new(Candidate, (w.id, w.in_flight, w.state, w.discovery, w.contract_id)) for w in workers]


class Decision(NamedTuple):
    worker: Candidate
    reason: RouteReason
    held: int  # prompt tokens the chosen worker holds (prefix policies)
    ticket: Any = None  # what the policy keeps about this request until ``released`` (exact's ``InFlight``)
    # ``held`` is the worker's cached tokens as its engine will report them (exact, READY workers)
    predicted: bool = False
    refused: NoPrediction | None = None  # why nothing was predicted for this request on this worker


class Policy(Protocol):
    """What the proxy asks of a routing policy and the fleet tells it."""

    name: str
    tokenizes: bool  # whether ``choose`` uses the prompt's tokens (the proxy skips tokenizing otherwise)
    attests: bool  # whether it routes on KV events, so workers must climb the attestation ladder

    def choose(self, workers: Sequence[Candidate], tokens: Sequence[int] | None,
               reuse: Reuse | None = None) -> Decision: ...

    def released(self, decision: Decision) -> None:
        """The request ``decision`` routed has ended (answered, failed, or the client left)."""

    def forget(self, worker_id: str) -> None:
        """A worker left the pool: drop what the policy keeps about it."""


def least_loaded(workers: Sequence[Candidate], turn: int = 0) -> Candidate:
    """Fewest in flight; ties rotate with ``turn``, or a burst that finds every worker idle lands on one."""
    n = len(workers)
    return workers[min(range(n), key=lambda i: (workers[i].in_flight, (i - turn) % n))]


def _bounded(workers: Sequence[Candidate], epsilon: float) -> set[str]:
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

    def pick(self, workers: Sequence[Candidate], held: dict[str, int], counted: set[str]) -> Decision:
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

    def released(self, decision: Decision) -> None:
        return None

    def forget(self, worker_id: str) -> None:
        return None


class RoundRobin:
    name = "rr"
    tokenizes = attests = False

    def __init__(self) -> None:
        self._turn = itertools.count()

    def choose(self, workers: Sequence[Candidate], tokens: Sequence[int] | None,
               reuse: Reuse | None = None) -> Decision:
        return Decision(workers[next(self._turn) % len(workers)], RouteReason.ROUND_ROBIN, 0)

    def released(self, decision: Decision) -> None:
        return None

    def forget(self, worker_id: str) -> None:
        return None


class InFlight:
    """A request exact routed and has not seen end: its prompt's chain, the prefill it costs, when it should end.

    Until the worker's KV events show the chain's last block (its prefill is over), the request
    counts as prefill queued on that worker, and its chain as held there (the in-flight overlay).
    """

    __slots__ = ("chain", "page", "prefilling", "routed", "slotted", "uncached", "work", "worker")

    def __init__(self, worker: str, chain: list[int], page: int, uncached: int, work: int, routed: float,
                 slotted: bool) -> None:
        self.worker, self.chain, self.page, self.uncached, self.work = worker, chain, page, uncached, work
        self.routed, self.slotted = routed, slotted  # slotted: a sequence slot was free when it was routed
        self.prefilling = bool(uncached and chain)

    def shared(self, chain: Sequence[int]) -> int:
        """Leading blocks ``chain`` shares with this request's chain: a bisection, since two hash
        chains that agree at a block agree on every block before it."""
        mine = self.chain
        n = min(len(mine), len(chain))
        if not n or mine[0] != chain[0]:
            return 0
        if mine[n - 1] == chain[n - 1]:
            return n
        lo, hi = 0, n - 1  # equal at lo, different at hi
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if mine[mid] == chain[mid]:
                lo = mid
            else:
                hi = mid
        return hi


class FleetLoad(Protocol):
    """The other gateway replicas' requests in flight, kept as ``InFlight`` (``cacheon.fleet.load``)."""

    def routed(self, ticket: InFlight) -> None: ...

    def ended(self, ticket: InFlight) -> None: ...

    def flying(self, worker: str) -> list[InFlight]: ...

    def staleness(self) -> tuple[int, float]: ...


class RunTimes:
    """How long a request runs, as a line in its prefill work, learned from the requests routed.

    A request that found a sequence slot free runs for the prefill queued ahead of it plus its
    own (its work, in tokens), then its decode: lifetime = a + b × work, b the time of a prefill
    token and a the decode. A least-squares line over the ended requests that had a free slot
    (recent ones weigh more) gives both; there is none until it can be fitted (too few requests,
    all with the same work) and while its slope is uncertain: the slope's standard error must be
    within ``max_slope_error`` of it. The slot wait divides a time by b, so a slope fitted from a
    burst's first few noisy ends (the gateway's own estimate of the work queued ahead is one of
    them) made a holder's queue look up to twice as long as it was, and sent its prefix elsewhere
    (benchmarks/README.md, issue 22: after ``forks``' first wave b came out at 26-35 µs against the simulator's 50).
    """

    def __init__(self, decay: float = 0.98, min_samples: int = 8, max_slope_error: float = 0.2) -> None:
        self.decay, self.min_samples, self.max_slope_error = decay, min_samples, max_slope_error
        self.samples = 0
        self._w = self._ww = self._x = self._xx = self._y = self._xy = self._yy = 0.0

    def add(self, work: int, lifetime: float) -> None:
        d = self.decay
        self._w, self._ww, self._x = d * self._w + 1, d * d * self._ww + 1, d * self._x + work
        self._xx, self._y = d * self._xx + work * work, d * self._y + lifetime
        self._xy, self._yy = d * self._xy + work * lifetime, d * self._yy + lifetime * lifetime
        self.samples += 1

    def line(self) -> tuple[float, float] | None:
        """(a, b): seconds of decode, seconds per prefill token; None until fitted well enough."""
        w = self._w
        sxx = self._xx - self._x * self._x / w if w else 0.0
        if self.samples < self.min_samples or sxx <= 1e-9 * self._xx:
            return None
        sxy, syy = self._xy - self._x * self._y / w, self._yy - self._y * self._y / w
        b = sxy / sxx
        a = (self._y - b * self._x) / w
        freedom = w * w / self._ww - 2  # the weighted samples' effective count, less the line's two
        if a <= 0 or b <= 0 or freedom <= 0:
            return None
        residual = max(0.0, syy - b * sxy) / freedom
        return (a, b) if residual / sxx <= (self.max_slope_error * b) ** 2 else None


class Exact:
    """Lowest expected time to first token, from the KV index, on attested (READY) workers only.

    The expected TTFT on worker w, in prefill tokens (prefill is compute-bound, its time follows
    the tokens not cached), is what w's two queues make a request wait plus its own prefill:

    - the prefill queued on w: requests routed there whose KV events have not come yet (their
      uncached tokens);
    - a sequence slot: when w runs as many requests as its scheduler allows (``max_running`` ×
      DP ranks, from discovery; unknown means no bound), the next one waits until the earliest
      of them ends, expected from the line ``RunTimes`` fits (before it can: each waiting
      position costs a slot's share of one mean prompt);
    - its own prefill: the prompt less the longest prefix w holds;
    - the decode the worker already runs: ``decode_weight`` × the share of its slots in use × the
      mean prompt. An engine's decode steps slow as its batch grows, and prefill waits between
      them (Dynamo's router weighs a worker's active blocks the same way); without a known slot
      bound there is no share to weigh.

    One more term keeps a prefix where it is until a copy is needed: prefilling again a prefix that the
    deepest holder has costs ``private_weight`` × its tokens, not once, since the copy delays whoever
    queues behind it there and serves no one else. That holds for a conversation's own history (no
    request in flight shares it) and for a hot prefix (an application's system prompt, a tree's root:
    requests in flight share it) while its holders have a sequence slot for each request in flight
    that shares it; as those requests outnumber the holders' slots the weight falls toward 1 (a copy
    on a less busy worker spreads the demand, at its plain cost). Copying a hot prefix at its plain
    cost whenever a holder had a queue (``spread_by_demand=False``, exact before issue 22) lost
    0.02-0.05 of hit rate on a shared system prompt and 0.06-0.10 on forks, with TTFT p99 in the
    same range (benchmarks/README.md).

    No fixed load bound: the worker holding the prompt wins until its queues cost more than the
    prefill it saves. A prefix counts as held when the index says so, or when a request in flight
    on w shares it (the in-flight overlay: its events are still coming, so a burst of siblings
    follows it). Ties go to the deeper cache, then rotate.

    Replicas sharing load (``fleet_load``) hear each other's decisions late (the plane's delay), so a
    worker's cost here misses whatever the peers routed there within that delay. Costs closer to the
    best than that unseen prefill (``_unseen_margin``) are a tie: among them, at the best's depth, the
    worker with the fewest of this replica's own requests wins. Steering by a partial view of the
    peers made replicas in a burst herd onto the same workers (1.22–1.33× one gateway's TTFT p99,
    benchmarks/README.md); each replica even on its own is even in sum.
    """

    name = "exact"
    tokenizes = attests = True

    def __init__(self, index: PrefixIndex[Source], chains: ChainCache, *, private_weight: float = 3.0,
                 decode_weight: float = 0.25, overlay: bool = True, spread_by_demand: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.index, self.chains, self.overlay, self.clock = index, chains, overlay, clock
        self.spread_by_demand = spread_by_demand  # off: a hot prefix's copy at its plain cost (an ablation)
        self.private_weight, self.decode_weight = private_weight, decode_weight
        self.runtimes = RunTimes()
        self.mean_prompt = self.mean_uncached = 0.0  # moving averages of prompt and prefill tokens
        self._recent: deque[float] = deque()  # this replica's decisions within the fleet's load delay
        self._turns = itertools.count()
        self._flying: dict[str, list[InFlight]] = {}  # worker -> the requests routed there, not yet released
        self.fleet_load: FleetLoad | None = None  # the other replicas' requests, counted beside this one's

    def choose(self, workers: Sequence[Candidate], tokens: Sequence[int] | None,
               reuse: Reuse | None = None) -> Decision:
        """``reuse``: the engine's cap on what it reuses of this prompt and its namespace (none: all of it)."""
        ready = [(w, w.discovery) for w in workers if w.state == WorkerState.READY and w.discovery is not None]
        if not ready or tokens is None:
            return Decision(least_loaded(workers, next(self._turns)), RouteReason.FALLBACK_NOT_READY, 0)
        reuse = reuse or Reuse(len(tokens))
        n, now = len(tokens), self.clock()
        self.mean_prompt += (n - self.mean_prompt) * (0.02 if self.mean_prompt else 1.0)
        # One hash chain per (page size, chain seed) in the pool (usually one), and one index query of
        # it cut at what the engine may reuse; a worker is credited only with its own group's match.
        groups: dict[str, tuple[int, bytes]] = {}
        refused: dict[str, NoPrediction] = {}
        for w, found in ready:
            prior = chain_prior(w.contract_id or "", reuse)
            if isinstance(prior, NoPrediction):
                refused[w.id] = prior
            else:
                groups[w.id] = (found.page_size, prior)
        chains: dict[tuple[int, bytes], list[int]] = {}  # the whole prompt's chain (the in-flight ticket's)
        usable: dict[tuple[int, bytes], list[int]] = {}  # cut at the engine's reuse limit
        held: dict[str, int] = {}
        for group in dict.fromkeys(groups.values()):
            size, prior = group
            chain = chains[group] = self.chains.chain(tokens, size, prior)
            cut = usable[group] = chain[: reuse.limit // size]
            for (source, _rank), depth in self.index.longest_prefix(cut).items():
                if groups.get(source) == group:
                    held[source] = max(held.get(source, 0), depth * size)
        line = self.runtimes.line()
        # Per worker: the prefix it holds (index, or in-flight overlay), prefill queued, slot wait.
        views: list[tuple[Candidate, int, int, float, float, int]] = []
        commons: list[int] = []  # per request in flight, the prefix of this prompt it shares
        for w, found in ready:
            have, queued, wait = held.get(w.id, 0), 0, 0.0
            flying: Sequence[InFlight] = self._flying.get(w.id, ())
            in_flight = w.in_flight
            if self.fleet_load is not None and (remote := self.fleet_load.flying(w.id)):
                flying, in_flight = [*flying, *remote], in_flight + len(remote)
            if flying:
                queued = self._queued(w.id, flying)
                cut = usable.get(groups.get(w.id, (0, b"")), [])
                common = [(p.shared(cut) * p.page, p.prefilling) for p in flying if p.page == found.page_size]
                commons += [c for c, _ in common]
                if self.overlay:
                    have = max(have, max((c for c, prefilling in common if prefilling), default=0))
            slots = found.max_running * found.dp_size if found.max_running else 0
            busy = 0.0
            if slots:
                busy = self.decode_weight * min(in_flight, slots) / slots * self.mean_prompt
                if in_flight >= slots:
                    wait = self._slot_wait(flying, in_flight - slots + 1, slots, now, line)
            views.append((w, have, queued, wait, busy, slots))
        deepest = max(view[1] for view in views)
        hot = min(deepest, max(commons, default=0))  # what requests in flight share of the deepest match
        spread_weight = self._spread_weight(hot, commons, views)
        turn = next(self._turns)
        keys: list[tuple[float, int, int, int]] = []  # (cost, -held, rotation, view): ties go to the deeper cache
        for i, (_w, have, queued, wait, busy, _slots) in enumerate(views):
            copied = max(0, deepest - max(have, hot))  # a private prefix prefilled again, here
            spread = max(0, hot - have)  # a hot one
            cost = (queued + wait + busy + (n - have) + (self.private_weight - 1) * copied
                    + (spread_weight - 1) * spread)
            keys.append((cost, -have, (i - turn) % len(ready), i))
        best = min(keys)
        if margin := self._unseen_margin(now):
            # Costs within the margin of the best differ by less than the peers' decisions not seen yet:
            # spread this replica's own requests among them (each replica even on its own is even in
            # sum), never away from the depth the best holds.
            best = min((k for k in keys if k[1] == best[1] and k[0] <= best[0] + margin),
                       key=lambda k: (views[k[3]][0].in_flight, k[2]))
        chosen, chosen_held, queued_there, wait_there = views[best[3]][:4]
        free_there = not wait_there
        reason = (RouteReason.FALLBACK_MISS if not deepest else
                  RouteReason.PREFIX_HIT if chosen_held == deepest else RouteReason.FALLBACK_OVERLOAD)
        page = chosen.discovery.page_size  # type: ignore[union-attr]  # READY workers are discovered
        chosen_group = groups.get(chosen.id)
        ticket = InFlight(chosen.id, chains[chosen_group] if chosen_group else [], page, n - chosen_held,
                          queued_there + n - chosen_held, now, free_there)
        self._flying.setdefault(chosen.id, []).append(ticket)
        self.mean_uncached += (ticket.uncached - self.mean_uncached) * (0.02 if self.mean_uncached else 1.0)
        if self.fleet_load is not None:
            self.fleet_load.routed(ticket)
            self._recent.append(now)
        return Decision(chosen, reason, chosen_held, ticket, chosen.id not in refused, refused.get(chosen.id))

    def _unseen_margin(self, now: float) -> float:
        """Prefill tokens the other replicas may have queued on the cheapest-looking worker that this one
        has not heard of yet: their decisions of the last ``delay`` seconds, as many each as this replica
        made in it (the load balancer's share) plus the one each may be making now. All of it, not a
        share: replicas deciding with nearly the same view pick the same worker. 0 for a single gateway."""
        peers, delay = self.fleet_load.staleness() if self.fleet_load is not None else (0, 0.0)
        recent = self._recent
        while recent and recent[0] <= now - delay:
            recent.popleft()
        return peers * (len(recent) + 1) * self.mean_uncached if peers and delay else 0.0

    def _spread_weight(self, hot: int, commons: Sequence[int],
                       views: Sequence[tuple[Candidate, int, int, float, float, int]]) -> float:
        """What a token of a copy of the ``hot`` prefix costs: ``private_weight`` while the workers holding it
        have a slot for this request and each in flight that shares at least half of it, falling to 1 as
        those requests outnumber the slots. A holder whose slot bound is unknown counts none (a pool that
        reports no bound copies at the plain cost: there is no demand to weigh)."""
        if not hot or not self.spread_by_demand:
            return 1.0
        slots = sum(view[5] for view in views if view[1] >= hot)
        sharers = sum(1 for c in commons if 2 * c >= hot) + 1
        return 1 + (self.private_weight - 1) * min(1.0, slots / sharers)

    def _queued(self, worker: str, flying: Sequence[InFlight]) -> int:
        """Uncached tokens still to prefill on ``worker``; a request is past its prefill once the
        worker's KV events show its chain's last block."""
        queued = 0
        for p in flying:
            if p.prefilling:
                if any(source == worker for source, _rank in self.index.longest_prefix(p.chain[-1:])):
                    p.prefilling = False
                else:
                    queued += p.uncached
        return queued

    def _slot_wait(self, flying: Sequence[InFlight], position: int, slots: int, now: float,
                   line: tuple[float, float] | None) -> float:
        """Prefill tokens' worth of waiting for a sequence slot, ``position`` places past the last free one."""
        if line is None or len(flying) < position:
            return position / slots * self.mean_prompt
        a, b = line
        ends = sorted(p.routed + a + b * p.work for p in flying)
        return max(0.0, ends[position - 1] - now) / b

    def released(self, decision: Decision) -> None:
        ticket = decision.ticket
        if not isinstance(ticket, InFlight):
            return
        if ticket.slotted:
            self.runtimes.add(ticket.work, self.clock() - ticket.routed)
        flying = self._flying.get(ticket.worker)
        if flying and ticket in flying:
            flying.remove(ticket)
        if self.fleet_load is not None:
            self.fleet_load.ended(ticket)

    def forget(self, worker_id: str) -> None:
        self._flying.pop(worker_id, None)


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

    def choose(self, workers: Sequence[Candidate], tokens: Sequence[int] | None,
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


PolicyFactory = Callable[[GatewayConfig, PrefixIndex[Source], ChainCache], Policy]
POLICIES: dict[str, PolicyFactory] = {
    "rr": lambda cfg, index, chains: RoundRobin(),
    "exact": lambda cfg, index, chains: Exact(index, chains),
    "approx": lambda cfg, index, chains: Approx(cfg.load_epsilon, cfg.min_prefix_blocks, cfg.min_match_ratio,
                                                cfg.approx_max_entries),
}


def make_policy(cfg: GatewayConfig, index: PrefixIndex[Source], chains: ChainCache) -> Policy:
    """The configured policy, with the gateway's index and chain cache."""
    return POLICIES[cfg.policy](cfg, index, chains)
