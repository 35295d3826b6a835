"""Strict, batch-atomic decoders for SGLang KV-event payloads, one per wire contract.

The msgspec types are generated from the contract (encoding, optional fields), so the wire
contract *is* the type: msgspec validates while it decodes and nothing half-decoded escapes.
A payload that fails is diagnosed on a slow path that never runs for good batches:
another release's shape (``schema_mismatch``) versus broken bytes or types (``decode_error``).
Decoded events leave this module as version-neutral operations for the index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from cacheon.gateway.contracts import WireContract

SCHEMA_MISMATCH = "schema_mismatch"
DECODE_ERROR = "decode_error"
RANK_MISMATCH = "rank_mismatch"
REJECT_REASONS = (SCHEMA_MISMATCH, DECODE_ERROR, RANK_MISMATCH)

# Block ids are signed int64 (msgpack uint64 when positive); tokens are hashed as u32 LE.
Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Token = Annotated[int, Meta(ge=0, le=2**32 - 1)]

# Media whose blocks an index routes on: SGLang's device tier (nil means GPU in its recorder).
DEVICE_MEDIA = frozenset({None, "GPU"})


class StoredMetadata(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The map 0.5.18/0.5.19 append to a salted BlockStored array."""

    cache_salt: str


_REQUIRED_STORED: tuple[tuple[str, Any], ...] = (
    ("block_hashes", list[Int64]),
    ("parent_block_hash", Int64 | None),
    ("token_ids", list[Token]),
    ("block_size", Annotated[int, Meta(ge=1)]),
    ("lora_id", int | None),
)
_OPTIONAL_TYPES: dict[str, Any] = {
    "medium": str | None,
    "metadata": StoredMetadata | None,
    "cache_salt": str | None,
    "session_id": str | None,
    "lora_name": str | None,
}
_TAGS = ("BlockStored", "BlockRemoved", "AllBlocksCleared")


class WireReject(Exception):
    """A whole batch refused: ``reason`` is one of REJECT_REASONS, ``detail`` says where."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class DecodedBatch:
    """One accepted batch: typed events in wire order."""

    ts: float
    rank: int
    events: list[Any]


class WireDecoder:
    """Decodes one contract's payloads; instances are cheap to share, not thread-bound."""

    def __init__(self, contract: WireContract) -> None:
        self.contract = contract
        options = {
            "tag": True,
            "array_like": contract.encoding == "tagged-array",
            "forbid_unknown_fields": True,
            "gc": False,
        }
        optional = [(name, _OPTIONAL_TYPES[name], None) for name in contract.stored_optional]
        stored_fields = [*_REQUIRED_STORED, *optional]
        self.stored = msgspec.defstruct("BlockStored", stored_fields, **options)
        self.removed = msgspec.defstruct(
            "BlockRemoved", [("block_hashes", list[Int64]), ("medium", str | None, None)], **options
        )
        self.cleared = msgspec.defstruct("AllBlocksCleared", [], **options)
        batch = msgspec.defstruct(
            "EventBatch",
            [
                ("ts", float),
                ("events", list[self.stored | self.removed | self.cleared]),  # type: ignore[valid-type]
                ("attn_dp_rank", int | None, None),
            ],
            array_like=True,
            forbid_unknown_fields=True,
            gc=False,
        )
        self._decoder = msgspec.msgpack.Decoder(batch)
        self._allowed = {
            "BlockStored": (tuple(n for n, _ in _REQUIRED_STORED), contract.stored_optional),
            "BlockRemoved": (("block_hashes",), ("medium",)),
            "AllBlocksCleared": ((), ()),
        }

    def decode(self, payload: bytes, rank: int) -> DecodedBatch:
        """The batch, or WireReject; never a partial batch, never another exception."""
        try:
            batch = self._decoder.decode(payload)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError too
            raise self._diagnose(payload, exc) from None
        if batch.attn_dp_rank != rank:
            raise WireReject(RANK_MISMATCH, f"batch attn_dp_rank={batch.attn_dp_rank}, socket rank={rank}")
        return DecodedBatch(batch.ts, rank, batch.events)

    def operations(self, events: list[Any]) -> tuple[list[tuple[str, list[int]]], int]:
        """Version-neutral index operations for decoded events, and how many were skipped.

        Consecutive stores (or removals) merge into one operation so the index works in bulk;
        events on a non-device medium (host/disk tiers) are skipped: they do not make a
        worker's GPU prefix reusable.
        """
        names = {self.stored: "store", self.removed: "remove"}
        cleared = self.cleared
        ops: list[tuple[str, list[int]]] = []
        current: type | None = None
        run: list[int] = []
        skipped = 0
        for ev in events:
            cls = type(ev)
            if cls is cleared:
                ops.append(("clear", []))
                current = None
            elif ev.medium not in DEVICE_MEDIA:
                skipped += 1
            else:
                if cls is not current:
                    current, run = cls, []
                    ops.append((names[cls], run))
                run += ev.block_hashes
        return ops, skipped

    def _diagnose(self, payload: bytes, exc: msgspec.DecodeError) -> WireReject:
        """Slow path: is this another wire shape, or broken bytes/values?"""
        try:
            raw = msgspec.msgpack.decode(payload)
        except msgspec.DecodeError as malformed:
            return WireReject(DECODE_ERROR, str(malformed))
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
        arrays = self.contract.encoding == "tagged-array"
        if isinstance(event, dict if arrays else list):
            theirs, ours = ("map", "arrays") if arrays else ("array", "maps")
            return f"a tagged {theirs}, but {self.contract.id} speaks tagged {ours}"
        if arrays and isinstance(event, list) and event:
            tag, fields = event[0], dict.fromkeys(range(len(event) - 1))
        elif not arrays and isinstance(event, dict):
            tag, fields = event.get("type"), {k: v for k, v in event.items() if k != "type"}
        else:
            return None  # not a shape any release uses: a type error
        if not isinstance(tag, str) or tag not in self._allowed:
            return f"unknown event tag {tag!r}"
        required, optional = self._allowed[tag]
        if arrays:
            if not len(required) <= len(fields) <= len(required) + len(optional):
                return f"{tag} has {len(fields)} fields; {self.contract.id} takes {len(required)}" + (
                    f" to {len(required) + len(optional)}" if optional else ""
                )
            fields = dict(zip(required + optional, event[1:], strict=False))
        unknown = sorted(str(k) for k in fields if k not in required + optional)
        if unknown:
            return f"{tag} field(s) {', '.join(unknown)} not in {self.contract.id}"
        missing = [n for n in required if n not in fields]
        if missing:
            return f"{tag} lacks {', '.join(missing)}"
        metadata = fields.get("metadata")
        if isinstance(metadata, dict) and set(metadata) != {"cache_salt"}:
            return f"metadata keys {sorted(map(str, metadata))} are not exactly [cache_salt]"
        return None


def event_json(event: Any) -> dict[str, Any]:
    """One decoded event as the JSON object ``cacheon kv listen`` prints (nil options left out)."""
    out: dict[str, Any] = {"type": type(event).__name__}
    for name in event.__struct_fields__:
        value = getattr(event, name)
        if name == "metadata" and value is not None:
            out["cache_salt"] = value.cache_salt
        elif value is not None or name in ("parent_block_hash", "lora_id"):
            out[name] = value
    return out
