"""Proxy overhead: latency, CPU and request rate through the gateway (rr) vs calling a sim worker directly.

Same run, same simulated worker (zero delay), same request. Baselines: the worker called directly;
a bare TCP byte relay (uvloop, no HTTP parsing) in front of it, the cost of one more process hop on
this machine; a minimal forwarder on the gateway's own stack (aiohttp.web posting with an aiohttp
client, no routing, no checks), the floor of any proxy built on it; and the peer, SGLang's own
router (PyPI ``sglang-router``, Rust; ``round_robin``; its own venv: benchmarks/peers/install.sh;
``--no-peer`` leaves it out).

Time-sliced: latencies are taken in ``--slices`` slices, each running every target in turn (the
order rotating) for N / slices requests, and the 16-thread request rate in rounds of one second per
target, so every target sees the same machine state; the p50 of each target's pooled samples.
Goals (issue 22): added p50 <= 1.0x sglang-router's (1.2x at worst), CPU per request <= 2x its;
<= 1 ms added.

``--stream``: every request is a streamed chat completion (16 output tokens, usage included: 18
server-sent events, as benchmarks/routing_peers.py sends them), read to its end; latency is the
whole stream's, CPU per request includes the per-chunk relay.

``--profile DIR``: afterwards, py-spy samples the gateway for ``--profile-s`` seconds under the
16-thread load and writes DIR/gateway.txt (collapsed stacks with native frames: the event loop, the
HTTP parser and the socket calls are C; summarise with benchmarks/pyspy_top.py).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx
import psutil
import uvloop
from _peers import ROOT, SglangRouter

from cacheon.sim.launch import GatewayProcess, SimProcess, free_port, wait_until
from cacheon.sim.tokenizer import gateway_model, write_profile

N = 600
PROMPT = {"prompt": "Routing by prefix keeps the KV cache hot.", "max_tokens": 4}
CHAT = {"messages": [{"role": "user", "content": "Routing by prefix keeps the KV cache hot."}], "max_tokens": 16,
        "stream": True, "stream_options": {"include_usage": True}}


def send(client: httpx.Client, url: str, body: dict) -> None:
    """One request read to its end: a completion, or (``stream`` in the body) a streamed chat completion."""
    if not body.get("stream"):
        client.post(f"{url}/v1/completions", json=body).raise_for_status()
        return
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        lines = list(r.iter_lines())  # to the end of the body: leaving at [DONE] would close the connection
        if "data: [DONE]" not in lines:
            raise SystemExit(f"a stream from {url} ended without [DONE]")


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
    """The smallest HTTP proxy on the gateway's own stack (aiohttp.web + an aiohttp client, uvloop): read
    the body, post it, answer what came back (a stream chunk by chunk). No routing, no checks, no metrics."""
    import aiohttp
    from aiohttp import web

    async def serve() -> None:
        client = aiohttp.ClientSession()

        async def forward(request: web.Request) -> web.StreamResponse:
            async with client.request(request.method, upstream + request.path, data=await request.read(),
                                   headers={"content-type": "application/json"}) as resp:
                if resp.content_type != "text/event-stream":
                    return web.Response(body=await resp.read(), status=resp.status, content_type="application/json")
                out = web.StreamResponse(status=resp.status, headers={"content-type": "text/event-stream"})
                await out.prepare(request)
                async for chunk in resp.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    uvloop.run(serve())


def latencies(url: str, body: dict, n: int) -> list[float]:
    out = []
    with httpx.Client() as client:
        for _ in range(n):
            t0 = time.perf_counter()
            send(client, url, body)
            out.append(time.perf_counter() - t0)
    return out


def cpu_ms(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return (times.user + times.system) * 1e3


def rate(url: str, body: dict, threads: int = 16, seconds: float = 1.0) -> int:
    """Requests completed by ``threads`` closed-loop clients in ``seconds``."""
    def loop(_: int) -> int:
        done, stop = 0, time.monotonic() + seconds
        with httpx.Client() as client:
            while time.monotonic() < stop:
                send(client, url, body)
                done += 1
        return done

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(loop, range(threads)))


def sliced(targets: dict[str, tuple[str, int]], body: dict, slices: int, rounds: int
           ) -> tuple[dict[str, list[float]], dict[str, float], dict[str, float]]:
    """Latencies, CPU ms per request and request rate of every target, measured in interleaved slices."""
    names = list(targets)
    samples: dict[str, list[float]] = {n: [] for n in names}
    cpu = dict.fromkeys(names, 0.0)
    for k in range(slices):
        for name in names[k % len(names):] + names[: k % len(names)]:
            url, pid = targets[name]
            before = cpu_ms(pid)
            samples[name] += latencies(url, body, N // slices)
            cpu[name] += cpu_ms(pid) - before
    done = dict.fromkeys(names, 0)
    for k in range(rounds):
        for name in names[k % len(names):] + names[: k % len(names)]:
            done[name] += rate(targets[name][0], body)
    return samples, {n: cpu[n] / len(samples[n]) for n in names}, {n: done[n] / rounds for n in names}


def profiled(url: str, body: dict, pid: int, seconds: float, out: Path) -> None:
    """py-spy's collapsed stacks of ``pid`` while 16 clients load ``url``."""
    spy = Path(os.environ.get("PY_SPY", Path(sys.executable).with_name("py-spy")))
    if not spy.exists():
        raise SystemExit(f"--profile needs py-spy ({spy}): .venv/bin/pip install py-spy")
    out.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            rate(url, body)

    thread = threading.Thread(target=load)
    thread.start()
    try:
        spied = subprocess.run([str(spy), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "250",
                        "--format", "raw", "--output", str(out / "gateway.txt"), "--native"],
                               capture_output=True, text=True)
    finally:
        stop.set()
        thread.join()
    if spied.returncode != 0:
        raise SystemExit(f"py-spy failed: {spied.stderr.strip()[-2000:]}")
    print(f"profile: {out / 'gateway.txt'} (python benchmarks/pyspy_top.py {out / 'gateway.txt'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, default=12, help="latency slices per target (N=600 requests each)")
    parser.add_argument("--rounds", type=int, default=5, help="one-second 16-thread rate rounds per target")
    parser.add_argument("--no-peer", action="store_true", help="leave sglang-router out")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="then profile the gateway with py-spy into DIR")
    parser.add_argument("--profile-s", type=float, default=20.0)
    parser.add_argument("--stream", action="store_true", help="streamed chat completions (16 tokens) instead")
    args = parser.parse_args()
    releases = Path(os.environ.get("SGLANG_RELEASES_DIR", ROOT / ".sglang"))
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        profile = write_profile(Path(tmp) / "tok")
        model = str(profile[0].parent)  # a local model path: sglang-router loads its tokenizer from there
        body = {"model": model, **(CHAT if args.stream else PROMPT)}
        sim = SimProcess(stack, Path(tmp), profile, "0.5.13.post1", model=model, releases=releases)
        sim.ready()
        gw = GatewayProcess(stack, Path(tmp), profile, "rr", [{"url": sim.url}], health_interval_s=30,
                            models={model: gateway_model(*profile)})
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
            targets[name] = (url, proc.pid or 0)
        targets["gateway"] = (gw.url, gw.proc.pid)
        if not args.no_peer:
            peer = SglangRouter(stack, Path(tmp), [sim.url], "round_robin")
            targets["sglang-router"] = (peer.url, peer.proc.pid)
        for url, _pid in targets.values():
            latencies(url, body, 100)  # warm
        print(f"load average {os.getloadavg()[0]:.1f}; {N} {'streamed chat' if args.stream else 'completion'} "
              f"requests per target in {args.slices} slices, "
              f"rate: 16 threads, {args.rounds} x 1 s rounds per target")
        samples, cpu, rates = sliced(targets, body, args.slices, args.rounds)
        p50 = {name: statistics.median(xs) * 1e3 for name, xs in samples.items()}
        print(f"{'':<14} {'p50':>8} {'added':>8} {'CPU/request':>12} {'max rate':>10}")
        for name in targets:
            print(f"{name:<14} {p50[name]:>6.2f}ms {p50[name] - p50['direct']:>+6.2f}ms {cpu[name]:>10.2f}ms "
                  f"{rates[name]:>6.0f}/s")
        added = p50["gateway"] - p50["direct"]
        print(f"goal: gateway adds <= 1 ms at p50: {added <= 1}")
        if "sglang-router" in targets:
            peer_added = p50["sglang-router"] - p50["direct"]
            ratio, cpu_ratio = added / peer_added, cpu["gateway"] / cpu["sglang-router"]
            print(f"vs sglang-router rr: added p50 {added:.2f} / {peer_added:.2f} ms = {ratio:.2f}x "
                  f"(goal <= 1.0x: {ratio <= 1.0}, <= 1.2x at worst: {ratio <= 1.2}); CPU/request "
                  f"{cpu['gateway']:.2f} / {cpu['sglang-router']:.2f} ms = {cpu_ratio:.2f}x "
                  f"(goal <= 2x: {cpu_ratio <= 2}); "
                  f"rate {rates['gateway'] / rates['sglang-router']:.2f}x; load average {os.getloadavg()[0]:.1f}")
        if args.profile:
            profiled(gw.url, body, gw.proc.pid, args.profile_s, args.profile)


if __name__ == "__main__":
    main()
