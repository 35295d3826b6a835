"""Routing decision cost (tokenize + hash chain + index lookup + pick), chat prompts of 1k and 8k tokens, 64 workers.

cold: the prompt is seen for the first time (window, stem and chain caches emptied before each run).
warm: multi-turn chat; the previous turn was routed, now its answer and one new user message are appended.
baseline, in the same run: tokenizing the same prompt alone, uncached (a cost any tokenizing router pays).
Goal: p99 <= 2 ms at 8k tokens.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cacheon.gateway.config import GatewayConfig, WorkerSpec
from cacheon.gateway.heap import freeze_startup_objects
from cacheon.gateway.policy import Exact
from cacheon.gateway.workers import Discovery, Worker, WorkerState
from cacheon.kv.hashing import page_hashes
from cacheon.kv.index import BlockIndex
from cacheon.sim.tokenizer import CORPUS, write_profile
from cacheon.tokens.chains import ChainCache
from cacheon.tokens.profile import TokenizerProfile, TokenizerSpec

CHAINS = ChainCache()  # the gateway's own chain cache
WORKERS = 64
RUNS = 200  # cold and base runs (tens of ms each)
WARM_RUNS = 1000  # warm runs are ~1 ms: enough that p99 is not just the slowest two
Messages = list[dict[str, Any]]


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1e3


def timed(fn: Callable[[int], None], prepare: Callable[[int], None], runs: int = RUNS) -> list[float]:
    """Seconds per run of ``fn(run)``, each after an untimed ``prepare(run)``."""
    out = []
    for run in range(runs):
        prepare(run)
        t0 = time.perf_counter()
        fn(run)
        out.append(time.perf_counter() - t0)
    return out


def message(role: str, label: str, k: int) -> dict[str, str]:
    """A chat message of about 70 tokens, distinct per (label, k)."""
    return {"role": role, "content": f"{label} {k}. " + " ".join(CORPUS[k % 3 : k % 3 + 4])}


def history(profile: TokenizerProfile, target: int) -> Messages:
    """System prompt, then user/assistant turns, ending on an assistant answer, about ``target`` tokens."""
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    while len(profile.encode_chat(messages)) < target:
        messages += [message("user", "Turn", len(messages)), message("assistant", "Turn", len(messages) + 1)]
    return messages


def pool(profile: TokenizerProfile, messages: Messages, page: int) -> tuple[Exact, list[Worker]]:
    """64 READY workers, each holding a prefix of a different length of the conversation."""
    index, workers = BlockIndex(), []
    chain = page_hashes(list(profile.encode_chat(messages)), page)
    for i in range(WORKERS):
        w = Worker(f"w{i}", WorkerSpec(url=f"http://w{i}:1"), discovery=Discovery("0.5.13.post1", "m", page, 1, 1))
        w.state = WorkerState.READY
        workers.append(w)
        index.apply((w.id, 0), [("store", chain[: (i + 1) * len(chain) // (WORKERS + 1)])])
    d = {k: f.default for k, f in GatewayConfig.__dataclass_fields__.items()}  # the gateway's defaults
    return Exact(index, CHAINS, d["load_epsilon"], d["min_prefix_blocks"], d["min_match_ratio"]), workers


def cold(profile: TokenizerProfile) -> None:
    profile.windows.clear()
    CHAINS.clear()


def row(profile: TokenizerProfile, target: int, page: int) -> str:
    base = history(profile, target)
    policy, workers = pool(profile, base, page)
    # Warm run r: base + a question routed before (untimed), then its answer and a new question (timed).
    turn: Messages = []

    def ask(r: int) -> None:
        turn[:] = [*base, message("user", "Question", r), message("assistant", "Answer", r)]
        policy.choose(workers, profile.encode_chat(turn[:-1]))

    route_cold = timed(lambda r: policy.choose(workers, profile.encode_chat(base)), lambda r: cold(profile))
    route_warm = timed(lambda r: policy.choose(workers, profile.encode_chat([*turn, message("user", "Next", r)])), ask,
                       WARM_RUNS)
    text = profile.render_chat(base)
    alone = timed(lambda r: profile.tokenizer.encode(text, add_special_tokens=False), lambda r: None)
    tokens = len(profile.encode_chat(base))
    cells = [pct(xs, q) for xs in (route_cold, route_warm, alone) for q in (0.5, 0.99)]
    return f"{tokens:>6} {page:>4} " + " ".join(f"{c:>8.2f}ms" for c in cells)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tok, template = write_profile(Path(tmp))
        profile = TokenizerProfile(TokenizerSpec(tok, template, bos_token="<s>", eos_token="</s>"))
    freeze_startup_objects()  # as `cacheon gateway serve` does once its profiles are loaded
    print(f"{WORKERS} workers, {RUNS} cold and base runs, {WARM_RUNS} warm;"
          " route = tokenize + hash chain + index lookup + pick")
    heads = ["cold p50", "cold p99", "warm p50", "warm p99", "base p50", "base p99"]
    print(f"{'tokens':>6} {'page':>4} " + " ".join(f"{h:>10}" for h in heads))
    for target in (1024, 8192):
        for page in (16, 1):
            print(row(profile, target, page), flush=True)


if __name__ == "__main__":
    main()
