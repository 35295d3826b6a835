"""Strict, batch-atomic decoders for SGLang KV-event payloads, one per wire contract.

The contract's batch type (``cacheon.kv.events``) is the decoder: msgspec validates while it
decodes and nothing half-decoded escapes. A payload that fails is diagnosed on a slow path that
never runs for good batches: another release's shape (``schema_mismatch``) versus broken bytes
or types (``decode_error``, nesting too deep included). A batch that decodes but carries what no
real publisher sends (a non-finite timestamp, a block size, page or token count past
``WireBounds``) is ``out_of_bounds``. Decoded events leave this module as version-neutral index
operations (``operations``).

Token ids, most of a per-page payload, are not made into Python ints: each BlockStored's
``token_ids`` stays raw msgpack, and one pass in C (``_events.scan``, with the bounds) checks that
it is an array of u32s in the encodings msgpack writers use for them (positive fixints, uint 8,
uint 16, uint 32). That accepts a subset of what the contract's typed decoder accepts; a payload it
does not recognise goes to that typed decoder (``typed_batch``), whose verdict stands. So a batch is
accepted, or rejected with its reason and detail, exactly as a decoder building every token would
(tests/kv/test_kv_wire_properties.py), with one known difference: a map-encoded event (0.5.22+) that
repeats its ``token_ids`` key is judged by the last value only (msgspec keeps the last; the typed
decoder validates each). No writer repeats a key, and the index never reads token ids.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, cast

import msgspec
from msgspec import Meta

from cacheon.kv import _events
from cacheon.kv.contracts import Encoding, WireContract
from cacheon.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    event_types,
    field_names,
    tag,
)
from cacheon.kv.index import IndexOp, Operation


class RejectReason(StrEnum):
    SCHEMA_MISMATCH = "schema_mismatch"
    DECODE_ERROR = "decode_error"
    RANK_MISMATCH = "rank_mismatch"
    OUT_OF_BOUNDS = "out_of_bounds"


SCHEMA_MISMATCH, DECODE_ERROR, RANK_MISMATCH, OUT_OF_BOUNDS = RejectReason
REJECT_REASONS = tuple(RejectReason)
_Bound = Annotated[int, msgspec.Meta(ge=1)]


class WireBounds(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The most one batch may carry; past any of these the batch is refused whole.

    ``max_payload_bytes`` is checked before decoding, so it bounds the memory one decode can take
    (decoded lists of ints cost up to ~40 bytes per encoded byte); the others bound values no real
    SGLang sends (its page sizes are at most a few hundred tokens).
    """

    max_payload_bytes: Annotated[_Bound, Meta(
        description="largest KV batch, checked before decoding: bounds one decode's memory")] = 16 << 20
    max_events: Annotated[_Bound, Meta(description="events in one batch")] = 1 << 16
    max_block_size: Annotated[_Bound, Meta(description="a BlockStored's block size")] = 1024
    max_pages: Annotated[_Bound, Meta(description="block ids in one event")] = 1 << 16
    max_tokens: Annotated[_Bound, Meta(description="token ids in one event")] = 1 << 20

# Media whose blocks an index routes on: SGLang's device tier (nil means GPU in its recorder).
DEVICE_MEDIA = frozenset({None, "GPU"})


