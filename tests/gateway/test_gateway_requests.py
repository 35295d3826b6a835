"""Requests the gateway must refuse or survive, and workers that misbehave, over real HTTP.

Gateways are served in this process (tests/gateway/inproc.py); the workers are ``StandIn``s, plain
aiohttp servers that answer SGLang's discovery routes and then misbehave on purpose (a truncated
answer, a stream cut mid-way), which neither SGLang nor the simulator does on request.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from aiohttp import web

from cacheon.gateway import logs
from cacheon.gateway.config import WorkerSpec
from cacheon.gateway.proxy import OFFLOAD_CHARS
from cacheon.sim.launch import wait_until
from cacheon.sim.tokenizer import gateway_model
from tests.gateway.inproc import InProcessGateway, LoopThread

pytestmark = pytest.mark.timeout(120)
ANSWER = {"choices": [{"text": " ok", "index": 0, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


FLOOD_EVENTS = 768  # of 64 KiB: more than the loopback sockets on the way hold


class StandIn:
    """A worker over real HTTP: discovery, health, and completions answered as ``mode`` says:
    ``ok``, ``truncated`` (a 200 whose JSON stops half-way), ``dies`` (a stream cut after one event),
    ``stalls`` (a stream silent for 3 s after one event), ``late`` (no head for 3 s), ``steady`` (a
    stream of 6 events 0.4 s apart), ``quick`` (the same 6 events at once) or ``flood`` (a 48 MiB
    stream, as fast as it goes). ``peers``: the
    client address of each answered request (which connection it came on); ``written``: the events
    a stream has written so far."""

    def __init__(self, loop: LoopThread, mode: str = "ok", max_model_len: int = 1 << 20,
                 keepalive_s: float = 75) -> None:
        self.mode, self.max_model_len = mode, max_model_len
        self.bodies: list[bytes] = []
        self.peers: list[Any] = []
        self.written = 0
        self._loop = loop

        async def server_info(_: web.Request) -> web.Response:
            return web.json_response({"version": "0.5.23", "served_model_name": "demo", "page_size": 1})

        async def model_info(_: web.Request) -> web.Response:
            return web.json_response({"model_path": "demo"})

        async def models(_: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "demo", "max_model_len": self.max_model_len}]})

        async def health(_: web.Request) -> web.Response:
            return web.json_response({})

        async def answer(request: web.Request) -> web.StreamResponse:
            self.bodies.append(await request.read())
            self.peers.append(request.transport and request.transport.get_extra_info("peername"))
            if self.mode == "truncated":
                return web.Response(body=msgspec.json.encode(ANSWER)[:20], content_type="application/json")
            if self.mode == "late":
                await asyncio.sleep(3)
            if self.mode not in ("dies", "stalls", "steady", "quick", "flood"):
                return web.json_response(ANSWER)
            out = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await out.prepare(request)
            if self.mode in ("steady", "quick", "flood"):
                event = b'data: {"choices": [{"text": "' + b"a" * (65536 if self.mode == "flood" else 1) + b'"}]}\n\n'
                for _ in range(FLOOD_EVENTS if self.mode == "flood" else 6):
                    await out.write(event)
                    self.written += 1
                    await asyncio.sleep(0.4 if self.mode == "steady" else 0)
                await out.write(b"data: [DONE]\n\n")
                await out.write_eof()
                return out
            await out.write(b'data: {"choices": [{"text": " a", "index": 0}]}\n\n')
            if self.mode == "stalls":
                await asyncio.sleep(3)
                return out
            assert request.transport is not None
            request.transport.abort()  # the engine process died: no more bytes, no chunked end
            return out

        async def start() -> str:
            app = web.Application(client_max_size=64 << 20)
            for path, handler in (("/server_info", server_info), ("/model_info", model_info), ("/v1/models", models),
                                  ("/health", health)):
                app.router.add_get(path, handler)
            for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
                app.router.add_post(path, answer)
            self._runner = web.AppRunner(app, keepalive_timeout=keepalive_s)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", 0).start()
            return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

        self.url: str = loop.call(start())

    def close(self) -> None:
        self._loop.call(self._runner.cleanup())


@pytest.fixture
def gateway(loop: LoopThread, tmp_path: Path) -> Iterator[Any]:
    """``gateway(raw config, *workers)``: an in-process gateway over stand-ins, its workers discovered."""
    made: list[Any] = []

    def make(raw: dict[str, Any], *workers: StandIn) -> InProcessGateway:
        made.extend(workers)
        gw = InProcessGateway(loop, {"policy": "rr", "workers": [{"url": w.url} for w in workers], **raw}, tmp_path)
        made.append(gw)
        fleet = gw.gateway.fleet
        wait_until(lambda: all(w.discovery is not None for w in fleet.workers.values()), "discovery", 10)
        return gw

    yield make
    for thing in reversed(made):
        thing.close()


def post(gw: InProcessGateway, path: str, body: bytes | dict[str, Any], timeout: float = 30) -> httpx.Response:
    content = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return httpx.post(f"{gw.url}{path}", content=content, headers={"content-type": "application/json"},
                      timeout=timeout)


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_deep_nesting_is_an_openai_400_wherever_it_is(loop: LoopThread, gateway: Any) -> None:
    worker = StandIn(loop)
    gw = gateway({}, worker)
    deep = b"[" * 5000 + b"]" * 5000
    for body in (b'{"model": "demo", "prompt": "x", "anything": ' + deep + b"}",  # a field the gateway skips
                 b'{"model": "demo", "prompt": "x", "n": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001):
        assert "nested too deeply" in error_of(post(gw, "/v1/completions", body), 400)["message"]
    typed = error_of(post(gw, "/v1/completions", b'{"model": "demo", "prompt": ' + deep + b"}"), 400)
    assert typed["message"].startswith("'prompt' must be a string")  # a typed field's depth is its type's
    # Chat content the gateway decodes whole: bounded well before the decoder's own limit.
    content = [{"type": "text", "text": "x", "more": [[[]]]}]
    for _ in range(40):
        content = [{"type": "text", "parts": content}]  # type: ignore[dict-item]
    chat = {"model": "demo", "messages": [{"role": "user", "content": content}]}
    assert "nested more than 32 deep" in error_of(post(gw, "/v1/chat/completions", chat), 400)["message"]
    assert worker.bodies == []


def test_token_ids_past_the_vocabulary_are_refused_under_every_policy(loop: LoopThread, gateway: Any,
                                                                      profile: tuple[Path, Path]) -> None:
    worker = StandIn(loop)
    rr = gateway({}, worker)
    bad = [("/v1/completions", {"model": "demo", "prompt": [[2**32 + 5]]}),  # batched
           ("/v1/completions", {"model": "demo", "prompt": [1, 2, -1]}),
           ("/v1/completions", {"model": "demo", "prompt": [[1, 2], [3, 2**64 + 1]]}),
           ("/generate", {"input_ids": [[1], [2**40]]}),
           ("/generate", {"input_ids": [2**32]})]
    for path, body in bad:
        assert "is outside [0, 2**32)" in error_of(post(rr, path, body), 400)["message"], body
    assert worker.bodies == []
    assert post(rr, "/v1/completions", {"model": "demo", "prompt": [[1, 2], [3]]}).status_code == 200
    mixed = error_of(post(rr, "/v1/completions", {"model": "demo", "prompt": [1, "two"]}), 400)["message"]
    assert mixed.startswith("'prompt' must be a string, a list of strings")


def test_prompts_are_bounded_by_the_models_context(loop: LoopThread, gateway: Any,
                                                   profile: tuple[Path, Path]) -> None:
    worker = StandIn(loop, max_model_len=64)
    models = {"models": {"demo": gateway_model(*profile)}}
    rr = gateway(models, worker)
    assert rr.gateway.fleet.workers["w0"].discovery.max_model_len == 64  # type: ignore[union-attr]
    longest = max(map(len, rr.gateway.profiles["demo"].tokenizer.get_vocab()))
    # Too long in characters to fit, whatever it tokenizes to: refused before tokenizing, by any policy.
    too_long = {"model": "demo", "prompt": "y" * (64 * longest + 1)}
    assert error_of(post(rr, "/v1/completions", too_long), 400)["code"] == "context_length_exceeded"
    ids = {"model": "demo", "prompt": list(range(65))}
    assert error_of(post(rr, "/v1/completions", ids), 400)["code"] == "context_length_exceeded"
    chat = {"model": "demo", "messages": [{"role": "user", "content": "z" * (64 * longest + 1)}]}
    assert error_of(post(rr, "/v1/chat/completions", chat), 400)["code"] == "context_length_exceeded"
    assert worker.bodies == []
    # Short in characters, past the context in tokens: refused once tokenized (a policy that tokenizes).
    approx = gateway({"policy": "approx", **models}, StandIn(loop, max_model_len=64))
    words = {"model": "demo", "prompt": " ".join(f"w{i}" for i in range(80))}
    assert "longer than the model's context of 64" in error_of(post(approx, "/v1/completions", words), 400)["message"]
    assert post(approx, "/v1/completions", {"model": "demo", "prompt": "a short one"}).status_code == 200


class HeldTokenizer:
    """The profile's tokenizer, its encoding of a long text held until the test lets it go: while it
    is held, whatever thread called it is stuck there, as it would be for a long prompt."""

    def __init__(self, real: Any) -> None:
        self.real, self.entered, self.release = real, threading.Event(), threading.Event()
        self.threads: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def encode_batch_fast(self, texts: list[str], **kwargs: Any) -> Any:
        if any(len(text) > OFFLOAD_CHARS for text in texts):
            self.threads.append(threading.current_thread().name)
            self.entered.set()
            self.release.wait(60)
        return self.real.encode_batch_fast(texts, **kwargs)


def test_a_long_prompt_tokenizes_off_the_event_loop(loop: LoopThread, gateway: Any,
                                                    profile: tuple[Path, Path]) -> None:
    """While a long prompt is being tokenized, the gateway still answers: ``/livez`` and a short request
    complete with the tokenizer held mid-call. Tokenized on the event loop, neither would (no timing)."""
    gw = gateway({"policy": "approx", "models": {"demo": gateway_model(*profile)}, "max_body_bytes": 8 << 20},
                 StandIn(loop))
    live = gw.gateway.profiles["demo"]
    held = HeldTokenizer(live.tokenizer)
    live.tokenizer = live.windows.tokenizer = held
    text = "Every sentence here is new to the tokenizer, number %d. " * 8_000  # ~450 kB
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(post, gw, "/v1/completions", {"model": "demo", "prompt": text % tuple(range(8_000))})
        try:
            assert held.entered.wait(30), "the long prompt never reached the tokenizer"
            assert httpx.get(f"{gw.url}/livez", timeout=10).status_code == 200
            assert post(gw, "/v1/completions", {"model": "demo", "prompt": "a short one"}).status_code == 200
        finally:
            held.release.set()
        assert answer.result(60).status_code == 200
    assert held.threads == ["tokenize_0"]  # the gateway's tokenizer thread, one call with the long text


def test_an_unknown_model_is_404_under_rr_and_logs_carry_a_bounded_model(loop: LoopThread, gateway: Any,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    gw = gateway({}, StandIn(loop))
    huge = "m" * 100_000
    with caplog.at_level(logging.INFO, logger="cacheon.access"):
        assert error_of(post(gw, "/v1/completions", {"model": "nope", "prompt": "x"}), 404)["code"] == "model_not_found"
        message = error_of(post(gw, "/v1/completions", {"model": huge, "prompt": "x"}), 404)["message"]
        assert post(gw, "/v1/completions", {"model": "demo", "prompt": "x"}).status_code == 200
        # A line is written once its answer is (a client may read the answer first): wait for the three.
        wait_until(lambda: sum(r.name == "cacheon.access" for r in caplog.records) == 3, "three access lines", 10)
    assert len(message) < 400
    lines = [r for r in caplog.records if r.name == "cacheon.access"]
    assert [r.fields["status"] for r in lines] == [404, 404, 200]  # type: ignore[attr-defined]
    models = [r.fields["model"] for r in lines]  # type: ignore[attr-defined]
    assert models[0] == "nope" and models[1].startswith("mmm") and len(models[1]) < 400


def test_a_worker_dying_mid_stream_leaves_an_error_and_an_unfinished_stream(loop: LoopThread, gateway: Any) -> None:
    gw = gateway({}, StandIn(loop, mode="dies"))
    body = {"model": "demo", "prompt": "x", "stream": True}
    events: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError), httpx.stream(  # the body's chunked framing never ends
            "POST", f"{gw.url}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        events.extend(line for line in r.iter_lines() if line)
    assert events[0].startswith('data: {"choices"')
    error = msgspec.json.decode(events[-1].removeprefix("data: "))["error"]
    assert error["type"] == "upstream_error" and "mid-stream" in error["message"]
    assert gw.gateway.fleet.workers["w0"].breaker.failures == 1


def test_a_stream_silent_past_the_timeout_is_cut_with_an_error(loop: LoopThread, gateway: Any,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    gw = gateway({"request_timeout_s": 1}, StandIn(loop, mode="stalls"))
    events: list[str] = []
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="cacheon.access"), pytest.raises(httpx.RemoteProtocolError), \
            httpx.stream("POST", f"{gw.url}/v1/completions", json={"model": "demo", "prompt": "x", "stream": True},
                         timeout=30) as r:  # the body's chunked framing never ends
        events.extend(line for line in r.iter_lines() if line)
    assert time.monotonic() - started < 2.5  # the gateway's 1 s gap, not the worker's 3 s
    assert "mid-stream" in msgspec.json.decode(events[-1].removeprefix("data: "))["error"]["message"]
    wait_until(lambda: any(r.name == "cacheon.access" for r in caplog.records), "the access line", 5)
    line = next(r for r in caplog.records if r.name == "cacheon.access")
    assert line.fields["error"] == "upstream ended mid-stream: no answer within 1 s"  # type: ignore[attr-defined]
    assert gw.gateway.fleet.workers["w0"].breaker.failures == 1


def test_a_stream_longer_than_the_timeout_with_short_gaps_completes(loop: LoopThread, gateway: Any) -> None:
    gw = gateway({"request_timeout_s": 1}, StandIn(loop, mode="steady"))
    started = time.monotonic()
    with httpx.stream("POST", f"{gw.url}/v1/completions", json={"model": "demo", "prompt": "x", "stream": True},
                      timeout=30) as r:
        events = [line for line in r.iter_lines() if line]
    assert time.monotonic() - started > 2  # longer than the timeout in all: only the gaps count
    assert len(events) == 7 and events[-1] == "data: [DONE]"


def test_a_slow_reader_is_not_a_silent_worker(loop: LoopThread, gateway: Any) -> None:
    """The relay waits on the client (its socket buffers full) longer than the timeout: the stream still
    completes, and the wait reaches the worker (the gateway stops reading it) instead of piling the
    stream up in the gateway's memory."""
    worker = StandIn(loop, mode="flood")
    gw = gateway({"request_timeout_s": 1}, worker)
    with httpx.stream("POST", f"{gw.url}/v1/completions", json={"model": "demo", "prompt": "x", "stream": True},
                      timeout=30) as r:
        time.sleep(2.5)  # reading nothing: 48 MiB overflow the loopback buffers, the gateway's write waits
        held_back = worker.written
        events = [line for line in r.iter_lines() if line]
    assert held_back < FLOOD_EVENTS  # the worker's writes wait too: what the sockets hold is all that moved
    assert len(events) == FLOOD_EVENTS + 1 and events[-1] == "data: [DONE]"
    assert gw.gateway.fleet.workers["w0"].breaker.failures == 0


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_a_stream_is_framed_as_the_clients_http_version_allows(loop: LoopThread, gateway: Any, version: str) -> None:
    """HTTP/1.1: chunked, each chunk's size what follows it; HTTP/1.0 has no chunked framing: the
    events as they are, ended by the connection's close."""
    gw = gateway({}, StandIn(loop, mode="quick"))
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    body = b'{"model": "demo", "prompt": "x", "stream": true}'
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/%b\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n%b" % (version.encode(), len(body), body))
        head, _, rest = s.makefile("rb").read().partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"200"
    if version == "1.1":
        assert b"transfer-encoding: chunked" in head.lower()
        chunks = []
        while True:
            size, _, rest = rest.partition(b"\r\n")
            chunk, rest = rest[: int(size, 16)], rest[int(size, 16):]
            assert rest.startswith(b"\r\n")
            rest = rest[2:]
            if not chunk:
                break
            chunks.append(chunk)
        assert rest == b""
        rest = b"".join(chunks)
    else:
        assert b"transfer-encoding" not in head.lower()
    event = b'data: {"choices": [{"text": "a"}]}\n\n'
    assert rest == event * 6 + b"data: [DONE]\n\n"


