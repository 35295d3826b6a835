"""The gateway's control calls (discovery, tokenize, health, the hash challenge): one pooled aiohttp session.
Proxied requests, streamed or not, go through the lean client (``upstream.py``).

aiohttp rather than httpx on this path: measured in the same run against the same simulated
worker, an httpx ``AsyncClient`` round trip costs ~1.1 ms more than aiohttp's on the 2-core
development VM, and the proxy's whole budget is 1 ms (benchmarks/README.md).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from cacheon.gateway.upstream import whole

# identity: the gateway relays bodies as they come and reads JSON from them, so a worker (or a proxy in front
# of it) must not compress; without the header any coding is acceptable (RFC 9110 12.5.3).
JSON_HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}
CONTROL_BODY_BYTES = 4 << 20  # a control call's answer (discovery, tokenize, health): a few KiB in fact
# What ends a call for a reason on the transport side (the worker never answered in full).
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


class CallError(Exception):
    """A control call failed: transport, HTTP status, or a body that is not JSON."""


def session(connections: int = 1000) -> aiohttp.ClientSession:
    """Keep-alive pool to every worker; no client-wide timeout (each call sets its own)."""
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0, ttl_dns_cache=300)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                 auto_decompress=False, skip_auto_headers=("User-Agent",),
                                 headers={"accept-encoding": "identity"})


async def call_json(client: aiohttp.ClientSession, method: str, url: str, timeout_s: float,
                    body: Any = None) -> tuple[int, Any]:
    """Status and parsed JSON body (``None`` when the body is not JSON); CallError on transport failure or an
    answer past ``CONTROL_BODY_BYTES``."""
    data = None if body is None else json.dumps(body).encode()
    try:
        async with client.request(method, url, data=data, headers=JSON_HEADERS if data else None,
                                  timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            status = resp.status
            raw = await whole(resp.content.readany, CONTROL_BODY_BYTES)
    except TRANSPORT_ERRORS as exc:
        raise CallError(f"{method} {url}: {exc!r}") from None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


async def get_json(client: aiohttp.ClientSession, url: str, timeout_s: float, *,
                   fallbacks: tuple[str, ...] = ()) -> Any:
    """A 2xx JSON answer, or CallError saying what came instead; on a 404, each of ``fallbacks`` in turn."""
    for candidate in (url, *fallbacks):
        status, got = await call_json(client, "GET", candidate, timeout_s)
        if status != 404:
            break
    if not 200 <= status < 300 or got is None:
        raise CallError(f"GET {candidate}: HTTP {status}{'' if got is not None else ', not JSON'}")
    return got
