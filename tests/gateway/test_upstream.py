"""The streams' upstream client (``cacheon.gateway.upstream``) against workers that misbehave at the byte level,
each a real TCP server on loopback writing exactly the bytes the case needs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from cacheon.gateway.upstream import MAX_HEAD, Upstream, UpstreamError

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunked(*events: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


async def _request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return head + await reader.readexactly(length)


def _run(serve: Serve, client: Callable[[Upstream, str], Awaitable[object]]) -> object:
    async def main() -> object:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        upstream = Upstream()
        try:
            return await client(upstream, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        finally:
            upstream.close()
            server.close()

    return asyncio.run(main())


def test_a_head_that_never_ends_is_refused_at_the_bound() -> None:
    """One header line growing without end (httptools buffers it whole): refused once the head passes
    MAX_HEAD, not held in memory for as long as the worker writes."""
    sent = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        with pytest.raises(ConnectionError):
            while True:
                writer.write(b"a" * 4096)
                sent += 4096
                await writer.drain()

    async def client(upstream: Upstream, url: str) -> object:
        with pytest.raises(UpstreamError, match="head is larger than"):  # not a hang: fails in 20 s at worst
            await asyncio.wait_for(upstream.post(url, "/v1/completions", b"{}", {}, 5), 20)
        return None

    _run(serve, client)
    assert MAX_HEAD <= sent < 64 * MAX_HEAD  # the worker was cut off near the bound (socket buffers beside)


@pytest.mark.parametrize("later", [False, True], ids=["same-read", "while-idle"])
def test_bytes_a_worker_sends_unasked_answer_nothing(later: bool) -> None:
    """A worker that writes a second answer before the second request (in the same reads as the first, or
    while the connection is idle in the pool) must not have it taken as the answer to the next request
    (another client's): the connection is dropped, a new one carries the request."""
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        mine = connections
        while True:
            try:
                await _request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(OK + _chunked(b"data: answer %d\n\n" % mine))
            if later:
                await writer.drain()
                await asyncio.sleep(0.05)
            if mine == 1:
                writer.write(OK + _chunked(b"data: forged\n\n"))  # unasked
            await writer.drain()

    async def client(upstream: Upstream, url: str) -> object:
        answers = []
        for _ in range(2):
            resp = await upstream.post(url, "/v1/completions", b"{}", {}, 5)
            answers.append(await resp.read(5, 1 << 16))
            upstream.done(resp)
            await asyncio.sleep(0.1)  # the forged answer arrives while the connection is idle
        return answers

    assert _run(serve, client) == [b"data: answer 1\n\n", b"data: answer 2\n\n"]
    assert connections == 2


@pytest.mark.parametrize("value", ["a\r\nX-Injected: 1", "a\nb", "a\0b"])
def test_a_header_that_would_split_the_request_is_never_written(value: str) -> None:
    received: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read(65536))

    async def client(upstream: Upstream, url: str) -> object:
        with pytest.raises(ValueError, match="line break or NUL"):
            await upstream.post(url, "/v1/completions", b"{}", {"x-cacheon-hop": value}, 5)
        await asyncio.sleep(0.1)
        return None

    _run(serve, client)
    assert received in ([], [b""])  # no connection made, or nothing written on it


def test_a_kept_connection_carries_the_next_stream_and_the_body_arrives_decoded() -> None:
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                request = await _request(reader)
            except asyncio.IncompleteReadError:
                return
            assert b"\r\nx-request-id: r1\r\n" in request and request.endswith(b"\r\n\r\n{}")
            writer.write(OK + _chunked(b"data: 1\n\n", b"data: [DONE]\n\n"))
            await writer.drain()

    async def client(upstream: Upstream, url: str) -> object:
        bodies = []
        for _ in range(3):
            resp = await upstream.post(url, "/v1/completions", b"{}", {"x-request-id": "r1"}, 5)
            bodies.append((resp.status, await resp.read(5, 1 << 16)))
            upstream.done(resp)
        return bodies

    assert _run(serve, client) == [(200, b"data: 1\n\ndata: [DONE]\n\n")] * 3
    assert connections == 1


class RecordingSink:
    """A client side that keeps what ``pipe`` hands it: with ``room``, never full (a drain is a test error);
    without, full at once and then gone (``pipe`` pauses the worker's socket and the drain raises)."""

    def __init__(self, room: bool = True) -> None:
        self.room = room
        self.bodies: list[bytes] = []

    def write(self, body: bytes) -> bool:
        self.bodies.append(body)
        return self.room

    async def drain(self) -> None:
        if self.room:
            raise AssertionError("never full")
        raise ConnectionResetError("the client closed the connection")


@pytest.mark.parametrize("client_leaves", [False, True])
def test_a_piped_answer_reaches_its_sink_and_only_a_clean_end_pools_the_connection(client_leaves: bool) -> None:
    """The body arrives after the head, while the relay pipes it: a client side found full pauses the worker's
    socket; when it is then gone the answer is complete but its connection paused, and it must not go back to
    the pool (the next answer on it would never be read). A clean end pools it."""
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                await _request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(OK)
            await writer.drain()
            await asyncio.sleep(0.05)  # the relay is piping by now
            writer.write(_chunked(b"data: 1\n\n", b"data: [DONE]\n\n"))
            await writer.drain()

    async def client(upstream: Upstream, url: str) -> object:
        sinks = []
        for _ in range(2):
            resp = await upstream.post(url, "/v1/completions", b"{}", {}, 5)
            sink = RecordingSink(room=not client_leaves)
            sinks.append(sink)
            try:
                await resp.pipe(sink, 5)
            except ConnectionResetError:
                assert client_leaves
            upstream.done(resp)
        return [b"".join(s.bodies) for s in sinks]

    assert _run(serve, client) == [b"data: 1\n\ndata: [DONE]\n\n"] * 2
    assert connections == (2 if client_leaves else 1)


def test_a_connection_idle_past_the_timeout_still_carries_the_next_answer() -> None:
    """The waits time out by the gap since ``_read_at``: the request's write must start it, or an answer would
    time out at once on a new connection (no read yet) and on one pooled for longer than the timeout (its last
    read long past)."""
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                await _request(reader)
            except asyncio.IncompleteReadError:
                return
            await asyncio.sleep(0.1)  # the answer is not in the request's own reads
            writer.write(OK + _chunked(b"data: 1\n\n"))
            await writer.drain()

    async def client(upstream: Upstream, url: str) -> object:
        bodies = []
        for _ in range(2):
            resp = await upstream.post(url, "/v1/completions", b"{}", {}, 0.5)
            bodies.append(await resp.read(0.5, 1 << 16))
            upstream.done(resp)
            await asyncio.sleep(0.7)  # idle in the pool past the timeout
        return bodies

    assert _run(serve, client) == [b"data: 1\n\n"] * 2
    assert connections == 1
