"""Routing quality in simulated time: the policies over simulated workers, no HTTP, no wall clock.

The same traces as ``routing_peers.py`` (``_traces``), the same worker model (the simulator's
prefix cache and scheduler: ``cacheon.sim.cache``, ``cacheon.sim.schedule``), the gateway's own
index, chain cache and ``Exact`` policy, all driven by one event queue in virtual time: a request
arrives, the policy routes it, the worker plans it, its KV events reach the index when its
simulated prefill ends, it is released when it ends. Every figure is deterministic (a seed), so
policy variants compare exactly, in seconds rather than the live benchmark's minutes, and
without this shared box's noise. What it leaves out is what ``routing_peers.py`` measures: real
processes, sockets, the event path's latency, the routers' own speed.

Policies: ``exact``; ``exact-no-overlay`` (requests in flight do not count as held: only the
index's KV events); ``exact-private-1`` (a private prefix prefilled again costs its plain
tokens); ``exact-hot-plain`` (a hot prefix's copy costs its plain tokens however few requests
share it: ``exact`` before issue 22); ``cache-aware-rule``, an emulation of sglang-router's
``cache_aware`` rule (requests count as inserted into its tree when routed; a match of 30 % or
more of the prompt goes to the best match, else to the worker with the smallest tree; its load
thresholds never trigger at this scale) whose hit rates and max/mean reproduce the live peer's
on all four traces at seed 0.

    python benchmarks/routing_offline.py [--traces chat,system] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _traces import TRACES, Message

from cacheon.gateway.config import WorkerSpec
from cacheon.gateway.policy import Decision, Exact, InFlight, RouteReason, snapshot
from cacheon.gateway.workers import Discovery, Worker, WorkerState
from cacheon.kv.feed import Source
from cacheon.kv.index import BlockIndex
from cacheon.sim.cache import PrefixCache
from cacheon.sim.schedule import RankScheduler, TimeModel
from cacheon.sim.tokenizer import write_profile
from cacheon.sim.worker import reply_words
from cacheon.tokens.chains import ChainCache
from cacheon.tokens.profile import TokenizerProfile, TokenizerSpec

VERSION = "0.5.13.post1"
ARRIVAL_GAP_S = 2e-4  # requests of one wave reach the router one after another, this far apart


class CacheAwareRule(Exact):
    """An emulation of sglang-router's cache_aware decision (module docstring), on the same bookkeeping."""

    def choose(self, workers, tokens) -> Decision:  # type: ignore[no-untyped-def]
        page = workers[0].discovery.page_size
        chain = self.chains.chain(tokens, page)
        held = {source: depth * page for (source, _), depth in self.index.longest_prefix(chain).items()}
        for w in workers:
            for p in self._flying.get(w.id, ()):
                held[w.id] = max(held.get(w.id, 0), p.shared(chain) * page)
        best = max(workers, key=lambda w: (held.get(w.id, 0), -w.in_flight))
        if held.get(best.id, 0) < 0.3 * len(tokens):
            best = min(workers, key=lambda w: (self.index.blocks((w.id, 0)) + sum(len(p.chain) for p in
                                                                                 self._flying.get(w.id, ())),
                                               w.in_flight))
        ticket = InFlight(best.id, chain, page, 0, 0, self.clock(), False)
        self._flying.setdefault(best.id, []).append(ticket)
        return Decision(best, RouteReason.PREFIX_HIT, held.get(best.id, 0), ticket)


POLICIES: dict[str, Callable[[BlockIndex[Source], ChainCache], Exact]] = {
    "exact": lambda index, chains: Exact(index, chains),
    "exact-no-overlay": lambda index, chains: Exact(index, chains, overlay=False),
    "exact-private-1": lambda index, chains: Exact(index, chains, private_weight=1.0),
    "exact-hot-plain": lambda index, chains: Exact(index, chains, spread_by_demand=False),
    "cache-aware-rule": lambda index, chains: CacheAwareRule(index, chains),
}


@dataclass(frozen=True)
class Outcome:
    hit_rate: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    max_mean: float


