"""Routing decision cost (tokenize + hash + index lookup + pick) for 1k and 8k-token prompts, 64 workers.

Baseline in the same run: tokenizing the same prompt alone (a cost any tokenizing router pays).
Goal: p99 <= 2 ms at 8k tokens.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from cacheon.gateway.config import WorkerSpec
from cacheon.gateway.hashing import page_hashes
from cacheon.gateway.index import BlockIndex
from cacheon.gateway.policy import Exact
from cacheon.gateway.tokenize import Profile, ProfileSpec
from cacheon.gateway.workers import READY, Discovery, Worker
from cacheon.sim.tokenizer import CORPUS, write_profile

WORKERS = 64
RUNS = 200


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1e3


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tok, template = write_profile(Path(tmp))
        profile = Profile(ProfileSpec(tok, template))
    text = " ".join(CORPUS)
    print(f"{'tokens':>6} {'page':>4} {'route p50':>10} {'route p99':>10} {'tokenize p50':>13} {'ratio p50':>9}")
    for target in (1024, 8192):
        prompt = text
        while len(profile.encode_completion(prompt)) < target:
            prompt += " " + text
        ids = profile.encode_completion(prompt)[:target]
        prompt = profile.tokenizer.decode(ids)
        for page in (16, 1):
            index = BlockIndex()
            workers = []
            for i in range(WORKERS):
                found = Discovery("0.5.13.post1", "m", page, 1, 1)
                w = Worker(f"w{i}", WorkerSpec(url=f"http://w{i}:1"), discovery=found)
                w.state = READY
                workers.append(w)
                # Every worker holds a prefix of a different length of this prompt; others hold noise.
                chain = page_hashes(profile.encode_completion(prompt), page)
                index.apply((w.id, 0), [("store", chain[: (i + 1) * len(chain) // (WORKERS + 1)])])
            policy = Exact(index, 0.25, 1)
            route, base = [], []
            for _ in range(RUNS):
                t0 = time.perf_counter()
                policy.choose(workers, profile.encode_completion(prompt))
                t1 = time.perf_counter()
                profile.encode_completion(prompt)
                t2 = time.perf_counter()
                route.append(t1 - t0)
                base.append(t2 - t1)
            print(f"{target:>6} {page:>4} {pct(route, .5):>8.2f}ms {pct(route, .99):>8.2f}ms "
                  f"{pct(base, .5):>11.2f}ms {statistics.median(route) / statistics.median(base):>9.1f}")


if __name__ == "__main__":
    main()