class WireReject(Exception):
    """A whole batch refused: ``reason`` says which kind of wrong, ``detail`` says where."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class DecodedBatch:
    """One accepted batch: typed events in wire order."""

    ts: float
    rank: int
    events: Sequence[KvEvent]


@functools.cache
def typed_batch(batch: type[EventBatch]) -> type[EventBatch]:
    """``batch`` with its BlockStored's ``token_ids`` typed as the contract's token list (u32; 0.5.22+
    wide): the decoder that builds every token, for the verdict on a payload the fast path does not
    recognise (wide ids always take this path)."""
    kinds = event_types(batch)
    stored = next(t for t in kinds if issubclass(t, BlockStored))
    tokens: Any = list[stored.token_type]  # type: ignore[name-defined]  # a run-time type
    typed = msgspec.defstruct(f"{stored.__name__}Tokens", [("token_ids", tokens)], bases=(stored,))
    union: Any = functools.reduce(operator.or_, [typed if t is stored else t for t in kinds])  # a run-time union
    return cast(type[EventBatch], msgspec.defstruct(f"{batch.__name__}Tokens", [("events", list[union])],
                                                    bases=(batch,)))


class WireDecoder:
    """Decodes one contract's payloads; instances are cheap to share, not thread-bound."""

    def __init__(self, contract: WireContract, bounds: WireBounds | None = None) -> None:
        self.contract = contract
        self.bounds = bounds or WireBounds()
        self._decoder = msgspec.msgpack.Decoder(contract.batch)
        self._typed = msgspec.msgpack.Decoder(typed_batch(contract.batch))
        self._stored = contract.stored
        # Each tag's (required, optional) fields, for diagnosing a payload that did not decode.
        self._allowed = {tag(t): field_names(t) for t in event_types(contract.batch)}

    def decode(self, payload: bytes, rank: int) -> DecodedBatch:
        """The batch, or WireReject; never a partial batch, never another exception."""
        if len(payload) > self.bounds.max_payload_bytes:
            raise WireReject(OUT_OF_BOUNDS, f"payload of {len(payload)} bytes, bound {self.bounds.max_payload_bytes}")
        batch: EventBatch | None
        try:
            batch = self._decoder.decode(payload)
        except msgspec.DecodeError:
            batch = None
        except RecursionError:
            raise WireReject(DECODE_ERROR, "payload nests too deeply") from None
        b = self.bounds
        flags = _events.UNUSUAL_TOKENS if batch is None else _events.scan(
            batch.events, self._stored, b.max_block_size, b.max_tokens, b.max_pages)
        if flags & _events.UNUSUAL_TOKENS:
            try:  # the typed decoder's verdict: a reject with its reason, or a rare valid encoding
                self._typed.decode(payload)
            except msgspec.DecodeError as exc:  # ValidationError is a DecodeError too
                raise self._diagnose(payload, exc) from None
            except RecursionError:
                raise WireReject(DECODE_ERROR, "payload nests too deeply") from None
        if batch is None:  # cannot happen: what decodes with typed token ids decodes with raw ones
            raise WireReject(DECODE_ERROR, "the payload decodes only with typed token ids")
        if batch.attn_dp_rank != rank:
            raise WireReject(RANK_MISMATCH, f"batch attn_dp_rank={batch.attn_dp_rank}, socket rank={rank}")
        if flags & _events.PAST_BOUNDS or not math.isfinite(batch.ts) or len(batch.events) > b.max_events:
            raise WireReject(OUT_OF_BOUNDS, self._out_of_bounds(batch.ts, batch.events))
        return DecodedBatch(batch.ts, rank, batch.events)

    def _out_of_bounds(self, ts: float, events: Sequence[KvEvent]) -> str:
        """What in a decoded batch is past the bounds (the first, in order), for a batch ``scan`` flagged."""
        b = self.bounds
        if not math.isfinite(ts):
            return f"timestamp {ts} is not finite"
        if len(events) > b.max_events:
            return f"{len(events)} events, bound {b.max_events}"
        stored = self._stored
        for ev in events:  # one pass, exact type checks: this runs for every accepted batch
            if type(ev) is stored:
                if ev.block_size > b.max_block_size or ev.token_count() > b.max_tokens or len(
                        ev.block_hashes) > b.max_pages:
                    return _store_bounds(ev, b)
            elif len(getattr(ev, "block_hashes", ())) > b.max_pages:
                return f"a BlockRemoved of {len(cast(BlockRemoved, ev).block_hashes)} block ids, bound {b.max_pages}"
        raise AssertionError("scan flagged a batch past its bounds that this pass finds within them")

    def _diagnose(self, payload: bytes, exc: msgspec.DecodeError) -> WireReject:
        """Slow path: is this another wire shape, or broken bytes/values?"""
        try:
            raw = msgspec.msgpack.decode(payload)
        except msgspec.DecodeError as malformed:
            return WireReject(DECODE_ERROR, str(malformed))
        except RecursionError:
            return WireReject(DECODE_ERROR, "payload nests too deeply")
        if not isinstance(raw, list) or not 2 <= len(raw) <= 3:
            return WireReject(SCHEMA_MISMATCH, "payload is not an [ts, events, attn_dp_rank] array")
        if isinstance(raw[1], list):
            for i, event in enumerate(raw[1]):
                problem = self._shape_problem(event)
                if problem:
                    return WireReject(SCHEMA_MISMATCH, f"event {i}: {problem}")
        return WireReject(DECODE_ERROR, str(exc))

    def _shape_problem(self, event: Any) -> str | None:
        """Why ``event`` is not this contract's shape, or None when only a value is wrong."""
        arrays = self.contract.encoding == Encoding.TAGGED_ARRAY
        if isinstance(event, dict if arrays else list):
            theirs, ours = ("map", "arrays") if arrays else ("array", "maps")
            return f"a tagged {theirs}, but {self.contract.id} speaks tagged {ours}"
        fields: dict[Any, Any]
        if arrays and isinstance(event, list) and event:
            tag_, fields = event[0], dict.fromkeys(range(len(event) - 1))
        elif not arrays and isinstance(event, dict):
            tag_, fields = event.get("type"), {k: v for k, v in event.items() if k != "type"}
        else:
            return None  # not a shape any release uses: a type error
        if not isinstance(tag_, str) or tag_ not in self._allowed:
            return f"unknown event tag {tag_!r}"
        required, optional = self._allowed[tag_]
        if arrays:
            if not len(required) <= len(fields) <= len(required) + len(optional):
                return f"{tag_} has {len(fields)} fields; {self.contract.id} takes {len(required)}" + (
                    f" to {len(required) + len(optional)}" if optional else ""
                )
            fields = dict(zip(required + optional, event[1:], strict=False))
        unknown = sorted(str(k) for k in fields if k not in required + optional)
        if unknown:
            return f"{tag_} field(s) {', '.join(unknown)} not in {self.contract.id}"
        missing = [n for n in required if n not in fields]
        if missing:
            return f"{tag_} lacks {', '.join(missing)}"
        metadata = fields.get("metadata")
        if isinstance(metadata, dict) and set(metadata) != {"cache_salt"}:
            return f"metadata keys {sorted(map(str, metadata))} are not exactly [cache_salt]"
        return None