def pct(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(trace_name: str, policy_name: str, seed: int, args: argparse.Namespace, profile: TokenizerProfile) -> Outcome:
    trace = TRACES[trace_name](seed)
    model = TimeModel(args.prefill_us_per_token / 1e6, args.decode_ms_per_token / 1e3, args.max_running_requests)
    index: BlockIndex[Source] = BlockIndex()
    clock = [0.0]
    policy = POLICIES[policy_name](index, ChainCache())
    policy.clock = lambda: clock[0]
    workers = []
    for i in range(args.workers):
        w = Worker(f"w{i}", WorkerSpec(url=f"http://w{i}:1"),
                   discovery=Discovery(VERSION, "m", args.page, 1, 1, max_running=args.max_running_requests or None))
        w.state = WorkerState.READY
        workers.append(w)
    caches = [PrefixCache(args.page, args.capacity_tokens, hasher=ChainCache().chain) for _ in workers]
    schedulers = [RankScheduler(model) for _ in workers]
    history: dict[int, list[Message]] = {}
    cached_total = prompt_total = 0
    ttft: list[float] = []
    load = [0] * args.workers
    order = itertools.count()
    start = 0.0
    for wave in range(trace.waves):
        events: list[tuple[float, int, str, object]] = []
        for k, i in enumerate(trace.active(wave)):
            session, turn = trace.sessions[i], wave - trace.sessions[i].start
            asked = {"role": "user", "content": session.follow_ups[turn - 1]} if turn else None
            messages = list(session.opening) if asked is None else [*history[i], asked]
            heapq.heappush(events, (start + k * ARRIVAL_GAP_S, next(order), "arrive", (i, messages)))
        replies: dict[int, list[Message]] = {}
        while events:
            now, _, kind, payload = heapq.heappop(events)
            clock[0] = now
            if kind == "arrive":
                i, messages = payload  # type: ignore[misc]
                encoded = profile.encode_chat({"messages": messages})  # the pieces the chain cache reuses
                tokens = list(encoded)
                decision = policy.choose(snapshot(workers), encoded)  # as the proxy asks
                w = int(decision.worker.id[1:])
                load[w] += 1
                workers[w].in_flight += 1
                cached = caches[w].match(tokens)
                plan = schedulers[w].plan(now, len(tokens) - cached, args.max_tokens)
                stored, removed = caches[w].insert(tokens)
                ops: list = [("remove", removed, None)] if removed else []
                for p in stored:  # chained pages as one run, as the gateway's decoder merges them
                    if ops and ops[-1][0] == "store" and ops[-1][1][-1] == p.parent:
                        ops[-1][1].append(p.block_hash)
                    else:
                        ops.append(("store", [p.block_hash], p.parent))
                heapq.heappush(events, (plan.prefill_end, next(order), "kv", (w, ops)))
                heapq.heappush(events, (plan.done, next(order), "done", (decision, i, messages, tokens)))
                cached_total += cached
                prompt_total += len(tokens)
                ttft.append((plan.first_token - now) * 1e3)
            elif kind == "kv":
                w, ops = payload  # type: ignore[misc]
                index.apply((f"w{w}", 0), ops)
            else:
                decision, i, messages, tokens = payload  # type: ignore[misc]
                workers[int(decision.worker.id[1:])].in_flight -= 1
                policy.released(decision)
                reply = "".join(reply_words(tokens, args.max_tokens))
                replies[i] = [*messages, {"role": "assistant", "content": reply}]
                start = max(start, now)
        history.update(replies)
        start += 1e-3  # the client's turn-around before the next wave
    return Outcome(cached_total / prompt_total, pct(ttft, 0.5), pct(ttft, 0.99), max(load) / statistics.mean(load))



def span(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}-{hi:{fmt}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("--traces", default=",".join(TRACES), help="comma-separated: %(default)s")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated: %(default)s")
    parser.add_argument("--seeds", default="0,1,2", help="the traces' seeds, comma-separated")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--page", type=int, default=4)
    parser.add_argument("--capacity-tokens", type=int, default=1 << 16)
    parser.add_argument("--prefill-us-per-token", type=float, default=50.0)
    parser.add_argument("--decode-ms-per-token", type=float, default=5.0)
    parser.add_argument("--max-running-requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    traces, policies = args.traces.split(","), args.policies.split(",")
    unknown = sorted(set(traces) - set(TRACES)) + sorted(set(policies) - set(POLICIES))
    if unknown:
        raise SystemExit(f"unknown trace or policy: {', '.join(unknown)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds: not integers: {args.seeds!r}") from None
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer, template = write_profile(Path(tmp))
        profile = TokenizerProfile(TokenizerSpec(tokenizer, template, bos_token="<s>"))
    print(f"{args.workers} workers, page {args.page}; prefill {args.prefill_us_per_token:g} us per uncached token, "
          f"decode {args.decode_ms_per_token:g} ms per token, {args.max_running_requests or 'unbounded'} running per "
          f"worker, {args.max_tokens} output tokens; seeds {args.seeds} (ranges over seeds); simulated time")
    base = "cache-aware-rule" if "cache-aware-rule" in policies else None
    print(f"{'trace':<8}{'policy':<19}{'hit rate':>13}{'TTFT p50 ms':>14}{'TTFT p99 ms':>14}{'max/mean':>12}"
          + (f"{'hit - rule':>15}{'p99 / rule':>13}" if base else ""))
    for trace in traces:
        outs = {name: [run(trace, name, seed, args, profile) for seed in seeds] for name in policies}
        for name, got in outs.items():
            line = (f"{trace:<8}{name:<19}{span([o.hit_rate for o in got], '.3f'):>13}"
                    f"{span([o.ttft_p50_ms for o in got], '.1f'):>14}{span([o.ttft_p99_ms for o in got], '.1f'):>14}"
                    f"{span([o.max_mean for o in got], '.2f'):>12}")
            if base and name != base:  # seed by seed against the rule
                pairs = list(zip(got, outs[base], strict=True))
                line += (f"{span([o.hit_rate - b.hit_rate for o, b in pairs], '+.3f'):>15}"
                         f"{span([o.ttft_p99_ms / b.ttft_p99_ms for o, b in pairs], '.2f'):>13}")
            print(line, flush=True)


if __name__ == "__main__":
    main()
