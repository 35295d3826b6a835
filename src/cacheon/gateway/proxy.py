"""The gateway's request path: parse, tokenize, pick a worker, forward, retry, relay.

A request is retried on another worker only while nothing has reached the client. Every request
ends in one ``Outcome``, recorded in one place (``_record``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from cacheon.disconnect import unless_client_leaves
from cacheon.errors import UsageError
from cacheon.gateway.config import GatewayConfig
from cacheon.gateway.fleet import Fleet
from cacheon.gateway.http import JSON_HEADERS, TRANSPORT_ERRORS
from cacheon.gateway.metrics import Metrics
from cacheon.gateway.policy import Decision, Policy, RouteReason
from cacheon.gateway.workers import Worker
from cacheon.tokens.profile import TokenizerProfile

_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding", "keep-alive"}


def oai_error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status)


class UnknownModel(ValueError):
    """The request names a model the gateway has no profile for (HTTP 404, as OpenAI answers)."""


class Retry(Exception):
    """This worker failed before anything reached the client: why, and the 5xx it sent, if any."""

    def __init__(self, why: str, response: Response | None = None) -> None:
        super().__init__(why)
        self.why, self.response = why, response


@dataclass
class Outcome:
    """How one request ended: its answer, and the attempts that led there."""

    endpoint: str
    response: Response
    decisions: list[Decision] = field(default_factory=list)  # one per attempt, in order
    failures: list[str] = field(default_factory=list)  # "worker: why" per failed attempt


class Proxy:
    """Forwards OpenAI and SGLang-native requests to the fleet's workers under one policy."""

    def __init__(self, cfg: GatewayConfig, fleet: Fleet, policy: Policy, profiles: dict[str, TokenizerProfile],
                 metrics: Metrics) -> None:
        self.cfg, self.fleet, self.policy, self.profiles, self.metrics = cfg, fleet, policy, profiles, metrics

    async def handle(self, request: Request, path: str, kind: str) -> Response:
        outcome = await self._route(request, path, kind)
        self._record(outcome)
        return outcome.response

    def _record(self, outcome: Outcome) -> None:
        self.metrics.requests.labels(outcome.endpoint, str(outcome.response.status_code)).inc()

    # -- parse ---------------------------------------------------------------------------

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
        if not self.policy.tokenizes or model is None:
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

    # -- route ---------------------------------------------------------------------------

    async def _route(self, request: Request, path: str, kind: str) -> Outcome:
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
            return Outcome(path, oai_error(404, str(exc), code="model_not_found"))
        except (ValueError, UsageError) as exc:
            return Outcome(path, oai_error(400, str(exc)))
        stream = bool(body.get("stream"))
        outcome = Outcome(path, oai_error(503, "no healthy worker can take this request", "service_unavailable"))
        tried: set[str] = set()
        last: Response | None = None  # the last upstream 5xx, returned if no worker is left to try
        while pool := self.fleet.pool(model, tried):
            decision = self._pick(pool, tokens, first=not tried)
            outcome.decisions.append(decision)
            worker = decision.worker
            tried.add(worker.id)
            headers = {"x-cacheon-worker": worker.url, "x-cacheon-route": f"{self.policy.name}:{decision.reason}"}
            worker.in_flight += 1  # from the decision on: the next arrival of a burst must see it
            relayed = False
            try:
                if stream:
                    outcome.response = await self._stream(worker, path, raw, headers, decision)
                    relayed = True  # the relay releases the count when the stream ends
                else:
                    answered, called = await unless_client_leaves(request, self._call(worker, path, raw, headers))
                    # A client gone first closed the upstream call too.
                    outcome.response = called if answered and called is not None else Response(status_code=499)
            except Retry as retry:
                last = retry.response or last
                outcome.failures.append(f"{worker.id}: {retry.why}")
                continue
            finally:
                if not relayed:
                    worker.in_flight -= 1
                    self.policy.released(decision)
            return outcome
        if last is not None:
            outcome.response = last
        elif outcome.failures:
            outcome.response = oai_error(
                503, f"no healthy worker can take this request (tried {'; '.join(outcome.failures)})",
                "service_unavailable")
        return outcome

    def _pick(self, pool: list[Worker], tokens: list[int] | None, first: bool) -> Decision:
        """The policy's choice for a first attempt; the least-loaded untried worker for a retry."""
        if first:
            decision = self.policy.choose(pool, tokens)
            self.metrics.prefix_hit_tokens.inc(decision.held)
        else:
            decision = Decision(min(pool, key=lambda w: w.in_flight), RouteReason.RETRY, 0)
        self.metrics.decisions.labels(self.policy.name, decision.reason).inc()
        return decision

    def _failed(self, w: Worker) -> None:
        self.metrics.upstream_errors.labels(w.id).inc()
        w.failed(self.cfg.breaker_failures, self.cfg.breaker_open_s)

    # -- forward -------------------------------------------------------------------------

    async def _call(self, w: Worker, path: str, raw: bytes, headers: dict[str, str]) -> Response:
        """The whole response; Retry on a transport error, a timeout or a 5xx."""
        try:
            async with self.fleet.client.post(f"{w.url}{path}", data=raw, headers=JSON_HEADERS,
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

    async def _stream(self, w: Worker, path: str, raw: bytes, headers: dict[str, str], decision: Decision
                      ) -> Response:
        """Chunk-by-chunk passthrough; Retry only before the status line reaches the client."""
        # A stream may run long: the limit is on the gap between chunks, not on the whole.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.cfg.request_timeout_s,
                                        sock_read=self.cfg.request_timeout_s)
        try:
            resp = await self.fleet.client.post(f"{w.url}{path}", data=raw, headers=JSON_HEADERS, timeout=timeout)
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
            self.policy.released(decision)

        return _Relay(chunks(), finish, resp.status, _passed(resp.headers, headers))


def _transport(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return f"no answer within {timeout_s:g} s"
    return f"{type(exc).__name__}: {exc}"


def _passed(upstream: Mapping[str, str], ours: dict[str, str]) -> dict[str, str]:
    """The worker's response headers minus hop-by-hop ones, plus the gateway's decision headers."""
    return {**{k: v for k, v in upstream.items() if k.lower() not in _HOP}, **ours}


class _Relay(StreamingResponse):
    """A stream whose upstream is released however the relay ends (done, client gone, or never started)."""

    def __init__(self, content: AsyncIterator[bytes], finish: Callable[[], None], status: int,
                 headers: dict[str, str]) -> None:
        super().__init__(content, status, headers)
        self._finish = finish

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._finish()
