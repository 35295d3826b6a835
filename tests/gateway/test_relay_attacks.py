"""The stream relay (``Response.pipe`` into ``proxy.ClientSink``) attacked with shapes its own tests do not
use: workers that misbehave at the byte level (a raw TCP server here, writing exactly the bytes a case
needs) and clients that misbehave at the socket level (raw sockets). Gateways are served in this process
(tests/gateway/inproc.py) on the module's loop thread; the raw worker runs on that loop too."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cacheon.gateway import proxy
from cacheon.gateway.upstream import Response, Upstream
from cacheon.sim.launch import wait_until
from tests.gateway.inproc import InProcessGateway, LoopThread
from tests.gateway.test_upstream import RecordingSink

pytestmark = pytest.mark.timeout(60)

Script = Callable[[asyncio.StreamWriter, int], Awaitable[bool]]
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENT = b'data: {"choices": [{"text": " a", "index": 0}]}\n\n'
DONE = b"data: [DONE]\n\n"
STREAM = b'{"model": "demo", "prompt": "x", "stream": true}'
_DISCOVERY = {b"/server_info": {"version": "0.5.23", "served_model_name": "demo", "page_size": 1},
              b"/model_info": {"model_path": "demo"},
              b"/v1/models": {"object": "list", "data": [{"id": "demo", "max_model_len": 1 << 20}]},
              b"/health": {}}


def chunked(*events: bytes, end: bytes = b"0\r\n\r\n") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + end


class RawWorker:
    """A worker on raw TCP: SGLang's discovery routes answered plainly, each POST by ``script(writer, n)``
    (n: the POST's number, from 1), which writes the answer's bytes itself and says whether the connection
    stays open. ``connections``: the connection each POST came on, by number (discovery's count too);
    ``heads``: each POST's request head as it came."""

    def __init__(self, loop: LoopThread, script: Script) -> None:
        self.script, self.posts, self.made = script, 0, 0
        self.connections: list[int] = []
        self.heads: list[bytes] = []
        self._loop = loop

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.made += 1
            mine = self.made
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length")), 0)
                    await reader.readexactly(length)
                    method, path = head.split(b" ")[:2]
                    if method == b"GET":
                        payload = msgspec.json.encode(_DISCOVERY.get(path, {}))
                        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d"
                                     b"\r\n\r\n%b" % (len(payload), payload))
                        await writer.drain()
                        continue
                    self.posts += 1
                    self.connections.append(mine)
                    self.heads.append(head)
                    if not await self.script(writer, self.posts):
                        writer.close()
                        return
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        async def start() -> tuple[asyncio.Server, int]:
            server = await asyncio.start_server(serve, "127.0.0.1", 0)
            return server, server.sockets[0].getsockname()[1]

        self._server, port = loop.call(start())
        self.url = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()

        self._loop.call(stop())


@pytest.fixture
def gateway(loop: LoopThread, tmp_path: Path) -> Iterator[Callable[..., InProcessGateway]]:
    """``gateway(script, **config)``: an in-process gateway (rr) over one ``RawWorker``, discovered."""
    made: list[Any] = []

    def make(script: Script, **raw: Any) -> InProcessGateway:
        worker = RawWorker(loop, script)
        made.append(worker)
        gw = InProcessGateway(loop, {"policy": "rr", "workers": [{"url": worker.url}], **raw}, tmp_path)
        made.append(gw)
        gw.worker = worker  # type: ignore[attr-defined]
        wait_until(lambda: all(w.discovery is not None for w in gw.gateway.fleet.workers.values()), "discovery", 10)
        return gw

    yield make
    for thing in reversed(made):
        thing.close()


def _connect(gw: InProcessGateway) -> socket.socket:
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _request(body: bytes = STREAM, version: bytes = b"1.1", extra: bytes = b"Connection: close\r\n") -> bytes:
    return (b"POST /v1/completions HTTP/%b\r\nHost: x\r\nContent-Type: application/json\r\n%bContent-Length: %d"
            b"\r\n\r\n%b" % (version, extra, len(body), body))


def _read_all(s: socket.socket) -> bytes:
    parts = []
    with contextlib.suppress(ConnectionResetError):
        while part := s.recv(65536):
            parts.append(part)
    return b"".join(parts)


def dechunk(rest: bytes) -> tuple[bytes, bool, bytes]:
    """A chunked body, strictly: (its bytes, whether it ended with the zero chunk, what followed the end)."""
    chunks = []
    while True:
        size, sep, after = rest.partition(b"\r\n")
        if not sep:
            return b"".join(chunks), False, rest
        n = int(size, 16)
        if len(after) < n + 2:
            return b"".join([*chunks, after]), False, b""
        assert after[n:n + 2] == b"\r\n", "a chunk not followed by CRLF: the framing is broken"
        if n == 0:  # the last chunk (no trailers from the gateway): its CRLF ends the body
            return b"".join(chunks), True, after[2:]
        chunks.append(after[:n])
        rest = after[n + 2:]


def exchange(gw: InProcessGateway, request: bytes | None = None) -> tuple[bytes, bytes, bool, bytes]:
    """One request on its own connection (Connection: close): (head, body, ended cleanly, bytes after it)."""
    with _connect(gw) as s:
        s.sendall(request or _request())
        raw = _read_all(s)
    head, _, rest = raw.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" not in head.lower():
        return head, rest, True, b""
    body, ended, after = dechunk(rest)
    return head, body, ended, after


def failures(gw: InProcessGateway) -> int:
    return gw.gateway.fleet.workers["w0"].breaker.failures


# -- workers -----------------------------------------------------------------------------------------


async def _whole_stream(writer: asyncio.StreamWriter, n: int) -> bool:
    """A worker's script: one whole stream (the head, one event, the end) in one write, the connection kept."""
    writer.write(HEAD + chunked(EVENT, DONE))
    await writer.drain()
    return True


@pytest.mark.parametrize("extra", [HEAD + chunked(b"data: forged\n\n"), b"garbage\r\n"],
                         ids=["second-answer", "garbage"])
def test_bytes_after_a_complete_answer_in_the_same_read_do_not_cut_the_stream(
        gateway: Any, extra: bytes) -> None:
    """BUG. A worker's answer complete to its last chunk, followed in the same socket read by bytes no request
    asked for (a second answer, garbage). The client asked for nothing more and got the whole answer: it must
    see it end cleanly and the worker must not be blamed; only the connection must not be reused.

    What happens: ``data_received`` feeds it all to httptools; ``on_message_begin`` (or the parser) refuses
    the extra bytes and ``_error`` is set on a response that is also ``complete``. ``Response.pipe`` checks
    ``_error`` before ``complete`` (upstream.py, the ``elif self._error is not None: raise`` above ``elif
    self.complete: return``), so the relay takes a complete answer for a mid-stream failure: ``_abort`` appends
    an error event and closes the client's connection without the zero chunk, and ``_failed`` counts a
    breaker failure. The old relay's ``chunk()`` checked ``complete`` first (``return b""``: a clean end).
    Fix: in ``pipe`` test ``self.complete`` before ``self._error`` (``reusable()`` still refuses the
    connection, ``_error`` being set)."""

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(HEAD + chunked(EVENT, DONE) + (extra if n == 1 else b""))  # one write: one read
        await writer.drain()
        return True

    gw = gateway(script)
    head, body, ended, after = exchange(gw)
    assert head.split(b" ")[1] == b"200"
    assert (body, ended, after) == (EVENT + DONE, True, b""), body
    assert failures(gw) == 0
    _, body, ended, _ = exchange(gw)  # the next request: on a new connection, the dirty one dropped
    assert (body, ended) == (EVENT + DONE, True)
    assert len(set(gw.worker.connections)) == 2  # type: ignore[attr-defined]


def test_a_worker_dying_mid_event_still_leaves_a_parseable_error_event(gateway: Any) -> None:
    """BUG (older than today's relay; the old loop did the same). A worker that dies half-way through an
    event (mid-chunk: a chunk's size line and part of it, then the close). Each read's decoded body is relayed as
    it comes, so the client already holds the event's first half; ``_abort`` then writes ``data: {error}``
    straight after it, on the same SSE line: the client's SSE parser sees one event whose data is
    ``{"choices": [{"te...data: {"error": ...}`` (not JSON), never the error event that tells an OpenAI client
    the stream failed. Fix: ``_abort`` starts its event with a blank line (an SSE blank line ends whatever
    partial event came before: the error event is then its own), or the relay tracks whether the last byte
    relayed ended an event."""
    half = EVENT[:20]

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(HEAD + chunked(EVENT, end=b"") + b"%x\r\n%b" % (len(EVENT), half))
        await writer.drain()
        return False  # closed (FIN): everything written is read first, then the close

    gw = gateway(script)
    head, body, ended, _ = exchange(gw)
    assert head.split(b" ")[1] == b"200" and not ended  # cut short, in the framing too
    assert body.startswith(EVENT + half)
    last = body.rstrip(b"\n").split(b"\n\n")[-1]
    assert last.startswith(b"data: "), last
    error = msgspec.json.decode(last.removeprefix(b"data: "))  # the bug: msgspec.DecodeError
    assert error["error"]["type"] == "upstream_error"


def test_an_interim_1xx_answer_is_not_taken_as_the_answer(gateway: Any) -> None:
    """BUG (older than today's relay). HTTP/1.1 lets a server send interim 1xx answers before the final one
    (103 Early Hints; a proxy in front of a worker may add them); a client must skip them. httptools reports
    the 103 as a whole message: ``on_headers_complete`` takes status 103 as the answer's and
    ``on_message_complete`` marks it complete; the real 200 that follows trips ``on_message_begin`` ("more
    than one answer"). The relay forwards a 103 with no final answer after it (and, the error checked first
    in ``pipe``, an error event written as a 1xx's body): the client never gets its 200. Fix: in
    ``on_headers_complete``/``on_message_complete`` of upstream.Response, a 1xx other than 101 is dropped
    (status, headers and ``headed`` reset, ``complete`` not set) and parsing goes on to the final answer."""

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
                     + HEAD + chunked(EVENT, DONE))
        await writer.drain()
        return True

    gw = gateway(script)
    with _connect(gw) as s:
        s.sendall(_request())
        raw = _read_all(s)
    final = raw.find(b"HTTP/1.1 200 ")  # after any interim answers the gateway forwards
    assert final >= 0, raw[:300]  # the bug: only the 103 (then an error event as its body) reaches the client
    body, ended, _ = dechunk(raw[final:].partition(b"\r\n\r\n")[2])
    assert (body, ended) == (EVENT + DONE, True)


