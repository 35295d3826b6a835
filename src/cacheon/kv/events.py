"""SGLang's KV events as types: one msgspec ``Struct`` per event per wire contract.

Code reads events through the version-neutral bases (``isinstance(ev, BlockStored)``, ``match``);
each contract's concrete classes add exactly the optional fields its releases send, in wire
order, so msgspec checks the contract while it decodes and nothing half-decoded escapes. The
contracts in ``cacheon.kv.contracts`` name their batch type; everything else is derived from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, ClassVar, get_args, get_type_hints

import msgspec
from msgspec import Meta

# Block ids are signed int64 (msgpack uint64 when positive); tokens are hashed as u32 LE, except
# where a release hashes pages holding ids past u32 wide (0.5.23: multimodal pad sentinels are
# 62-bit), which it then publishes as they are; above int64 its hash extension throws.
Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Token = Annotated[int, Meta(ge=0, le=2**32 - 1)]
WideToken = Annotated[int, Meta(ge=0, le=2**63 - 1)]
PageSize = Annotated[int, Meta(ge=1)]


class KvEvent(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """Any event of any contract."""


class BlockStored(KvEvent):
    """Pages cached on a rank: their ids in chain order, the parent of the first, their tokens.

    The contract's ``token_ids`` is a list of u32 (``Token``); the index never reads them, so an
    event keeps them as the msgpack bytes they came in (``cacheon.kv.wire`` checks those are
    exactly such a list) and ``tokens()`` makes the list where it is read (attestation).
    """

    token_type: ClassVar[object] = Token  # what the raw ``token_ids`` must decode as (the typed verdict)

    block_hashes: list[Int64]
    parent_block_hash: Int64 | None
    token_ids: msgspec.Raw
    block_size: PageSize
    lora_id: int | None
    medium: str | None = None

    def tokens(self) -> list[int]:
        return msgspec.msgpack.decode(self.token_ids, type=list[int])

    def token_count(self) -> int:
        """How many token ids, read from the array's msgpack header alone (the wire has checked
        it is one: fixarray, array 16 or array 32)."""
        raw = bytes(memoryview(self.token_ids)[:5])
        head = raw[0]
        if head == 0xDC:
            return int.from_bytes(raw[1:3], "big")
        if head == 0xDD:
            return int.from_bytes(raw[1:5], "big")
        return head & 0x0F


class BlockRemoved(KvEvent):
    """Pages evicted from a rank."""

    block_hashes: list[Int64]
    medium: str | None = None


class AllBlocksCleared(KvEvent):
    """Everything the rank held is gone (``/flush_cache``, a reset)."""


class StoredMetadata(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The map 0.5.18/0.5.19 append to a salted BlockStored array."""

    cache_salt: str


# -- tagged arrays: ["BlockStored", block_hashes, ...] -----------------------------------


class BlockRemovedArray(BlockRemoved, tag="BlockRemoved", array_like=True):
    pass


class AllBlocksClearedArray(AllBlocksCleared, tag="AllBlocksCleared", array_like=True):
    pass


class BlockStoredV1(BlockStored, tag="BlockStored", array_like=True):
    """0.5.13.post1: the five required fields and ``medium``."""


class BlockStoredV2(BlockStored, tag="BlockStored", array_like=True):
    """0.5.18, 0.5.19: a salted store appends ``{"cache_salt": ...}``."""

    metadata: StoredMetadata | None = None


# -- tagged maps: {"type": "BlockStored", ...}, nil options omitted ------------------------


class BlockRemovedMap(BlockRemoved, tag="BlockRemoved"):
    pass


class AllBlocksClearedMap(AllBlocksCleared, tag="AllBlocksCleared"):
    pass


class BlockStoredV3(BlockStored, tag="BlockStored"):
    """0.5.20, 0.5.21."""

    cache_salt: str | None = None
    session_id: str | None = None


class BlockStoredV4(BlockStoredV3):
    """0.5.22, 0.5.23: named LoRA adapters; token ids past u32 (0.5.23's wide pages)."""

    token_type: ClassVar[object] = WideToken
    lora_name: str | None = None


# -- batches: [ts, events, attn_dp_rank] in every release -----------------------------------


class EventBatch(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    """One publisher message's payload; each contract narrows ``events`` to its own union."""

    ts: float
    events: Sequence[KvEvent]
    attn_dp_rank: int | None = None


class BatchV1(EventBatch):
    events: list[BlockStoredV1 | BlockRemovedArray | AllBlocksClearedArray]


class BatchV2(EventBatch):
    events: list[BlockStoredV2 | BlockRemovedArray | AllBlocksClearedArray]


class BatchV3(EventBatch):
    events: list[BlockStoredV3 | BlockRemovedMap | AllBlocksClearedMap]


class BatchV4(EventBatch):
    events: list[BlockStoredV4 | BlockRemovedMap | AllBlocksClearedMap]


def event_types(batch: type[EventBatch]) -> tuple[type[KvEvent], ...]:
    """The concrete event classes a batch type's ``events`` may hold."""
    (union,) = get_args(get_type_hints(batch)["events"])
    return get_args(union)


def tag(event_type: type[KvEvent]) -> str:
    """The wire tag of a concrete event class (``BlockStored``, ...)."""
    return str(event_type.__struct_config__.tag)


def field_names(event_type: type[KvEvent]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(required, optional) field names of an event class, in wire order."""
    fields = msgspec.structs.fields(event_type)
    return tuple(f.name for f in fields if f.required), tuple(f.name for f in fields if not f.required)
