"""The gateway's request path: parse, tokenize, pick a worker, forward, retry, relay.

A request is retried on another worker only while nothing has reached the client. Every request
ends in one ``Outcome``, recorded in one place (``_record``): the metrics, the access log line and
the trace span all hang off it. A client that leaves cancels the handler (the server runs with
handler cancellation), which closes the upstream connection: that is how a worker learns to abort.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import aiohttp
import msgspec
from aiohttp import web
from yarl import URL

from cacheon.errors import UsageError
from cacheon.gateway.config import GatewayConfig
from cacheon.gateway.fleet import Fleet
from cacheon.gateway.http import JSON_HEADERS, TRANSPORT_ERRORS
from cacheon.gateway.metrics import Metrics
from cacheon.gateway.policy import Decision, Policy, RouteReason
from cacheon.gateway.precision import StreamTail, reported_cached
from cacheon.gateway.prediction import NoPrediction, Reuse, reuse_of
from cacheon.gateway.tracing import Tracing
from cacheon.gateway.workers import Worker
from cacheon.tokens.chat import NotPredictable
from cacheon.tokens.profile import TokenizerProfile

log = logging.getLogger("cacheon.access")
_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "server", "date"}
_json = msgspec.json.Encoder()
CLIENT_GONE = 499  # nginx's code for a client that closed the connection first
U32_IDS = 1 << 32  # no vocabulary reaches it; a token id at or past a model's vocabulary crashes SGLang's scheduler


class Refusal(StrEnum):
    """Why the gateway answered a request itself (``cacheon_request_rejects_total{reason}``)."""

    BAD_JSON = "bad_json"
    BAD_REQUEST = "bad_request"
    UNKNOWN_MODEL = "unknown_model"
    BODY_TOO_LARGE = "body_too_large"
    NO_WORKER = "no_worker"
    UNKNOWN_ROUTE = "unknown_route"
    UNAUTHORIZED = "unauthorized"
    INTERNAL = "internal"


def oai_error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
              headers: Mapping[str, str] | None = None) -> web.Response:
    """An OpenAI-shaped error: ``{"error": {message, type, param, code}}``."""
    body = _json.encode({"error": {"message": message, "type": kind, "param": None, "code": code}})
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


class Rejected(Exception):
    """The gateway answers this request itself, with an OpenAI error."""

    def __init__(self, refusal: Refusal, status: int, message: str, kind: str = "invalid_request_error",
                 code: str | None = None) -> None:
        super().__init__(message)
        self.refusal, self.status, self.message, self.kind, self.code = refusal, status, message, kind, code


class Retry(Exception):
    """This worker failed before anything reached the client: why, and the 5xx it sent, if any."""

    def __init__(self, why: str, response: web.Response | None = None) -> None:
        super().__init__(why)
        self.why, self.response = why, response


@dataclass
class Outcome:
    """How one request ended: its answer, the attempts that led there, and what they took."""

    endpoint: str
    request_id: str
    started: float  # perf_counter at arrival
    kind: str = "completion"  # completion, chat or generate: where the engine reports its cached tokens
    model: str | None = None
    stream: bool = False
    prompt_tokens: int | None = None  # as the gateway tokenized it (None: not tokenized)
    response: web.StreamResponse | None = None
    status: int = 0  # what the client got (499: it left first)
    refusal: Refusal | None = None
    decisions: list[Decision] = field(default_factory=list)  # one per attempt, in order
    failures: list[str] = field(default_factory=list)  # "worker: why" per failed attempt
    first_chunk: float | None = None  # perf_counter of a stream's first upstream chunk
    error: str | None = None  # how a stream ended early, if it did
    refusal_reason: NoPrediction | None = None  # why nothing about this request's cache can be predicted
    tail: StreamTail | None = None  # a stream's last counting event, for scoring the prediction
    span: Any = None  # the trace span, when tracing is on


def request_id(request: web.Request) -> str:
    """The client's ``x-request-id`` when it is a sane token (<= 128 printable ASCII), else a new one."""
    given = request.headers.get("x-request-id")
    if given and len(given) <= 128 and given.isascii() and given.isprintable():
        return given
    return os.urandom(16).hex()