@pytest.mark.parametrize("keepalive_s", [75, 0.3])
def test_streams_reuse_a_connection_the_worker_keeps_and_not_one_it_closed(loop: LoopThread, gateway: Any,
                                                                         keepalive_s: float) -> None:
    worker = StandIn(loop, mode="steady", keepalive_s=keepalive_s)
    gw = gateway({}, worker)
    for _ in range(2):
        with httpx.stream("POST", f"{gw.url}/v1/completions", json={"model": "demo", "prompt": "x", "stream": True},
                          timeout=30) as r:
            assert [line for line in r.iter_lines() if line][-1] == "data: [DONE]"
        time.sleep(1 if keepalive_s < 1 else 0)  # past the worker's keep-alive in the second case
    assert len(set(worker.peers)) == (1 if keepalive_s > 1 else 2)
    assert gw.gateway.fleet.workers["w0"].breaker.failures == 0


def test_a_stream_whose_head_does_not_come_is_answered_503(loop: LoopThread, gateway: Any) -> None:
    gw = gateway({"request_timeout_s": 1}, StandIn(loop, mode="late"))
    started = time.monotonic()
    r = post(gw, "/v1/completions", {"model": "demo", "prompt": "x", "stream": True})
    assert time.monotonic() - started < 2.5
    assert "no answer within 1 s" in error_of(r, 503)["message"]