def test_a_body_that_came_before_the_relay_piped_past_the_high_water_is_relayed() -> None:
    """BUG. More than ``_HIGH_WATER`` (128 KiB) of body arrives before ``pipe`` starts (one socket read of up
    to 256 KiB with the head does it; so does a loaded loop running the relay's task late): ``data_received``
    pauses the worker's socket (the no-sink branch, ``if self._held > _HIGH_WATER: self._pause()``). ``pipe``
    hands that body to the sink, which takes it (returns True), and only ``chunk()`` and the drain branch ever
    call ``_resume()``: pipe waits in ``_wait_read`` on a socket nobody reads until the gap timeout, and the
    stream is cut as a silent worker (client: an error event; breaker: a failure), though the worker sent
    everything. Fix: in ``pipe``, after the initial write succeeds, ``self._resume()`` (or resume
    unconditionally before the loop unless ``_full``)."""
    big = b"data: " + b"x" * (300 << 10) + b"\n\n"
    events = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n{}")
        writer.write(HEAD + chunked(big, end=b""))
        await writer.drain()
        await events.wait()  # the relay is piping now
        writer.write(chunked(DONE))
        await writer.drain()
        await reader.read()

    async def main() -> list[bytes]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        upstream = Upstream()
        try:
            url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            resp: Response = await upstream.post(url, "/v1/completions", b"{}", {}, 5)
            async with asyncio.timeout(5):  # the relay's task running late: the big event is read meanwhile
                while not resp._paused:
                    await asyncio.sleep(0.005)
            sink = RecordingSink()
            events.set()
            await resp.pipe(sink, 1)  # the bug: TimeoutError after 1 s, DONE never read
            return sink.bodies
        finally:
            upstream.close()
            server.close()

    assert b"".join(asyncio.run(main())) == big + DONE


