"""Decoders against the committed fixtures (each release's real encoding) and hand-made rejects."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import msgspec
import pytest

from cacheon.kv.contracts import CONTRACTS, INTEROP_RELEASES, by_id, for_version
from cacheon.kv.wire import (
    DECODE_ERROR,
    RANK_MISMATCH,
    SCHEMA_MISMATCH,
    WireDecoder,
    WireReject,
    event_json,
    operations,
)
from tests.interop.kv_interop import expected_json

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "kv_wire.json").read_text())
DECODERS = {c.id: WireDecoder(c) for c in CONTRACTS}
CASES = [(v, name) for v in INTEROP_RELEASES for name in FIXTURES[v]]
enc = msgspec.msgpack.encode


def payload(version: str, name: str) -> tuple[bytes, int, list[dict]]:
    case = FIXTURES[version][name]
    return base64.b64decode(case["payload"]), case["rank"], case["events"]


def optional_fields_used(version: str, events: list[dict]) -> set[str]:
    """The contract-level optional fields a fixture's BlockStored events use."""
    arrays = for_version(version).encoding == "tagged-array"
    used = set()
    for e in events:
        for k in ("cache_salt", "session_id", "lora_name"):
            if e.get(k) is not None:
                used.add("metadata" if arrays and k == "cache_salt" else k)
    return used


def test_every_release_has_fixtures() -> None:
    assert set(FIXTURES) == set(INTEROP_RELEASES)


@pytest.mark.parametrize(("version", "name"), CASES)
def test_decodes_exactly_under_its_contract(version: str, name: str) -> None:
    data, rank, events = payload(version, name)
    batch = DECODERS[for_version(version).id].decode(data, rank)
    assert batch.rank == rank
    assert [event_json(e) for e in batch.events] == [expected_json(e) for e in events]


@pytest.mark.parametrize(("version", "name"), CASES)
def test_other_contracts_accept_only_what_they_declare(version: str, name: str) -> None:
    data, rank, events = payload(version, name)
    own = for_version(version)
    for contract in CONTRACTS:
        compatible = contract.encoding == own.encoding and optional_fields_used(version, events) <= set(
            contract.stored_optional
        )
        # A batch without events has no encoding: every contract accepts it.
        if compatible or not events:
            DECODERS[contract.id].decode(data, rank)
        else:
            with pytest.raises(WireReject) as rejected:
                DECODERS[contract.id].decode(data, rank)
            assert rejected.value.reason == SCHEMA_MISMATCH, rejected.value.detail


@pytest.mark.parametrize("version", INTEROP_RELEASES)
def test_rank_must_match_the_socket(version: str) -> None:
    data, rank, _ = payload(version, "mixed")
    with pytest.raises(WireReject) as rejected:
        DECODERS[for_version(version).id].decode(data, rank + 1)
    assert rejected.value.reason == RANK_MISMATCH


ARRAY_STORED = ["BlockStored", [1], None, [5], 1, None, "GPU"]
MAP_STORED = {
    "type": "BlockStored",
    "block_hashes": [1],
    "parent_block_hash": None,
    "token_ids": [5],
    "block_size": 1,
    "lora_id": None,
}
REJECTS = [
    # (contract, payload bytes, reason)
    ("sglang-kv-rank-v1", b"", DECODE_ERROR),
    ("sglang-kv-rank-v1", b"\xc1", DECODE_ERROR),
    ("sglang-kv-rank-v1", enc([1.0, [ARRAY_STORED], 0])[:-3], DECODE_ERROR),  # truncated
    ("sglang-kv-rank-v1", enc([1.0, [ARRAY_STORED], 0]) + b"\x00", DECODE_ERROR),  # trailing bytes
    ("sglang-kv-rank-v1", enc([1.0, [["BlockStored", ["1"], None, [5], 1, None]], 0]), DECODE_ERROR),
    ("sglang-kv-rank-v1", enc([1.0, [["BlockStored", [2**64 - 1], None, [5], 1, None]], 0]), DECODE_ERROR),
    ("sglang-kv-rank-v1", enc([1.0, [["BlockStored", [1], None, [2**32], 1, None]], 0]), DECODE_ERROR),
    ("sglang-kv-rank-v1", enc([1.0, [["BlockStored", [1], None, [-1], 1, None]], 0]), DECODE_ERROR),
    ("sglang-kv-rank-v1", enc([1.0, [["BlockStored", [1], None, [5], 0, None]], 0]), DECODE_ERROR),
    # EAGLE bigram stores put token pairs in token_ids, which SGLang's own type does not declare.
    ("sglang-kv-rank-v1", enc([1.0, [["BlockStored", [1], None, [[5, 6]], 1, None, "GPU"]], 0]), DECODE_ERROR),
    ("sglang-kv-rank-v1", enc(["now", [], 0]), DECODE_ERROR),
    ("sglang-kv-rank-v1", enc([1.0, [ARRAY_STORED], "0"]), DECODE_ERROR),
    ("sglang-kv-rank-v1", enc([1.0, "events", 0]), DECODE_ERROR),
    ("sglang-kv-rank-v1", enc([1.0, [ARRAY_STORED], None]), RANK_MISMATCH),
    ("sglang-kv-rank-v1", enc({"ts": 1.0, "events": [], "attn_dp_rank": 0}), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v1", enc([1.0, [ARRAY_STORED], 0, "extra"]), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v1", enc([1.0, [["BlockEvicted", [1]]], 0]), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v1", enc([1.0, [[7, [1]]], 0]), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v1", enc([1.0, [[*ARRAY_STORED, {"cache_salt": "s"}]], 0]), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v1", enc([1.0, [["BlockStored", [1], None, [5], 1]], 0]), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v1", enc([1.0, [["AllBlocksCleared", None]], 0]), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v1", enc([1.0, [MAP_STORED], 0]), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v2", enc([1.0, [[*ARRAY_STORED, {"cache_salt": "s", "tenant": 1}]], 0]), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v2", enc([1.0, [[*ARRAY_STORED, {}]], 0]), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v2", enc([1.0, [[*ARRAY_STORED, {"cache_salt": 5}]], 0]), DECODE_ERROR),
    ("sglang-kv-rank-v3", enc([1.0, [ARRAY_STORED], 0]), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v3", enc([1.0, [{**MAP_STORED, "lora_name": "x"}], 0]), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v3", enc([1.0, [{**MAP_STORED, "type": "BlockMoved"}], 0]), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v3", enc([1.0, [{k: v for k, v in MAP_STORED.items() if k != "lora_id"}], 0]), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v3", enc([1.0, [{k: v for k, v in MAP_STORED.items() if k != "type"}], 0]), SCHEMA_MISMATCH),
    ("sglang-kv-rank-v3", enc([1.0, [{**MAP_STORED, "block_hashes": "1"}], 0]), DECODE_ERROR),
    ("sglang-kv-rank-v4", enc([1.0, [{**MAP_STORED, "medium": 3}], 0]), DECODE_ERROR),
    ("sglang-kv-rank-v4", enc([1.0, [{"type": "AllBlocksCleared", "medium": "GPU"}], 0]), SCHEMA_MISMATCH),
]


