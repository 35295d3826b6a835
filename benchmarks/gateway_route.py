"""Routing decision cost (tokenize + hash chain + index lookup + pick), chat prompts of 1k and 8k tokens, 64 workers.

cold: the prompt is seen for the first time (window, stem and chain caches emptied before each run).
warm: multi-turn chat; the previous turn was routed, now its answer and one new user message are appended.
baseline, in the same run: tokenizing the same prompt alone, uncached (a cost any tokenizing router pays).
Goal: p99 <= 2 ms at 8k tokens. Warm runs also print CPU-time percentiles (``warm cpu50/cpu99``): the
route's own work, without the time slices other jobs take on a shared box.

    python benchmarks/gateway_route.py [--tokens 8192] [--page 1] [--phases warm]

``--tokens``/``--page`` keep one row, ``--phases`` some phases (a phase left out prints as -): e.g. to
profile only the warm 8k-token page-1 decision, ``py-spy record -o out.txt --format raw -- python
benchmarks/gateway_route.py --tokens 8192 --page 1 --phases warm``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cacheon.gateway.config import WorkerSpec
from cacheon.gateway.heap import freeze_startup_objects
from cacheon.gateway.policy import Decision, Exact, snapshot  # snapshot: timed with the route, as the proxy pays it
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


def timed(fn: Callable[[int], None], prepare: Callable[[int], None], runs: int = RUNS
          ) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds per run of ``fn(run)``, each after an untimed ``prepare(run)``. On a shared
    box a wall-clock tail is mostly other jobs' time slices; the CPU time is this process's own."""
    wall, cpu = [], []
    for run in range(runs):
        prepare(run)
        t0, c0 = time.perf_counter(), time.process_time()
        fn(run)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def message(role: str, label: str, k: int) -> dict[str, str]:
    """A chat message of about 70 tokens, distinct per (label, k)."""
    return {"role": role, "content": f"{label} {k}. " + " ".join(CORPUS[k % 3 : k % 3 + 4])}


def history(profile: TokenizerProfile, target: int) -> Messages:
    """System prompt, then user/assistant turns, ending on an assistant answer, about ``target`` tokens."""
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    while len(profile.encode_chat({"messages": messages})) < target:
        messages += [message("user", "Turn", len(messages)), message("assistant", "Turn", len(messages) + 1)]
    return messages


def pool(profile: TokenizerProfile, messages: Messages, page: int) -> tuple[Exact, list[Worker]]:
    """64 READY workers, each holding a prefix of a different length of the conversation."""
    index, workers = BlockIndex(), []
    chain = page_hashes(list(profile.encode_chat({"messages": messages})), page)
    for i in range(WORKERS):
        w = Worker(f"w{i}", WorkerSpec(url=f"http://w{i}:1"), discovery=Discovery("0.5.13.post1", "m", page, 1, 1))
        w.state = WorkerState.READY
        workers.append(w)
        index.apply((w.id, 0), [("store", chain[: (i + 1) * len(chain) // (WORKERS + 1)], None)])
    return Exact(index, CHAINS), workers


def cold(profile: TokenizerProfile) -> None:
    profile.windows.clear()
    CHAINS.clear()


def row(profile: TokenizerProfile, target: int, page: int, phases: set[str]) -> str:
    base = history(profile, target)
    policy, workers = pool(profile, base, page)
    # Warm run r: base + a question routed before (untimed), then its answer and a new question (timed).
    turn: Messages = []
    routed: list[Decision] = []  # released before the next run, as the proxy releases a request that ended

    def release() -> None:
        while routed:
            policy.released(routed.pop())

    def ask(r: int) -> None:
        release()
        turn[:] = [*base, message("user", "Question", r), message("assistant", "Answer", r)]
        policy.released(policy.choose(snapshot(workers), profile.encode_chat({"messages": turn[:-1]})))

    # Named, so that a profile can select one phase's timed calls (pyspy_top.py --under route_warm).
    def route_cold(r: int) -> None:
        routed.append(policy.choose(snapshot(workers), profile.encode_chat({"messages": base})))

    def route_warm(r: int) -> None:
        chat = {"messages": [*turn, message("user", "Next", r)]}
        routed.append(policy.choose(snapshot(workers), profile.encode_chat(chat)))

    def tokenize_alone(r: int) -> None:
        profile.tokenizer.encode(text, add_special_tokens=False)

    text = profile.render_chat({"messages": base})[0]
    runs = {
        "cold": lambda: timed(route_cold, lambda r: (release(), cold(profile))),
        "warm": lambda: timed(route_warm, ask, WARM_RUNS),
        "base": lambda: timed(tokenize_alone, lambda r: None),
    }
    tokens = len(profile.encode_chat({"messages": base}))
    cells = []
    for phase, run in runs.items():
        wall, cpu = run() if phase in phases else ([], [])
        cells += [f"{pct(wall, q):>8.2f}ms" if wall else f"{'-':>10}" for q in (0.5, 0.99)]
        if phase == "warm":
            cells += [f"{pct(cpu, q):>8.2f}ms" if cpu else f"{'-':>10}" for q in (0.5, 0.99)]
    return f"{tokens:>6} {page:>4} " + " ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, choices=(1024, 8192), help="only this prompt size")
    parser.add_argument("--page", type=int, choices=(16, 1), help="only this page size")
    parser.add_argument("--phases", default="cold,warm,base", help="comma-separated: %(default)s")
    args = parser.parse_args()
    phases = set(args.phases.split(","))
    if not phases <= {"cold", "warm", "base"}:
        raise SystemExit(f"--phases: unknown {', '.join(sorted(phases - {'cold', 'warm', 'base'}))}")
    with tempfile.TemporaryDirectory() as tmp:
        tok, template = write_profile(Path(tmp))
        profile = TokenizerProfile(TokenizerSpec(tok, template, bos_token="<s>", eos_token="</s>"))
    freeze_startup_objects()  # as `cacheon gateway serve` does once its profiles are loaded
    print(f"{WORKERS} workers, {RUNS} cold and base runs, {WARM_RUNS} warm;"
          " route = tokenize + hash chain + index lookup + pick")
    heads = ["cold p50", "cold p99", "warm p50", "warm p99", "warm cpu50", "warm cpu99", "base p50", "base p99"]
    print(f"{'tokens':>6} {'page':>4} " + " ".join(f"{h:>10}" for h in heads))
    for target in [args.tokens] if args.tokens else (1024, 8192):
        for page in [args.page] if args.page else (16, 1):
            print(row(profile, target, page, phases), flush=True)


if __name__ == "__main__":
    main()