# -- clients -----------------------------------------------------------------------------------------


@pytest.fixture
def sinks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ``ClientSink`` the relay makes, with the body bytes handed to it (``got``)."""
    made: list[Any] = []

    class Watched(proxy.ClientSink):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.got = 0
            made.append(self)

        def write(self, body: bytes) -> bool:
            self.got += len(body)
            return super().write(body)

    monkeypatch.setattr(proxy, "ClientSink", Watched)
    return made


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 5) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.002)
    assert condition(), what


def test_a_client_that_half_closes_while_behind_is_not_the_workers_failure(
        gateway: Any, sinks: list[Any], caplog: pytest.LogCaptureFixture) -> None:
    """BUG. A client that stops reading (its socket full, bytes waiting in the gateway's transport) and then
    half-closes (shutdown(SHUT_WR): EOF): aiohttp closes the transport on EOF, which stays open to flush, so
    the handler is not cancelled. The next read from the worker finds ``ClientSink.write`` refusing (the
    transport is closing) and ``ClientSink.drain`` raises ConnectionResetError from inside ``resp.pipe``;
    ``Proxy._relay`` catches it with ``except TRANSPORT_ERRORS`` (ConnectionError is one) as the *worker's*
    mid-stream failure: ``self._failed(w)`` (upstream_errors and a breaker failure: enough such clients
    eject a healthy worker) and ``_abort``. The old relay wrote with ``await out.write(chunk)`` outside that
    ``except``, so a client gone while writing was only CLIENT_GONE. Fix: in ``_relay`` catch the client's
    ConnectionResetError (from the sink's drain) before the worker's errors, e.g. have ``ClientSink.drain``
    raise a distinct exception type (or check ``request.transport.is_closing()`` in the handler) and
    re-raise it past ``except TRANSPORT_ERRORS``."""
    event = b"data: " + b"y" * (16 << 10) + b"\n\n"
    behind = threading.Event()

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(HEAD)
        sent = 0
        await _until(lambda: bool(sinks), "the relay piping")
        sink = sinks[0]
        for _ in range(4096):  # until the gateway holds bytes for the client (kernel buffers full)
            writer.write(chunked(event, end=b""))
            await writer.drain()
            sent += len(event)
            await _until(lambda sent=sent: sink.got == sent, "the gateway relaying the event")
            if sink._transport.get_write_buffer_size() > 0:
                break
        behind.set()
        await _until(sink._transport.is_closing, "the gateway seeing the client's EOF")
        writer.write(chunked(event, DONE))
        await writer.drain()
        return True

    gw = gateway(script)
    with caplog.at_level("INFO", logger="cacheon.access"), socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        host, port = gw.url.removeprefix("http://").rsplit(":", 1)
        s.settimeout(10)
        s.connect((host, int(port)))
        s.sendall(_request())
        assert behind.wait(20), "the gateway never held bytes back"
        s.shutdown(socket.SHUT_WR)
        wait_until(lambda: any(r.name == "cacheon.access" for r in caplog.records), "the access line", 10)
    line = next(r for r in caplog.records if r.name == "cacheon.access")
    assert line.fields["status"] == 499  # type: ignore[attr-defined]
    blamed = (failures(gw), gw.gateway.metrics.upstream_errors.labels("w0")._value.get())
    assert blamed == (0, 0)  # the bug: (1, 1.0), the worker counted failed for the client's leaving


# -- what holds (pinned: no other test sends these shapes) ---------------------------------------------


_CL = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(EVENT + DONE)
FRAMINGS = {  # the worker's answer, written in two pieces; whether the gateway may pool its connection
    "chunk-extensions-and-trailers": ((HEAD + b"%x;ext=1;q=\"a b\"\r\n%b\r\n" % (len(EVENT), EVENT),
                                       b"%x\r\n%b\r\n0\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n" % (len(DONE), DONE)),
                                      True),
    "content-length": ((_CL + EVENT, DONE), True),
    "chunked-connection-close": ((HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + chunked(EVENT, end=b""),
                                  chunked(DONE)), False),
    "http10-close-delimited": ((b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + EVENT, DONE), False),
}


@pytest.mark.parametrize("framing", list(FRAMINGS))
def test_every_worker_framing_is_reframed_and_pooled_only_when_the_worker_keeps_it(gateway: Any, framing: str) -> None:
    """Chunk extensions and trailers (dropped: the client gets clean chunks and its own zero chunk), a
    Content-Length body, a chunked answer with ``Connection: close`` (the worker leaves the socket open: the
    gateway must still not reuse it) and an HTTP/1.0 answer ended by the close: each reaches an HTTP/1.1
    client as the same well-framed chunked body, twice; the connection is reused exactly when the worker
    keeps it, and nobody counts a failure. Pins the reads' two pieces arriving while the relay pipes."""
    (first, second), kept = FRAMINGS[framing]

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(first)
        await writer.drain()
        await asyncio.sleep(0.02)  # a second read, while piping (an upper bound of nothing: any order passes)
        writer.write(second)
        await writer.drain()
        return not framing.startswith("http10")

    gw = gateway(script)
    for _ in range(2):
        head, body, ended, after = exchange(gw)
        assert head.split(b" ")[1] == b"200" and b"transfer-encoding: chunked" in head.lower()
        assert b"x-trailer" not in head.lower()
        assert (body, ended, after) == (EVENT + DONE, True, b"")
    assert len(set(gw.worker.connections)) == (1 if kept else 2)  # type: ignore[attr-defined]
    assert failures(gw) == 0


def test_a_client_that_leaves_mid_stream_aborts_the_worker_and_is_recorded_once(
        gateway: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A client that reads the first event and closes: the gateway closes the worker's connection (how the
    engine learns to abort), records exactly one 499 for the request, and counts no failure against the
    worker. Pinned end to end (test_upstream pins only the pool's side)."""
    aborted = threading.Event()

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(HEAD + chunked(EVENT, end=b""))
        for _ in range(500):  # an event every 10 ms until the gateway hangs up (5 s at most)
            await asyncio.sleep(0.01)
            if writer.transport.is_closing():
                aborted.set()
                return False
            writer.write(chunked(EVENT, end=b""))
        return False

    gw = gateway(script)
    with caplog.at_level("INFO", logger="cacheon.access"):
        with _connect(gw) as s:
            s.sendall(_request())
            got = b""
            while EVENT not in got:
                got += s.recv(65536)
        assert aborted.wait(10), "the worker's connection stayed open after the client left"
        wait_until(lambda: any(r.name == "cacheon.access" for r in caplog.records), "the access line", 10)
    lines = [r for r in caplog.records if r.name == "cacheon.access"]
    assert [r.fields["status"] for r in lines] == [499]  # type: ignore[attr-defined]
    assert failures(gw) == 0


def test_a_request_pipelined_behind_a_stream_is_answered_after_its_end(gateway: Any) -> None:
    """An HTTP/1.1 client that sends a streamed request and, before its answer, a second (plain) request on
    the same connection: the stream's bytes, written by the sink straight to the transport, end with the
    zero chunk before the second answer's head starts (nothing of the stream after it, nothing interleaved)."""
    answer = msgspec.json.encode({"choices": [{"text": " ok"}], "usage": {"prompt_tokens": 1}})

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 1:
            writer.write(HEAD + chunked(EVENT, end=b""))
            await writer.drain()
            await asyncio.sleep(0.05)  # the second request is in by now (an upper bound: any order passes)
            writer.write(chunked(EVENT, DONE))
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                         % (len(answer), answer))
        await writer.drain()
        return True

    gw = gateway(script)
    with _connect(gw) as s:
        s.sendall(_request(extra=b"") + _request(b'{"model": "demo", "prompt": "x"}'))
        raw = _read_all(s)
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"200" and b"transfer-encoding: chunked" in head.lower()
    body, ended, after = dechunk(rest)
    assert (body, ended) == (EVENT * 2 + DONE, True)
    second, _, plain = after.partition(b"\r\n\r\n")
    assert second.startswith(b"HTTP/1.1 200 ") and plain == answer


def test_an_http10_keep_alive_client_gets_a_stream_ended_by_the_close(gateway: Any) -> None:
    """BUG (older than today's relay; the old loop did the same). An HTTP/1.0 client asking for keep-alive
    (``ab -k`` does): a relayed stream has no length and 1.0 has no chunking, so the close is the only end
    its body can have. The gateway keeps the connection open instead: the client never sees the answer end
    (it waits for the keep-alive timeout) and, if it sends another request, the next answer's head reads as
    more of this body. Why: aiohttp 3.14's ``StreamResponse._prepare_headers`` stores ``self._keep_alive``
    (from the request: True) before it clears its local ``keep_alive`` for a length-less HTTP/1.0 body, and
    the server keeps the connection by ``resp.keep_alive``; ``Proxy._relay`` leans on that. Fix: in
    ``_relay``, ``if request.version < aiohttp.HttpVersion11: out.force_close()`` before ``prepare``."""

    gw = gateway(_whole_stream)
    with _connect(gw) as s:
        s.settimeout(2)  # an upper bound: the close comes at once (the bug: TimeoutError)
        s.sendall(_request(version=b"1.0", extra=b"Connection: keep-alive\r\n"))
        raw = _read_all(s)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 ") and b"transfer-encoding" not in head.lower()
    assert b"connection: keep-alive" not in head.lower()
    assert body == EVENT + DONE


def test_a_bodyless_answer_to_a_stream_keeps_the_clients_connection_well_framed(gateway: Any) -> None:
    """A worker answering a streamed request 204 (no body: a chunked relay would be wrong on it): the gateway
    asks aiohttp for chunking, which aiohttp drops for a 204, while the sink has ``out.chunked`` true; with no
    body the sink writes nothing and aiohttp no zero chunk, so the next request on the same keep-alive
    connection reads a clean answer. Pins that nothing writes chunk framing on a bodyless status."""

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n" if n == 1 else HEAD + chunked(EVENT, DONE))
        await writer.drain()
        return True

    gw = gateway(script)
    with _connect(gw) as s:
        s.sendall(_request(extra=b""))
        first = b""
        while b"\r\n\r\n" not in first:
            first += s.recv(65536)
        s.sendall(_request())
        raw = first + _read_all(s)
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 204 ") and b"transfer-encoding" not in head.lower()
    assert rest.startswith(b"HTTP/1.1 200 "), rest[:80]  # nothing between the 204's head and the next answer
    body, ended, after = dechunk(rest.partition(b"\r\n\r\n")[2])
    assert (body, ended, after) == (EVENT + DONE, True, b"")


def test_expect_100_continue_gets_its_continue_then_the_stream(gateway: Any) -> None:
    """A client that sends ``Expect: 100-continue`` and holds its body until told: it gets ``100 Continue``
    (the gateway reads the body), then the relayed stream, chunked and complete. The interim 100 is the
    gateway's own, written before the relay's raw writes start."""

    gw = gateway(_whole_stream)
    with _connect(gw) as s:
        s.sendall(_request(b"", extra=b"Connection: close\r\nExpect: 100-continue\r\n").replace(
            b"Content-Length: 0", b"Content-Length: %d" % len(STREAM)))
        interim = b""
        while b"\r\n\r\n" not in interim:
            interim += s.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100 "), interim
        s.sendall(STREAM)
        raw = interim.partition(b"\r\n\r\n")[2] + _read_all(s)
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert dechunk(rest) == (EVENT + DONE, True, b"")


def test_a_client_that_stops_reading_then_vanishes_frees_the_worker_and_the_pool(
        gateway: Any, sinks: list[Any], caplog: pytest.LogCaptureFixture) -> None:
    """A client that stops reading and then closes, the worker's last read both ending its answer and
    filling the client's side (so the relay pauses a connection whose answer is complete): the handler is
    cancelled inside the drain, the paused connection is closed, not pooled (the 56410d4 fix, here end to
    end: with ``reusable()`` ignoring ``_paused`` the next request goes to the paused socket and gets a 503
    after request_timeout_s), the request is one 499 and no failure of the worker's, and the next request is
    answered at once on a new connection."""
    small, big = b"data: " + b"y" * (16 << 10) + b"\n\n", b"data: " + b"z" * (96 << 10) + b"\n\n"
    full = threading.Event()

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        if n > 1:
            writer.write(HEAD + chunked(EVENT, DONE))
            await writer.drain()
            return True
        writer.write(HEAD)
        sent = 0
        await _until(lambda: bool(sinks), "the relay piping")
        sink = sinks[0]
        for _ in range(4096):  # until the gateway holds bytes for the client (its kernel buffers full)
            writer.write(chunked(small, end=b""))
            await writer.drain()
            sent += len(small)
            await _until(lambda sent=sent: sink.got == sent, "the gateway relaying the event")
            if sink._transport.get_write_buffer_size() > 0:
                break
        writer.write(chunked(big, DONE))  # one read: the end, and the client's side past its high water
        await writer.drain()
        await _until(lambda: sink._transport.get_write_buffer_size() > proxy.CLIENT_HIGH_WATER, "full")
        full.set()
        return True

    gw = gateway(script, request_timeout_s=1)
    with caplog.at_level("INFO", logger="cacheon.access"):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            host, port = gw.url.removeprefix("http://").rsplit(":", 1)
            s.settimeout(10)
            s.connect((host, int(port)))
            s.sendall(_request())
            assert full.wait(20), "the relay never held the worker back"
        head, body, ended, _ = exchange(gw)
        assert head.split(b" ")[1] == b"200", head
        assert (body, ended) == (EVENT + DONE, True)
        wait_until(lambda: sum(r.name == "cacheon.access" for r in caplog.records) == 2, "two access lines", 10)
    statuses = [r.fields["status"] for r in caplog.records if r.name == "cacheon.access"]  # type: ignore[attr-defined]
    assert statuses == [499, 200]
    assert failures(gw) == 0
    assert len(set(gw.worker.connections)) == 2  # type: ignore[attr-defined]


# -- what the gateway reads whole, the headers it passes on, clients that stop reading ---------------------


PLAIN = b'{"model": "demo", "prompt": "x"}'


def _answer(stream: bool, head: bytes) -> bytes:
    """A whole answer with ``head``'s extra header lines: a short stream, or a JSON object by its length."""
    if stream:
        return HEAD.replace(b"\r\n\r\n", b"\r\n" + head + b"\r\n\r\n") + chunked(EVENT, DONE)
    body = b'{"choices": [{"text": " ok"}]}'
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%b\r\nContent-Length: %d\r\n\r\n%b"
            % (head, len(body), body))


def _answering(head: bytes, stream: bool | None = None) -> Script:
    """A worker's script: each POST answered ``_answer(stream, head)``, the connection kept; ``stream`` None:
    the first POST's answer a stream, the later ones not (a test sending a stream, then a plain request)."""
    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(_answer(n == 1 if stream is None else stream, head))
        await writer.drain()
        return True
    return script


def _headers(head: bytes) -> list[tuple[bytes, bytes]]:
    """A response head's header lines, in order, names lowered."""
    lines = head.split(b"\r\n")[1:]
    return [(name.strip().lower(), value.strip()) for name, _, value in (line.partition(b":") for line in lines)]


@pytest.mark.parametrize(("stream", "status", "limit"), [(True, 500, 1 << 16), (False, 500, 1 << 16),
                                                         (False, 200, 1 << 20)], ids=["streamed-5xx", "5xx", "2xx"])
def test_a_body_read_whole_is_cut_at_its_bound_and_fails_the_worker(
        gateway: Any, stream: bool, status: int, limit: int) -> None:
    """BUG. What the gateway reads whole from a worker (a streamed answer's 5xx, to answer with if no worker
    is left; a non-streamed answer) was read with no bound: a broken worker sending 64 MiB (or an endless
    body) made the gateway hold all of it, and pass it on. Now a 5xx body past 64 KiB is the worker's failure
    (its breaker counts it, a 503 if no worker is left); a non-streamed answer past ``max_answer_bytes`` is
    what the request asked for: a 502 ``answer_too_large``, not retried (every worker would send as much) and
    not counted (a client could open every breaker with such requests). Either way the worker is cut off
    near the bound and the client gets an OpenAI error naming it, never the body."""
    big, sent = 64 << 20, [0]

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b'7\r\n{"x": "\r\n' % status)
        piece = b"a" * (64 << 10)
        while sent[0] < big:
            writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
            await writer.drain()  # raises once the gateway hangs up
            sent[0] += len(piece)
        writer.write(chunked(b'"}'))
        await writer.drain()
        return False

    gw = gateway(script, max_answer_bytes=1 << 20)
    head, body, _, _ = exchange(gw, _request(STREAM if stream else PLAIN))
    assert head.split(b" ")[1] == (b"503" if status >= 500 else b"502"), head  # the bug: the 64 MiB body
    error = msgspec.json.decode(body)["error"]
    assert f"larger than the gateway takes ({limit} bytes)" in error["message"]
    assert failures(gw) == (1 if status >= 500 else 0)
    assert sent[0] < 16 << 20  # cut off near the bound (loopback's socket buffers beside), not read to the end


