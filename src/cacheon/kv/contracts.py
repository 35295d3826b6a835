"""The registry of SGLang KV-event wire contracts: one exact, versioned entry per wire shape.

Every fact here was measured on the release wheels' own ``kv_events`` module (README, *KV
events*; tests/interop runs each release's publisher). A version outside every contract is an
error, never "the closest" one: a decoder that mostly understands a payload routes silently wrong.
Each contract names its batch type (``cacheon.kv.events``); its encoding and optional fields are
read off that type, so the registry and the decoder cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from cacheon.errors import UsageError
from cacheon.kv.events import (
    BatchV1,
    BatchV2,
    BatchV3,
    BatchV4,
    BlockRemoved,
    BlockStored,
    EventBatch,
    event_types,
    field_names,
)


class Promotion(StrEnum):
    """How far a contract is proven, weakest first. Only evidence from a real engine promotes to
    ``validated``; contracts backed by fixtures and the releases' own publisher code stay ``candidate``."""

    OBSERVED = "observed"
    CANDIDATE = "candidate"
    VALIDATED = "validated"
    BLOCKED = "blocked"


PROMOTION_STATES = tuple(Promotion)


class Encoding(StrEnum):
    TAGGED_ARRAY = "tagged-array"
    TAGGED_MAP = "tagged-map"


class ReplayFraming(StrEnum):
    """``seq``: replies [b"", seq, payload], end [b"", END, b""].
    ``topic-seq``: replies [b"", topic, seq, payload], end [b"", b"", END, b""]."""

    SEQ = "seq"
    TOPIC_SEQ = "topic-seq"


# SGLang's page-hash chain (cacheon.kv.hashing). What each contract's releases do beyond the plain
# chain is declared below (salt, wide ids); EAGLE bigram keys are declared by none (docs/sglang-hashing-facts.md).
HASH_BINDING = "sglang-page-sha256-v1"


class SaltedIds(StrEnum):
    """What a salted request's (``cache_salt``) pages are published as.

    ``unsalted``: the plain chain, though the engine keeps them in a namespace of their own (the pin:
    the salt is in the radix key, not in the hash), so no id tells a salted page from a plain one.
    ``seeded``: the chain starts from ``hashing.salt_seed(salt)`` (0.5.18 and later).
    """

    UNSALTED = "unsalted"
    SEEDED = "seeded"


@dataclass(frozen=True)
class WireContract:
    """One wire shape: which releases speak it and exactly what a payload may contain."""

    id: str
    versions: tuple[str, ...]
    batch: type[EventBatch]
    replay_framing: ReplayFraming
    hash_binding: str
    # Whether page_hashes was checked bit-exact against this contract's own SGLang code
    # (tests/sglang). 0.5.18+ hash in a C++ extension built at run time, not checked here.
    hash_checked: bool
    promotion: Promotion
    summary: str
    salted_ids: SaltedIds
    # Releases that hash a page holding an id past u32 wide (0xff || u64 LE) and publish such ids;
    # the others fail the request instead. Cacheon indexes wide pages but never predicts one.
    wide_token_versions: tuple[str, ...] = ()
    # Releases whose real servers (on CPU, tests/engines) published exactly the ids page_hashes
    # predicts, plain and salted, at page 1 and 16; their captures are the conformance kit
    # (tests/fixtures/engines), replayed in the fast suite.
    engine_proven: tuple[str, ...] = ()

    @property
    def stored(self) -> type[BlockStored]:
        """This contract's BlockStored class."""
        return next(t for t in event_types(self.batch) if issubclass(t, BlockStored))

    @property
    def encoding(self) -> Encoding:
        return Encoding.TAGGED_ARRAY if self.stored.__struct_config__.array_like else Encoding.TAGGED_MAP

    @property
    def stored_optional(self) -> tuple[str, ...]:
        """Optional BlockStored fields beyond the required five (block_hashes, parent_block_hash,
        token_ids, block_size, lora_id); for tagged arrays, in wire order after them."""
        return field_names(self.stored)[1]

    def describe(self) -> dict[str, object]:
        """JSON-ready form for ``cacheon kv contracts --json``."""
        return {
            "id": self.id,
            "versions": list(self.versions),
            "encoding": self.encoding,
            "replay_framing": self.replay_framing,
            "stored_optional": list(self.stored_optional),
            "removed_optional": list(field_names(BlockRemoved)[1]),
            "hash_binding": self.hash_binding,
            "hash_checked": self.hash_checked,
            "promotion": self.promotion,
            "salted_ids": self.salted_ids,
            "wide_token_versions": list(self.wide_token_versions),
            "engine_proven": list(self.engine_proven),
            "summary": self.summary,
        }


