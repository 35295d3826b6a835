"""Proxy overhead: latency, CPU and request rate through the gateway (rr) vs calling a sim worker directly.

Same run, same simulated worker (zero delay), same request. Three baselines: the worker called
directly; a bare TCP byte relay (uvloop, no HTTP parsing) in front of it, the cost of one more
process hop on this machine; and a minimal forwarder on the gateway's own stack (a bare ASGI app
under uvicorn posting with aiohttp, no routing, no checks), the floor of any proxy built on it.
Goal: <= 1 ms added at p50.
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
from typing import Any

import httpx
import psutil
import uvloop

from cacheon.sim.launch import GatewayProcess, SimProcess, free_port, wait_until
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


def forwarder(port: int, upstream: str) -> None:
    """The smallest HTTP proxy on uvicorn + aiohttp: read the body, post it, answer what came back."""
    import aiohttp
    import uvicorn

    client: list[aiohttp.ClientSession] = []

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                client.append(aiohttp.ClientSession())
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        async with client[0].request(scope["method"], upstream + scope["path"], data=body,
                                     headers={"content-type": "application/json"}) as resp:
            data = await resp.read()
        await send({"type": "http.response.start", "status": resp.status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


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
        sim = SimProcess(stack, Path(tmp), profile, "0.5.13.post1")
        sim.ready()
        gw = GatewayProcess(stack, Path(tmp), profile, "rr", [{"url": sim.url}], health_interval_s=30)
        spawn = multiprocessing.get_context("spawn")
        ports = {"relay": free_port(), "forwarder": free_port()}
        procs = {"relay": spawn.Process(target=relay, args=(ports["relay"], sim.port), daemon=True),
                 "forwarder": spawn.Process(target=forwarder, args=(ports["forwarder"], sim.url), daemon=True)}
        targets = {"direct": (sim.url, sim.proc.pid)}
        for name, proc in procs.items():
            proc.start()
            stack.callback(proc.terminate)
            url = f"http://127.0.0.1:{ports[name]}"
            wait_until(lambda url=url: httpx.get(f"{url}/health", timeout=2).status_code == 200, name)
            targets[name] = (url, proc.pid)
        targets["gateway"] = (gw.url, gw.proc.pid)
        for url, _pid in targets.values():
            latencies(url)  # warm
        p50, cpu = {}, {}
        for name, (url, pid) in targets.items():
            before = cpu_ms(pid or 0)
            p50[name] = statistics.median(latencies(url)) * 1e3
            cpu[name] = (cpu_ms(pid or 0) - before) / N
        print(f"{'':<10} {'p50':>8} {'added':>8} {'CPU/request':>12} {'max rate':>10}")
        rates = {name: rate(url) for name, (url, _pid) in targets.items()}
        for name in targets:
            print(f"{name:<10} {p50[name]:>6.2f}ms {p50[name] - p50['direct']:>+6.2f}ms {cpu[name]:>10.2f}ms "
                  f"{rates[name]:>6.0f}/s")
        print(f"goal: gateway adds <= 1 ms at p50: {p50['gateway'] - p50['direct'] <= 1}")


if __name__ == "__main__":
    main()
