"""Byte relays between TCP on 127.0.0.1 and Unix sockets: how a confined server's ports reach the host.

The confined server has a network namespace of its own (loopback only). Each published port is
two relays meeting at a Unix socket the host makes in a directory only it sees: the sandbox
inherits the listening descriptor, and ``unix_to_tcp`` accepts on it and dials the server's
``127.0.0.1:<port>``; on the host ``tcp_to_unix`` listens on ``127.0.0.1:<port>`` and dials that
socket's path. The sandbox cannot rename, replace or link over that path (a writable socket
directory would let it point the host's clients at any socket of the host). Nothing else crosses:
a listening socket only accepts, and the inside has no route out. The relay is protocol-blind,
so HTTP and ZMQ (the KV publisher, its replay endpoint) pass alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

CHUNK = 1 << 16


class SocketDirectory:
    """The host's socket directory, named through a descriptor it holds open.

    A Unix socket's path is bounded (108 bytes with its NUL); a work directory can be longer (pytest's
    are). ``/proc/self/fd/<n>/<port>.sock`` is short whatever the directory's real path, and resolves
    only in this process, for as long as the descriptor stays open.
    """

    def __init__(self, directory: Path) -> None:
        self._fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def path(self, port: int) -> Path:
        return Path(f"/proc/self/fd/{self._fd}/{port}.sock")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    dial: Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]],
) -> None:
    """Join one accepted connection to a freshly dialled one until both directions end."""
    try:
        far_reader, far_writer = await dial()
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(_pump(reader, far_writer), _pump(far_reader, writer))
    finally:
        for w in (writer, far_writer):
            w.close()
            with contextlib.suppress(ConnectionError, OSError):
                await w.wait_closed()


async def tcp_to_unix(port: int, sock: Path) -> asyncio.Server:
    """The host side: 127.0.0.1:``port`` → ``sock``."""
    return await asyncio.start_server(
        lambda r, w: _splice(r, w, lambda: asyncio.open_unix_connection(str(sock))), "127.0.0.1", port
    )


async def unix_to_tcp(listening: socket.socket, port: int) -> asyncio.Server:
    """The sandbox side: a listening Unix socket the host made and handed in → 127.0.0.1:``port``."""
    return await asyncio.start_unix_server(
        lambda r, w: _splice(r, w, lambda: asyncio.open_connection("127.0.0.1", port)), sock=listening
    )


def listen_unix(path: Path) -> socket.socket:
    """A listening Unix socket at ``path`` (the host side makes it; the sandbox gets only the descriptor)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(128)
    return sock


class RelayThread:
    """An event loop on a daemon thread holding the relays ``make`` starts; ``close()`` ends them."""

    def __init__(self, make: Callable[[], Iterable[Awaitable[asyncio.Server]]]) -> None:
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.Server] = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="cacheon-relay", daemon=True)
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(make), self._loop)
        future.result(timeout=30)

    async def _start(self, make: Callable[[], Iterable[Awaitable[asyncio.Server]]]) -> None:
        for pending in make():
            self._servers.append(await pending)

    def close(self) -> None:
        async def stop() -> None:
            for server in self._servers:
                server.close()
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:  # connections still open: end them here, not at interpreter exit
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