class Proxy:
    """Forwards OpenAI and SGLang-native requests to the fleet's workers under one policy."""

    def __init__(self, cfg: GatewayConfig, fleet: Fleet, policy: Policy, profiles: dict[str, TokenizerProfile],
                 metrics: Metrics, tracing: Tracing | None = None) -> None:
        self.cfg, self.fleet, self.policy, self.profiles, self.metrics = cfg, fleet, policy, profiles, metrics
        self.tracing = tracing
        # Per-request costs kept off the hot path: parsed upstream URLs, timeouts, metric children.
        self._urls: dict[tuple[str, str], URL] = {}
        self._timeout = aiohttp.ClientTimeout(total=cfg.request_timeout_s)
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.request_timeout_s,
                                                     sock_read=cfg.request_timeout_s)
        self._series: dict[tuple[str, ...], Any] = {}

    async def handle(self, request: web.Request, path: str, kind: str) -> web.StreamResponse:
        outcome = Outcome(path, request_id(request), time.perf_counter(), kind)
        if self.tracing is not None:
            outcome.span = self.tracing.start(f"{request.method} {path}", request.headers, outcome.request_id)
        try:
            outcome.response = await self._route(request, kind, outcome)
        except Rejected as rejected:
            outcome.refusal = rejected.refusal
            outcome.response = oai_error(rejected.status, rejected.message, rejected.kind, rejected.code,
                                         {"x-request-id": outcome.request_id})
        except asyncio.CancelledError:
            outcome.status, outcome.error = CLIENT_GONE, "client disconnected"
            raise
        except Exception:
            log.exception("request failed inside the gateway", extra={"fields": {"request_id": outcome.request_id}})
            outcome.refusal = Refusal.INTERNAL
            outcome.response = oai_error(500, f"internal gateway error (request {outcome.request_id})",
                                         "internal_error", headers={"x-request-id": outcome.request_id})
        finally:
            self._record(outcome)
        return outcome.response

    def _record(self, o: Outcome) -> None:
        """The one place a request's outcome is counted, logged and traced."""
        status = o.status or (o.response.status if o.response is not None else 0)
        elapsed = time.perf_counter() - o.started
        self._child("requests", o.endpoint, str(status)).inc()
        last = o.decisions[-1] if o.decisions else None
        worker = last.worker.id if last else None
        route = f"{self.policy.name}:{last.reason}" if last else None
        if o.refusal is not None:
            self.metrics.rejects.labels(o.refusal).inc()
        if last is not None and worker is not None and route is not None:
            model = self._model_label(o.model, last.worker)
            self._child("latency", worker, model, route).observe(elapsed)
            if o.first_chunk is not None:
                self._child("ttft", worker, model, route).observe(o.first_chunk - o.started)
        predicted = o.decisions[0].held if o.decisions else None
        if last is not None and 200 <= status < 300:
            self._score(o, last)
        if log.isEnabledFor(logging.INFO):
            log.info(f"POST {o.endpoint} {status}", extra={"fields": {
                "request_id": o.request_id, "endpoint": o.endpoint, "model": o.model, "stream": o.stream,
                "status": status, "latency_ms": round(elapsed * 1e3, 3),
                "ttft_ms": None if o.first_chunk is None else round((o.first_chunk - o.started) * 1e3, 3),
                "route": route, "worker": worker, "worker_url": last.worker.url if last else None,
                "prompt_tokens": o.prompt_tokens, "predicted_cached_tokens": predicted,
                "attempts": len(o.decisions), "failures": o.failures or None, "refusal": o.refusal,
                "error": o.error}})
        if o.span is not None and self.tracing is not None:
            self.tracing.finish(o.span, status=status, route=route, worker=worker, model=o.model,
                                predicted_cached_tokens=predicted, attempts=len(o.decisions), error=o.error)

    def _score(self, o: Outcome, answered: Decision) -> None:
        """The answering worker's prediction against the cached tokens its engine reports."""
        precision = answered.worker.precision
        if answered.refused is not None:
            precision.refused(answered.refused)
            return
        if not answered.predicted:
            return
        found = answered.worker.discovery
        body = o.tail.last if o.tail is not None else getattr(o.response, "body", None)
        reported = None if body is None or not isinstance(body, bytes) else reported_cached(
            o.kind, body, found is None or found.cache_report)
        if reported is None:
            precision.unreported += 1
        else:
            precision.score(answered.held, reported, o.request_id)

    def _child(self, metric: str, *labels: str) -> Any:
        """``metrics.<metric>.labels(*labels)``, looked up once per label set."""
        key = (metric, *labels)
        child = self._series.get(key)
        if child is None:
            child = self._series[key] = getattr(self.metrics, metric).labels(*labels)
        return child

    def _url(self, w: Worker, path: str) -> URL:
        url = self._urls.get((w.url, path))
        if url is None:
            url = self._urls[(w.url, path)] = URL(f"{w.url}{path}")
        return url

    def _model_label(self, model: str | None, worker: Worker) -> str:
        """A bounded label: a configured or discovered model name, else ``other``."""
        if model is not None and (model in self.profiles or (worker.discovery and worker.discovery.model == model)):
            return model
        return "other"

    # -- parse ---------------------------------------------------------------------------

    def model_of(self, kind: str, body: dict[str, Any]) -> str | None:
        """The served model a request is for (None: no profiles, any model goes), or Rejected.

        SGLang's native ``/generate`` has no ``model`` field: with one configured model it is that
        one; with several the client names one in ``model``, which is removed before forwarding.
        """
        model = body.get("model")
        if kind == "generate" and model is None:
            if len(self.profiles) > 1:
                raise _bad(f"several models are served ({', '.join(self.profiles)}): name one in 'model'")
            return next(iter(self.profiles), None)
        if model is None:
            raise _bad("'model' is required")
        if not isinstance(model, str):
            raise _bad(f"'model' must be a string, got {_kind(model)}")
        if self.profiles and model not in self.profiles:
            raise Rejected(Refusal.UNKNOWN_MODEL, 404, f"The model '{model}' does not exist", code="model_not_found")
        return model

    def tokens(self, kind: str, body: dict[str, Any], model: str | None) -> list[int] | None:
        """The request's prompt tokens as the worker will see them; None when not predictable."""
        if kind == "chat":
            messages = body.get("messages")
            if not isinstance(messages, list):
                raise _bad(f"'messages' must be a list of messages, got {_kind(messages)}")
            for i, m in enumerate(messages):
                if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                    raise _bad(f"messages[{i}] must be an object with a string 'role'")
        if not self.policy.tokenizes or model is None:
            return None
        profile = self.profiles[model]
        try:
            if kind == "chat":
                # A worker not yet discovered could run any release: it counts as one no contract covers.
                pool = self.fleet.pool(model, set())
                releases = {w.discovery.version if w.discovery else "undiscovered" for w in pool}
                return profile.encode_chat(body, releases)
            prompt = body.get("input_ids") if kind == "generate" and "input_ids" in body else body.get(
                "text" if kind == "generate" else "prompt")
            if isinstance(prompt, list) and all(type(t) is int for t in prompt):
                return _in_vocabulary(prompt, profile.vocab_size)
            if isinstance(prompt, str):
                return profile.encode(prompt) if kind == "generate" else profile.encode_completion(prompt)
        except UsageError as exc:
            raise _bad(str(exc)) from None
        return None

    # -- route ---------------------------------------------------------------------------

    async def _route(self, request: web.Request, kind: str, outcome: Outcome) -> web.StreamResponse:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise Rejected(Refusal.BODY_TOO_LARGE, 413, f"the request body is larger than the gateway's "
                           f"max_body_bytes ({self.cfg.max_body_bytes})") from None
        try:
            body = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            raise Rejected(Refusal.BAD_JSON, 400, "the request body is not valid JSON"
                           if raw.strip() else "the request body is empty: send a JSON object") from None
        if not isinstance(body, dict):
            raise _bad(f"the request body must be a JSON object, got {_kind(body)}")
        outcome.model = model = self.model_of(kind, body)
        if kind == "generate" and "model" in body:
            del body["model"]
            raw = _json.encode(body)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise _bad(f"'stream' must be a boolean, got {_kind(stream)}")
        outcome.stream = stream
        tokens, reuse = self._prompt(kind, body, model, outcome)
        upstream = {**JSON_HEADERS, "x-request-id": outcome.request_id}
        if outcome.span is not None and self.tracing is not None:
            self.tracing.inject(outcome.span, upstream)
        tried: set[str] = set()
        last: web.Response | None = None  # the last upstream 5xx, returned if no worker is left to try
        while pool := self.fleet.pool(model, tried):
            decision = self._pick(pool, tokens, reuse, outcome.refusal_reason, first=not tried)
            outcome.decisions.append(decision)
            worker = decision.worker
            tried.add(worker.id)
            ours = {"x-cacheon-worker": worker.url, "x-cacheon-route": f"{self.policy.name}:{decision.reason}",
                    "x-request-id": outcome.request_id}
            if decision.predicted:
                ours["x-cacheon-predicted-cached-tokens"] = str(decision.held)
            elif decision.refused is not None:
                ours["x-cacheon-prediction-refused"] = decision.refused
            worker.in_flight += 1  # from the decision on: the next arrival of a burst must see it
            try:
                if stream:
                    return await self._stream(request, worker, outcome, raw, upstream, ours)
                return await self._call(worker, outcome.endpoint, raw, upstream, ours)
            except Retry as retry:
                last = retry.response or last
                outcome.failures.append(f"{worker.id}: {retry.why}")
            finally:
                worker.in_flight -= 1
                self.policy.released(decision)  # a stream's ends here too: _stream writes it whole
        if last is not None:
            return last
        why = f" (tried {'; '.join(outcome.failures)})" if outcome.failures else ""
        raise Rejected(Refusal.NO_WORKER, 503, f"no healthy worker can take this request{why}", "service_unavailable")

    def _prompt(self, kind: str, body: dict[str, Any], model: str | None,
                outcome: Outcome) -> tuple[list[int] | None, Reuse | None]:
        """The prompt's tokens and what the engine may reuse of them; None where nothing can be predicted."""
        try:
            tokens = self.tokens(kind, body, model)
        except NotPredictable as exc:  # a chat rendering the gateway cannot reproduce exactly
            outcome.refusal_reason = NoPrediction(exc.reason)
            return None, None
        if tokens is None:
            return None, None
        outcome.prompt_tokens = len(tokens)
        reuse = reuse_of(kind, body, len(tokens))
        if reuse.refusal is not None:
            outcome.refusal_reason = reuse.refusal
            return None, reuse
        return tokens, reuse

    def _pick(self, pool: list[Worker], tokens: list[int] | None, reuse: Reuse | None,
              refusal: NoPrediction | None, first: bool) -> Decision:
        """The policy's choice for a first attempt; the least-loaded untried worker for a retry."""
        if first:
            decision = self.policy.choose(pool, tokens, reuse)
            if refusal is not None:
                decision = decision._replace(refused=refusal)
            self.metrics.prefix_hit_tokens.inc(decision.held)
        else:
            decision = Decision(min(pool, key=lambda w: w.in_flight), RouteReason.RETRY, 0)
        self._child("decisions", self.policy.name, decision.reason).inc()
        return decision

    def _failed(self, w: Worker) -> None:
        self.metrics.upstream_errors.labels(w.id).inc()
        w.failed(self.cfg.breaker_failures, self.cfg.breaker_open_s)

    # -- forward -------------------------------------------------------------------------

    async def _call(self, w: Worker, path: str, raw: bytes, upstream: dict[str, str],
                    ours: dict[str, str]) -> web.Response:
        """The whole response; Retry on a transport error, a timeout or a 5xx."""
        try:
            async with self.fleet.client.post(self._url(w, path), data=raw, headers=upstream,
                                              timeout=self._timeout) as resp:
                content, status, headers = await resp.read(), resp.status, resp.headers
        except TRANSPORT_ERRORS as exc:
            self._failed(w)
            raise Retry(_transport(exc, self.cfg.request_timeout_s)) from None
        response = web.Response(body=content, status=status, headers=_passed(headers, ours))
        if status >= 500:
            self._failed(w)
            raise Retry(f"HTTP {status}", response)
        w.failures = 0
        return response

    async def _stream(self, request: web.Request, w: Worker, outcome: Outcome, raw: bytes,
                      upstream: dict[str, str], ours: dict[str, str]) -> web.StreamResponse:
        """Chunk-by-chunk passthrough; Retry only before the status line reaches the client."""
        try:  # a stream may run long: its timeout is on the gap between chunks, not on the whole
            resp = await self.fleet.client.post(self._url(w, outcome.endpoint), data=raw, headers=upstream,
                                                timeout=self._stream_timeout)
            if resp.status >= 500:  # read whole: it may become the answer if no worker is left
                failed = web.Response(body=await resp.read(), status=resp.status, headers=_passed(resp.headers, ours))
                resp.release()
                self._failed(w)
                raise Retry(f"HTTP {resp.status}", failed)
        except TRANSPORT_ERRORS as exc:
            self._failed(w)
            raise Retry(_transport(exc, self.cfg.request_timeout_s)) from None
        w.failures = 0
        out = web.StreamResponse(status=resp.status, headers=_passed(resp.headers, ours))
        try:  # closing an unfinished upstream response aborts that request on the worker
            await out.prepare(request)
            chunks = resp.content.iter_any()
            # Only a prediction is scored against the stream's last counting event (Proxy._score).
            tail = outcome.tail = StreamTail() if outcome.decisions[-1].predicted else None
            while True:
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except TRANSPORT_ERRORS as exc:  # mid-stream: too late to retry
                    self.metrics.upstream_errors.labels(w.id).inc()
                    outcome.error = f"upstream ended mid-stream: {_transport(exc, self.cfg.request_timeout_s)}"
                    break
                if outcome.first_chunk is None:
                    outcome.first_chunk = time.perf_counter()
                if tail is not None:
                    tail.feed(chunk)
                await out.write(chunk)
            await out.write_eof()
        except ConnectionResetError:  # the client left while we wrote to it
            outcome.status, outcome.error = CLIENT_GONE, "client disconnected"
        finally:
            resp.close()
        return out