def test_a_malformed_json_answer_is_retried_elsewhere_and_counted(loop: LoopThread, gateway: Any) -> None:
    bad, good = StandIn(loop, mode="truncated"), StandIn(loop)
    gw = gateway({"breaker_failures": 100}, bad, good)
    for _ in range(4):
        r = post(gw, "/v1/completions", {"model": "demo", "prompt": "x"})
        assert r.status_code == 200 and r.json() == ANSWER and r.headers["x-cacheon-worker"] == good.url
    assert len(bad.bodies) == 2 and gw.gateway.fleet.workers["w0"].breaker.failures == 2
    alone = gateway({}, StandIn(loop, mode="truncated"))
    assert error_of(post(alone, "/v1/completions", {"model": "demo", "prompt": "x"}), 502)["type"] == "upstream_error"


def test_two_gateways_that_are_each_others_worker_refuse_the_loop(loop: LoopThread, gateway: Any) -> None:
    """Registration refuses a gateway as its own worker; a loop through another gateway passes that check
    (each URL is a different listener) and only the hop mark stops it."""
    first, second = gateway({"request_timeout_s": 5}), gateway({"request_timeout_s": 5})

    async def each_names_the_other() -> None:
        await first.gateway.fleet.add(WorkerSpec(url=second.url))
        await second.gateway.fleet.add(WorkerSpec(url=first.url))

    loop.call(each_names_the_other())
    error = error_of(post(first, "/v1/completions", {"model": "demo", "prompt": "x"}, timeout=20), 508)
    assert error["code"] == "loop_detected"


