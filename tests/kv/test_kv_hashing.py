"""Properties of the block-hash chain (bit-exactness with SGLang lives in tests/sglang)."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cacheon.kv.hashing import page_hashes

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