@pytest.mark.parametrize(("contract_id", "data", "reason"), REJECTS)
def test_rejects_carry_the_right_reason(contract_id: str, data: bytes, reason: str) -> None:
    with pytest.raises(WireReject) as rejected:
        DECODERS[contract_id].decode(data, 0)
    assert rejected.value.reason == reason, rejected.value.detail


def test_one_bad_event_rejects_the_whole_batch() -> None:
    good = [ARRAY_STORED] * 50
    data = enc([1.0, [*good, ["BlockStored", [1], None, [5], 1, "not-a-lora-id"], *good], 0])
    with pytest.raises(WireReject):
        DECODERS["sglang-kv-rank-v1"].decode(data, 0)


def test_operations_merge_runs_and_skip_host_tiers() -> None:
    data, rank, _ = payload("0.5.13.post1", "mixed")
    decoder = DECODERS["sglang-kv-rank-v1"]
    ops, skipped = operations(decoder.decode(data, rank).events)
    assert ops == [("remove", [1], None), ("store", [2], None), ("clear", [], None), ("store", [3, 4], 2),
                   ("remove", [4], None)]
    assert skipped == 0
    data, rank, _ = payload("0.5.23", "host_tier")
    decoder = DECODERS["sglang-kv-rank-v4"]
    assert operations(decoder.decode(data, rank).events) == ([], 2)
    many = enc([1.0, [ARRAY_STORED, ["BlockStored", [2], 1, [6], 1, None, "GPU"], ["BlockRemoved", [3]]], 0])
    assert operations(DECODERS["sglang-kv-rank-v1"].decode(many, 0).events) == (
        [("store", [1, 2], None), ("remove", [3], None)],  # page 2 continues page 1: one run
        0,
    )


def test_unknown_contract_id_is_a_usage_error() -> None:
    with pytest.raises(Exception, match="unknown KV-event contract"):
        by_id("sglang-kv-rank-v9")


def test_wide_token_ids_decode_only_where_a_release_publishes_them() -> None:
    """0.5.23 hashes a page holding an id past u32 wide and publishes the id as it is; Cacheon indexes
    the page (its id is the engine's) but never predicts one, since no vocabulary reaches u32."""
    wide = {**MAP_STORED, "token_ids": [2**40]}
    decoder = DECODERS["sglang-kv-rank-v4"]
    assert "0.5.23" in decoder.contract.wide_token_versions
    assert operations(decoder.decode(enc([1.0, [wide], 0]), 0).events) == ([("store", [1], None)], 0)
    for contract_id, data in (("sglang-kv-rank-v3", enc([1.0, [wide], 0])),  # control: u32 before 0.5.22
                              ("sglang-kv-rank-v4", enc([1.0, [{**wide, "token_ids": [2**63]}], 0]))):
        with pytest.raises(WireReject) as rejected:
            DECODERS[contract_id].decode(data, 0)
        assert rejected.value.reason == DECODE_ERROR
