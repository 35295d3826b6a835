"""Proxy overhead: latency and request rate through the gateway (rr) vs calling a sim worker directly.

Same run, same simulated worker (zero delay), same request: the difference is the gateway's.
Goal: <= 1 ms added at p50.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx

from cacheon.sim.launch import Gateway, Sim
from cacheon.sim.tokenizer import write_profile

N = 400
BODY = {"model": "demo", "prompt": "Routing by prefix keeps the KV cache hot.", "max_tokens": 4}


def latencies(url: str) -> list[float]:
    out = []
    with httpx.Client() as client:
        for _ in range(N):
            t0 = time.perf_counter()
            client.post(f"{url}/v1/completions", json=BODY).raise_for_status()
            out.append(time.perf_counter() - t0)
    return out


def rate(url: str, threads: int = 16, seconds: float = 3.0) -> float:
    def loop(_: int) -> int:
        done, stop = 0, time.monotonic() + seconds
        with httpx.Client() as client:
            while time.monotonic() < stop:
                client.post(f"{url}/v1/completions", json=BODY).raise_for_status()
                done += 1
        return done

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(loop, range(threads))) / seconds


def main() -> None:
    os.environ.setdefault("SGLANG_RELEASES_DIR", str(Path(__file__).resolve().parents[1] / ".sglang"))
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        profile = write_profile(Path(tmp) / "tok")
        sim = Sim(stack, Path(tmp), profile, "0.5.13.post1")
        sim.ready()
        gw = Gateway(stack, Path(tmp), profile, "rr", [{"url": sim.url}])
        latencies(sim.url), latencies(gw.url)  # warm both
        direct, proxied = latencies(sim.url), latencies(gw.url)
        d50, p50 = statistics.median(direct) * 1e3, statistics.median(proxied) * 1e3
        print(f"p50 direct {d50:.2f} ms, via gateway {p50:.2f} ms: added {p50 - d50:.2f} ms (goal <= 1 ms)")
        d_rate, p_rate = rate(sim.url), rate(gw.url)
        print(f"max rate direct {d_rate:.0f} req/s, via gateway {p_rate:.0f} req/s: ratio {p_rate / d_rate:.2f}")


if __name__ == "__main__":
    main()
