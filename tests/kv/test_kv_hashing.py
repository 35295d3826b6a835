"""Properties of the block-hash chain (bit-exactness with SGLang lives in tests/sglang)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cacheon.kv.contracts import CONTRACTS, SaltedIds, WireContract
from cacheon.kv.hashing import SALT_SEED_TAG, page_hashes, salt_seed
from cacheon.sim.releases import default_dir
from cacheon.tokens.chains import ChainCache, Tokens

TOKENS = st.lists(st.integers(0, 2**32 - 1), max_size=80)


@given(TOKENS, st.integers(1, 9))
def test_chain_is_prefix_stable_and_ignores_partial_pages(tokens: list[int], page: int) -> None:
    chain = page_hashes(tokens, page)
    assert len(chain) == len(tokens) // page
    for k in range(len(chain) + 1):
        assert page_hashes(tokens[: k * page], page) == chain[:k]
    assert page_hashes([*tokens, 1] * 1, page)[: len(chain)] == chain
    assert all(-(2**63) <= h < 2**63 for h in chain)


def test_first_page_is_sha256_of_le_u32_tokens() -> None:
    digest = hashlib.sha256((1).to_bytes(4, "little") + (2).to_bytes(4, "little")).digest()
    assert page_hashes([1, 2], 2) == [int.from_bytes(digest[:8], "big", signed=True)]


def test_position_matters() -> None:
    assert page_hashes([5, 5], 1)[0] != page_hashes([5, 5], 1)[1]


@pytest.mark.parametrize("tokens", [[-1], [2**32], [1.5], ["7"], [None]])
def test_bad_tokens(tokens: list) -> None:
    with pytest.raises(ValueError):
        page_hashes(tokens, 1)


def test_bad_page_size() -> None:
    with pytest.raises(ValueError):
        page_hashes([1], 0)


def test_a_salted_chain_starts_from_the_seed_and_differs_from_the_plain_one() -> None:
    seed = salt_seed("tenant-a")
    assert seed == hashlib.sha256(b"sglang-cache-salt-v1\0tenant-a").digest()
    tokens = list(range(12))
    salted = page_hashes(tokens, 4, seed)
    first = hashlib.sha256(seed + b"".join(t.to_bytes(4, "little") for t in tokens[:4])).digest()
    assert salted[0] == int.from_bytes(first[:8], "big", signed=True)
    assert set(salted).isdisjoint(page_hashes(tokens, 4))  # control: the seed is what keeps tenants apart
    assert ChainCache().chain(Tokens([tuple(tokens[:5]), tuple(tokens[5:])]), 4, seed) == salted


@pytest.mark.parametrize("contract", CONTRACTS, ids=lambda c: c.id)
def test_the_salt_seed_is_declared_exactly_where_the_releases_source_applies_it(contract: WireContract) -> None:
    """From each release's own ``mem_cache/utils.py`` (unpacked under .sglang/): the seed's tag is
    there from 0.5.18 on, and absent at the pin, which publishes salted pages under plain ids."""
    for version in contract.versions:
        source = default_dir() / version / "sglang" / "srt" / "mem_cache" / "utils.py"
        seeded = SALT_SEED_TAG[:-1].decode() + "\\0" in source.read_text(encoding="utf-8")  # as the source spells it
        assert seeded == (contract.salted_ids is SaltedIds.SEEDED), version
