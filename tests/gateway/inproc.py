"""A gateway served inside the test process (real listeners on real ports, its own event loop thread),
and a header-recording HTTP server: a stand-in worker used only where a test must see what the
gateway sent upstream (request ids, trace context), which neither SGLang nor the simulator echoes."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from cacheon.aio import cancel_pending
from cacheon.gateway.app import GatewayServer
from cacheon.gateway.config import parse
from cacheon.gateway.service import Gateway
from cacheon.gateway.tracing import Tracing


class LoopThread:
    """An event loop on a thread of its own, for servers the test thread talks to over HTTP."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="test-loop")
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def halt(self) -> None:
        """Stop the loop where it is, tasks and all, without closing it (a process frozen or killed)."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def close(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self.call(cancel_pending(), 10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class InProcessGateway:
    def __init__(self, loop: LoopThread, raw: dict[str, Any], base: Path, tracing: Tracing | None = None) -> None:
        raw = {"listen": "127.0.0.1:0", "admin": {"listen": "127.0.0.1:0"}, "health_interval_s": 0.5, **raw}
        self.loop = loop
        self.gateway = Gateway(parse(raw, base, {}), tracing)
        self.server = GatewayServer(self.gateway)
        loop.call(self.server.start())
        self.url = f"http://{self.server.addresses['listen']}"
        admin = self.server.addresses.get("admin.listen")
        self.admin_url = f"http://{admin}" if admin else None

    def status(self) -> dict[str, dict[str, Any]]:
        """Every worker's full status, by URL, from the admin listener (as ``GatewayProcess.status``)."""
        return {w["url"]: w for w in httpx.get(f"{self.admin_url}/status", timeout=5).json()["workers"]}

    def close(self) -> None:
        self.loop.call(self.server.stop())


async def serve_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """``app`` served on a free loopback port: its runner (to clean up) and its URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


class Recorder:
    """A plain HTTP server answering like a worker (health, a completion, a 2-chunk stream), keeping
    each request's headers. Not SGLang: only for checking what the gateway forwards."""

    def __init__(self, loop: LoopThread) -> None:
        self.headers: list[dict[str, str]] = []
        self.probes = 0  # GET /health calls

        async def health(_: web.Request) -> web.Response:
            self.probes += 1
            return web.json_response({})

        async def complete(request: web.Request) -> web.StreamResponse:
            self.headers.append({k.lower(): v for k, v in request.headers.items()})
            body = await request.json()
            if not body.get("stream"):
                return web.json_response({"choices": [{"text": " ok"}], "usage": {"prompt_tokens": 1}})
            out = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await out.prepare(request)
            for chunk in (b'data: {"choices": [{"text": " a"}]}\n\n', b"data: [DONE]\n\n"):
                await out.write(chunk)
            await out.write_eof()
            return out

        async def start() -> str:
            app = web.Application()
            app.router.add_get("/health", health)
            app.router.add_post("/v1/completions", complete)
            self._runner, url = await serve_app(app)
            return url

        self._loop = loop
        self.url: str = loop.call(start())

    def close(self) -> None:
        self._loop.call(self._runner.cleanup())
