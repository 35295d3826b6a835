"""The simulated SGLang worker's HTTP side: SGLang's endpoints, a deterministic fake completion.

It is a simulator, not an engine: it generates no real text. What is real is what a gateway
depends on: the endpoints and their JSON shapes (0.5.13.post1), the tokenization, a prefix cache
per DP rank with a capacity, the KV events that cache publishes when a simulated prefill ends,
and time that follows the work (``cacheon.sim.schedule``: queueing, uncached prefill, decode).
Fault switches make it lie in one precise way each, so every rung of the gateway's attestation
ladder can be failed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import json
import time
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from packaging.version import Version
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from cacheon.disconnect import unless_client_leaves
from cacheon.errors import UsageError
from cacheon.sim.cache import PrefixCache, SimCache, StoredPage
from cacheon.sim.publisher import RankPublishers, kv_events_config
from cacheon.sim.schedule import Plan, RankScheduler, TimeModel
from cacheon.tokens.chains import ChainCache
from cacheon.tokens.chat import NotPredictable
from cacheon.tokens.profile import TokenizerProfile

CacheFactory = Callable[[int, int], SimCache]  # page size, capacity in tokens -> one rank's cache

# From 0.5.22 the /server_info ``kv_events`` descriptor also names the replay ROUTER's base port
# (runtime_context.py ``describe_kv_events_publisher``); before, only ``kv_events_config`` does.
REPLAY_ADVERTISED_FROM = Version("0.5.22")
MAX_MODEL_LEN = 1 << 20  # the context length reported (/v1/models, /v1/tokenize)

FAULTS = ("tokenize_drift", "tokenize_500", "no_echo", "wrong_echo", "rank_lie", "geometry_lie", "version_lie",
          "wire_lie", "generate_500", "silent_flush")


@dataclass(frozen=True)
class SimSettings:
    model: str
    version: str
    page_size: int
    dp_size: int
    kv_port: int
    capacity_tokens: int
    time: TimeModel = field(default_factory=TimeModel)
    fault: str | None = None
    kv_replay_port: int | None = None

    @property
    def kv_events_config(self) -> str:
        """The JSON the publishers are built from, reported as a real server reports its argument."""
        return kv_events_config(self.kv_port, self.kv_replay_port)


def _reported_version(version: str, lie: str | None) -> str:
    """The version /server_info claims: wire_lie names a covered release whose wire differs from the one sent."""
    if lie == "version_lie":
        return "0.0.0-sim-lie"
    if lie == "wire_lie":
        return "0.5.13.post1" if version != "0.5.13.post1" else "0.5.23"
    return version


class SimWorker:
    """State behind the routes: one cache per DP rank, the publishers, counters."""

    def __init__(self, settings: SimSettings, profile: TokenizerProfile, publishers: RankPublishers | None,
                 cache: CacheFactory | None = None) -> None:
        if settings.fault is not None and settings.fault not in FAULTS:
            raise ValueError(f"unknown fault {settings.fault!r}")
        if settings.fault == "rank_lie" and settings.dp_size < 2:
            raise ValueError("rank_lie needs --dp-size 2 or more")
        self.s, self.profile, self.publishers = settings, profile, publishers
        # Prompts tokenized through the profile hash through one chain cache, as in the gateway.
        self.chains = ChainCache()
        make = cache or functools.partial(PrefixCache, hasher=self.chains.chain)
        self.caches = [make(settings.page_size, settings.capacity_tokens) for _ in range(settings.dp_size)]
        self.schedulers = [RankScheduler(settings.time) for _ in range(settings.dp_size)]
        self._next_rank = itertools.cycle(range(settings.dp_size))
        self._ids = itertools.count()
        # Per rank: (number, stored, removed) of admitted requests whose prefill has not ended yet.
        self._unpublished: list[collections.deque[tuple[int, list[StoredPage], list[int]]]] = [
            collections.deque() for _ in range(settings.dp_size)]
        self._admitted = itertools.count()
        # Requests served to the end and abandoned because the client left first (SGLang aborts those);
        # prompt and cached tokens over every admitted request; simulated seconds queued and in prefill.
        self.stats: dict[str, float] = {"completed": 0, "aborted": 0, "prompt_tokens": 0, "cached_tokens": 0,
                                        "queued_s": 0.0, "prefill_s": 0.0}
        # The latest admitted requests' schedules, for benchmarks: (prompt, cached, queued s, prefill s, step s).
        self.recent: collections.deque[tuple[int, int, float, float, float]] = collections.deque(maxlen=1 << 14)

    def server_info(self) -> dict[str, Any]:
        s, lie = self.s, self.s.fault
        page = s.page_size + (lie == "geometry_lie")
        kv: dict[str, Any] = {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": s.kv_port, "topic": "",
                              "block_size": page, "dp_size": s.dp_size}
        if s.kv_replay_port and Version(s.version) >= REPLAY_ADVERTISED_FROM:
            kv["replay_endpoint_port_base"] = s.kv_replay_port
        return {
            "model_path": s.model,
            "served_model_name": s.model,
            "page_size": page,
            "dp_size": s.dp_size,
            "max_running_requests": s.time.max_running or None,  # the server argument (None: SGLang sizes it)
            # What the scheduler runs per DP rank (SGLang's get_internal_state); absent: no bound.
            "internal_states": [{"effective_max_running_requests_per_dp": s.time.max_running}
                                if s.time.max_running else {} for _ in range(s.dp_size)],
            "version": _reported_version(s.version, lie),
            "simulator": True,
            # ServerArgs.kv_events_config verbatim (a JSON string): where a client finds replay_endpoint.
            "kv_events_config": s.kv_events_config,
            "kv_events": kv,
        }

    def tokenize(self, body: dict[str, Any]) -> list[int]:
        # SGLang's /v1/tokenize encodes with the tokenizer's own special-token rule (no quirks).
        ids = self.encode_chat(body) if "messages" in body else self.profile.encode(body["prompt"])
        if self.s.fault == "tokenize_drift" and ids:
            ids = [*ids[:-1], ids[-1] + 1]
        return ids

    def encode_chat(self, body: dict[str, Any]) -> list[int]:
        """The chat as this release's chat path renders it (cacheon.tokens.chat): a rendering the
        simulator cannot reproduce is a 400 here, never a guess."""
        try:
            return self.profile.encode_chat(body, (self.s.version,))
        except NotPredictable as exc:
            raise ValueError(f"the simulator does not render this chat ({exc})") from None

    def prefill_tokens(self, body: dict[str, Any]) -> list[int]:
        prompt = body.get("prompt", body.get("text", ""))
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if "input_ids" in body:
            return list(body["input_ids"])
        if not isinstance(prompt, str):
            raise ValueError("prompt must be a string or a list of token ids")
        return self.profile.encode(prompt) if "text" in body else self.profile.encode_completion(prompt)

    def rank_for(self, body: dict[str, Any]) -> int:
        """The request's ``data_parallel_rank`` (a DP-aware router names one), else the next in turn."""
        rank = body.get("data_parallel_rank")
        if rank is None:
            return next(self._next_rank)
        if type(rank) is not int or not 0 <= rank < self.s.dp_size:
            raise ValueError(f"data_parallel_rank must be an int in [0, {self.s.dp_size}), got {rank!r}")
        return rank

    def admit(self, tokens: list[int], output_tokens: int, limit: int, rank: int) -> tuple[int, Plan]:
        """Schedule a request on ``rank``; returns its cached tokens and its plan (loop time).
        ``limit``: the most leading tokens a prefix match may cover (``max_prefix_len``).

        The cache is matched and filled now, as the request's prefill will find it (the schedule's
        queues are FIFO: ``cacheon.sim.schedule``); the KV events go out when its prefill ends.
        """
        loop = asyncio.get_running_loop()
        cache = self.caches[rank]
        cached = min(cache.match(tokens), limit // self.s.page_size * self.s.page_size)
        plan = self.schedulers[rank].plan(loop.time(), len(tokens) - cached, output_tokens)
        stored, removed = cache.insert(tokens)
        number = next(self._admitted)
        self._unpublished[rank].append((number, stored, removed))
        if plan.prefill_end <= loop.time():
            self._publish_through(rank, number)
        else:
            loop.call_at(plan.prefill_end, self._publish_through, rank, number)
        prefill = plan.prefill_end - plan.prefill_start
        for key, value in (("prompt_tokens", len(tokens)), ("cached_tokens", cached), ("queued_s", plan.queued),
                           ("prefill_s", prefill)):
            self.stats[key] += value
        self.recent.append((len(tokens), cached, plan.queued, prefill, plan.step))
        return cached, plan

    def _publish_through(self, rank: int, number: int) -> None:
        """Publish the rank's changes up to admitted request ``number``, in order (a rank's prefills
        end in admission order; a timer firing late must not let a later one overtake)."""
        pending = self._unpublished[rank]
        while pending and pending[0][0] <= number:
            _, stored, removed = pending.popleft()
            self._publish(rank, stored, removed)

    def _publish(self, rank: int, stored: list[StoredPage], removed: list[int]) -> None:
        if self.publishers is None or self.s.fault == "no_echo":
            return
        if self.s.fault == "wrong_echo":  # a consistently wrong hash chain: every id (and parent link) off
            stored = [type(p)(p.block_hash ^ 1, None if p.parent is None else p.parent ^ 1, p.tokens) for p in stored]
            removed = [h ^ 1 for h in removed]
        if self.s.fault == "rank_lie" and len(stored) > 1:
            half = len(stored) // 2
            self.publishers.publish(rank, stored[:half], removed, self.s.page_size)
            self.publishers.publish((rank + 1) % self.s.dp_size, stored[half:], [], self.s.page_size)
        else:
            self.publishers.publish(rank, stored, removed, self.s.page_size)

    def flush(self) -> None:
        """``/flush_cache``: every rank's cache emptied, each rank publishing ``AllBlocksCleared``
        (silent_flush: without it, the cache a gateway's index no longer describes)."""
        for rank, cache in enumerate(self.caches):
            cache.clear()
            if self.publishers is not None and self.s.fault != "silent_flush":
                self.publishers.clear(rank)

    def words(self, tokens: list[int], n: int) -> list[str]:
        return reply_words(tokens, n)

    def request_id(self) -> str:
        return f"sim-{next(self._ids)}"


def reply_words(tokens: list[int], n: int) -> list[str]:
    """The simulator's deterministic completion: ``n`` words seeded by the prompt's tail."""
    seed = zlib.crc32(json.dumps(tokens[-64:]).encode())
    return [f" sim{(seed + i) % 997}" for i in range(n)]


def max_prefix_len(tokens: int, body: dict[str, Any], native: bool) -> int:
    """SGLang's cap on a request's prefix match (``Req._compute_max_prefix_len``): the last prompt
    token is always computed, and prompt logprobs (an OpenAI ``echo`` with ``logprobs``; a native
    ``return_logprob`` from ``logprob_start_len``) are computed from their start on."""
    limit = tokens - 1
    if native:
        start = body.get("logprob_start_len")
        if body.get("return_logprob") and type(start) is int and start >= 0:
            limit = min(limit, start)
    elif body.get("echo") and body.get("logprobs"):
        limit = 0
    return max(limit, 0)


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": "BadRequestError", "code": status}, status)


@contextlib.asynccontextmanager
async def _warm(_app: Starlette) -> AsyncIterator[None]:
    """anyio's asyncio backend imported at start-up: Starlette streams inside an anyio task group, and anyio
    imports its backend at the first one: 17-25 ms of CPU on each worker's first streamed request, inside a
    benchmark's measured replay (eight workers: ~0.8 ms a request of a 192-request ``routing_peers.py`` replay)."""
    async with anyio.create_task_group():
        pass
    yield


def build_app(sim: SimWorker) -> Starlette:
    """The Starlette app serving SGLang's endpoints from ``sim``."""
    s = sim.s

    async def generating(request: Request, plan: Plan) -> bool:
        """Until the plan's end; False (counted as aborted) if the client left first."""
        wait = plan.done - asyncio.get_running_loop().time()
        if wait <= 0:
            sim.stats["completed"] += 1
            return True
        finished, _ = await unless_client_leaves(request, asyncio.sleep(wait))
        sim.stats["completed" if finished else "aborted"] += 1
        return finished

    async def body_of(request: Request) -> dict[str, Any]:
        body = await request.json()
        if not isinstance(body, dict):
            raise ValueError("request body must be a JSON object")
        return body

    async def server_info(_: Request) -> Response:
        return JSONResponse(sim.server_info())

    async def model_info(_: Request) -> Response:
        return JSONResponse({"model_path": s.model, "tokenizer_path": s.model, "is_generation": True})

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def models(_: Request) -> Response:
        card = {"id": s.model, "object": "model", "created": 0, "owned_by": "sglang", "root": s.model,
                "max_model_len": MAX_MODEL_LEN}
        return JSONResponse({"object": "list", "data": [card]})

    async def tokenize(request: Request) -> Response:
        if s.fault == "tokenize_500":
            return _error(500, "simulated tokenizer failure")
        try:
            ids = sim.tokenize(await body_of(request))
        except (ValueError, KeyError, UsageError) as exc:
            return _error(400, str(exc))
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": MAX_MODEL_LEN})

    async def generate_openai(request: Request, chat: bool) -> Response:
        if s.fault == "generate_500":
            return _error(500, "simulated engine failure")
        try:
            body = await body_of(request)
            tokens = sim.encode_chat(body) if chat else sim.prefill_tokens(body)
            rank = sim.rank_for(body)
        except (ValueError, KeyError, TypeError, UsageError) as exc:  # SGLang: 400 for a chat it cannot template
            return _error(400, f"bad request: {exc}")
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        cached, plan = sim.admit(tokens, n, max_prefix_len(len(tokens), body, native=False), rank)
        words = sim.words(tokens, n)
        rid, created, model = sim.request_id(), int(time.time()), body.get("model", s.model)
        kind = "chat.completion" if chat else "text_completion"
        usage = _usage(len(tokens), n, cached)
        if not body.get("stream"):
            if not await generating(request, plan):
                return Response(status_code=499)
            text = "".join(words)
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            return JSONResponse(
                {"id": rid, "object": kind, "created": created, "model": model, "choices": [choice], "usage": usage}
            )

        async def chunks() -> AsyncIterator[bytes]:
            done = False
            try:
                async for chunk in stream():
                    yield chunk
                done = True
            finally:  # a client that leaves mid-stream cancels this generator: the request is aborted
                sim.stats["completed" if done else "aborted"] += 1

        async def stream() -> AsyncIterator[bytes]:
            loop = asyncio.get_running_loop()
            for i, word in enumerate(words):
                await asyncio.sleep(max(0.0, plan.token_at(i) - loop.time()))
                piece: dict[str, Any] = {"index": 0, "finish_reason": "length" if i == n - 1 else None}
                piece.update({"delta": {"role": "assistant", "content": word}} if chat else {"text": word})
                chunk = {"id": rid, "object": f"{kind}.chunk" if chat else kind, "created": created,
                         "model": model, "choices": [piece]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            if (body.get("stream_options") or {}).get("include_usage"):
                tail = {"id": rid, "object": f"{kind}.chunk" if chat else kind, "created": created,
                        "model": model, "choices": [], "usage": usage}
                yield f"data: {json.dumps(tail)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def completions(request: Request) -> Response:
        return await generate_openai(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await generate_openai(request, chat=True)

    async def generate(request: Request) -> Response:
        if s.fault == "generate_500":
            return _error(500, "simulated engine failure")
        try:
            body = await body_of(request)
            tokens = sim.prefill_tokens(body)
            rank = sim.rank_for(body)
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, f"bad request: {exc}")
        n = int((body.get("sampling_params") or {}).get("max_new_tokens", 16))
        cached, plan = sim.admit(tokens, n, max_prefix_len(len(tokens), body, native=True), rank)
        if not await generating(request, plan):
            return Response(status_code=499)
        meta = {"id": sim.request_id(), "prompt_tokens": len(tokens), "completion_tokens": n, "cached_tokens": cached,
                "finish_reason": {"type": "length", "length": n}}
        return JSONResponse({"text": "".join(sim.words(tokens, n)), "meta_info": meta})

    async def flush_cache(_: Request) -> Response:
        sim.flush()
        return Response("Cache flushed.\n")

    async def stats(_: Request) -> Response:
        return JSONResponse({"simulator": True, **sim.stats})

    async def recent(_: Request) -> Response:
        keys = ("prompt_tokens", "cached_tokens", "queued_s", "prefill_s", "step_s")
        return JSONResponse({"simulator": True, "requests": [dict(zip(keys, r, strict=True)) for r in sim.recent]})

    routes = [
        Route("/sim/stats", stats),  # the simulator's own, not SGLang endpoints
        Route("/sim/requests", recent),
        Route("/server_info", server_info),
        Route("/get_server_info", server_info),
        Route("/model_info", model_info),
        Route("/get_model_info", model_info),
        Route("/health", health),
        Route("/health_generate", health),
        Route("/v1/models", models),
        Route("/v1/tokenize", tokenize, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/generate", generate, methods=["POST"]),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
    ]
    return Starlette(routes=routes, lifespan=_warm)
