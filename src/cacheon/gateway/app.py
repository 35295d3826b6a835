"""The gateway's HTTP surface: OpenAI-compatible and SGLang-native routes, worker admin, status, metrics."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cacheon.errors import UsageError
from cacheon.gateway.config import GatewayConfig, worker_spec
from cacheon.gateway.proxy import oai_error
from cacheon.gateway.service import Gateway


def build_app(cfg: GatewayConfig) -> Starlette:
    gw = Gateway(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    fleet = gw.fleet

    def proxied(path: str, kind: str) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            return await gw.proxy.handle(request, path, kind)

        return handler

    async def models(_: Request) -> Response:
        names = list(gw.profiles) or sorted({w.discovery.model for w in fleet.workers.values() if w.discovery})
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "cacheon"} for n in names]
        return JSONResponse({"object": "list", "data": data})

    async def health(_: Request) -> Response:
        now = time.time()
        ok = any(w.available(now) for w in fleet.workers.values())
        return JSONResponse({"ok": ok}, 200 if ok else 503)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def status(_: Request) -> Response:
        return JSONResponse({"policy": cfg.policy, "workers": [fleet.status(w) for w in fleet.workers.values()]})

    async def workers(request: Request) -> Response:
        if request.method == "GET":
            return JSONResponse([fleet.status(w) for w in fleet.workers.values()])
        try:
            spec = worker_spec(await request.json())
            worker = fleet.add(spec)
        except (ValueError, UsageError) as exc:
            return oai_error(400, str(exc))
        return JSONResponse(fleet.status(worker), 201)

    async def one_worker(request: Request) -> Response:
        worker = fleet.workers.get(request.path_params["wid"])
        if worker is None:
            return oai_error(404, f"no worker {request.path_params['wid']!r}", code="worker_not_found")
        if request.url.path.endswith("/drain"):
            worker.draining = True
            return JSONResponse(fleet.status(worker), 202)
        await fleet.remove(worker)
        return JSONResponse({"removed": worker.id, "in_flight_left": worker.in_flight})

    routes = [
        Route("/v1/completions", proxied("/v1/completions", "completion"), methods=["POST"]),
        Route("/v1/chat/completions", proxied("/v1/chat/completions", "chat"), methods=["POST"]),
        Route("/generate", proxied("/generate", "generate"), methods=["POST"]),
        Route("/v1/models", models),
        Route("/health", health),
        Route("/metrics", metrics),
        Route("/status", status),
        Route("/workers", workers, methods=["GET", "POST"]),
        Route("/workers/{wid}", one_worker, methods=["DELETE"]),
        Route("/workers/{wid}/drain", one_worker, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
