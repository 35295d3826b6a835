"""The gateway's request path: decode (``prompt``), tokenize, pick a worker, forward, retry, relay.

A request is retried on another worker only while nothing has reached the client. Every request
ends in one ``Outcome``, recorded in one place (``recorder``). A client that leaves cancels the
handler (the server runs with handler cancellation), which closes the upstream connection: that is
how a worker learns to abort. A worker that dies mid-stream leaves the client an error event and
an unterminated stream, never a clean end; a non-streamed 2xx that is not a JSON object counts as
that worker's failure, as does a body read whole past its bound (``max_answer_bytes``, or
``ERROR_BODY_BYTES`` for a 5xx). A client whose side stays full past ``client_write_timeout_s``
(a stream's, or a whole answer's) is dropped (its own failure, 499), freeing the worker. Forwarded requests
carry this gateway's hop mark: one that comes back is refused, so a gateway registered as its own
worker cannot loop. Only headers the gateway makes go to a worker; a worker's response headers reach
the client as they came (repeats kept) minus hop-by-hop ones.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import aiohttp
import msgspec
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from multidict import CIMultiDict

from cacheon.gateway.config import GatewayConfig
from cacheon.gateway.fleet import Fleet
from cacheon.gateway.http import JSON_HEADERS, TRANSPORT_ERRORS
from cacheon.gateway.metrics import Metrics
from cacheon.gateway.policy import Decision, Policy, RouteReason, snapshot
from cacheon.gateway.precision import StreamTail
from cacheon.gateway.prediction import NoPrediction, Reuse
from cacheon.gateway.prompt import Prompt, Route, decode, encode, prompt_of, reuse_of, within_context
from cacheon.gateway.recorder import CLIENT_GONE, Attempt, Outcome, Recorder, log
from cacheon.gateway.refusals import Refusal, Rejected, clip, oai_error
from cacheon.gateway.tracing import Tracing
from cacheon.gateway.upstream import Response, TooLarge, Upstream
from cacheon.gateway.workers import Worker
from cacheon.tokens.chat import NotPredictable
from cacheon.tokens.profile import TokenizerProfile

# A worker's response headers never passed on: hop-by-hop ones (RFC 9110 7.6.1, and Trailer: the relay
# drops trailers), those its Connection header names (``_passed``), and the framing and server headers
# the gateway writes itself.
_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
                  "content-length", "server", "date"})
ERROR_BODY_BYTES = 1 << 16  # a worker's 5xx body, read whole to answer with: an error message needs little
HOP_HEADER = "x-cacheon-hop"  # the gateways a request passed through, by instance mark
OFFLOAD_CHARS = 1 << 16  # prompts longer than this are tokenized off the event loop
CLIENT_HIGH_WATER = 1 << 16  # bytes unsent to a client before its worker's socket is paused (aiohttp's own)
_ANSWER = msgspec.json.Decoder(dict[str, msgspec.Raw])  # a non-streamed answer is one JSON object
_json = msgspec.json.Encoder()


class Retry(Exception):
    """This worker failed before anything reached the client: why, and the 5xx it sent, if any."""

    def __init__(self, why: str, response: web.Response | None = None) -> None:
        super().__init__(why)
        self.why, self.response = why, response


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
        self.recorder = Recorder(policy.name, metrics, profiles, tracing)
        self.hop = os.urandom(8).hex()  # this gateway instance's mark on what it forwards
        self._tokenizer = ThreadPoolExecutor(1, thread_name_prefix="tokenize")  # long prompts, one at a time
        # Per-request costs kept off the hot path: parsed upstream URLs, timeouts.
        self._upstream = Upstream()  # streams' own keep-alive pool

    def close(self) -> None:
        self._tokenizer.shutdown(wait=False, cancel_futures=True)
        self._upstream.close()

    async def handle(self, request: web.Request, path: str, kind: str) -> web.StreamResponse:
        outcome = Outcome(path, request_id(request), time.perf_counter(), Route(kind))
        if self.tracing is not None:
            outcome.span = self.tracing.start(f"{request.method} {path}", request.headers, outcome.request_id)
        try:
            try:
                outcome.response = await self._route(request, outcome)
            except Rejected as rejected:
                outcome.refusal = rejected.refusal
                outcome.response = oai_error(rejected.status, rejected.message, rejected.kind, rejected.code,
                                             {"x-request-id": outcome.request_id})
            except asyncio.CancelledError:
                outcome.status, outcome.error = CLIENT_GONE, "client disconnected"
                raise
            except Exception:
                log.exception("request failed inside the gateway",
                              extra={"fields": {"request_id": outcome.request_id}})
                outcome.refusal = Refusal.INTERNAL
                outcome.response = oai_error(500, f"internal gateway error (request {outcome.request_id})",
                                             "internal_error", headers={"x-request-id": outcome.request_id})
            await self._send(request, outcome)
        finally:
            self.recorder.record(outcome)
        return outcome.response

    async def _send(self, request: web.Request, outcome: Outcome) -> None:
        """A whole answer written here, within ``client_write_timeout_s`` (aiohttp would write it after the
        handler, waiting on the client with no bound: one that does not read held the answer, up to
        ``max_answer_bytes``, and its connection for as long as it liked). A stream is written already."""
        response = outcome.response
        if response is None or response.prepared or request.transport is None:
            return
        try:
            await client_bound(cast(asyncio.WriteTransport, request.transport), self.cfg.client_write_timeout_s,
                               lambda: _whole(request, response))
        except ClientGone as gone:
            outcome.status, outcome.error = CLIENT_GONE, str(gone)
        except asyncio.CancelledError:  # the client left while it was written
            outcome.status, outcome.error = CLIENT_GONE, "client disconnected"
            raise

    # -- route ---------------------------------------------------------------------------

    async def _route(self, request: web.Request, outcome: Outcome) -> web.StreamResponse:
        hops = request.headers.get(HOP_HEADER)
        if hops is not None and self.hop in hops.split(","):
            raise Rejected(Refusal.LOOP, 508, "this request came back to the gateway that forwarded it: a worker "
                           "URL points at the gateway itself", "invalid_request_error", "loop_detected")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise Rejected(Refusal.BODY_TOO_LARGE, 413, f"the request body is larger than the gateway's "
                           f"max_body_bytes ({self.cfg.max_body_bytes})") from None
        decoded = decode(outcome.route, raw)
        outcome.model = None if decoded.model is None else clip(decoded.model)  # logged: bounded
        discovered = [w.discovery for w in self.fleet.workers.values()]
        prompt = prompt_of(outcome.route, decoded, raw, self.profiles, discovered)
        outcome.model, outcome.stream = outcome.model or prompt.model, decoded.stream
        tokens, reuse = await self._tokens(prompt, outcome)
        upstream = {**JSON_HEADERS, "x-request-id": outcome.request_id,
                    HOP_HEADER: f"{hops},{self.hop}" if hops else self.hop}
        if outcome.span is not None and self.tracing is not None:
            self.tracing.inject(outcome.span, upstream)
        tried: set[str] = set()
        last: web.Response | None = None  # the last upstream 5xx, returned if no worker is left to try
        while pool := self.fleet.pool(prompt.model, tried):
            worker, decision = self._pick(pool, tokens, reuse, outcome, first=not tried)
            outcome.attempts.append(Attempt(worker, decision))
            tried.add(worker.id)
            ours = {"x-cacheon-worker": worker.url, "x-cacheon-route": f"{self.policy.name}:{decision.reason}",
                    "x-request-id": outcome.request_id}
            if decision.predicted:
                ours["x-cacheon-predicted-cached-tokens"] = str(decision.held)
            elif decision.refused is not None:
                ours["x-cacheon-prediction-refused"] = decision.refused
            worker.in_flight += 1  # from the decision on: the next arrival of a burst must see it
            try:
                if prompt.request.stream:
                    return await self._stream(request, worker, outcome, prompt.raw, upstream, ours)
                return await self._call(worker, outcome.endpoint, prompt.raw, upstream, ours)
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

    async def _tokens(self, prompt: Prompt, outcome: Outcome) -> tuple[list[int] | None, Reuse | None]:
        """The prompt's tokens and what the engine may reuse of them; None where nothing can be predicted."""
        if not self.policy.tokenizes or prompt.model is None:
            return None, None
        profile = self.profiles[prompt.model]
        work = functools.partial(encode, prompt, profile, self._releases(prompt.model)) if prompt.chat is not None \
            else functools.partial(encode, prompt, profile)
        try:
            if prompt.chars > OFFLOAD_CHARS:  # a long prompt would stall every other request (and /livez)
                tokens = await asyncio.get_running_loop().run_in_executor(self._tokenizer, work)
            else:
                tokens = work()
        except NotPredictable as exc:  # a chat rendering the gateway cannot reproduce exactly
            outcome.refusal_reason = NoPrediction(exc.reason)
            return None, None
        if tokens is None:
            return None, None
        within_context(len(tokens), prompt.context)
        outcome.prompt_tokens = len(tokens)
        reuse = reuse_of(prompt.request, len(tokens))
        if reuse.refusal is not None:
            outcome.refusal_reason = reuse.refusal
            return None, reuse
        return tokens, reuse

    def _releases(self, model: str) -> set[str]:
        """The SGLang releases a chat for ``model`` may land on (its contract decides the rendering); a
        worker not yet discovered could run any, so it counts as one no chat contract covers."""
        return {w.discovery.version if w.discovery else "undiscovered" for w in self.fleet.pool(model, set())}

    def _pick(self, pool: list[Worker], tokens: list[int] | None, reuse: Reuse | None, outcome: Outcome,
              first: bool) -> tuple[Worker, Decision]:
        """The policy's choice (on a snapshot of the pool) for a first attempt; the least-loaded untried
        worker for a retry."""
        if first:
            decision = self.policy.choose(snapshot(pool), tokens, reuse)
            outcome.routed = time.perf_counter()
            if outcome.refusal_reason is not None:
                decision = decision._replace(refused=outcome.refusal_reason)
            self.metrics.prefix_hit_tokens.inc(decision.held)
            worker = next(w for w in pool if w.id == decision.worker.id)
        else:
            worker = min(pool, key=lambda w: w.in_flight)
            decision = Decision(snapshot([worker])[0], RouteReason.RETRY, 0)
        self.recorder.child("decisions", self.policy.name, decision.reason).inc()
        return worker, decision

    def _failed(self, w: Worker) -> None:
        self.metrics.upstream_errors.labels(w.id).inc()
        w.breaker.failed()

    # -- forward -------------------------------------------------------------------------

    async def _call(self, w: Worker, path: str, raw: bytes, upstream: dict[str, str],
                    ours: dict[str, str]) -> web.Response:
        """The whole response, within ``request_timeout_s``; Retry on a transport error, a timeout, a 5xx or a
        2xx that is not JSON. On the streams' client: its pool closes a connection a worker writes to while
        idle (aiohttp's queued such bytes as the answer to the next request on it, another client's)."""
        timeout_s, resp = self.cfg.request_timeout_s, None
        try:
            async with asyncio.timeout(timeout_s):
                resp = await self._upstream.post(w.url, path, raw, upstream, timeout_s)
                status, headers = resp.status, resp.headers
                try:
                    content = await resp.read(timeout_s, ERROR_BODY_BYTES if status >= 500 else
                                              self.cfg.max_answer_bytes)
                except TooLarge as exc:
                    if status >= 500:
                        raise
                    # An answer this large is what the request asked for (n, max_tokens, logprobs): retried, it
                    # would cost every worker as much, and counted, a client could open every breaker with it.
                    raise Rejected(Refusal.ANSWER_TOO_LARGE, 502, f"worker {w.id}: {exc} (max_answer_bytes); "
                                   "ask for less (max_tokens, n, logprobs) or stream it", "upstream_error",
                                   "answer_too_large") from None
        except TRANSPORT_ERRORS as exc:
            self._failed(w)
            raise Retry(_transport(exc, timeout_s)) from None
        finally:  # pooled only after a complete answer the worker lets it keep
            if resp is not None:
                self._upstream.done(resp)
        response = web.Response(body=content, status=status, headers=_passed(headers, ours))
        if status >= 500:
            self._failed(w)
            raise Retry(f"HTTP {status}", response)
        if 200 <= status < 300:
            try:
                _ANSWER.decode(content)
            except (msgspec.DecodeError, RecursionError):
                self._failed(w)
                raise Retry(f"HTTP {status} with a body that is not a JSON object ({len(content)} bytes)",
                            oai_error(502, f"worker {w.id} answered with a malformed body", "upstream_error",
                                      headers=ours)) from None
        w.breaker.succeeded(200 <= status < 300)
        return response

    async def _stream(self, request: web.Request, w: Worker, outcome: Outcome, raw: bytes,
                      upstream: dict[str, str], ours: dict[str, str]) -> web.StreamResponse:
        """Chunk-by-chunk passthrough on the lean client (``upstream``); Retry only before the status
        line reaches the client. Its timeout is on the gap between chunks, not on the whole stream."""
        timeout_s, resp = self.cfg.request_timeout_s, None
        try:
            try:
                resp = await self._upstream.post(w.url, outcome.endpoint, raw, upstream, timeout_s)
                if resp.status >= 500:  # read whole: it may become the answer if no worker is left
                    failed = web.Response(body=await resp.read(timeout_s, ERROR_BODY_BYTES), status=resp.status,
                                          headers=_passed(resp.headers, ours))
                    self._failed(w)
                    raise Retry(f"HTTP {resp.status}", failed)
            except TRANSPORT_ERRORS as exc:
                self._failed(w)
                raise Retry(_transport(exc, timeout_s)) from None
            return await self._relay(request, w, outcome, resp, ours)
        finally:  # an unfinished answer's connection is closed, not pooled: that aborts it on the worker
            if resp is not None:
                self._upstream.done(resp)

    async def _relay(self, request: web.Request, w: Worker, outcome: Outcome, resp: Response,
                     ours: dict[str, str]) -> web.StreamResponse:
        out = web.StreamResponse(status=resp.status, headers=_passed(resp.headers, ours))
        if request.version >= aiohttp.HttpVersion11:
            out.enable_chunked_encoding()  # the client sink frames the chunks itself
        else:  # no framing before HTTP/1.1: the body ends with the connection, whatever keep-alive it asked for
            out.force_close()
        timeout_s = self.cfg.request_timeout_s
        try:
            writer = await out.prepare(request)
            assert writer is not None and request.transport is not None  # prepared once, here
            # Only a prediction is scored against the stream's last counting event (Recorder._score).
            tail = outcome.tail = StreamTail() if outcome.attempts[-1].decision.predicted else None
            sink = ClientSink(request.transport, writer, out.chunked, outcome, tail, self.cfg.client_write_timeout_s)
            try:
                await resp.pipe(sink, timeout_s)
            except ClientGone:
                raise
            except TRANSPORT_ERRORS as exc:  # mid-stream: too late to retry; the client must see it failed
                self._failed(w)
                outcome.error = f"upstream ended mid-stream: {_transport(exc, timeout_s)}"
                await _abort(request, out, f"worker {w.id} failed mid-stream; the answer is incomplete")
                return out
            await sink.within(out.write_eof)  # its drain waits on the client too
            w.breaker.succeeded(200 <= resp.status < 300)
        except ClientGone as gone:  # the client left or stopped reading: not the worker's failure
            outcome.status, outcome.error = CLIENT_GONE, str(gone)
        except ConnectionResetError:  # the client left while we wrote to it outside the sink
            outcome.status, outcome.error = CLIENT_GONE, "client disconnected"
        return out


