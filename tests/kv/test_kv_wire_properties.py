"""Property tests: random and mutated payloads never escape as anything but a typed reject.
(That a rejected batch never changes the index is driven through the feed in test_kv_feed.py.)"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheon.kv.contracts import CONTRACTS
from cacheon.kv.events import event_types, tag
from cacheon.kv.wire import REJECT_REASONS, DecodedBatch, WireDecoder, WireReject, typed_batch

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "kv_wire.json").read_text())
PAYLOADS = [base64.b64decode(c["payload"]) for cases in FIXTURES.values() for c in cases.values()]
DECODERS = [WireDecoder(c) for c in CONTRACTS]
PROFILE = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.binary(max_size=12)
    | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "type", "GPU", "medium"])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=8)
        | st.dictionaries(st.text(max_size=20) | st.integers(-(2**63), 2**63 - 1), inner, max_size=6)
    ),
    max_leaves=40,
)
# Batches shaped like SGLang's, with arbitrary events: the decoders' hardest inputs.
batches = st.tuples(values, st.lists(values, max_size=6), values).map(list)


def outcome(decoder: WireDecoder, data: bytes) -> DecodedBatch | WireReject:
    try:
        return decoder.decode(data, 0)
    except WireReject as reject:
        assert reject.reason in REJECT_REASONS
        return reject


def check_typed(decoder: WireDecoder, result: DecodedBatch | WireReject) -> None:
    if isinstance(result, DecodedBatch):
        kinds = event_types(decoder.contract.batch)
        assert all(isinstance(e, kinds) for e in result.events)


@PROFILE
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    for decoder in DECODERS:
        check_typed(decoder, outcome(decoder, data))


@PROFILE
@given(batches)
def test_random_msgpack_batches(batch: list) -> None:
    data = msgspec.msgpack.encode(batch)
    for decoder in DECODERS:
        check_typed(decoder, outcome(decoder, data))


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(PAYLOADS)))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if action == "flip" and pos < len(data):
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif action == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=3))
        elif action == "delete":
            del data[pos : pos + draw(st.integers(1, 3))]
        elif action == "truncate":
            del data[pos:]
    return bytes(data)


@PROFILE
@given(mutated())
def test_mutated_real_payloads(data: bytes) -> None:
    for decoder in DECODERS:
        check_typed(decoder, outcome(decoder, data))


# -- token ids: the fast path (raw bytes checked by a pattern) against a decoder building every token --

def _int(value: int, code: str) -> bytes:
    """``value`` in one msgpack int encoding, canonical or not (writers may use any that holds it)."""
    if code == "canonical":
        return msgspec.msgpack.encode(value)
    head, fmt = {"u8": (0xCC, ">B"), "u16": (0xCD, ">H"), "u32": (0xCE, ">I"), "u64": (0xCF, ">Q"),
                 "i8": (0xD0, ">b"), "i16": (0xD1, ">h"), "i32": (0xD2, ">i"), "i64": (0xD3, ">q")}[code]
    try:
        return bytes([head]) + struct.pack(fmt, value)
    except struct.error:
        return msgspec.msgpack.encode(value)


ENCODINGS = st.sampled_from(["canonical"] * 6 + ["u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64"])
EDGES = [0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1,
         -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]
valid_token = st.tuples(st.integers(0, 2**32 - 1) | st.sampled_from(EDGES[:8]), ENCODINGS)
# Any int, in any encoding that holds it (so often a valid one), or no int at all.
odd_token = (st.tuples(st.sampled_from(EDGES) | st.integers(-(2**63), 2**64 - 1), ENCODINGS)
             | st.tuples(st.sampled_from([1.5, True, None, "7", b"7", [5], {"a": 1}]), st.just("canonical")))


@st.composite
def token_array(draw: st.DrawFn) -> msgspec.Raw:
    """Valid tokens in any encoding, at most one odd token among them (so it is often the only fault)."""
    items = draw(st.lists(valid_token, max_size=8) if draw(st.booleans()) else
                 st.lists(valid_token, min_size=14, max_size=20))
    if draw(st.booleans()):
        items.insert(draw(st.integers(0, len(items))), draw(odd_token))
    body = b"".join(_int(v, code) if code != "canonical" else msgspec.msgpack.encode(v) for v, code in items)
    n = len(items)
    header = draw(st.sampled_from(["canonical", "a16", "a32"]) if n < 16 else st.sampled_from(["canonical", "a32"]))
    head = (msgspec.msgpack.encode([None] * n)[: 1 if n < 16 else 3] if header == "canonical"
            else b"\xdc" + struct.pack(">H", n) if header == "a16" else b"\xdd" + struct.pack(">I", n))
    if draw(st.integers(0, 9)) == 0:  # now and then not an array of the items at all
        return msgspec.Raw(draw(st.sampled_from([msgspec.msgpack.encode(7), msgspec.msgpack.encode("x"),
                                                 head + body + b"\x01", head[:1] + body])))
    return msgspec.Raw(head + body)


@st.composite
def stored_batches(draw: st.DrawFn) -> tuple[str, bytes]:
    contract = draw(st.sampled_from(CONTRACTS))
    arrays = contract.encoding == "tagged-array"
    events: list = []
    for i in range(draw(st.integers(0, 3))):
        tokens = draw(token_array())
        if arrays:
            events.append(["BlockStored", [i + 1], None, tokens, 1, None, "GPU"])
        else:
            events.append({"type": "BlockStored", "block_hashes": [i + 1], "parent_block_hash": None,
                           "token_ids": tokens, "block_size": 1, "lora_id": None, "medium": "GPU"})
        if draw(st.booleans()):
            events.append(["BlockRemoved", [i + 1], "GPU"] if arrays else
                          {"type": "BlockRemoved", "block_hashes": [i + 1], "medium": "GPU"})
    return contract.id, msgspec.msgpack.encode([1.0, events, draw(st.sampled_from([0, 0, 0, 1]))])


def reference(decoder: WireDecoder, data: bytes) -> tuple[str, object]:
    """What a decoder building every token says: the contract's types with typed token ids."""
    try:
        batch = msgspec.msgpack.decode(data, type=typed_batch(decoder.contract.batch))
    except msgspec.DecodeError as exc:
        reject = decoder._diagnose(data, exc)
        return "reject", (reject.reason, reject.detail)
    if batch.attn_dp_rank != 0:
        return "reject", ("rank_mismatch", None)
    return "accept", [(tag(type(e)), [getattr(e, f) for f in e.__struct_fields__]) for e in batch.events]


