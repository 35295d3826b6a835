"""The contract registry: exact versions, fail closed, honest promotion states."""

from __future__ import annotations

import pytest

from cacheon.errors import UsageError
from cacheon.kv.contracts import CONTRACTS, INTEROP_RELEASES, PROMOTION_STATES, by_id, for_version


def test_matrix_releases_resolve_to_their_contract() -> None:
    expected = {
        "0.5.13.post1": "sglang-kv-rank-v1",
        "0.5.18": "sglang-kv-rank-v2",
        "0.5.19": "sglang-kv-rank-v2",
        "0.5.20": "sglang-kv-rank-v3",
        "0.5.21": "sglang-kv-rank-v3",
        "0.5.22": "sglang-kv-rank-v4",
        "0.5.23": "sglang-kv-rank-v4",
    }
    assert {v: for_version(v).id for v in INTEROP_RELEASES} == expected


@pytest.mark.parametrize("version", ["0.5.13", "0.5.14", "0.5.17", "0.5.18.post1", "0.5.24", "0.5.23 ", "", "v0.5.23"])
def test_other_versions_fail_closed(version: str) -> None:
    with pytest.raises(UsageError, match="no KV-event contract covers"):
        for_version(version)


def test_each_version_has_one_contract_and_ids_are_unique() -> None:
    assert len(INTEROP_RELEASES) == len(set(INTEROP_RELEASES))
    assert len({c.id for c in CONTRACTS}) == len(CONTRACTS)
    assert all(by_id(c.id) is c for c in CONTRACTS)


def test_nothing_is_validated_without_engine_evidence() -> None:
    assert {c.promotion for c in CONTRACTS} <= set(PROMOTION_STATES) - {"validated"}


def test_measured_wire_facts() -> None:
    assert [c.encoding for c in CONTRACTS] == ["tagged-array", "tagged-array", "tagged-map", "tagged-map"]
    assert [c.replay_framing for c in CONTRACTS] == ["seq", "seq", "seq", "topic-seq"]
    assert "lora_name" in by_id("sglang-kv-rank-v4").stored_optional
    assert "lora_name" not in by_id("sglang-kv-rank-v3").stored_optional
    assert "metadata" in by_id("sglang-kv-rank-v2").stored_optional


def test_only_the_pins_hash_binding_is_claimed_checked() -> None:
    from cacheon.runtime.pin import SGLANG_PIN

    assert [c.id for c in CONTRACTS if c.hash_checked] == [for_version(SGLANG_PIN).id]
