"""Hit rate on the demo's shared-prefix trace: exact vs rr vs approx (live gateway over simulated
workers) vs an oracle that sees every worker's cache (in-process, same caches, turn order).

Goal: exact >= 0.95 x oracle and >= 3 x rr, with max/mean load <= 1.3.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

from cacheon.gateway.tokenize import Profile, ProfileSpec
from cacheon.sim.cache import PrefixCache
from cacheon.sim.demo import conversations, demo
from cacheon.sim.tokenizer import write_profile

WORKERS, SESSIONS, TURNS, PAGE, CAPACITY = 4, 16, 6, 4, 1 << 16


def oracle(workload: list, profile: Profile) -> tuple[float, float]:
    """Route each request to the cache with the longest real match (ties: fewest requests)."""
    caches = [PrefixCache(PAGE, CAPACITY) for _ in range(WORKERS)]
    load: Counter[int] = Counter()
    cached = total = 0
    for turn in range(TURNS):
        for session in workload:
            tokens = profile.encode_chat(session[turn])
            best = max(range(WORKERS), key=lambda i: (caches[i].match(tokens), -load[i]))
            cached += caches[best].match(tokens)
            total += len(tokens)
            caches[best].insert(tokens)
            load[best] += 1
    counts = [load[i] for i in range(WORKERS)]
    return cached / total, max(counts) / (sum(counts) / WORKERS)


def main() -> None:
    os.environ.setdefault("SGLANG_RELEASES_DIR", str(Path(__file__).resolve().parents[1] / ".sglang"))
    with tempfile.TemporaryDirectory() as tmp:
        tok, template = write_profile(Path(tmp))
        profile = Profile(ProfileSpec(tok, template))
        best, best_spread = oracle(conversations(SESSIONS, TURNS), profile)
    outcomes = {o.policy: o for o in demo(WORKERS, SESSIONS, TURNS, "0.5.13.post1", PAGE, CAPACITY)}
    print(f"{'policy':<8} {'hit rate':>8} {'max/mean':>8} {'vs oracle':>9} {'vs rr':>6}")
    rr = outcomes["rr"].hit_rate
    for name, o in outcomes.items():
        print(f"{name:<8} {o.hit_rate:>8.3f} {o.spread:>8.2f} {o.hit_rate / best:>9.2f} {o.hit_rate / rr:>6.2f}")
    print(f"{'oracle':<8} {best:>8.3f} {best_spread:>8.2f} {1:>9.2f} {best / rr:>6.2f}")


if __name__ == "__main__":
    main()