def fast(decoder: WireDecoder, data: bytes) -> tuple[str, object]:
    try:
        batch = decoder.decode(data, 0)
    except WireReject as reject:
        return "reject", (reject.reason, None if reject.reason == "rank_mismatch" else reject.detail)
    return "accept", [(tag(type(e)), [e.tokens() if f == "token_ids" else getattr(e, f) for f in e.__struct_fields__])
                      for e in batch.events]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stored_batches())
def test_raw_token_ids_are_accepted_and_rejected_exactly_as_typed_ones(case: tuple[str, bytes]) -> None:
    contract_id, data = case
    decoder = next(d for d in DECODERS if d.contract.id == contract_id)
    assert fast(decoder, data) == reference(decoder, data)


def _array(*items: bytes, header: bytes | None = None) -> msgspec.Raw:
    return msgspec.Raw((header if header is not None else bytes([0x90 + len(items)])) + b"".join(items))


# One token array per encoding class: every way a u32 can be written, and every near miss.
TOKEN_CASES = {
    **{f"5 as {code}": _array(_int(5, code)) for code in ("canonical", "u8", "u16", "u32", "u64", "i8", "i16",
                                                          "i32", "i64")},
    **{f"2**32-1 as {code}": _array(_int(2**32 - 1, code)) for code in ("canonical", "u64", "i64")},
    "empty": _array(),
    "array 16": _array(_int(7, "canonical"), header=b"\xdc\x00\x01"),
    "array 32": _array(_int(7, "canonical"), header=b"\xdd\x00\x00\x00\x01"),
    "-1 as fixint": _array(b"\xff"),
    **{f"-1 as {code}": _array(_int(-1, code)) for code in ("i8", "i16", "i32", "i64")},
    **{f"2**32 as {code}": _array(_int(2**32, code)) for code in ("u64", "i64")},
    "a float": _array(msgspec.msgpack.encode(5.0)),
    "a bool": _array(msgspec.msgpack.encode(True)),
    "nil": _array(msgspec.msgpack.encode(None)),
    "a string": _array(msgspec.msgpack.encode("7")),
    "bytes": _array(msgspec.msgpack.encode(b"7")),
    "a nested array": _array(msgspec.msgpack.encode([5])),
    "a map": msgspec.Raw(msgspec.msgpack.encode({"5": 5})),
    "not an array": msgspec.Raw(msgspec.msgpack.encode(5)),
}


@pytest.mark.parametrize("case", TOKEN_CASES)
def test_every_token_encoding_is_judged_as_the_typed_decoder_judges_it(case: str) -> None:
    for decoder in DECODERS:
        arrays = decoder.contract.encoding == "tagged-array"
        stored = (["BlockStored", [1], None, TOKEN_CASES[case], 1, None, "GPU"] if arrays else
                  {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                   "token_ids": TOKEN_CASES[case], "block_size": 1, "lora_id": None, "medium": "GPU"})
        data = msgspec.msgpack.encode([1.0, [stored], 0])
        assert fast(decoder, data) == reference(decoder, data), decoder.contract.id
