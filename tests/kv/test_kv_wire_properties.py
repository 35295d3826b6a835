"""Property tests: random and mutated payloads never escape as anything but a typed reject.
(That a rejected batch never changes the index is driven through the feed in test_kv_feed.py.)"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheon.kv.contracts import CONTRACTS
from cacheon.kv.events import event_types
from cacheon.kv.wire import REJECT_REASONS, DecodedBatch, WireDecoder, WireReject

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
