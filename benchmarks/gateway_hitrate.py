"""Hit rate on the demo's "chat with a document" trace: rr, approx and exact (live gateway over
simulated workers) against an oracle that sees every worker's cache.

Goal: exact >= 0.95 x oracle and >= 3 x rr, with max/mean load <= 1.3. Run from the repository
root (the workers find the SGLang releases under ./.sglang, or $SGLANG_RELEASES_DIR).

Fairness: the demo replays turn-synchronised waves (every request of a wave is in flight at
once; replies are the workers' own, so every policy sends the same prompts, which is checked).
The oracle replays exact's run request for request, in the order the workers served them, into
caches built like the workers' (``PrefixCache``, same page size and capacity, the prompt alone
inserted, DP rank 0 only), tokenized with the same tokenizer, chat template and BOS as the
gateway and the workers (every prompt's length is checked against the worker's usage). Two
oracles, the better one counts: "greedy" routes each request to the deepest real match among
workers within exact's load bound (in-flight <= (1+epsilon) x max(mean, 1), a wave's requests
counted as in flight); "rule" applies exact's whole decision rule to the real caches.
A mirror replay of each live run's own routing through the same caches must reproduce every
worker-reported cached-token count, or the oracle is not modelling the workers.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from itertools import groupby
from pathlib import Path

from cacheon.gateway.config import DEFAULTS, WorkerSpec
from cacheon.gateway.policy import Prefix, snapshot
from cacheon.gateway.workers import Worker
from cacheon.sim.cache import PrefixCache
from cacheon.sim.demo import Outcome, Served, demo
from cacheon.sim.tokenizer import BOS_TOKEN, write_profile
from cacheon.tokens.chains import ChainCache
from cacheon.tokens.profile import TokenizerProfile, TokenizerSpec

PAGE, CAPACITY, DELAY_MS = 4, 1 << 16, 200
CHAINS = ChainCache()  # prompts from the profile hash through a chain cache, as in the workers
EPSILON: float = DEFAULTS.load_epsilon


def tokenized(served: Sequence[Served], profile: TokenizerProfile) -> list[list[int]]:
    """Each prompt as the workers saw it; a length the worker did not report is a tokenization mismatch."""
    out = [profile.encode_chat({"messages": r.messages}) for r in served]
    bad = [r.order for r, t in zip(served, out, strict=True) if len(t) != r.prompt_tokens]
    if bad:
        raise SystemExit(f"oracle tokenization disagrees with the workers on requests {bad[:10]}")
    return out


def mirror(served: Sequence[Served], tokens: list[list[int]]) -> int:
    """Requests whose reported cached tokens a replay of the run's own routing does not reproduce."""
    caches: dict[str, PrefixCache] = {}
    wrong = 0
    for r, t in zip(served, tokens, strict=True):
        cache = caches.setdefault(r.worker, PrefixCache(PAGE, CAPACITY, CHAINS.chain))
        wrong += cache.match(t) != r.cached_tokens
        cache.insert(t)
    return wrong


def oracle(served: Sequence[Served], tokens: list[list[int]], rule: Prefix | None,
           workers_n: int) -> tuple[float, float]:
    """Hit rate and max/mean load of routing on every worker's real cache, wave by wave.

    ``rule`` None: the deepest real match within the load bound (ties by load). Otherwise exact's
    own decision rule (``Prefix.pick``: match-ratio threshold, load bound, rotating ties) fed with
    the real caches instead of the index: the difference to exact is then only what exact knows.
    """
    caches = [PrefixCache(PAGE, CAPACITY, CHAINS.chain) for _ in range(workers_n)]
    workers = [Worker(str(i), WorkerSpec(url=f"http://oracle-{i}:1")) for i in range(workers_n)]
    load = [0] * workers_n
    cached = total = 0
    items = list(zip(served, tokens, strict=True))
    for _, wave in groupby(items, key=lambda item: item[0].wave):
        for w in workers:
            w.in_flight = 0
        for _, t in wave:
            held = [c.match(t, touch=False) for c in caches]
            if rule is None:
                bound = (1 + EPSILON) * max(sum(w.in_flight for w in workers) / workers_n, 1.0)
                allowed = [i for i in range(workers_n) if workers[i].in_flight <= bound]
                best = max(allowed, key=lambda i: (held[i], -workers[i].in_flight, -load[i]))
            else:
                needed = rule.needed(len(t) // PAGE) * PAGE
                chosen = rule.pick(snapshot(workers), {str(i): h for i, h in enumerate(held) if h},
                                   {str(i) for i, h in enumerate(held) if h and h >= needed})[0]
                best = int(chosen.id)
            cached += caches[best].match(t)
            total += len(t)
            caches[best].insert(t)
            workers[best].in_flight += 1
            load[best] += 1
    return cached / total, max(load) / (sum(load) / workers_n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--arrivals", type=int, default=16, help="new sessions per wave")
    args = parser.parse_args()
    n = args.workers
    outcomes: dict[str, Outcome] = {o.policy: o for o in demo(n, args.sessions, args.turns, "0.5.13.post1", PAGE,
                                                                CAPACITY, DELAY_MS, arrivals=args.arrivals)}
    prompts = {p: sorted((r.wave, r.session, json.dumps(r.messages)) for r in o.served) for p, o in outcomes.items()}
    if any(v != prompts["exact"] for v in prompts.values()):
        raise SystemExit("the policies' runs did not send the same prompts")
    with tempfile.TemporaryDirectory() as tmp:
        tok, template = write_profile(Path(tmp))
        profile = TokenizerProfile(TokenizerSpec(tok, template, bos_token=BOS_TOKEN))  # as the gateway and the workers
        tokens = {p: tokenized(o.served, profile) for p, o in outcomes.items()}
    rule = Prefix(EPSILON, DEFAULTS.min_prefix_blocks, DEFAULTS.min_match_ratio)
    oracles = {"greedy": oracle(outcomes["exact"].served, tokens["exact"], None, n),
               "rule": oracle(outcomes["exact"].served, tokens["exact"], rule, n)}
    best = max(rate for rate, _spread in oracles.values())
    rr = outcomes["rr"].hit_rate
    print(f"{n} workers, {args.sessions} sessions x {args.turns} turns, {args.arrivals} new per wave, page {PAGE}, "
          f"capacity {CAPACITY} tokens, {DELAY_MS} ms per request, epsilon {EPSILON}")
    print(f"{'policy':<13} {'hit rate':>8} {'max/mean':>8} {'vs oracle':>9} {'vs rr':>6} {'mirror misses':>13}")
    for name, o in outcomes.items():
        print(f"{name:<13} {o.hit_rate:>8.3f} {o.spread:>8.2f} {o.hit_rate / best:>9.2f} {o.hit_rate / rr:>6.2f} "
              f"{mirror(o.served, tokens[name]):>13}")
    for name, (rate, spread) in oracles.items():
        print(f"{'oracle-' + name:<13} {rate:>8.3f} {spread:>8.2f} {rate / best:>9.2f} {rate / rr:>6.2f}")
    for name, o in outcomes.items():
        print(f"{name} routes: " + ", ".join(f"{k} {v}" for k, v in sorted(o.reasons.items())))
    exact = outcomes["exact"]
    print(f"goal: exact/oracle {exact.hit_rate / best:.2f} >= 0.95 {exact.hit_rate >= 0.95 * best}; "
          f"exact/rr {exact.hit_rate / rr:.2f} >= 3 {exact.hit_rate >= 3 * rr}; "
          f"exact max/mean {exact.spread:.2f} <= 1.3 {exact.spread <= 1.3}")


if __name__ == "__main__":
    main()
