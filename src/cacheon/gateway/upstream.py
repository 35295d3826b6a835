"""The gateway's upstream client for streamed answers: HTTP/1.1 on ``asyncio.Protocol``, parsed by httptools.

aiohttp's client costs a per-chunk parse in Python, a ``StreamReader`` feed and a task wake-up for
every event of a stream. Here httptools (C) takes the chunked framing off inside ``data_received``,
and ``Response.pipe`` hands what each socket read carried to the client's side (a ``Sink``) from
inside that callback: the relaying task wakes only at the answer's end, on an error, on the gap
timeout or when the client's side is full, never per event (benchmarks/README.md, issue 22). Timeouts:
the head, and a body read whole, within ``timeout_s`` in all (a worker that trickles them is still
bounded); a piped body by the gap since the worker's last read. One pool of keep-alive
connections per worker; a connection goes back to it only after a complete answer the worker lets
it keep, so a request the relay leaves unfinished is aborted on the worker by the close. Idle
connections are closed by the worker's own keep-alive timeout (seen here as the connection lost).
Non-streamed answers come through here too (read whole, bounded): aiohttp's pool queued bytes a worker wrote
on an idle connection as the answer to the next request on it, another client's. Control calls stay on
aiohttp (``http.py``).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools

_HIGH_WATER = 1 << 17  # decoded bytes held before the worker's socket is paused (a slow client)
MAX_HEAD = 1 << 16  # bytes of status line and headers a worker may send (aiohttp's client allowed 8 KiB a line)
_UNSAFE = frozenset("\r\n\0")  # in a header a request carries: would end the header (request splitting)


class UpstreamError(ConnectionError):
    """The worker's connection failed, closed early, or carried malformed HTTP: a transport error."""


class TooLarge(UpstreamError):
    """A body read whole went past its bound (``whole``)."""


async def whole(read: Callable[[], Awaitable[bytes]], limit: int) -> bytes:
    """A body read whole by ``read`` (the next part, ``b""`` at the end), never more than ``limit`` bytes
    of it: past that the worker has failed (UpstreamError), so a broken one cannot make the gateway hold
    an unbounded body."""
    got, size = [], 0
    while part := await read():
        size += len(part)
        if size > limit:
            raise TooLarge(f"the worker's answer is larger than the gateway takes ({limit} bytes)")
        got.append(part)
    return b"".join(got)


class Sink(Protocol):
    """Where ``Response.pipe`` puts a body as it is read: the client's side of a relayed stream."""

    def write(self, body: bytes) -> bool:
        """Take ``body`` (called inside the read); False when this side is full or gone: the worker's
        socket is paused until ``drain`` returns."""
        ...

    async def drain(self) -> None:
        """Until this side takes more; raises when it is gone (never a transport error of the worker's)."""
        ...