@pytest.mark.parametrize("where", ["head", "5xx-body"])
def test_a_worker_that_trickles_what_is_read_whole_is_cut_at_the_timeout(gateway: Any, where: str) -> None:
    """Found attacking the bound above. A streamed answer's head, and a 5xx's body, are read whole; each wait
    on the worker timed out only after ``request_timeout_s`` with nothing new, so a worker sending a byte
    every 0.1 s held the client for as long as it had bytes (a head may be 64 KiB: ~2 hours). Both are now
    bounded in all by ``request_timeout_s`` (as aiohttp's total is for a non-streamed call): a 503."""
    answer = b"HTTP/1.1 500 X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        if where == "head":
            trickled = answer
        else:
            writer.write(answer)
            trickled = chunked(b"x" * 100)
        for byte in trickled:  # ~8-11 s in all, well past the timeout
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.1)
        return False

    gw = gateway(script, request_timeout_s=1)
    started = time.monotonic()
    head, body, _, _ = exchange(gw)
    assert time.monotonic() - started < 2.5  # the bug: ~8 s (head), ~11 s (the 5xx's body)
    assert head.split(b" ")[1] == b"503", head
    assert "no answer within 1 s" in msgspec.json.decode(body)["error"]["message"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_a_workers_repeated_headers_reach_the_client_as_they_came(gateway: Any, stream: bool) -> None:
    """BUG. ``_passed`` made a dict of the worker's headers: of several Set-Cookie, Vary or Link only the last
    reached the client. They pass on in order now, each value as it came (UTF-8 included: the stream's client
    decoded it as Latin-1, and aiohttp wrote it back as UTF-8, doubling it), and the gateway's own headers
    still replace any the worker sent by the same name."""
    sent = (b"Set-Cookie: a=1\r\nVary: accept\r\nSet-Cookie: b=2\r\nLink: </a>; rel=preload\r\nVary: origin\r\n"
            b"Set-Cookie: c=3\r\nLink: </b>; rel=preload\r\nX-Name: caf\xc3\xa9\r\n"
            b"x-cacheon-worker: forged\r\nX-Cacheon-Worker: forged-again\r\nx-request-id: forged")

    gw = gateway(_answering(sent, stream))
    head, _, _, _ = exchange(gw, _request(STREAM if stream else PLAIN))
    got = _headers(head)
    for name in (b"set-cookie", b"vary", b"link", b"x-name"):
        assert [v for k, v in got if k == name] == [v for k, v in _headers(b"\r\n" + sent) if k == name], name
    assert [v for k, v in got if k == b"x-cacheon-worker"] == [gw.worker.url.encode()]  # type: ignore[attr-defined]
    assert [v for k, v in got if k == b"x-request-id"] != [b"forged"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_headers_a_workers_connection_header_names_are_not_passed_on(gateway: Any, stream: bool) -> None:
    """BUG. RFC 9110 7.6.1: a header named in ``Connection`` is for that hop only, and a proxy removes it; the
    gateway removed only its fixed hop-by-hop set. Now every name in every Connection header goes too (one
    that names a header the gateway sets removes only the worker's), as do the standard hop-by-hop headers."""
    sent = (b"Connection: keep-alive, X-Private , x-cacheon-route\r\nConnection: X-Second\r\nX-Private: secret\r\n"
            b"X-Second: secret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nTrailer: X-T\r\nProxy-Connection: x\r\n"
            b"x-cacheon-route: forged\r\nX-Kept: yes")

    gw = gateway(_answering(sent, stream))
    head, _, ended, _ = exchange(gw, _request(STREAM if stream else PLAIN))
    names = [k for k, _ in _headers(head)]
    assert not {b"x-private", b"x-second", b"keep-alive", b"te", b"trailer", b"proxy-connection"} & set(names), head
    assert [v for k, v in _headers(head) if k == b"x-cacheon-route"] == [b"rr:round_robin"]
    assert b"x-kept" in names and ended


def test_no_header_the_client_sends_reaches_the_worker_so_no_hop_by_hop_one_does(gateway: Any) -> None:
    """Pinned (it holds: the gateway builds a worker request's headers itself, keeping only a sane
    ``x-request-id`` and its own hop mark, and asking for no compression), because RFC 9110 7.6.1 applies to
    requests too: what a client names in ``Connection``, and the hop-by-hop headers, must not reach the worker
    on either client."""
    nominated = (b"Connection: close, X-Private, x-request-id\r\nX-Private: secret\r\nKeep-Alive: timeout=5\r\n"
                 b"TE: trailers\r\nProxy-Connection: keep-alive\r\nCookie: a=1\r\nx-request-id: r1\r\n")
    gw = gateway(_answering(b"X-Kept: yes"))
    for body in (STREAM, PLAIN):
        exchange(gw, _request(body, extra=nominated))
    for head in gw.worker.heads:  # type: ignore[attr-defined]
        names = {k for k, _ in _headers(head)}
        assert not {b"x-private", b"keep-alive", b"te", b"proxy-connection", b"cookie"} & names, head
        assert b"x-request-id: r1" in head  # the gateway's own use of it (the request's id), as the gateway's header
        assert (b"accept-encoding", b"identity") in _headers(head)  # it relays and parses bodies as they come


def _client(gw: InProcessGateway) -> socket.socket:
    """A client socket with a small receive buffer (so its side fills soon), connected, its request sent."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    s.settimeout(10)
    s.connect((host, int(port)))
    s.sendall(_request())
    return s


def _access(caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    wait_until(lambda: any(r.name == "cacheon.access" for r in caplog.records), "the access line", 10)
    fields: dict[str, Any] = next(r for r in caplog.records if r.name == "cacheon.access").fields  # type: ignore[attr-defined]
    return fields


@pytest.mark.parametrize("reads", [False, True], ids=["never-reads", "a-byte-at-a-time"])
def test_a_client_that_stops_reading_is_dropped_and_frees_its_worker(
        gateway: Any, sinks: list[Any], caplog: pytest.LogCaptureFixture, reads: bool) -> None:
    """BUG. A streaming client that never reads (or takes a byte every 0.1 s) while its worker floods: the
    relay pauses the worker and waits in ``ClientSink.drain`` with no bound, holding the worker's connection
    (and its slot on the engine) for as long as the client keeps its socket open. Now a client whose side
    stays full for ``client_write_timeout_s`` is dropped: its connection aborted (closed at once, not left
    to flush to a client that may never read), the worker's closed (the engine aborts), a 499 that is the
    client's, never a failure of the worker's."""
    event = b"data: " + b"f" * (16 << 10) + b"\n\n"
    aborted = threading.Event()

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(HEAD)
        try:
            for _ in range(1 << 16):  # until the gateway hangs up (1 GiB: never reached)
                writer.write(chunked(event, end=b""))
                await writer.drain()  # waits while the gateway holds the worker back
        except ConnectionError:
            aborted.set()
        return False

    gw = gateway(script, client_write_timeout_s=1)
    with caplog.at_level("INFO", logger="cacheon.access"), _client(gw) as s:
        got = []
        while reads and not aborted.is_set():
            got.append(s.recv(1))
            time.sleep(0.1)
        assert aborted.wait(10), "the worker's connection stayed open for a client that does not read"
        socket_of = sinks[0]._transport.get_extra_info("socket")
        wait_until(lambda: socket_of.fileno() == -1, "the gateway's side of the client's connection closed", 5)
        raw = b"".join(got) + _read_all(s)  # the gateway closed the client's connection: the read ends
    body, ended, _ = dechunk(raw.partition(b"\r\n\r\n")[2])
    assert body.startswith(event) and not ended
    fields = _access(caplog)
    assert fields["status"] == 499 and fields["error"] == "client stopped reading: its side stayed full for 1 s"
    assert (failures(gw), gw.gateway.metrics.upstream_errors.labels("w0")._value.get()) == (0, 0)
    assert gw.gateway.fleet.workers["w0"].in_flight == 0


def test_a_client_that_stops_reading_at_the_very_end_is_dropped_too(
        gateway: Any, sinks: list[Any], caplog: pytest.LogCaptureFixture) -> None:
    """Found attacking the bound above. The relay bounds its waits on the client inside ``pipe``; after a
    complete answer, ``out.write_eof()`` writes the last chunk and waits (aiohttp's drain) with no bound
    when that chunk is what fills the client's side: a client that stops reading just then held the request
    for ever (no access line, the worker's in-flight count never back). The worker here sends its last
    event so the client's side ends 2 bytes under the high water; the zero chunk tips it over."""
    event = b"data: " + b"g" * (4 << 10) + b"\n\n"
    high = 1 << 16  # the client transport's high water (asyncio's default, and CLIENT_HIGH_WATER)

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(HEAD)
        await _until(lambda: bool(sinks), "the relay piping")
        sink, sent = sinks[0], 0
        for _ in range(4096):  # until the gateway holds bytes for the client, close under the high water
            writer.write(chunked(event, end=b""))
            await writer.drain()
            sent += len(event)
            await _until(lambda sent=sent: sink.got == sent, "the gateway relaying the event")
            held = sink._transport.get_write_buffer_size()
            if held and high - held < 2 * len(event):
                break
        room = high - 2 - held - len(b"\r\n\r\n")  # what the last chunk's framed body may take
        last = b"data: " + b"h" * (room - len(b"%x" % room) - len(b"data: \n\n" + DONE)) + b"\n\n" + DONE
        assert len(b"%x\r\n%b\r\n" % (len(last), last)) == high - 2 - held
        writer.write(chunked(last))
        await writer.drain()
        return True

    gw = gateway(script, client_write_timeout_s=1)
    with caplog.at_level("INFO", logger="cacheon.access"), _client(gw):
        fields = _access(caplog)  # the bug: no access line, ever
    assert fields["status"] == 499 and fields["error"].startswith("client stopped reading")
    assert failures(gw) == 0 and gw.gateway.fleet.workers["w0"].in_flight == 0


def test_a_client_that_does_not_read_a_whole_answer_is_dropped_too(gateway: Any, caplog: pytest.LogCaptureFixture) -> None:
    """BUG, left by the round above. A non-streamed answer was written by aiohttp after the handler returned,
    waiting on the client with no bound: one that never read held the answer (up to ``max_answer_bytes``) and
    its connection for as long as it liked, logged as a 200 before a byte had reached it. Now the gateway
    writes the answer itself within ``client_write_timeout_s``: past it the client is dropped, a 499."""
    body = b'{"choices": [{"text": "' + b"x" * (8 << 20) + b'"}]}'

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                     % (len(body), body))
        await writer.drain()
        return True

    gw = gateway(script, client_write_timeout_s=1)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    s.settimeout(10)
    with caplog.at_level("INFO", logger="cacheon.access"), s:
        s.connect((host, int(port)))
        s.sendall(_request(PLAIN))
        fields = _access(caplog)
        got = _read_all(s)  # the gateway aborted the connection: the read ends (a timeout here: it never did)
    assert fields["status"] == 499 and fields["error"] == "client stopped reading: its side stayed full for 1 s"
    assert len(got) < len(body) and failures(gw) == 0


def test_a_client_slower_than_the_gap_timeout_does_not_make_a_silent_worker(
        gateway: Any, sinks: list[Any]) -> None:
    """BUG, found tidying the two waits into one. A client that stops reading longer than
    ``request_timeout_s`` (allowed: only ``client_write_timeout_s`` bounds it), the worker's last read
    being what filled the client's side, the worker quiet until the client reads again: reading resumed
    with the gap counted from the last read before the pause, so the timer ran out at once and the stream
    was cut as a silent worker (an error event, a breaker failure). A worker held back was not silent: the gap
    counts from when reading resumes."""
    small, big = b"data: " + b"y" * (16 << 10) + b"\n\n", b"data: " + b"z" * (96 << 10) + b"\n\n"
    full, reading = threading.Event(), threading.Event()

    async def script(writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(HEAD)
        await _until(lambda: bool(sinks), "the relay piping")
        sink, sent = sinks[0], 0
        for _ in range(4096):  # until the gateway holds bytes for the client (its kernel buffers full)
            writer.write(chunked(small, end=b""))
            await writer.drain()
            sent += len(small)
            await _until(lambda sent=sent: sink.got == sent, "the gateway relaying the event")
            if sink._transport.get_write_buffer_size() > 0:
                break
        writer.write(chunked(big, end=b""))  # the last read for a while: past the client's high water
        await writer.drain()
        await _until(lambda: sink._transport.get_write_buffer_size() > proxy.CLIENT_HIGH_WATER, "full")
        full.set()
        await _until(reading.is_set, "the client reading again", 10)
        await asyncio.sleep(0.3)  # quiet, well inside the 1 s gap once reading resumed
        writer.write(chunked(DONE))
        await writer.drain()
        return True

    gw = gateway(script, request_timeout_s=1)
    with _client(gw) as s:
        assert full.wait(20), "the relay never held the worker back"
        time.sleep(1.5)  # longer than the gap timeout
        reading.set()
        raw = _read_all(s)
    body, ended, _ = dechunk(raw.partition(b"\r\n\r\n")[2])
    assert body.endswith(DONE) and ended, body[-200:]  # the bug: an error event, the stream cut
    assert failures(gw) == 0
