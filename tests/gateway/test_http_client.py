"""The gateway's control calls (discovery, tokenize, health) on its aiohttp session: what a worker can make it read."""

from __future__ import annotations

import asyncio

from aiohttp import web

from cacheon.gateway.http import CONTROL_BODY_BYTES, CallError, call_json, session
from tests.gateway.inproc import serve_app


async def _served(body: bytes) -> tuple[web.AppRunner, str, list[str | None]]:
    """A worker answering every GET with ``body`` (chunked), keeping each request's Accept-Encoding."""
    asked: list[str | None] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        asked.append(request.headers.get("accept-encoding"))
        out = web.StreamResponse(headers={"content-type": "application/json"})
        await out.prepare(request)
        for i in range(0, len(body), 1 << 16):
            await out.write(body[i : i + (1 << 16)])
        await out.write_eof()
        return out

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    runner, url = await serve_app(app)
    return runner, url, asked


async def _call(body: bytes) -> tuple[tuple[int, object] | CallError, list[str | None]]:
    runner, url, asked = await _served(body)
    client = session()
    try:
        return await call_json(client, "GET", f"{url}/server_info", 10), asked
    except CallError as exc:
        return exc, asked
    finally:
        await client.close()
        await runner.cleanup()


def test_a_control_answer_past_its_bound_is_a_failed_call_not_held_whole() -> None:
    """A broken worker's endless /server_info was read whole (aiohttp's ``read``, no bound); past
    CONTROL_BODY_BYTES the call fails as a transport failure does."""
    got, _ = asyncio.run(_call(b"[" + b"1," * CONTROL_BODY_BYTES + b"1]"))
    assert isinstance(got, CallError) and f"({CONTROL_BODY_BYTES} bytes)" in str(got)


def test_a_control_answer_within_its_bound_is_parsed_and_asked_for_uncompressed() -> None:
    got, asked = asyncio.run(_call(b'{"ok": true}'))
    assert got == (200, {"ok": True})
    assert asked == ["identity"]  # the gateway parses what it reads: no worker may compress it
