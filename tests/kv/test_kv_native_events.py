"""The per-event pass in C (``cacheon.kv._events``) against plain Python spellings of the same rules:
the token-array form (the regular expression it replaced), the bounds, and ``reference_operations``.
(That whole payloads are judged as a decoder building every token judges them is
test_kv_wire_properties.py's.)"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheon.kv import _events
from cacheon.kv.contracts import CONTRACTS
from cacheon.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, event_types
from cacheon.kv.wire import WireBounds, operations, reference_operations

PROFILE = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The form the wire took as usual before the pass moved to C: an array header, then u32 encodings.
USUAL = re.compile(rb"(?:[\x90-\x9f]|\xdc..|\xdd....)(?:[\x00-\x7f]|\xcc.|\xcd..|\xce....)*", re.DOTALL)
HEADS = [b"", b"\x90", b"\x9f", b"\xdc", b"\xdc\x00", b"\xdc\x01\x00", b"\xdd\x00\x00\x00", b"\xdd\xff\xff\xff\xff",
         b"\x80", b"\xc0"]
ELEMENTS = [b"\x00", b"\x7f", b"\xcc\xff", b"\xcd\x01\x02", b"\xce\x01\x02\x03\x04", b"\xcf" + bytes(8), b"\xd0\x01",
            b"\xcc", b"\xce\x01", b"\xff", b"\xc2"]


def header_count(raw: bytes) -> int:
    if raw[:1] and 0x90 <= raw[0] <= 0x9F:
        return raw[0] & 0x0F
    if len(raw) >= 3 and raw[0] == 0xDC:
        return int.from_bytes(raw[1:3], "big")
    if len(raw) >= 5 and raw[0] == 0xDD:
        return int.from_bytes(raw[1:5], "big")
    return -1


@PROFILE
@given(st.sampled_from(HEADS) | st.binary(max_size=6), st.lists(st.sampled_from(ELEMENTS) | st.binary(max_size=3),
                                                             max_size=12))
def test_the_token_array_form_is_the_regular_expressions(head: bytes, elements: list[bytes]) -> None:
    raw = head + b"".join(elements)
    assert _events.token_array(msgspec.Raw(raw)) == (header_count(raw), USUAL.fullmatch(raw) is not None)


def test_every_u32_writers_use_is_usual_and_nothing_wider() -> None:
    for value in (0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1):
        raw = msgspec.msgpack.encode([value, value])
        assert _events.token_array(msgspec.Raw(raw)) == (2, True), value
    for odd in (2**32, -1, 1.5, "1", None, [1]):
        assert _events.token_array(msgspec.Raw(msgspec.msgpack.encode([1, odd])))[1] is False, odd
    assert _events.token_array(msgspec.Raw(msgspec.msgpack.encode(list(range(70_000))))) == (70_000, True)


ALL_KINDS = [t for c in CONTRACTS for t in event_types(c.batch)]
IDS = st.integers(-4, 4) | st.integers(-(2**63), 2**63 - 1)
MEDIA = st.sampled_from([None, "GPU", "CPU", "DISK", "gpu"])


@st.composite
def events(draw: Any, kinds: list[type]) -> list[Any]:
    """Events of one contract: runs that continue the previous store or not, removals, clears, other media."""
    out: list[Any] = []
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(kinds))
        if issubclass(kind, AllBlocksCleared):
            out.append(kind())
            continue
        hashes = draw(st.lists(IDS, max_size=4))
        medium = draw(MEDIA)
        if issubclass(kind, BlockStored):
            last = next((e.block_hashes[-1] for e in reversed(out) if isinstance(e, BlockStored) and e.block_hashes),
                        None)
            parent = draw(st.sampled_from([last, None]) | IDS)
            tokens = msgspec.Raw(msgspec.msgpack.encode(draw(st.lists(st.integers(0, 2**32 - 1), max_size=20))))
            fields = {"block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
                      "block_size": draw(st.integers(1, 2048)), "lora_id": None, "medium": medium}
            out.append(kind(**{k: v for k, v in fields.items() if k in kind.__struct_fields__}))
        else:
            out.append(kind(block_hashes=hashes, medium=medium))
    return out


def by_contract() -> Any:
    return st.sampled_from(CONTRACTS).flatmap(lambda c: st.tuples(st.just(c), events(event_types(c.batch))))


@PROFILE
@given(by_contract())
def test_operations_are_the_references(case: tuple[Any, list[Any]]) -> None:
    _, batch = case
    assert operations(batch) == reference_operations(batch)


def past_bounds(batch: list[Any], stored: type, b: WireBounds) -> bool:
    """The bounds spelled plainly, per event."""
    for ev in batch:
        if type(ev) is stored:
            if ev.block_size > b.max_block_size or header_count(bytes(ev.token_ids)) > b.max_tokens:
                return True
            if len(ev.block_hashes) > b.max_pages:
                return True
        elif isinstance(ev, BlockRemoved) and len(ev.block_hashes) > b.max_pages:
            return True
    return False


@PROFILE
@given(by_contract(), st.integers(1, 2048), st.integers(0, 21), st.integers(1, 5))
def test_the_scan_flags_a_batch_past_its_bounds_as_the_rules_say(case: tuple[Any, list[Any]], block_size: int,
                                                                 tokens: int, pages: int) -> None:
    contract, batch = case
    b = WireBounds(max_block_size=block_size, max_tokens=max(tokens, 1), max_pages=pages)
    flags = _events.scan(batch, contract.stored, b.max_block_size, b.max_tokens, b.max_pages)
    assert bool(flags & _events.PAST_BOUNDS) == past_bounds(batch, contract.stored, b)
    assert not flags & _events.UNUSUAL_TOKENS  # every token list here is u32s as msgspec writes them


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda t: t.__name__)
def test_an_event_kind_first_seen_is_classified_by_the_reference_rule(kind: type) -> None:
    if issubclass(kind, AllBlocksCleared):
        batch = [kind()]
    elif issubclass(kind, BlockStored):
        fields = {"block_hashes": [1], "parent_block_hash": None, "token_ids": msgspec.Raw(b"\x90"),
                  "block_size": 1, "lora_id": None}
        batch = [kind(**{k: v for k, v in fields.items() if k in kind.__struct_fields__})]
    else:
        batch = [kind(block_hashes=[1])]
    assert operations(batch) == reference_operations(batch)
