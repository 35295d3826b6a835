"""The demo: a shared-prefix multi-turn workload through the gateway over simulated workers.

For each policy it starts fresh simulated workers (cold caches) and a gateway, replays the same
conversations turn by turn, and measures what the workers report: prefix-cache hit rate (cached
prompt tokens / prompt tokens, from each response's usage), load spread, routing reasons.
"""

from __future__ import annotations

import random
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from cacheon.sim.launch import Gateway, Sim
from cacheon.sim.tokenizer import CORPUS, write_profile


@dataclass(frozen=True)
class Outcome:
    policy: str
    hit_rate: float
    load: dict[str, int]
    reasons: dict[str, int]

    @property
    def spread(self) -> float:
        """max / mean requests per worker (1.0 is perfectly even)."""
        counts = list(self.load.values())
        return max(counts) / (sum(counts) / len(counts)) if counts else 0.0


def conversations(sessions: int, turns: int, seed: int = 0) -> list[list[list[dict[str, str]]]]:
    """Per session, the message list of each turn; sessions share a few long system prompts."""
    rng = random.Random(seed)
    systems = [f"System prompt {k}. " + " ".join(rng.sample(CORPUS[:3], 3)) * 3 for k in range(3)]
    out = []
    for s in range(sessions):
        history = [{"role": "system", "content": systems[s % len(systems)]}]
        turns_of = []
        for t in range(turns):
            history = [*history, {"role": "user", "content": f"Session {s} question {t}: {rng.choice(CORPUS)}"}]
            turns_of.append(history)
            history = [*history, {"role": "assistant", "content": f"answer {s}.{t}"}]
        out.append(turns_of)
    return out


def replay(url: str, workload: list[list[list[dict[str, str]]]]) -> tuple[float, Counter[str], Counter[str]]:
    """Sessions run concurrently, each turn after the previous one: hit rate, load, route reasons."""
    results: list[tuple[int, int, str, str]] = []

    def session(turns: list[list[dict[str, str]]]) -> None:
        with httpx.Client(timeout=30) as client:
            for messages in turns:
                r = client.post(f"{url}/v1/chat/completions",
                                json={"model": "demo", "messages": messages, "max_tokens": 4})
                r.raise_for_status()
                usage = r.json()["usage"]
                results.append((usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"],
                                r.headers["x-cacheon-worker"], r.headers["x-cacheon-route"]))

    with ThreadPoolExecutor(len(workload)) as pool:
        list(pool.map(session, workload))
    cached, prompt = sum(r[0] for r in results), sum(r[1] for r in results)
    return cached / max(prompt, 1), Counter(r[2] for r in results), Counter(r[3] for r in results)


def run(policy: str, workers: int, version: str, workload: Any, tmp: Path, profile: tuple[Path, Path],
        page_size: int, capacity_tokens: int, delay_ms: int) -> Outcome:
    with ExitStack() as stack:
        sims = [Sim(stack, tmp, profile, version, page_size=page_size, capacity_tokens=capacity_tokens,
                    delay_ms=delay_ms)
                for _ in range(workers)]
        for s in sims:
            s.ready()
        gw = Gateway(stack, tmp, profile, policy, [{"url": s.url} for s in sims])
        if policy == "exact":
            gw.settled([s.url for s in sims])
        hit_rate, load, reasons = replay(gw.url, workload)
        names = {s.url: f"sim{i}" for i, s in enumerate(sims)}
        return Outcome(policy, hit_rate, {names[s.url]: load.get(s.url, 0) for s in sims}, dict(reasons))


def demo(workers: int, sessions: int, turns: int, version: str, page_size: int, capacity_tokens: int,
         delay_ms: int = 50, policies: tuple[str, ...] = ("rr", "approx", "exact")) -> list[Outcome]:
    workload = conversations(sessions, turns)
    with tempfile.TemporaryDirectory(prefix="cacheon-demo-") as tmp:
        profile = write_profile(Path(tmp) / "tok")
        return [run(p, workers, version, workload, Path(tmp), profile, page_size, capacity_tokens, delay_ms)
                for p in policies]