class ClientGone(Exception):
    """The client's side of a stream closed, or was dropped for not reading: raised out of the relay, never
    counted as the worker's failure (a ConnectionResetError would be, among the transport errors of the
    worker's connection)."""

    def __init__(self, why: str = "client disconnected") -> None:
        super().__init__(why)


class ClientSink:
    """The client's side of a relayed stream, written from inside the worker's socket reads
    (``Response.pipe``): each read's body in one framed write, its first byte's time, its tail."""

    __slots__ = ("_chunked", "_outcome", "_tail", "_timeout_s", "_transport", "_writer")

    def __init__(self, transport: asyncio.BaseTransport, writer: AbstractStreamWriter, chunked: bool,
                 outcome: Outcome, tail: StreamTail | None, timeout_s: float) -> None:
        self._transport = cast(asyncio.WriteTransport, transport)
        self._writer, self._chunked, self._outcome, self._tail = writer, chunked, outcome, tail
        self._timeout_s = timeout_s

    def write(self, body: bytes) -> bool:
        transport = self._transport
        if transport.is_closing():
            return False  # drain says the client is gone
        if self._outcome.first_chunk is None:
            self._outcome.first_chunk = time.perf_counter()
        if self._tail is not None:
            self._tail.feed(body)
        transport.write(b"%x\r\n%b\r\n" % (len(body), body) if self._chunked else body)
        return transport.get_write_buffer_size() <= CLIENT_HIGH_WATER

    async def drain(self) -> None:
        await self.within(self._writer.drain)

    async def within(self, wait: Callable[[], Awaitable[None]]) -> None:
        """``wait()`` on the client's side within the sink's bound (``client_bound``): a client that stops
        reading (or reads a byte at a time) would hold its worker's connection and slot for ever."""
        await client_bound(self._transport, self._timeout_s, wait)