def test_requests_the_http_parser_refuses_get_openai_errors(gateway: Any) -> None:
    gw = gateway({})
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n")
        head, _, body = s.makefile("rb").read().partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400" and b"content-type: application/json" in head.lower()
    assert set(msgspec.json.decode(body)["error"]) == {"message", "type", "param", "code"}
    r = httpx.get(f"{gw.url}/livez", headers={"x-long": "a" * 9000})  # past aiohttp's 8190-byte header line
    assert error_of(r, 400)["message"].startswith("the request could not be read: Got more than 8190 bytes")
    assert len(r.json()["error"]["message"]) < 400  # what the client sent is clipped


@pytest.fixture
def json_logs() -> Iterator[None]:
    logs.configure("info", "json")
    yield
    logs.stop()
    for name in logs.ROUTED:  # as before configure: records propagate to the root (and caplog)
        logger = logging.getLogger(name)
        logger.handlers[:], logger.propagate = [], True
        logger.setLevel(logging.NOTSET)


def test_aiohttp_tracebacks_go_through_the_json_formatter(json_logs: None) -> None:
    server = logging.getLogger("aiohttp.server")  # where aiohttp logs a request it could not handle
    handlers = [h for name in ("aiohttp", "asyncio") for h in logging.getLogger(name).handlers]
    assert handlers == logging.getLogger("cacheon").handlers * 2 and not logging.getLogger("aiohttp").propagate
    try:
        raise ValueError("a parser's failure")
    except ValueError:
        record = server.makeRecord(server.name, logging.ERROR, __file__, 1, "Error handling request", (),
                                   sys.exc_info())
    line = msgspec.json.decode(handlers[0].format(record))
    assert (line["logger"], line["level"]) == ("aiohttp.server", "error")
    assert "ValueError: a parser's failure" in line["exception"]
