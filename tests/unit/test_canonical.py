"""cacheon.canonical is RFC 8785 (JCS): held byte for byte to the ``rfc8785`` library, the oracle."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheon.canonical import MAX_INTEGER, canonical_json

rfc8785 = pytest.importorskip("rfc8785")

# Every code point class JCS treats differently: C0 controls, DEL, BMP, private use near the top of the
# BMP (sorted after astral characters in UTF-16), astral characters, line separators.
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=8) | st.sampled_from(
    ["\ue000", "\uffff", "\U0001f600", "\x00", "\x1f", "\x7f", "\u2028", '"', "\\", "é"]
)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-MAX_INTEGER, MAX_INTEGER) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_canonical_bytes_are_rfc8785s(value: object) -> None:
    assert canonical_json(value) == rfc8785.dumps(value)


def test_key_order_is_utf16_not_code_points() -> None:
    """JCS sorts keys by UTF-16 code units: an astral character sorts before U+E000..U+FFFF. Control: the
    encoder before RFC 8785 (``json.dumps(sort_keys=True)``) sorted by code point: the other order."""
    value = {"\ue000": 1, "\U0001f600": 2}
    assert canonical_json(value) == rfc8785.dumps(value) == '{"\U0001f600":2,"\ue000":1}'.encode()
    assert json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() != canonical_json(value)


@pytest.mark.parametrize("value", [1.5, {"a": 0.0}, {1: 2}, MAX_INTEGER + 1, -(MAX_INTEGER + 1), {"a": "\udc00"}, b"x"])
def test_what_jcs_cannot_say_exactly_is_refused(value: object) -> None:
    with pytest.raises(TypeError):
        canonical_json(value)


def test_deep_values_are_a_type_error_not_a_crash() -> None:
    with pytest.raises(TypeError):
        canonical_json(_nested(5000))


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value