async def client_bound(transport: asyncio.WriteTransport, timeout_s: float,
                       wait: Callable[[], Awaitable[None]]) -> None:
    """``wait()`` on a client, which must take what the gateway holds for it within ``timeout_s``; past it the
    client is dropped, its connection aborted (a close would wait to flush to it): ClientGone either way."""
    if transport.is_closing():
        raise ClientGone()
    try:
        async with asyncio.timeout(timeout_s):
            await wait()
    except ConnectionResetError:  # lost while draining (aiohttp's own reset error)
        raise ClientGone() from None
    except TimeoutError:
        transport.abort()
        raise ClientGone(f"client stopped reading: its side stayed full for {timeout_s:g} s") from None


async def _whole(request: web.Request, response: web.StreamResponse) -> None:
    await response.prepare(request)
    await response.write_eof()


async def _abort(request: web.Request, out: web.StreamResponse, message: str) -> None:
    """An error event (what OpenAI clients raise on), then the connection closed without the chunked
    body's end, so a client that reads only the HTTP framing sees the answer cut short too."""
    event = _json.encode({"error": {"message": message, "type": "upstream_error", "param": None, "code": 502}})
    await out.write(b"\n\ndata: " + event + b"\n\n")  # the blank line first ends any event the worker left half-sent
    if request.transport is not None:
        request.transport.close()  # written out first, then closed: aiohttp's own end of the body is never sent


def _transport(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return f"no answer within {timeout_s:g} s"
    return f"{type(exc).__name__}: {exc}"


def _passed(upstream: Iterable[tuple[str, str]], ours: dict[str, str]) -> CIMultiDict[str]:
    """The worker's response headers as they came, repeats and all (Set-Cookie, Vary, Link), minus
    hop-by-hop ones: ``_HOP`` and whatever its Connection header names (RFC 9110 7.6.1); the gateway's
    decision headers replace any of the worker's by the same name."""
    headers = list(upstream)
    hop = _HOP.union(name.strip().lower() for k, v in headers if k.lower() == "connection" for name in v.split(","))
    passed = CIMultiDict((k, v) for k, v in headers if k.lower() not in hop)
    passed.update(ours)
    return passed
