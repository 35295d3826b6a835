"""Routing precision: what the gateway predicted a worker holds against what the engine reports.

Every answered request the exact policy predicted for is scored once, where its outcome is
recorded (``Proxy._record``): the prediction (``Decision.held``) against the engine's own
count, ``usage.prompt_tokens_details.cached_tokens`` (OpenAI endpoints) or
``meta_info.cached_tokens`` (``/generate``). SGLang writes ``prompt_tokens_details: null`` for
"nothing cached" at the pin, and for every request when ``--enable-cache-report`` is off: null
counts as 0 only on a worker whose ``/server_info`` says the report is on. A response without
the count (a stream without ``stream_options.include_usage``) is ``unreported``, never a match.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import msgspec

from cacheon.gateway.prediction import NoPrediction


class _Details(msgspec.Struct, gc=False):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens_details: _Details | None = None


class _OpenAI(msgspec.Struct, gc=False):
    usage: _Usage | None = None


class _Meta(msgspec.Struct, gc=False):
    cached_tokens: int | None = None


class _Native(msgspec.Struct, gc=False):
    meta_info: _Meta | None = None


_openai = msgspec.json.Decoder(_OpenAI)
_native = msgspec.json.Decoder(_Native)


def reported_cached(kind: str, body: bytes, cache_report: bool) -> int | None:
    """The cached prompt tokens one JSON answer (or stream event) reports; None: not reported."""
    try:
        if kind == "generate":
            meta = _native.decode(body).meta_info
            return None if meta is None else meta.cached_tokens
        usage = _openai.decode(body).usage
    except msgspec.DecodeError:
        return None
    if usage is None:
        return None
    details = usage.prompt_tokens_details
    if details is None:
        return 0 if cache_report else None
    return details.cached_tokens


MAX_EVENT_BYTES = 1 << 20  # the longest event the tail parses: a count's is a few hundred bytes


class StreamTail:
    """The last complete server-sent event of a stream that carries a count, fed chunk by chunk.

    OpenAI streams report usage in their last event before ``[DONE]`` (with ``include_usage``);
    ``/generate`` streams in every event's ``meta_info``. Only the latest event that mentions
    either is kept, and an event in progress past ``MAX_EVENT_BYTES`` is skipped to its end, so a
    stream costs no more than that whatever the worker sends (one endless event held it whole).
    Lines may end in CRLF, as the event-stream format allows; CR alone is not read as an end.
    """

    __slots__ = ("_cr", "_held", "_nl", "_pieces", "_skip", "last")

    def __init__(self) -> None:
        self._pieces: list[bytes] = []  # the event in progress, as read: joined only once it ends
        self._held = 0  # bytes in _pieces
        self._nl = False  # the last byte fed was a line feed (a blank line may be split over two reads)
        self._cr = False  # a carriage return held back from the last read (its line feed may come next)
        self._skip = False  # in an event past MAX_EVENT_BYTES: nothing kept until it ends
        self.last: bytes | None = None

    def feed(self, chunk: bytes) -> None:
        if self._cr or b"\r" in chunk:
            if self._cr:
                chunk, self._cr = b"\r" + chunk, False
            if chunk.endswith(b"\r"):
                chunk, self._cr = chunk[:-1], True
            chunk = chunk.replace(b"\r\n", b"\n")
        self._feed(chunk)

    def _feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        split_end = self._nl and chunk[:1] == b"\n"  # the blank line's two line feeds in two reads
        if not split_end and b"\n\n" not in chunk:
            self._nl = chunk[-1:] == b"\n"
            if not self._skip:
                self._pieces.append(chunk)  # kept, not copied (one event over many reads stays linear)
                self._held += len(chunk)
                if self._held > MAX_EVENT_BYTES:
                    self._pieces, self._held, self._skip = [], 0, True
            return
        if self._skip:  # the end of an event too long to parse: what follows starts afresh
            self._skip, self._nl = False, False
            self._feed(chunk[1:] if split_end else chunk[chunk.index(b"\n\n") + 2 :])
            return
        self._nl = chunk[-1:] == b"\n"
        events = b"".join((*self._pieces, chunk)).split(b"\n\n")
        partial = events.pop()
        self._pieces, self._held = ([partial], len(partial)) if partial else ([], 0)
        if self._held > MAX_EVENT_BYTES:
            self._pieces, self._held, self._skip = [], 0, True
        for event in reversed(events):
            if (len(event) <= MAX_EVENT_BYTES and event.startswith(b"data: {")
                    and (b'"usage"' in event or b'"meta_info"' in event)):
                self.last = event[6:]
                break


class Match(StrEnum):
    EXACT = "exact"
    OVER = "over"  # predicted more than the engine reused
    UNDER = "under"


@dataclass
class Precision:
    """One worker's scored predictions (changed on the event loop only)."""

    scored: dict[Match, int] = field(default_factory=lambda: dict.fromkeys(Match, 0))
    predicted_tokens: int = 0  # over scored requests
    reported_tokens: int = 0
    unreported: int = 0  # predicted, answered, but the engine's count was absent
    refusals: dict[NoPrediction, int] = field(default_factory=dict)
    last_mismatch: dict[str, Any] | None = None

    def score(self, predicted: int, reported: int, request_id: str) -> Match:
        match = Match.EXACT if predicted == reported else Match.OVER if predicted > reported else Match.UNDER
        self.scored[match] += 1
        self.predicted_tokens += predicted
        self.reported_tokens += reported
        if match is not Match.EXACT:
            self.last_mismatch = {"request_id": request_id, "predicted": predicted, "reported": reported,
                                  "at": time.time()}
        return match

    def refused(self, reason: NoPrediction) -> None:
        self.refusals[reason] = self.refusals.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        total = sum(self.scored.values())
        return {
            "scored": total,
            **{m.value: n for m, n in self.scored.items()},
            "exact_ratio": None if not total else self.scored[Match.EXACT] / total,
            "predicted_tokens": self.predicted_tokens,
            "reported_tokens": self.reported_tokens,
            "unreported": self.unreported,
            "refusals": {str(k): v for k, v in sorted(dict(self.refusals).items())},
            "last_mismatch": self.last_mismatch,
        }
