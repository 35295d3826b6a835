"""Proxy overhead: latency, CPU and request rate through the gateway (rr) vs calling a sim worker directly.

Same run, same simulated worker (zero delay), same request. Two baselines: the worker called
directly, and a bare TCP byte relay (uvloop, no HTTP parsing) in front of it, the cost of one
more process hop on this machine that no HTTP-aware proxy can avoid. Goal: <= 1 ms added at p50.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import psutil
import uvloop

from cacheon.sim.launch import Gateway, Sim, free_port, wait_until
from cacheon.sim.tokenizer import write_profile

N = 600
BODY = {"model": "demo", "prompt": "Routing by prefix keeps the KV cache hot.", "max_tokens": 4}


def relay(port: int, upstream: int) -> None:
    """Pipe each client connection's bytes to the worker and back: one hop, no HTTP."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    uvloop.run(serve())


def latencies(url: str) -> list[float]:
    out = []
    with httpx.Client() as client:
        for _ in range(N):
            t0 = time.perf_counter()
            client.post(f"{url}/v1/completions", json=BODY).raise_for_status()
            out.append(time.perf_counter() - t0)
    return out


def cpu_ms(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return (times.user + times.system) * 1e3


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
        gw = Gateway(stack, Path(tmp), profile, "rr", [{"url": sim.url}], health_interval_s=30)
        port = free_port()
        hop = multiprocessing.get_context("spawn").Process(target=relay, args=(port, sim.port), daemon=True)
        hop.start()
        stack.callback(hop.terminate)
        hop_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: httpx.get(f"{hop_url}/health", timeout=2).status_code == 200, "the relay")
        targets = {"direct": (sim.url, sim.proc.pid), "relay": (hop_url, hop.pid), "gateway": (gw.url, gw.proc.pid)}
        for url, _pid in targets.values():
            latencies(url)  # warm
        p50, cpu = {}, {}
        for name, (url, pid) in targets.items():
            before = cpu_ms(pid or 0)
            p50[name] = statistics.median(latencies(url)) * 1e3
            cpu[name] = (cpu_ms(pid or 0) - before) / N
        print(f"p50 direct {p50['direct']:.2f} ms | bare relay {p50['relay']:.2f} ms "
              f"(+{p50['relay'] - p50['direct']:.2f}) | gateway {p50['gateway']:.2f} ms "
              f"(+{p50['gateway'] - p50['direct']:.2f}, goal <= 1 ms)")
        print(f"CPU per request: worker {cpu['direct']:.2f} ms | relay {cpu['relay']:.2f} ms | "
              f"gateway {cpu['gateway']:.2f} ms")
        rates = {name: rate(url) for name, (url, _pid) in targets.items()}
        print(f"max rate (16 client threads) direct {rates['direct']:.0f} req/s | relay {rates['relay']:.0f} | "
              f"gateway {rates['gateway']:.0f}: gateway/direct {rates['gateway'] / rates['direct']:.2f}")


if __name__ == "__main__":
    main()