class Response(asyncio.Protocol):
    """One connection to a worker and the answer in progress on it: head first, then body by reads."""

    def __init__(self, key: str) -> None:
        self.key = key  # the worker's base URL: the pool it goes back to
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Sink | None = None  # set while ``pipe`` runs
        self._read_at = 0.0  # loop time the worker was last heard from or waited on: gap timeouts count from it
        self._timer: asyncio.TimerHandle | None = None
        self.reset()

    def reset(self) -> None:
        """Ready for the next answer on this connection."""
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.received = False  # any byte of this answer: a reused connection that got none may be stale
        self.idle = False  # pooled, no request on it: bytes arriving now answer nothing
        self.complete = self.headed = False
        self._head_bytes = 0
        self._framed = self._paused = self._keep = self._full = self._interim = False
        self._body: list[bytes] = []
        self._held = 0
        self._error: Exception | None = None

    # -- asyncio.Protocol and the parser's callbacks ---------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one, though not by class

    def data_received(self, data: bytes) -> None:
        if self.idle:  # a worker that answers before it is asked must not answer the next request with it
            self.lost = True
            self.close()
            return
        self.received = True
        self._read_at = asyncio.get_running_loop().time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:  # a callback's own refusal arrives wrapped: say it, not the wrapper
            ours = exc.__context__
            self._error = (ours if isinstance(ours, UpstreamError)
                           else UpstreamError(f"malformed HTTP from the worker: {exc}"))
            self.close()
        if not self.headed:  # httptools buffers a header line however long: the head is bounded here
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD and self._error is None:
                self._error = UpstreamError(f"the worker's response head is larger than {MAX_HEAD} bytes")
                self.close()
        sink = self._sink
        if sink is not None:
            if self._body and not sink.write(self._take()):
                self._full = True  # the client's side: pipe drains it, then reading resumes
                self._pause()
            if self._full or self.complete or self._error is not None:
                self._wake()
            return
        if self._held > _HIGH_WATER:
            self._pause()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.headed and not self._framed:  # no length, not chunked: the body ends with the connection
            self.complete = True
        elif not self.complete and self._error is None:
            why = f": {exc}" if exc else ""
            self._error = UpstreamError(f"the worker closed the connection before its answer ended{why}")
        self._wake()

    def on_message_begin(self) -> None:
        if self.complete:  # a second answer in the same reads as this one's end: nothing asked for it
            raise UpstreamError("the worker sent more than one answer to one request")

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered in (b"content-length", b"transfer-encoding"):
            self._framed = True
        # A value decoded as aiohttp's client decodes it: UTF-8 passes on as it came, on either path.
        self.headers.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # an interim answer (103 Early Hints): the real one follows
            self.headers, self._framed, self._interim = [], False, True
            return
        self.status = status
        self.headed = True

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._held += len(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.complete = True
        self._keep = self._parser.should_keep_alive()  # llhttp forgets it once the message is over

    # -- the relay's side --------------------------------------------------------------------

    def send(self, request: Iterable[bytes]) -> None:
        """The request written; the worker's time to answer counts from here."""
        assert self.transport is not None
        self.transport.writelines(request)
        self._read_at = asyncio.get_running_loop().time()

    async def head(self, timeout_s: float) -> None:
        """Until the status line and headers are in; TimeoutError when they are not all in within
        ``timeout_s``, however the worker trickles them."""
        async with asyncio.timeout(timeout_s):
            while not self.headed:
                if self._error is not None:
                    raise self._error
                await self._wait(timeout_s)

    async def chunk(self, timeout_s: float) -> bytes:
        """The body bytes every read since the last call carried (decoded); ``b""`` at the answer's end.
        TimeoutError after ``timeout_s`` with nothing new: the gap between chunks, not the whole."""
        while not self._body:
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait(timeout_s)
        body = self._take()
        self._resume()
        return body

    async def pipe(self, sink: Sink, timeout_s: float) -> None:
        """Every body byte to ``sink`` as it is read, until the answer's end. TimeoutError after
        ``timeout_s`` without a read (the gap, as ``chunk``); the worker's error before the end raises
        it, after the bytes before it; what ``sink.drain`` raises when the client is gone."""
        self._sink = sink
        try:
            if self._body and not sink.write(self._take()):  # what came with the head
                self._full = True
            else:  # reading may have paused before the relay piped (past the high water with the head)
                self._resume()
            while True:
                if self._full:
                    await sink.drain()
                    self._full = False
                    self._resume()
                elif self.complete:  # bytes after the end (an error now) do not undo a whole answer
                    return
                elif self._error is not None:
                    raise self._error
                else:
                    await self._wait(timeout_s)
        finally:
            self._sink = None

    async def read(self, timeout_s: float, limit: int) -> bytes:
        """The rest of the body, whole: within ``timeout_s`` in all, and no more than ``limit`` bytes
        (``whole``)."""
        async with asyncio.timeout(timeout_s):
            return await whole(lambda: self.chunk(timeout_s), limit)

    def reusable(self) -> bool:
        """Its answer read to the end and relayed (not paused for a client that then left), the connection
        open, and the worker keeps it alive."""
        return self._keep and not self.lost and not self._body and not self._paused and self._error is None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _take(self) -> bytes:
        body, self._body, self._held = self._body, [], 0
        return body[0] if len(body) == 1 else b"".join(body)

    def _pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        """Reading on again; a worker held back meanwhile was not silent: its gap counts from now."""
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
            self._read_at = asyncio.get_running_loop().time()

    async def _wait(self, timeout_s: float) -> None:
        """Until woken, or TimeoutError once ``timeout_s`` passed since ``_read_at``: one timer for
        the whole wait, moved on as reads come (a timer per read would be a timer per event)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._timer = loop.call_at(self._read_at + timeout_s, self._gap, waiter, timeout_s)
        try:
            await waiter
        finally:
            if self._timer is not None:
                self._timer.cancel()
            self._waiter = None

    def _gap(self, waiter: asyncio.Future[None], timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        due = self._read_at + timeout_s
        if loop.time() < due:
            self._timer = loop.call_at(due, self._gap, waiter, timeout_s)
        elif not waiter.done():
            waiter.set_exception(TimeoutError())

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Upstream:
    """Keep-alive connections per worker (base URL), most recently used first."""

    def __init__(self) -> None:
        self._idle: dict[str, list[Response]] = {}
        self._targets: dict[str, tuple[str, int, bytes, ssl.SSLContext | None]] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(self, base: str, path: str, body: bytes, headers: Mapping[str, str],
                   timeout_s: float) -> Response:
        """The worker's answer with its head in: the request written in one go on a pooled connection,
        or on a new one when the pooled one turns out closed before a byte of the answer came."""
        host, port, netloc, tls = self._target(base)
        if any(not _UNSAFE.isdisjoint(k) or not _UNSAFE.isdisjoint(v) for k, v in headers.items()):
            raise ValueError("a header to the worker has a line break or NUL in it")  # aiohttp refused CR, LF too
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        head = b"".join((b"POST ", path.encode(), b" HTTP/1.1\r\nHost: ", netloc, b"\r\nContent-Length: ",
                         str(len(body)).encode(), b"\r\n", lines.encode(), b"\r\n"))
        idle = self._idle.get(base)
        while idle:
            resp = idle.pop()
            if resp.lost:
                continue
            resp.idle = False
            try:
                return await self._ask(resp, (head, body), timeout_s)
            except UpstreamError:
                if resp.received:  # the worker answered something broken: not a stale connection
                    raise
        resp = Response(base)
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.get_running_loop().create_connection(
                    lambda: resp, host, port, ssl=tls, server_hostname=host if tls else None)
        except TimeoutError:  # an OSError too: it stays the timeout it is
            raise
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {netloc.decode()}: {exc}") from None
        return await self._ask(resp, (head, body), timeout_s)

    @staticmethod
    async def _ask(resp: Response, request: tuple[bytes, bytes], timeout_s: float) -> Response:
        """``request`` written on ``resp``'s connection, and its answer's head awaited; closed if that fails."""
        resp.send(request)
        try:
            await resp.head(timeout_s)
        except BaseException:
            resp.close()
            raise
        return resp

    def done(self, resp: Response) -> None:
        """Back to the pool after a complete answer on a connection the worker keeps open; closed otherwise
        (an unfinished request is aborted on the worker that way)."""
        if resp.reusable():
            resp.reset()
            resp.idle = True
            self._idle.setdefault(resp.key, []).append(resp)
        else:
            resp.close()

    def close(self) -> None:
        for idle in self._idle.values():
            for resp in idle:
                resp.close()
        self._idle.clear()

    def _target(self, base: str) -> tuple[str, int, bytes, ssl.SSLContext | None]:
        target = self._targets.get(base)
        if target is None:
            parts = urlsplit(base)  # a validated worker URL: scheme, host and optional port only
            tls = None
            if parts.scheme == "https":
                tls = self._tls = self._tls or ssl.create_default_context()
            port = parts.port or (443 if tls else 80)
            target = self._targets[base] = (parts.hostname or "", port, parts.netloc.encode(), tls)
        return target
