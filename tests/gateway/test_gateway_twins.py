"""One engine registered twice under URLs that do not resolve alike (its port and a TCP forward to it): the
discovered KV publisher is the same, so the second is fenced ``duplicate_engine`` and never routed to."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from cacheon.sim.launch import SimProcess, wait_until
from cacheon.sim.tokenizer import gateway_model
from tests.gateway.inproc import InProcessGateway, LoopThread

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # a simulated worker process


async def _forward(target_port: int) -> tuple[asyncio.Server, int]:
    """A TCP port forward to 127.0.0.1:``target_port`` (what a second Service or kubectl port-forward is)."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _close(server: asyncio.Server) -> None:
    """On the server's own loop: ``close()`` from another thread races its connections' ends."""
    server.close()


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


def test_the_same_engine_behind_a_port_forward_is_fenced_as_a_duplicate(
        loop: LoopThread, profile: tuple[Path, Path], tmp_path: Path) -> None:
    with ExitStack() as stack:
        sim = SimProcess(stack, tmp_path, profile, "0.5.23", replay=True)
        sim.ready()
        server, port = loop.call(_forward(sim.port))
        forwarded = f"http://127.0.0.1:{port}"
        gw = InProcessGateway(loop, {"policy": "exact", "models": {"demo": gateway_model(*profile)},
                                     "workers": [{"url": sim.url, "id": "direct"},
                                                 {"url": forwarded, "id": "forwarded"}],
                                     "attest_interval_s": 1.0, "attest_retry_s": 1.0}, tmp_path)
        try:
            def settled() -> dict[str, dict] | None:
                workers = {w["id"]: w for w in loop.call(gw.gateway.status())["workers"]}
                states = sorted(w["ladder"]["state"] for w in workers.values())
                return workers if states == ["FENCED", "READY"] else None

            workers = wait_until(settled, "one READY, one FENCED", 30)
            fenced = next(w for w in workers.values() if w["ladder"]["state"] == "FENCED")
            ready = next(w for w in workers.values() if w["ladder"]["state"] == "READY")
            assert fenced["ladder"]["reason"] == "duplicate_engine" and not fenced["subscribed"]
            assert f"is worker {ready['id']}'s ({ready['url']}): the same engine" in fenced["ladder"]["detail"]
            # Both ladders run again (READY past attest_interval_s, FENCED past attest_retry_s): the READY one
            # is not fenced by its own fenced duplicate.
            time.sleep(3)
            workers = wait_until(settled, "one READY, one FENCED after re-attesting", 30)
            assert [w["id"] for w in workers.values() if w["ladder"]["state"] == "READY"] == [ready["id"]]
            for _ in range(4):
                r = httpx.post(f"{gw.url}/v1/completions", timeout=30,
                               json={"model": "demo", "prompt": "one engine, two names", "max_tokens": 1})
                assert r.status_code == 200 and r.headers["x-cacheon-worker"] == ready["url"]
        finally:
            gw.close()
            loop.call(_close(server))
