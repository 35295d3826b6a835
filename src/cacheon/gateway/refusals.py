"""The answers the gateway gives itself: why (``Refusal``), as an OpenAI-shaped error."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import msgspec
from aiohttp import web

_json = msgspec.json.Encoder()
LOGGED_CHARS = 256  # the most of any client-given string a log line, trace or error message carries


class Refusal(StrEnum):
    """Why the gateway answered a request itself (``cacheon_request_rejects_total{reason}``)."""

    BAD_JSON = "bad_json"
    BAD_REQUEST = "bad_request"
    UNKNOWN_MODEL = "unknown_model"
    BODY_TOO_LARGE = "body_too_large"
    ANSWER_TOO_LARGE = "answer_too_large"
    CONTEXT_TOO_LONG = "context_too_long"
    LOOP = "loop"
    NO_WORKER = "no_worker"
    UNKNOWN_ROUTE = "unknown_route"
    UNAUTHORIZED = "unauthorized"
    INTERNAL = "internal"


def oai_error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
              headers: Mapping[str, str] | None = None) -> web.Response:
    """An OpenAI-shaped error: ``{"error": {message, type, param, code}}``."""
    body = _json.encode({"error": {"message": message, "type": kind, "param": None, "code": code}})
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


class Rejected(Exception):
    """The gateway answers this request itself, with an OpenAI error."""

    def __init__(self, refusal: Refusal, status: int, message: str, kind: str = "invalid_request_error",
                 code: str | None = None) -> None:
        super().__init__(message)
        self.refusal, self.status, self.message, self.kind, self.code = refusal, status, message, kind, code


def bad(message: str, refusal: Refusal = Refusal.BAD_REQUEST) -> Rejected:
    return Rejected(refusal, 400, message)


def clip(text: str, limit: int = LOGGED_CHARS) -> str:
    """A client-given string cut to ``limit`` characters (and marked), for logs and messages."""
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"
