"""What replicas do not share costs, and what sharing their in-flight load gives back.

One exact gateway; three replicas behind an alternating client, each knowing only its own
requests in flight; three replicas on the event plane (a real nats-server) with
``event_plane.share_load``, each counting the others' requests in its cost model (issue 25).
Replicas share the KV index either way (each subscribes to every worker's publisher). Same run,
same trace (the demo's chat-with-a-document sessions, shared system prompts), fresh simulated
workers per configuration, configurations in a rotating order between runs; the workers run the
simulator's time model (prefill per uncached token, a sequence-slot bound), so queueing shows in
the client's latency. Reports the workers' prefix-cache hit rate, the client's TTFT p99 (one
output token per request: the answer's latency is its first token's) and max/mean requests per
worker, with ranges over ``--runs``, and each configuration's median ratios to one gateway.

    python benchmarks/gateway_replicas.py [--workers 4] [--sessions 24] [--turns 4] [--runs 3]
        [--prefill-us-per-token 100] [--max-running 4] [--delay-ms 0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fleet.natsd: the real nats-server

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cacheon.sim.demo import Session, conversations, replay
from cacheon.sim.launch import GatewayProcess, SimProcess, wait_until
from cacheon.sim.tokenizer import write_profile
from tests.fleet.natsd import NatsServer

PAGE = 4


class Config(NamedTuple):
    label: str
    replicas: int
    share: bool


CONFIGS = (Config("one gateway", 1, False), Config("3 replicas, own load", 3, False),
           Config("3 replicas, shared load", 3, True))


class Result(NamedTuple):
    hit: float
    ttft_p99: float
    spread: float
    delay_mean: float | None = None  # shared load: a decision published to applied on another replica, mean


def peers(gw: GatewayProcess) -> int:
    return int(httpx.get(f"{gw.url}/readyz", timeout=5).json()["fleet_load"]["peers"])


def delay(gateways: list[GatewayProcess]) -> float:
    """Mean publish-to-applied delay over every replica's ``cacheon_fleet_load_delay_seconds``."""
    total = count = 0.0
    for gw in gateways:
        for family in text_string_to_metric_families(httpx.get(f"{gw.url}/metrics", timeout=5).text):
            for sample in family.samples:
                if sample.name == "cacheon_fleet_load_delay_seconds_sum":
                    total += sample.value
                elif sample.name == "cacheon_fleet_load_delay_seconds_count":
                    count += sample.value
    return total / count if count else float("nan")


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def measure(config: Config, args: argparse.Namespace, sessions: list[Session], tmp: Path, profile: tuple[Path, Path],
            nats_url: str, run: int) -> Result:
    with ExitStack() as stack:
        time_model = ["--prefill-us-per-token", str(args.prefill_us_per_token), "--max-running-requests",
                      str(args.max_running)]
        sims = [SimProcess(stack, tmp, profile, "0.5.13.post1", page_size=PAGE, replay=True, delay_ms=args.delay_ms,
                           extra_args=time_model)
                for _ in range(args.workers)]
        for s in sims:
            s.ready()
        urls = [s.url for s in sims]
        extra: dict[str, Any] = {}
        if config.share:
            extra["event_plane"] = {"url": nats_url, "stream": f"BENCH{run}", "kv_events": "workers",
                                    "share_load": True}
        gateways = [GatewayProcess(stack, tmp, profile, "exact", [{"url": u} for u in urls], **extra)
                    for _ in range(config.replicas)]
        for gw in gateways:
            gw.settled(urls)
            if config.share:
                wait_until(lambda gw=gw: peers(gw) == config.replicas - 1, "the replicas to hear each other")
        served = replay([gw.url for gw in gateways], sessions, max_tokens=1)
        load = Counter(r.worker for r in served)
        counts = [load.get(u, 0) for u in urls]
        hit = sum(r.cached_tokens for r in served) / max(sum(r.prompt_tokens for r in served), 1)
        return Result(hit, p99([r.latency_s for r in served]), max(counts) / (sum(counts) / len(counts)),
                      delay(gateways) if config.share else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prefill-us-per-token", type=float, default=100.0, help="simulated prefill, uncached tokens")
    parser.add_argument("--max-running", type=int, default=4, help="sequence slots per simulated worker (0: none)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="a fixed delay per simulated request")
    args = parser.parse_args()
    sessions = conversations(args.sessions, args.turns)
    results: dict[Config, list[Result]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp, NatsServer(Path(tmp) / "nats") as nats:
        profile = write_profile(Path(tmp) / "tok")
        for run in range(args.runs):
            order = CONFIGS[run % len(CONFIGS):] + CONFIGS[: run % len(CONFIGS)]  # rotate the order between runs
            for config in order:
                got = measure(config, args, sessions, Path(tmp), profile, nats.url, run)
                results[config].append(got)
                print(f"run {run}: {config.label}: hit rate {got.hit:.3f}, TTFT p99 {got.ttft_p99 * 1e3:.0f} ms, "
                      f"max/mean load {got.spread:.2f}"
                      + ("" if got.delay_mean is None else f", load delay mean {got.delay_mean * 1e3:.2f} ms"),
                      flush=True)
    print(f"\n{args.workers} workers, {args.sessions} sessions x {args.turns} turns, page {PAGE}, "
          f"{args.prefill_us_per_token:g} us/prefill token, {args.max_running} slots, {args.delay_ms:g} ms/request, "
          f"{args.runs} runs (exact)")
    print(f"{'':<26}{'hit rate':>14}{'TTFT p99 ms':>14}{'max/mean':>12}{'hit - one':>11}{'p99 / one':>11}")
    one = results[CONFIGS[0]]
    for config, rows in results.items():
        hits, p99s, spreads = [r.hit for r in rows], [r.ttft_p99 for r in rows], [r.spread for r in rows]
        dhit = statistics.median(r.hit - o.hit for r, o in zip(rows, one, strict=True))
        ratio = statistics.median(r.ttft_p99 / o.ttft_p99 for r, o in zip(rows, one, strict=True))
        print(f"{config.label:<26}{min(hits):>7.3f}-{max(hits):.3f}{min(p99s) * 1e3:>8.0f}-{max(p99s) * 1e3:.0f}"
              f"{min(spreads):>7.2f}-{max(spreads):.2f}{dhit:>+11.3f}{ratio:>10.2f}x")


if __name__ == "__main__":
    main()
