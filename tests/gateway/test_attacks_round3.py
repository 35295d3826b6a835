"""Round 3 of white-box attacks on the gateway: the health probe skipped for a worker that answered, the KV
subscriber's sleep (wake pipe, close, geometry churn), what is read whole and the headers passed on, and the
stream tail. Each BUG case failed on the code before its fix (session 13); the others pin shapes that hold
and that no other test sends. Reuses test_relay_attacks.py's raw worker, gateway fixture and helpers."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import zmq
from aiohttp import web

from cacheon.errors import UsageError
from cacheon.gateway.feeds import WorkerFeeds
from cacheon.gateway.precision import StreamTail
from cacheon.kv.contracts import for_version
from cacheon.kv.index import BlockIndex
from cacheon.kv.subscriber import Subscriber
from cacheon.kv.wire import WireBounds
from cacheon.sim.launch import wait_until
from tests.gateway import test_relay_attacks as relay_attacks
from tests.gateway.inproc import InProcessGateway, LoopThread, serve_app
from tests.gateway.test_relay_attacks import (
    DONE,
    EVENT,
    PLAIN,
    STREAM,
    _answer,
    _answering,
    _headers,
    _request,
    exchange,
    failures,
)

gateway = relay_attacks.gateway  # the raw worker behind an rr gateway: a fixture, shared

pytestmark = pytest.mark.timeout(60)


# -- the health probe skipped for a worker that answered (fleet._check) -----------------------------------


class SickWorker:
    """An aiohttp worker: ``/health`` 200 until ``sick`` (then 503), every POST answered ``status`` at once
    (JSON, or a 2-event stream when the request streams); counts the probes."""

    def __init__(self, loop: LoopThread, status: int = 200) -> None:
        self.sick, self.status, self.probes = False, status, 0

        async def health(_: web.Request) -> web.Response:
            self.probes += 1
            return web.json_response({}, status=503 if self.sick else 200)

        async def info(request: web.Request) -> web.Response:
            return web.json_response({"version": "0.5.23", "served_model_name": "demo", "page_size": 1,
                                      "model_path": "demo", "object": "list", "data": []})

        async def complete(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            if not body.get("stream"):
                return web.json_response({"error": {"message": "bad request"}} if self.status >= 400
                                         else {"choices": [{"text": " ok"}]}, status=self.status)
            out = web.StreamResponse(status=self.status, headers={"content-type": "text/event-stream"})
            await out.prepare(request)
            await out.write(EVENT + DONE)
            await out.write_eof()
            return out

        async def start() -> str:
            app = web.Application()
            app.router.add_get("/health", health)
            for path in ("/server_info", "/model_info", "/v1/models"):
                app.router.add_get(path, info)
            app.router.add_post("/v1/completions", complete)
            self._runner, url = await serve_app(app)
            return url

        self._loop = loop
        self.url: str = loop.call(start())

    def close(self) -> None:
        self._loop.call(self._runner.cleanup())


@pytest.fixture
def sick(loop: LoopThread, tmp_path: Path) -> Iterator[Any]:
    """``sick(status, interval_s)``: a ``SickWorker`` answering POSTs ``status`` behind an rr gateway probing
    every ``interval_s`` (0.2 s)."""
    made: list[Any] = []

    def make(status: int, interval_s: float = 0.2) -> tuple[SickWorker, InProcessGateway]:
        worker = SickWorker(loop, status)
        made.append(worker)
        gw = InProcessGateway(loop, {"policy": "rr", "health_interval_s": interval_s,
                                     "workers": [{"url": worker.url}]}, tmp_path)
        made.append(gw)
        wait_until(lambda: httpx.get(f"{gw.url}/readyz").status_code == 200, "the worker healthy", 20)
        return worker, gw

    yield make
    for thing in reversed(made):
        thing.close()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_worker_answering_only_4xx_while_its_health_fails_is_still_probed(sick: Any, stream: bool) -> None:
    """BUG. The probe is skipped for a healthy worker whose breaker ``answered_at`` is within the interval, and
    ``Breaker.succeeded()`` is called for every status under 500: a 400 (request validation, which SGLang's
    HTTP layer answers without its scheduler) counts as "the worker answered". An engine whose /health says 503
    (hung scheduler, a generation that no longer runs) stays healthy and routed for as long as anyone (a
    hostile client's invalid requests suffice) gets 4xx answers from it more often than once an interval.
    Expected: a 4xx is no proof of health; the probe runs and the worker is taken out within a few intervals.
    (Fails at dceff07: 0 probes in 3 s of 400s; passes with the working tree's ``Breaker.succeeded(served)``.)"""
    worker, gw = sick(400, 0.8)  # an answer every ~30 ms: far inside the interval on a loaded box too
    worker.sick = True  # from now on /health answers 503
    before, body = worker.probes, {"model": "demo", "prompt": "x", "stream": stream}
    until = time.monotonic() + 3
    codes = set()
    while time.monotonic() < until:
        codes.add(httpx.post(f"{gw.url}/v1/completions", json=body, timeout=10).status_code)
        time.sleep(0.03)
    healthy = gw.gateway.fleet.workers["w0"].healthy
    assert worker.probes - before >= 2 and not healthy, (worker.probes - before, healthy, codes)


def test_a_worker_that_dies_right_after_answering_is_taken_out_within_two_intervals(sick: Any) -> None:
    """Holds. A worker that answered (so its next probe is skipped) and then stops answering /health must
    still be probed at the interval after that: out of the pool within ~2 intervals of its last answer."""
    worker, gw = sick(200)
    assert httpx.post(f"{gw.url}/v1/completions", json={"model": "demo", "prompt": "x"}, timeout=10).status_code == 200
    worker.sick = True
    answered = time.monotonic()
    wait_until(lambda: not gw.gateway.fleet.workers["w0"].healthy, "the worker taken out", 5)
    assert time.monotonic() - answered < 3 * 0.2 + 0.5
    assert httpx.post(f"{gw.url}/v1/completions", json={"model": "demo", "prompt": "x"}, timeout=10).status_code == 503


# -- the stream tail (precision.StreamTail) -----------------------------------------------------------------


@pytest.mark.parametrize("shape", ["one-endless-event", "crlf-events"])
def test_the_stream_tail_holds_no_more_than_an_event(shape: str) -> None:
    """BUG. ``StreamTail`` (made for every predicted stream: the exact policy's normal case) keeps the event in
    progress until a blank line ``\\n\\n`` ends it. A worker whose stream never has one (an endless event, or
    events ended by CRLF CRLF, which the SSE format allows) makes the gateway hold the whole stream in memory
    for its life: 32 MiB here, without bound for a longer one; and the CRLF stream's usage event is never
    found (the prediction is 'unreported'). Expected: what is held is bounded (e.g. by a largest event the
    tail will parse, past which the event in progress is dropped) and a CRLF-ended event counts as ended."""
    tail = StreamTail()
    usage = b'data: {"choices": [], "usage": {"prompt_tokens_details": {"cached_tokens": 48}}}'
    if shape == "one-endless-event":
        piece = b"data: " + b"x" * ((64 << 10) - 6)
        for _ in range(512):  # 32 MiB in 64 KiB reads, no blank line
            tail.feed(piece)
    else:
        event = b'data: {"choices": [{"text": " a", "index": 0}]}\r\n\r\n'
        piece = event * ((64 << 10) // len(event))
        for _ in range(512):
            tail.feed(piece)
        tail.feed(usage + b"\r\n\r\ndata: [DONE]\r\n\r\n")
    held = sum(len(p) for p in tail._pieces)
    assert held <= 1 << 20, f"{held >> 20} MiB held for one stream"
    if shape == "crlf-events":
        assert tail.last == usage[6:]


# -- what is read whole, and the headers passed back ----------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_a_header_value_that_is_not_utf8_does_not_fail_the_request(gateway: Any, stream: bool) -> None:
    """Holds. A worker's header value with a byte that is not UTF-8 (\\xff: Latin-1 text, an opaque token): both
    clients decode it with ``surrogateescape``, and aiohttp must write it back to the client. Expected: the
    answer reaches the client (the value as it came, or the header dropped), never a 500 from the gateway."""
    gw = gateway(_answering(b"X-Odd: caf\xe9 \xff\r\nX-Kept: yes", stream))
    head, body, ended, _ = exchange(gw, _request(STREAM if stream else PLAIN))
    assert head.split(b" ")[1] == b"200", head + body[:300]
    assert (b"x-kept", b"yes") in _headers(head) and ended
    assert failures(gw) == 0


def test_connection_header_names_with_odd_case_whitespace_and_empty_items_are_all_dropped(gateway: Any) -> None:
    """Holds. ``Connection`` names in any case, padded with tabs and spaces, between empty list items, in a
    header whose own name is upper case: each named header is dropped on the non-streamed path (where
    aiohttp's client parsed the head), the rest passes."""
    sent = (b"CONNECTION: \t X-A\t,,  ,x-b ,\r\nconnection:X-C\r\nX-A: 1\r\nX-B: 2\r\nx-c: 3\r\nX-Kept: yes")

    gw = gateway(_answering(sent))
    for body in (STREAM, PLAIN):
        head, _, ended, _ = exchange(gw, _request(body))
        names = [k for k, _ in _headers(head)]
        assert not {b"x-a", b"x-b", b"x-c"} & set(names) and b"x-kept" in names and ended, head


def test_a_huge_4xx_body_is_cut_at_max_answer_bytes(gateway: Any) -> None:
    """Holds. A non-streamed 4xx is read whole too: a worker sending 64 MiB of it is cut near
    ``max_answer_bytes`` (a 502 naming the bound, not counted on the breaker), never held or passed on whole."""
    sent = [0]

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 400 X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (64 << 20))
        piece = b"a" * (64 << 10)
        while sent[0] < 64 << 20:
            writer.write(piece)
            await writer.drain()
            sent[0] += len(piece)
        return False

    gw = gateway(script, max_answer_bytes=1 << 20)
    head, body, _, _ = exchange(gw, _request(PLAIN))
    assert head.split(b" ")[1] == b"502", head
    assert "answer_too_large" in body.decode()
    assert failures(gw) == 0 and sent[0] < 16 << 20


def test_a_content_length_shorter_than_the_body_does_not_answer_the_next_request(gateway: Any) -> None:
    """BUG. A non-streamed answer whose Content-Length is shorter than what the worker sends: the rest (here a
    whole second answer, sent 0.2 s later while the connection sits idle in aiohttp's pool) answers nothing.
    What happens: aiohttp's client parses bytes that arrive on an idle pooled connection and queues them as
    a response; ``Proxy._call`` (the shared session of ``http.session``) takes that connection for the next
    request, from another client, which gets the forged answer at once, and the real answer then goes to
    the request after it: every answer on that connection is shifted by one, across clients. ``upstream.py``
    guards its own pool against exactly this (``Response.idle``: bytes before a request close the
    connection); the non-streamed path does not. Expected: the next request gets its own answer."""
    forged = b'{"forged": true}'

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        body = b'{"choices": [{"text": " ok"}]}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                     % (len(body), body))
        await writer.drain()
        if n == 1:
            await asyncio.sleep(0.2)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                         % (len(forged), forged))
            await writer.drain()
        return True

    gw = gateway(script)
    head, body, _, _ = exchange(gw, _request(PLAIN))
    assert head.split(b" ")[1] == b"200" and b"ok" in body
    time.sleep(0.5)
    head, body, _, _ = exchange(gw, _request(PLAIN))
    assert forged not in body, body


def test_a_content_length_longer_than_the_body_then_a_close_is_the_workers_failure(gateway: Any) -> None:
    """Holds. A non-streamed answer that promises more than it sends before closing: the gateway does not
    pass the half body on as an answer; it is the worker's failure (counted) and the client gets a 503."""
    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{}")
        await writer.drain()
        return False

    gw = gateway(script)
    head, _, _, _ = exchange(gw, _request(PLAIN))
    assert head.split(b" ")[1] == b"503", head
    assert failures(gw) == 1


# -- the KV subscriber's sleep: wake pipe, close, geometry churn (kv/subscriber.py, gateway/feeds.py) ----------

PIN = "0.5.13.post1"
_WIRE = msgspec.json.decode((Path(__file__).parents[1] / "kv" / "fixtures" / "kv_wire.json").read_bytes())
STORED = __import__("base64").b64decode(_WIRE[PIN]["stored_page"]["payload"])  # rank 0, stores block 11


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _feeds(endpoint: str, dp_size: int = 1, replay: str | None = None,
           index: BlockIndex[Any] | None = None) -> WorkerFeeds:
    return WorkerFeeds("w", endpoint, for_version(PIN), dp_size, replay, index if index is not None else BlockIndex(),
                       lambda d: None, WireBounds(), 10_000)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_feeds_for_a_geometry_past_the_last_port_leak_nothing() -> None:
    """BUG. A worker's discovery says where its KV publisher is (``endpoint_port_base``) and how many DP ranks
    it has, and nothing checks that the last rank's port (base + dp_size - 1) fits 65535: ``rank_endpoint``
    raises UsageError inside ``Subscriber.add_worker``, after ``Subscriber.__init__`` made its ZMQ context and
    wake pipe and the earlier ranks their SUB and monitor sockets. ``WorkerFeeds.__init__`` does not close
    them, so every attestation of such a worker (it re-attests every ``attest_interval_s``) leaks fds for
    good, and the exception escapes ``Fleet.attest``. Expected: a failed WorkerFeeds leaves no fd behind
    (and the ladder refuses the geometry as a fence, not a crash)."""
    before = _fds()
    for _ in range(10):
        with pytest.raises(UsageError):
            _feeds("tcp://127.0.0.1:65535", dp_size=2)
    assert _fds() - before <= 2, f"{_fds() - before} fds left by 10 failed WorkerFeeds"


def test_feeds_replaced_again_and_again_leave_no_fd_or_thread() -> None:
    """Holds. A worker whose geometry keeps changing has its ``WorkerFeeds`` closed and made again each time
    (``Fleet._subscribe``): with the wake pipe and a replay DEALER per rank, 30 rounds leave the process's
    fds and threads where they were, and each close returns at once (the sleeping thread is woken, not
    waited on for a tick)."""
    port = _free_port()
    first = _feeds(f"tcp://127.0.0.1:{port}", 2, f"tcp://127.0.0.1:{port + 2}")
    first.close()
    fds, threads = _fds(), threading.active_count()
    slowest = 0.0
    for i in range(30):
        feeds = _feeds(f"tcp://127.0.0.1:{port}", 1 + i % 3, f"tcp://127.0.0.1:{port + 3}")
        started = time.monotonic()
        feeds.close()
        slowest = max(slowest, time.monotonic() - started)
        assert not feeds.alive()
    wait_until(lambda: threading.active_count() <= threads, "the feeds' threads gone", 5)
    assert _fds() - fds <= 2, f"{_fds() - fds} fds more after 30 rounds"
    assert slowest < 0.5


def test_stop_before_run_and_stop_twice_end_the_thread_at_once() -> None:
    """Holds. ``stop`` called before the thread's ``run`` started (the flag is seen first: ``run`` never
    sleeps), and ``stop`` twice (two bytes in the pipe) on a thread already asleep: both threads end at once
    and ``close`` then succeeds."""
    early = Subscriber(BlockIndex())
    early.add_worker("w", f"tcp://127.0.0.1:{_free_port()}", for_version(PIN), [0])
    early.stop()
    thread = threading.Thread(target=early.run, daemon=True)
    thread.start()
    thread.join(2)
    assert not thread.is_alive()
    early.close()
    asleep = Subscriber(BlockIndex())
    asleep.add_worker("w", f"tcp://127.0.0.1:{_free_port()}", for_version(PIN), [0])
    thread = threading.Thread(target=asleep.run, daemon=True)
    thread.start()
    time.sleep(0.2)
    asleep.stop()
    asleep.stop()
    thread.join(2)
    assert not thread.is_alive()
    asleep.close()


def _publish_until(pub: zmq.Socket[bytes], seq: int, done: Any, what: str) -> None:
    """Send ``seq`` until ``done()``: a PUB drops what it sends before the subscription reaches it."""
    deadline = time.monotonic() + 20
    while not done():
        assert time.monotonic() < deadline, what
        pub.send_multipart([b"", seq.to_bytes(8, "big"), STORED])
        time.sleep(0.05)


def test_a_publisher_that_restarts_while_the_thread_sleeps_is_seen_and_followed() -> None:
    """Holds. The feeds' thread asleep in the poll, the publisher (the worker's engine) goes away and a new one
    binds the same port and counts from seq 0 again: the monitor's events alone wake the thread (nothing
    else arrives meanwhile), the reconnect is counted, the rank cleared, and the new publisher's batch indexed."""
    ctx = zmq.Context()
    port = _free_port()
    index: BlockIndex[Any] = BlockIndex()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    feeds = _feeds(f"tcp://127.0.0.1:{port}", index=index)
    try:
        _publish_until(pub, 5, lambda: index.longest_prefix([11]) == {("w", 0): 1}, "the first batch")
        pub.close(linger=0)
        wait_until(lambda: feeds.totals().reconnects == 0 and index.longest_prefix([11]) == {("w", 0): 1},
                   "still indexed", 1)
        time.sleep(0.3)
        pub = ctx.socket(zmq.PUB)
        pub.bind(f"tcp://127.0.0.1:{port}")
        wait_until(lambda: feeds.totals().reconnects >= 1, "the reconnect seen without any message", 10)
        assert index.longest_prefix([11]) == {("w", 0): 1}  # cleared only when the next batch comes
        _publish_until(pub, 0, lambda: feeds.totals().clears >= 1 and index.longest_prefix([11]) == {("w", 0): 1},
                       "the new publisher's batch")
        assert feeds.alive()
    finally:
        feeds.close()
        pub.close(linger=0)
        ctx.term()


def test_a_gap_is_replayed_by_the_sleeping_thread_with_nothing_after_it() -> None:
    """Holds. A batch that jumps one seq ahead and then silence: the sleeping thread, woken by that batch
    alone, asks the replay ROUTER for the hole, applies the replayed batch before the live one, and the
    hole does not clear the rank (no later traffic or tick needed)."""
    ctx = zmq.Context()
    port = _free_port()
    pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    pub.bind(f"tcp://127.0.0.1:{port}")
    rport = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def serve() -> None:  # SEQ framing: [b"", seq, payload] per batch, then the end marker
        while not stop.is_set():
            if not router.poll(50):
                continue
            ident, _, start = router.recv_multipart()
            first = int.from_bytes(start, "big")
            for s in range(first, first + 1):
                router.send_multipart([ident, b"", s.to_bytes(8, "big"), STORED])
            router.send_multipart([ident, b"", b"\xff" * 8, b""])

    seen: list[Any] = []
    index: BlockIndex[Any] = BlockIndex()
    feeds = WorkerFeeds("w", f"tcp://127.0.0.1:{port}", for_version(PIN), 1, f"tcp://127.0.0.1:{rport}", index,
                        seen.append, WireBounds(), 10_000)
    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        _publish_until(pub, 0, lambda: bool(seen), "first contact")
        time.sleep(0.3)  # the thread asleep again
        count = len(seen)
        last = seen[-1].seq
        pub.send_multipart([b"", (last + 2).to_bytes(8, "big"), STORED])
        wait_until(lambda: len(seen) >= count + 2, "the replayed batch and the live one", 10)
        got = [(d.seq, d.replayed) for d in seen[count:]]
        totals = feeds.totals()
        assert got == [(last + 1, True), (last + 2, False)], got
        assert (totals.gaps, totals.replay_failures, totals.clears) == (1, 0, 0), totals
    finally:
        stop.set()
        server.join(2)
        feeds.close()
        pub.close(linger=0)
        router.close(linger=0)
        ctx.term()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_a_5xx_without_length_on_a_kept_connection_is_bounded_by_the_timeout(gateway: Any, stream: bool) -> None:
    """Holds. A 5xx with neither Content-Length nor chunking, the worker keeping the connection open: its body
    ends only with the close (RFC 9112 6.3), which never comes. Read whole to answer with, it is bounded by
    ``request_timeout_s`` in all on both paths: the client gets a 503 in about that time, the worker counted
    once, and the connection is not pooled (the next request comes on a new one)."""
    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 1:
            writer.write(b"HTTP/1.1 503 X\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n\r\n{}")
            await writer.drain()
            await asyncio.sleep(5)
            return False
        writer.write(_answer(stream, b"X-Kept: yes"))
        await writer.drain()
        return True

    gw = gateway(script, request_timeout_s=1)
    started = time.monotonic()
    head, _, _, _ = exchange(gw, _request(STREAM if stream else PLAIN))
    assert time.monotonic() - started < 2.5 and head.split(b" ")[1] == b"503", head
    assert failures(gw) == 1
    head, _, ended, _ = exchange(gw, _request(STREAM if stream else PLAIN))
    assert head.split(b" ")[1] == b"200" and ended
    assert len(set(gw.worker.connections)) == 2
