"""The gateway's HTTP service: OpenAI-compatible proxy with KV-aware routing, worker admin, status.

One asyncio loop owns all routing state; each worker's KV feeds run in their own thread
(``Subscriber.run``) and touch only the shared ``BlockIndex`` (thread-safe) and ``Echoes``.
A request is retried on another worker only while nothing has reached the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from cacheon.errors import UsageError
from cacheon.gateway.attest import Echoes, run_ladder
from cacheon.gateway.config import GatewayConfig, worker_spec
from cacheon.gateway.contracts import by_id
from cacheon.gateway.disconnect import unless_client_leaves
from cacheon.gateway.http import JSON_HEADERS, TRANSPORT_ERRORS, session
from cacheon.gateway.index import BlockIndex
from cacheon.gateway.metrics import Metrics
from cacheon.gateway.policy import Approx, Exact, RoundRobin
from cacheon.gateway.subscriber import Subscriber
from cacheon.gateway.tokenize import Profile
from cacheon.gateway.workers import FENCED, READY, Discovery, Worker, discover

_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}


def oai_error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status)


class Gateway:
    """Routing state and the worker lifecycle."""

    def __init__(self, cfg: GatewayConfig) -> None:
        self.cfg = cfg
        self.profiles = {name: Profile(spec) for name, spec in cfg.models.items()}
        self.index = BlockIndex()
        self.echoes = Echoes()
        self.workers: dict[str, Worker] = {}
        self.metrics = Metrics(lambda: [(w.id, w.feed_totals()) for w in list(self.workers.values())], self.profiles)
        self.policy: Any = {
            "rr": lambda: RoundRobin(),
            "exact": lambda: Exact(self.index, cfg.load_epsilon, cfg.min_prefix_blocks, cfg.min_match_ratio),
            "approx": lambda: Approx(cfg.load_epsilon, cfg.min_prefix_blocks, cfg.min_match_ratio,
                                     cfg.approx_max_entries),
        }[cfg.policy]()
        self.client: aiohttp.ClientSession | None = None
        self._ids = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._attesting: set[str] = set()

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self.client = session()
        for spec in self.cfg.workers:
            self.add(spec)
        self._spawn(self._health_loop())

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in self.workers.values():
            self._unsubscribe(w)
        if self.client is not None:
            await self.client.close()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def add(self, spec: Any) -> Worker:
        wid = spec.id or f"w{next(self._ids)}"
        while wid in self.workers and spec.id is None:
            wid = f"w{next(self._ids)}"
        if wid in self.workers or any(w.url == spec.url for w in self.workers.values()):
            raise UsageError(f"worker {wid} ({spec.url}) is already registered")
        worker = self.workers[wid] = Worker(wid, spec)
        self._spawn(self.attest(worker))
        return worker

    async def attest(self, worker: Worker) -> None:
        """Exact policy: the full ladder. Others: discovery only, for /status and approx."""
        if worker.id in self._attesting:
            return
        self._attesting.add(worker.id)
        try:
            assert self.client is not None
            if self.cfg.policy == "exact":
                await run_ladder(self.client, worker, self.cfg, self.profiles, self.echoes, self._subscribe)
                self._sync_seen(worker)
            else:
                with contextlib.suppress(Exception):
                    worker.discovery = await discover(self.client, worker.url, self.cfg.request_timeout_s)
        finally:
            self._attesting.discard(worker.id)

    def _subscribe(self, worker: Worker) -> None:
        """(Re)connect the worker's KV feeds for its discovered geometry, in a thread of their own."""
        found: Discovery = worker.discovery  # type: ignore[assignment]
        if worker.subscriber is not None:
            ranks = [f.rank for f in worker.subscriber.feeds]
            if ranks == list(range(found.dp_size)) and worker.subscriber.feeds[0].contract.id == worker.contract_id:
                return
            self._unsubscribe(worker)
        sub = Subscriber(self.index, lambda d, wid=worker.id: self.echoes.on_delivery(wid, d))
        replay = worker.replay_port
        sub.add_worker(
            worker.id, f"tcp://{worker.kv_host}:{found.kv_port}", by_id(worker.contract_id or ""),
            range(found.dp_size), replay_base=f"tcp://{worker.kv_host}:{replay}" if replay else None,
        )
        worker.stop = threading.Event()
        worker.subscriber = sub
        worker.thread = threading.Thread(target=sub.run, args=(worker.stop, 0.05), daemon=True,
                                         name=f"kv-{worker.id}")
        worker.thread.start()

    def _unsubscribe(self, worker: Worker) -> None:
        if worker.subscriber is None:
            return
        worker.stop.set()
        if worker.thread is not None:
            worker.thread.join(timeout=5)
        for feed in worker.subscriber.feeds:
            self.index.drop(feed.source)
        worker.subscriber.close()
        worker.subscriber = worker.thread = None

    def _sync_seen(self, worker: Worker) -> None:
        worker.seen_resets, worker.seen_rejects = worker.resets(), worker.rejects()

    async def drain(self, worker: Worker) -> None:
        worker.draining = True
        deadline = time.monotonic() + self.cfg.drain_timeout_s
        while worker.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def remove(self, worker: Worker) -> None:
        """Drain first, then drop its KV state."""
        await self.drain(worker)
        self.workers.pop(worker.id, None)
        self._unsubscribe(worker)
        if isinstance(self.policy, Approx):
            self.policy.forget(worker.id)

    async def _health_loop(self) -> None:
        assert self.client is not None
        while True:
            await asyncio.sleep(self.cfg.health_interval_s)
            for w in list(self.workers.values()):
                await self._check(w)

    async def _check(self, w: Worker) -> None:
        """Active health check; restarts, reconnects, rejects and the cadence trigger re-attestation."""
        assert self.client is not None
        try:
            async with self.client.get(f"{w.url}/health", timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
                ok = resp.status == 200
        except TRANSPORT_ERRORS:
            ok = False
        came_back = ok and not w.healthy
        w.healthy = ok
        if ok and came_back:
            w.failures, w.open_until = 0, 0.0
        if self.cfg.policy != "exact" or not ok:
            return
        resets, rejects = w.resets(), w.rejects()
        if rejects > w.seen_rejects:
            w.set_state(FENCED, "contract_reject", f"{rejects - w.seen_rejects} KV batch(es) refused by the decoder")
        now = time.time()
        stale = w.state == READY and now - (w.attested_at or now) > self.cfg.attest_interval_s
        retry = w.state == FENCED and now - w.state_since > self.cfg.attest_retry_s
        if came_back or resets > w.seen_resets or rejects > w.seen_rejects or stale or retry:
            if w.state == READY:
                w.set_state(FENCED, "reattest", "re-attesting")
            self._spawn(self.attest(w))

    # -- status --------------------------------------------------------------------------

    def status(self, w: Worker) -> dict[str, Any]:
        totals = w.feed_totals()
        d = w.discovery
        return {
            "id": w.id,
            "url": w.url,
            "version": d.version if d else None,
            "model": d.model if d else None,
            "contract": w.contract_id,
            "ladder": {"state": w.state, "reason": w.reason, "detail": w.detail, "since": w.state_since,
                       "attested_at": w.attested_at},
            "healthy": w.healthy,
            "draining": w.draining,
            "breaker_open": time.time() < w.open_until,
            "in_flight": w.in_flight,
            "kv_replay_port": w.replay_port,
            "indexed_blocks": sum(self.index.blocks((w.id, r)) for r in range(d.dp_size if d else 0)),
            "last_seq": w.last_seq(),
            "rejects": totals.get("rejects", {}),
        }

    # -- proxy ---------------------------------------------------------------------------

    def model_of(self, kind: str, body: dict[str, Any]) -> str | None:
        """The served model a request is for (None: no profiles, any model goes), or why not.

        SGLang's native ``/generate`` has no ``model`` field: with one configured model it is that
        one; with several the client names one in ``model``, which is removed before forwarding.
        """
        model = body.get("model")
        if kind == "generate" and model is None:
            if len(self.profiles) > 1:
                raise ValueError(f"several models are served ({', '.join(self.profiles)}): name one in 'model'")
            return next(iter(self.profiles), None)
        if not isinstance(model, str):
            raise ValueError("'model' is required and must be a string")
        if self.profiles and model not in self.profiles:
            raise UnknownModel(f"The model '{model}' does not exist")
        return model

    def tokens(self, kind: str, body: dict[str, Any], model: str | None) -> list[int] | None:
        """The request's prompt tokens as the worker will see them; None when not predictable."""
        if self.cfg.policy == "rr" or model is None:
            return None
        profile = self.profiles[model]
        if kind == "chat":
            messages = body.get("messages")
            if not isinstance(messages, list):
                raise ValueError("'messages' must be a list")
            return profile.encode_chat(messages)
        prompt = body.get("input_ids") if kind == "generate" and "input_ids" in body else body.get(
            "text" if kind == "generate" else "prompt")
        if isinstance(prompt, list) and all(type(t) is int for t in prompt):
            return prompt
        if isinstance(prompt, str):
            return profile.encode(prompt) if kind == "generate" else profile.encode_completion(prompt)
        return None

    def _failed(self, w: Worker) -> None:
        self.metrics.upstream_errors.labels(w.id).inc()
        w.failures += 1
        if w.failures >= self.cfg.breaker_failures:
            w.open_until = time.time() + self.cfg.breaker_open_s

    def _pool(self, model: str | None, tried: set[str]) -> list[Worker]:
        """Workers that may take this request now: available, untried, serving its model (if known)."""
        now = time.time()
        return [w for w in self.workers.values()
                if w.available(now) and w.id not in tried
                and (model is None or w.discovery is None or w.discovery.model == model)]

    async def proxy(self, request: Request, path: str, kind: str) -> Response:
        try:
            raw = await request.body()
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("the request body must be a JSON object")
            model = self.model_of(kind, body)
            if kind == "generate" and "model" in body:
                del body["model"]
                raw = json.dumps(body).encode()
            tokens = self.tokens(kind, body, model)
        except UnknownModel as exc:
            self.metrics.requests.labels(path, "404").inc()
            return oai_error(404, str(exc), code="model_not_found")
        except (ValueError, UsageError) as exc:
            self.metrics.requests.labels(path, "400").inc()
            return oai_error(400, str(exc))
        stream = bool(body.get("stream"))
        tried: set[str] = set()
        last: Response | None = None  # the last upstream 5xx, returned if no worker is left to try
        failures: list[str] = []
        while pool := self._pool(model, tried):
            if not tried:
                worker, reason, held = self.policy.choose(pool, tokens)
                self.metrics.decisions.labels(self.policy.name, reason).inc()
                self.metrics.prefix_hit_tokens.inc(held)
            else:
                worker, reason = min(pool, key=lambda w: w.in_flight), "retry"
                self.metrics.decisions.labels(self.policy.name, reason).inc()
            tried.add(worker.id)
            headers = {"x-cacheon-worker": worker.url, "x-cacheon-route": f"{self.policy.name}:{reason}"}
            worker.in_flight += 1  # from the decision on: the next arrival of a burst must see it
            relayed = False
            try:
                if stream:
                    response = await self._stream(worker, path, raw, headers)
                    relayed = True  # the relay releases the count when the stream ends
                else:
                    answered, called = await unless_client_leaves(request, self._call(worker, path, raw, headers))
                    response = called if answered else Response(status_code=499)  # closed upstream too
            except Retry as retry:
                last = retry.response or last
                failures.append(f"{worker.id}: {retry.why}")
                continue
            finally:
                if not relayed:
                    worker.in_flight -= 1
            self.metrics.requests.labels(path, str(response.status_code)).inc()
            return response
        if last is not None:
            self.metrics.requests.labels(path, str(last.status_code)).inc()
            return last
        self.metrics.requests.labels(path, "503").inc()
        tried_note = f" (tried {'; '.join(failures)})" if failures else ""
        return oai_error(503, f"no healthy worker can take this request{tried_note}", "service_unavailable")

    async def _call(self, w: Worker, path: str, raw: bytes, headers: dict[str, str]) -> Response:
        """The whole response; Retry on a transport error, a timeout or a 5xx."""
        assert self.client is not None
        try:
            async with self.client.post(f"{w.url}{path}", data=raw, headers=JSON_HEADERS,
                                        timeout=aiohttp.ClientTimeout(total=self.cfg.request_timeout_s)) as resp:
                content, status, upstream = await resp.read(), resp.status, resp.headers
        except TRANSPORT_ERRORS as exc:
            self._failed(w)
            raise Retry(_transport(exc, self.cfg.request_timeout_s)) from None
        response = Response(content, status, _passed(upstream, headers))
        if status >= 500:
            self._failed(w)
            raise Retry(f"HTTP {status}", response)
        w.failures = 0
        return response

    async def _stream(self, w: Worker, path: str, raw: bytes, headers: dict[str, str]) -> Response:
        """Chunk-by-chunk passthrough; Retry only before the status line reaches the client."""
        assert self.client is not None
        # A stream may run long: the limit is on the gap between chunks, not on the whole.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.cfg.request_timeout_s,
                                        sock_read=self.cfg.request_timeout_s)
        try:
            resp = await self.client.post(f"{w.url}{path}", data=raw, headers=JSON_HEADERS, timeout=timeout)
            if resp.status >= 500:  # read whole: it may become the answer if no worker is left
                failed = Response(await resp.read(), resp.status, _passed(resp.headers, headers))
                self._failed(w)
                raise Retry(f"HTTP {resp.status}", failed)
        except TRANSPORT_ERRORS as exc:
            self._failed(w)
            raise Retry(_transport(exc, self.cfg.request_timeout_s)) from None
        w.failures = 0

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.content.iter_any():
                    yield chunk
            except TRANSPORT_ERRORS:
                self.metrics.upstream_errors.labels(w.id).inc()  # mid-stream: too late to retry

        def finish() -> None:
            resp.close()  # closing an unfinished upstream response aborts that request on the worker
            w.in_flight -= 1

        return _Relay(chunks(), finish, resp.status, _passed(resp.headers, headers))


