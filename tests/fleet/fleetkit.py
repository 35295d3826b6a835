"""The fleet tier's parts in the test process: relays on a loop thread, gateways on the event plane."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import msgspec

from cacheon.fleet.relay import Relay
from cacheon.gateway import relaying
from cacheon.gateway.config import RelayConfig
from cacheon.sim.tokenizer import gateway_model
from tests.gateway.inproc import InProcessGateway, LoopThread

_CRASHED: list[LoopThread] = []  # killed relays' loops, stopped and kept for the session


class RelayThread:
    """One relay (``relaying.serve``, what ``cacheon kv relay`` runs) on a loop thread of its own."""

    def __init__(self, plane: dict[str, Any], urls: list[str], relay_id: str, **extra: Any) -> None:
        raw = {"event_plane": plane, "workers": [{"url": u} for u in urls], "relay_id": relay_id,
               "lease_s": 2.0, "heartbeat_s": 0.2, "snapshot_interval_s": 0.3, **extra}
        self.loop = LoopThread()
        self._stop = asyncio.Event()
        started: asyncio.Future[Relay] = self.loop.loop.create_future()
        self.loop.loop.call_soon_threadsafe(lambda: self.loop.loop.create_task(
            relaying.serve(msgspec.convert(raw, RelayConfig), self._stop, started)))
        self.relay: Relay = asyncio.run_coroutine_threadsafe(_wait(started), self.loop.loop).result(30)

    def status(self) -> dict[str, Any]:
        return self.loop.call(_status(self.relay))

    def kill(self) -> None:
        """Die without letting go: no lease released, the loop stopped mid-work (a crashed process). The
        stopped loop is kept, never closed: its tasks are frozen, as a dead process's are, rather than
        destroyed later under another test (asyncio would log each one there)."""
        self.loop.halt()
        _CRASHED.append(self.loop)
        for follow in list(self.relay.follows.values()):  # what the OS does to a dead process's sockets
            follow.subscriber.stop()
            follow.thread.join(5)
            follow.subscriber.close()

    def close(self) -> None:
        self.loop.call(_set(self._stop))
        self.loop.call(asyncio.sleep(0.5))
        self.loop.close()


async def _wait(started: asyncio.Future[Relay]) -> Relay:
    return await started


async def _status(relay: Relay) -> dict[str, Any]:
    return relay.status()


async def _set(event: asyncio.Event) -> None:
    event.set()


def plane_gateway(loop: LoopThread, base: Path, profile: tuple[Path, Path], urls: list[str],
                  plane: dict[str, Any], **extra: Any) -> InProcessGateway:
    return InProcessGateway(loop, {"policy": "exact", "workers": [{"url": u} for u in urls],
                                   "models": {"demo": gateway_model(*profile)}, "challenge_timeout_s": 5,
                                   "event_plane": plane, **extra}, base)


def ready(gw: InProcessGateway, urls: list[str]) -> bool:
    s = gw.status()
    return all(u in s and s[u]["ladder"]["state"] == "READY" for u in urls)


def drive(gw: InProcessGateway, n: int, start: int) -> None:
    for i in range(start, start + n):
        messages = [{"role": "system", "content": f"shared system prompt {i % 3} " * 8},
                    {"role": "user", "content": f"question {i}"}]
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={"model": "demo", "messages": messages,
                                                              "max_tokens": 2}, timeout=30)
        assert r.status_code == 200, r.text