def _in_vocabulary(prompt: list[int], vocab_size: int | None) -> list[int]:
    """A token-id prompt whose ids a worker can embed, or Rejected: one id at or past the model's
    vocabulary makes SGLang's scheduler fail and the whole server exit (measured on 0.5.13.post1
    and 0.5.23, docs/sglang-hashing-facts.md). Past u32 no vocabulary reaches, whatever the model."""
    bound = vocab_size or U32_IDS
    if prompt and (min(prompt) < 0 or max(prompt) >= bound):
        bad = next(t for t in prompt if not 0 <= t < bound)
        where = f"the model's vocabulary [0, {vocab_size})" if vocab_size else "[0, 2**32)"
        raise _bad(f"prompt token id {bad} is outside {where}")
    return prompt


def _bad(message: str) -> Rejected:
    return Rejected(Refusal.BAD_REQUEST, 400, message)


def _kind(value: Any) -> str:
    """A JSON value's type as a client would name it."""
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _transport(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return f"no answer within {timeout_s:g} s"
    return f"{type(exc).__name__}: {exc}"


def _passed(upstream: Mapping[str, str], ours: dict[str, str]) -> dict[str, str]:
    """The worker's response headers minus hop-by-hop ones, plus the gateway's decision headers."""
    return {**{k: v for k, v in upstream.items() if k.lower() not in _HOP}, **ours}
