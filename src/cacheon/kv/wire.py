"""Strict, batch-atomic decoders for SGLang KV-event payloads, one per wire contract.

The contract's batch type (``cacheon.kv.events``) is the decoder: msgspec validates while it
decodes and nothing half-decoded escapes. A payload that fails is diagnosed on a slow path that
never runs for good batches: another release's shape (``schema_mismatch``) versus broken bytes
or types (``decode_error``, nesting too deep included). A batch that decodes but carries what no
real publisher sends (a non-finite timestamp, a block size, page or token count past
``WireBounds``) is ``out_of_bounds``. Decoded events leave this module as version-neutral index
operations (``operations``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, cast

import msgspec

from cacheon.kv.contracts import Encoding, WireContract
from cacheon.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent, event_types, field_names, tag
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

    max_payload_bytes: _Bound = 16 << 20
    max_events: _Bound = 1 << 16
    max_block_size: _Bound = 1024
    max_pages: _Bound = 1 << 16  # block ids in one event
    max_tokens: _Bound = 1 << 20  # token ids in one event

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


class WireDecoder:
    """Decodes one contract's payloads; instances are cheap to share, not thread-bound."""

    def __init__(self, contract: WireContract, bounds: WireBounds | None = None) -> None:
        self.contract = contract
        self.bounds = bounds or WireBounds()
        self._decoder = msgspec.msgpack.Decoder(contract.batch)
        self._stored = contract.stored
        # Each tag's (required, optional) fields, for diagnosing a payload that did not decode.
        self._allowed = {tag(t): field_names(t) for t in event_types(contract.batch)}

    def decode(self, payload: bytes, rank: int) -> DecodedBatch:
        """The batch, or WireReject; never a partial batch, never another exception."""
        if len(payload) > self.bounds.max_payload_bytes:
            raise WireReject(OUT_OF_BOUNDS, f"payload of {len(payload)} bytes, bound {self.bounds.max_payload_bytes}")
        try:
            batch = self._decoder.decode(payload)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError too
            raise self._diagnose(payload, exc) from None
        except RecursionError:
            raise WireReject(DECODE_ERROR, "payload nests too deeply") from None
        if batch.attn_dp_rank != rank:
            raise WireReject(RANK_MISMATCH, f"batch attn_dp_rank={batch.attn_dp_rank}, socket rank={rank}")
        problem = self._out_of_bounds(batch.ts, batch.events)
        if problem is not None:
            raise WireReject(OUT_OF_BOUNDS, problem)
        return DecodedBatch(batch.ts, rank, batch.events)

    def _out_of_bounds(self, ts: float, events: Sequence[KvEvent]) -> str | None:
        """What in a decoded batch is past the bounds, or None."""
        b = self.bounds
        if not math.isfinite(ts):
            return f"timestamp {ts} is not finite"
        if len(events) > b.max_events:
            return f"{len(events)} events, bound {b.max_events}"
        stored = self._stored
        for ev in events:  # one pass, exact type checks: this runs for every accepted batch
            if type(ev) is stored:
                if ev.block_size > b.max_block_size or len(ev.token_ids) > b.max_tokens or len(
                        ev.block_hashes) > b.max_pages:
                    return _store_bounds(ev, b)
            elif len(getattr(ev, "block_hashes", ())) > b.max_pages:
                return f"a BlockRemoved of {len(cast(BlockRemoved, ev).block_hashes)} block ids, bound {b.max_pages}"
        return None

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
    if len(ev.token_ids) > b.max_tokens:
        return f"a BlockStored of {len(ev.token_ids)} token ids, bound {b.max_tokens}"
    return f"a BlockStored of {len(ev.block_hashes)} block ids, bound {b.max_pages}"


def operations(events: Sequence[KvEvent]) -> tuple[list[Operation], int]:
    """Version-neutral index operations for decoded events, and how many were skipped.

    Consecutive stores (or removals) merge into one operation so the index works in bulk;
    events on a non-device medium (host/disk tiers) are skipped: they do not make a
    worker's GPU prefix reusable.
    """
    ops: list[Operation] = []
    current: IndexOp | None = None
    run: list[int] = []
    skipped = 0
    for ev in events:
        op = _OPS.get(type(ev)) or _op(type(ev))  # one dict lookup per event on the hot path
        if op is IndexOp.CLEAR:
            ops.append((IndexOp.CLEAR, []))
            current = None
            continue
        paged = cast(BlockStored | BlockRemoved, ev)
        if paged.medium not in DEVICE_MEDIA:
            skipped += 1
            continue
        if op is not current:
            current, run = op, []
            ops.append((op, run))
        run += paged.block_hashes
    return ops, skipped


_OPS: dict[type[KvEvent], IndexOp] = {}


def _op(event_type: type[KvEvent]) -> IndexOp:
    """The index operation of a concrete event class, remembered for the next event of that class."""
    if issubclass(event_type, AllBlocksCleared):
        op = IndexOp.CLEAR
    elif issubclass(event_type, BlockStored):
        op = IndexOp.STORE
    elif issubclass(event_type, BlockRemoved):
        op = IndexOp.REMOVE
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
        elif value is not None or name in ("parent_block_hash", "lora_id"):
            out[name] = value
    return out