CONTRACTS: tuple[WireContract, ...] = (
    WireContract(
        id="sglang-kv-rank-v1",
        versions=("0.5.13.post1",),
        batch=BatchV1,
        replay_framing=ReplayFraming.SEQ,
        hash_binding=HASH_BINDING,
        hash_checked=True,
        promotion=Promotion.CANDIDATE,
        summary="tagged arrays, one BlockStored per page; per-rank ports base+rank",
        salted_ids=SaltedIds.UNSALTED,
        engine_proven=("0.5.13.post1",),
    ),
    WireContract(
        id="sglang-kv-rank-v2",
        versions=("0.5.18", "0.5.19"),
        batch=BatchV2,
        replay_framing=ReplayFraming.SEQ,
        hash_binding=HASH_BINDING,
        hash_checked=False,
        promotion=Promotion.CANDIDATE,
        summary="tagged arrays; salted stores append a {cache_salt} map; pages coalesce per event",
        salted_ids=SaltedIds.SEEDED,
        engine_proven=("0.5.19",),
    ),
    WireContract(
        id="sglang-kv-rank-v3",
        versions=("0.5.20", "0.5.21"),
        batch=BatchV3,
        replay_framing=ReplayFraming.SEQ,
        hash_binding=HASH_BINDING,
        hash_checked=False,
        promotion=Promotion.CANDIDATE,
        summary="tagged maps {type, ...}; nil optional fields omitted",
        salted_ids=SaltedIds.SEEDED,
    ),
    WireContract(
        id="sglang-kv-rank-v4",
        versions=("0.5.22", "0.5.23"),
        batch=BatchV4,
        replay_framing=ReplayFraming.TOPIC_SEQ,
        hash_binding=HASH_BINDING,
        hash_checked=False,
        promotion=Promotion.CANDIDATE,
        summary="tagged maps + lora_name; replay replies carry the topic frame",
        salted_ids=SaltedIds.SEEDED,
        wide_token_versions=("0.5.23",),
        engine_proven=("0.5.23",),
    ),
)

# Every release the interop matrix runs; scripts/install_sglang_releases.sh reads this.
INTEROP_RELEASES: tuple[str, ...] = tuple(v for c in CONTRACTS for v in c.versions)


def promoted(validated: set[str]) -> tuple[WireContract, ...]:
    """The registry with ledger evidence applied: a contract with a real-engine pass under an
    identity it covers (``validated``, computed by the evidence ledger) is promoted; a blocked
    contract stays blocked whatever the evidence says."""
    return tuple(
        replace(c, promotion=Promotion.VALIDATED) if c.id in validated and c.promotion != Promotion.BLOCKED else c
        for c in CONTRACTS
    )


def by_id(contract_id: str) -> WireContract:
    """The contract named ``contract_id``; an unknown id is a usage error."""
    for contract in CONTRACTS:
        if contract.id == contract_id:
            return contract
    known = ", ".join(c.id for c in CONTRACTS)
    raise UsageError(f"unknown KV-event contract {contract_id!r} (known: {known})")


def for_version(version: str) -> WireContract:
    """The contract covering exactly this SGLang version; anything else fails closed."""
    for contract in CONTRACTS:
        if version in contract.versions:
            return contract
    raise UsageError(
        f"no KV-event contract covers SGLang {version!r} (covered: {', '.join(INTEROP_RELEASES)}); "
        "capture its wire and add a contract rather than guessing"
    )
