"""The registry of SGLang KV-event wire contracts: one exact, versioned entry per wire shape.

Every fact here was measured on the release wheels' own ``kv_events`` module (see
docs/kv-events.md). A version outside every contract is an error, never "the closest" one:
a decoder that mostly understands a payload routes silently wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cacheon.errors import UsageError

# Promotion states, weakest first. Only evidence from a real engine promotes to `validated`;
# contracts backed by fixtures and the releases' own publisher code stay `candidate`.
PROMOTION_STATES = ("observed", "candidate", "validated", "blocked")

ENCODINGS = ("tagged-array", "tagged-map")
# `seq`: replies [b"", seq, payload], end [b"", END, b""].
# `topic-seq`: replies [b"", topic, seq, payload], end [b"", b"", END, b""].
REPLAY_FRAMINGS = ("seq", "topic-seq")

# SGLang's unsalted page-hash chain (cacheon.gateway.hashing). Salted, adapter-namespaced
# and EAGLE bigram stores publish other ids, which a gateway indexes but cannot predict.
HASH_BINDING = "sglang-page-sha256-v1"


@dataclass(frozen=True)
class WireContract:
    """One wire shape: which releases speak it and exactly what a payload may contain."""

    id: str
    versions: tuple[str, ...]
    encoding: str
    replay_framing: str
    # Optional BlockStored fields beyond the required five (block_hashes, parent_block_hash,
    # token_ids, block_size, lora_id); for tagged arrays, in wire order after them.
    stored_optional: tuple[str, ...]
    hash_binding: str
    # Whether page_hashes was checked bit-exact against this contract's own SGLang code
    # (tests/sglang). 0.5.18+ hash in a C++ extension built at run time, not checked here.
    hash_checked: bool
    promotion: str
    summary: str

    def __post_init__(self) -> None:
        for value, allowed in (
            (self.encoding, ENCODINGS),
            (self.replay_framing, REPLAY_FRAMINGS),
            (self.promotion, PROMOTION_STATES),
        ):
            if value not in allowed:
                raise ValueError(f"contract {self.id}: {value!r} is not one of {allowed}")

    def describe(self) -> dict[str, object]:
        """JSON-ready form for ``cacheon kv contracts --json``."""
        return {
            "id": self.id,
            "versions": list(self.versions),
            "encoding": self.encoding,
            "replay_framing": self.replay_framing,
            "stored_optional": list(self.stored_optional),
            "removed_optional": ["medium"],
            "hash_binding": self.hash_binding,
            "hash_checked": self.hash_checked,
            "promotion": self.promotion,
            "summary": self.summary,
        }


CONTRACTS: tuple[WireContract, ...] = (
    WireContract(
        id="sglang-kv-rank-v1",
        versions=("0.5.13.post1",),
        encoding="tagged-array",
        replay_framing="seq",
        stored_optional=("medium",),
        hash_binding=HASH_BINDING,
        hash_checked=True,
        promotion="candidate",
        summary="tagged arrays, one BlockStored per page; per-rank ports base+rank",
    ),
    WireContract(
        id="sglang-kv-rank-v2",
        versions=("0.5.18", "0.5.19"),
        encoding="tagged-array",
        replay_framing="seq",
        stored_optional=("medium", "metadata"),
        hash_binding=HASH_BINDING,
        hash_checked=False,
        promotion="candidate",
        summary="tagged arrays; salted stores append a {cache_salt} map; pages coalesce per event",
    ),
    WireContract(
        id="sglang-kv-rank-v3",
        versions=("0.5.20", "0.5.21"),
        encoding="tagged-map",
        replay_framing="seq",
        stored_optional=("medium", "cache_salt", "session_id"),
        hash_binding=HASH_BINDING,
        hash_checked=False,
        promotion="candidate",
        summary="tagged maps {type, ...}; nil optional fields omitted",
    ),
    WireContract(
        id="sglang-kv-rank-v4",
        versions=("0.5.22", "0.5.23"),
        encoding="tagged-map",
        replay_framing="topic-seq",
        stored_optional=("medium", "cache_salt", "session_id", "lora_name"),
        hash_binding=HASH_BINDING,
        hash_checked=False,
        promotion="candidate",
        summary="tagged maps + lora_name; replay replies carry the topic frame",
    ),
)

# Every release the interop matrix runs; scripts/install_sglang_releases.sh reads this.
INTEROP_RELEASES: tuple[str, ...] = tuple(v for c in CONTRACTS for v in c.versions)


def promoted(validated: set[str]) -> tuple[WireContract, ...]:
    """The registry with ledger evidence applied: a contract with a real-engine pass under an
    identity it covers (``validated``, computed by the evidence ledger) is promoted; a blocked
    contract stays blocked whatever the evidence says."""
    return tuple(
        replace(c, promotion="validated") if c.id in validated and c.promotion != "blocked" else c
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