def _store_bounds(ev: BlockStored, b: WireBounds) -> str:
    if ev.block_size > b.max_block_size:
        return f"a BlockStored with block_size {ev.block_size}, bound {b.max_block_size}"
    if ev.token_count() > b.max_tokens:
        return f"a BlockStored of {ev.token_count()} token ids, bound {b.max_tokens}"
    return f"a BlockStored of {len(ev.block_hashes)} block ids, bound {b.max_pages}"


def operations(events: Sequence[KvEvent]) -> tuple[list[Operation], int]:
    """Version-neutral index operations for decoded events, and how many were skipped: ``reference_operations``
    in C (``_events.operations``), which the feeds call per batch."""
    return _events.operations(events, _OPS, _op, DEVICE_MEDIA, _STORE, _CLEAR)


def reference_operations(events: Sequence[KvEvent]) -> tuple[list[Operation], int]:
    """Version-neutral index operations for decoded events, and how many were skipped (the reference
    the native ``operations`` is tested against).

    Consecutive removals merge into one operation, and so do consecutive stores that continue one
    chain (each event's parent is the previous one's last block: the per-page wire's pages of one
    prefill), so the index works in bulk; a store names its run's parent. Events on a non-device
    medium (host/disk tiers) are skipped: they do not make a worker's GPU prefix reusable.
    """
    ops: list[Operation] = []
    current: IndexOp | None = None
    run: list[int] = []
    tail: int | None = None  # the last block of the current store run
    skipped = 0
    # Fields are read only after dispatching on the event's class (a clear has none).
    for ev in cast(Sequence[BlockStored], events):
        op = _OPS.get(type(ev)) or _op(type(ev))  # one dict lookup per event on the hot path
        if op is _CLEAR:
            ops.append((_CLEAR, [], None))
            current = None
            continue
        if ev.medium not in DEVICE_MEDIA:
            skipped += 1
            continue
        hashes = ev.block_hashes
        if not hashes:
            continue
        if op is _STORE:
            parent = ev.parent_block_hash
            if current is not _STORE or parent is None or parent != tail:
                current, run = op, []
                ops.append((op, run, parent))
            tail = hashes[-1]
        elif current is not op:
            current, run = op, []
            ops.append((op, run, None))
        run += hashes
    return ops, skipped


# The members bound once: on Python 3.11 each ``IndexOp.X`` is a descriptor call (~0.1 us).
_STORE, _REMOVE, _CLEAR = IndexOp.STORE, IndexOp.REMOVE, IndexOp.CLEAR
_OPS: dict[type[KvEvent], IndexOp] = {}


def _op(event_type: type[KvEvent]) -> IndexOp:
    """The index operation of a concrete event class, remembered for the next event of that class."""
    if issubclass(event_type, AllBlocksCleared):
        op = _CLEAR
    elif issubclass(event_type, BlockStored):
        op = _STORE
    elif issubclass(event_type, BlockRemoved):
        op = _REMOVE
    else:
        raise TypeError(f"not a KV event type: {event_type!r}")
    _OPS[event_type] = op
    return op


def event_json(event: KvEvent) -> dict[str, Any]:
    """One decoded event as the JSON object ``cacheon kv listen`` prints (nil options left out)."""
    out: dict[str, Any] = {"type": tag(type(event))}
    for name in event.__struct_fields__:
        value = getattr(event, name)
        if name == "metadata" and value is not None:
            out["cache_salt"] = value.cache_salt
        elif name == "token_ids":
            out[name] = cast(BlockStored, event).tokens()
        elif value is not None or name in ("parent_block_hash", "lora_id"):
            out[name] = value
    return out
