"""Errors the HTTP server answers before any route runs (a request aiohttp cannot parse: broken
framing, an oversized header line), OpenAI-shaped like every other error the gateway answers.

aiohttp builds these as text/plain in ``RequestHandler.handle_error``; its server makes one
handler per connection, so the runner's server is given a handler class that reshapes them.
"""

from __future__ import annotations

from http import HTTPStatus

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from cacheon.gateway.refusals import clip, oai_error


class _Handler(RequestHandler):
    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs it; raises if the answer had begun
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "error"
        said = (message or "").strip().splitlines()
        text = f"the request could not be read: {clip(said[0])}" if said and status < 500 else phrase
        response = oai_error(status, text, "invalid_request_error" if status < 500 else "internal_error",
                             code=phrase.lower().replace(" ", "_"))
        response.force_close()
        return response


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)


class Runner(web.AppRunner):
    """``web.AppRunner`` whose connections answer parser-level errors as OpenAI-shaped JSON."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # the same server; only the class of the handlers it makes differs
        return server