class UnknownModel(ValueError):
    """The request names a model the gateway has no profile for (HTTP 404, as OpenAI answers)."""


class Retry(Exception):
    """This worker failed before anything reached the client: why, and the 5xx it sent, if any."""

    def __init__(self, why: str, response: Response | None = None) -> None:
        super().__init__(why)
        self.why, self.response = why, response


def _transport(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return f"no answer within {timeout_s:g} s"
    return f"{type(exc).__name__}: {exc}"


def _passed(upstream: Any, ours: dict[str, str]) -> dict[str, str]:
    """The worker's response headers minus hop-by-hop ones, plus the gateway's decision headers."""
    return {**{k: v for k, v in upstream.items() if k.lower() not in _HOP}, **ours}


class _Relay(StreamingResponse):
    """A stream whose upstream is released however the relay ends (done, client gone, or never started)."""

    def __init__(self, content: AsyncIterator[bytes], finish: Any, status: int, headers: dict[str, str]) -> None:
        super().__init__(content, status, headers)
        self._finish = finish

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._finish()


def build_app(cfg: GatewayConfig) -> Starlette:
    gw = Gateway(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    def proxied(path: str, kind: str) -> Any:
        async def handler(request: Request) -> Response:
            return await gw.proxy(request, path, kind)

        return handler

    async def models(_: Request) -> Response:
        names = list(gw.profiles) or sorted({w.discovery.model for w in gw.workers.values() if w.discovery})
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "cacheon"} for n in names]
        return JSONResponse({"object": "list", "data": data})

    async def health(_: Request) -> Response:
        now = time.time()
        ok = any(w.available(now) for w in gw.workers.values())
        return JSONResponse({"ok": ok}, 200 if ok else 503)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def status(_: Request) -> Response:
        return JSONResponse({"policy": cfg.policy, "workers": [gw.status(w) for w in gw.workers.values()]})

    async def workers(request: Request) -> Response:
        if request.method == "GET":
            return JSONResponse([gw.status(w) for w in gw.workers.values()])
        try:
            spec = worker_spec(await request.json())
            worker = gw.add(spec)
        except (ValueError, UsageError) as exc:
            return oai_error(400, str(exc))
        return JSONResponse(gw.status(worker), 201)

    async def one_worker(request: Request) -> Response:
        worker = gw.workers.get(request.path_params["wid"])
        if worker is None:
            return oai_error(404, f"no worker {request.path_params['wid']!r}", code="worker_not_found")
        if request.url.path.endswith("/drain"):
            worker.draining = True
            return JSONResponse(gw.status(worker), 202)
        await gw.remove(worker)
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
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.gateway = gw
    return app
