"""One NATS connection with JetStream, shared by every fleet module (relay, consumer, load sharing).

The client reconnects on its own, forever, to any of the configured servers; what a caller needs
is whether the plane is reachable now (``connected``) and since when it has not been
(``down_since``), so it can say so instead of blocking on a dead server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext

log = logging.getLogger("cacheon.fleet")

RECONNECT_WAIT_S = 0.5
CONNECT_TIMEOUT_S = 2


@dataclass
class Plane:
    """A connected client and its JetStream context; ``down_since`` is None while connected."""

    nc: Client
    js: JetStreamContext
    down_since: float | None = None
    reconnects: int = 0
    disconnects: int = 0
    on_reconnected: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # run after each reconnect

    @property
    def connected(self) -> bool:
        return self.nc.is_connected

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.close()


def servers(url: str) -> list[str]:
    """``EventPlaneConfig.url``'s comma-separated servers."""
    return [part.strip() for part in url.split(",") if part.strip()]


async def connect(url: str, name: str, timeout_s: float = 5.0) -> Plane:
    """Connect, with reconnects forever after that; TimeoutError when no server answers within ``timeout_s``
    (the client would otherwise retry its first connect forever too, and a caller could not stop it)."""
    holder: list[Plane] = []

    async def disconnected() -> None:
        if holder:
            holder[0].disconnects += 1
            holder[0].down_since = holder[0].down_since or time.time()
        log.warning("event plane disconnected", extra={"fields": {"client": name}})

    async def reconnected() -> None:
        if holder:
            holder[0].reconnects += 1
            holder[0].down_since = None
            for hook in holder[0].on_reconnected:
                await hook()
        log.info("event plane reconnected", extra={"fields": {"client": name}})

    async def error(exc: Exception) -> None:
        log.debug("event plane error", extra={"fields": {"client": name, "error": str(exc)[:200]}})

    nc = await asyncio.wait_for(nats.connect(
        servers(url), name=name, allow_reconnect=True, max_reconnect_attempts=-1,
        reconnect_time_wait=RECONNECT_WAIT_S, connect_timeout=CONNECT_TIMEOUT_S,
        disconnected_cb=disconnected, reconnected_cb=reconnected, error_cb=error,
    ), timeout_s)
    plane = Plane(nc, nc.jetstream())
    holder.append(plane)
    return plane
