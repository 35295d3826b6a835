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


class StreamTail:
    """The last complete server-sent event of a stream that carries a count, fed chunk by chunk.

    OpenAI streams report usage in their last event before ``[DONE]`` (with ``include_usage``);
    ``/generate`` streams in every event's ``meta_info``. Only the latest event that mentions
    either is kept, so a long stream costs no more than its largest event.
    """

    __slots__ = ("_pieces", "last")

    def __init__(self) -> None:
        self._pieces: list[bytes] = []  # the event in progress, as read: joined only once it ends
        self.last: bytes | None = None

    def feed(self, chunk: bytes) -> None:
        pieces = self._pieces
        if b"\n\n" not in chunk and not (pieces and pieces[-1][-1:] == b"\n" and chunk[:1] == b"\n"):
            if chunk:
                pieces.append(chunk)  # no event ends here: kept, not copied (one event over many reads stays linear)
            return
        events = b"".join((*pieces, chunk)).split(b"\n\n")
        partial = events.pop()
        self._pieces = [partial] if partial else []
        for event in reversed(events):
            if event.startswith(b"data: {") and (b'"usage"' in event or b'"meta_info"' in event):
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
