"""A hostile or broken publisher: frames found by mutating real ones must end as whole-batch rejects
with a reason, sequence jumps must not cost per missing number, and memory stays bounded."""

from __future__ import annotations

import base64
import json
import logging
import math
import threading
import tracemalloc
from pathlib import Path

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheon.kv.contracts import CONTRACTS, for_version
from cacheon.kv.feed import Feed
from cacheon.kv.index import BlockIndex
from cacheon.kv.replay import END_SEQ, ReplayClient, Replayed, ReplayStatus
from cacheon.kv.sequencer import Continuity, Sequencer
from cacheon.kv.wire import DECODE_ERROR, OUT_OF_BOUNDS, WireBounds, WireDecoder, WireReject

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "kv_wire.json").read_text())
PIN = "0.5.13.post1"
DECODERS = [WireDecoder(c) for c in CONTRACTS]
enc = msgspec.msgpack.encode
STORED = ["BlockStored", [1], None, [5, 6, 7, 8], 4, None, "GPU"]


def reject_of(decoder: WireDecoder, data: bytes) -> WireReject:
    with pytest.raises(WireReject) as rejected:
        decoder.decode(data, 0)
    return rejected.value


@pytest.mark.parametrize("depth", [10_000, 1_000_000])
def test_nesting_that_exhausts_recursion_is_a_decode_error(depth: int) -> None:
    """Found by mutation: msgspec raises RecursionError (not a DecodeError) on deep arrays."""
    for data in (b"\x91" * depth + b"\xc0", enc([1.0, []])[:-1] + b"\x91" * depth + b"\xc0"):
        for decoder in DECODERS:
            rejected = reject_of(decoder, data)
            assert rejected.reason == DECODE_ERROR, rejected.detail


@pytest.mark.parametrize(
    ("batch", "detail"),
    [
        ([math.nan, [STORED], 0], "timestamp nan is not finite"),
        ([math.inf, [], 0], "timestamp inf is not finite"),
        ([-math.inf, [], 0], "timestamp -inf is not finite"),
        ([1.0, [["BlockStored", [1], None, [5], 1 << 40, None, "GPU"]], 0], "block_size 1099511627776, bound 1024"),
        ([1.0, [["BlockStored", list(range(70_000)), None, [], 4, None, "GPU"]], 0], "70000 block ids, bound 65536"),
        ([1.0, [["BlockRemoved", list(range(70_000)), "GPU"]], 0], "BlockRemoved of 70000 block ids"),
        ([1.0, [["BlockStored", [1], None, [0] * 1_100_000, 4, None, "GPU"]], 0], "1100000 token ids, bound 1048576"),
        ([1.0, [["AllBlocksCleared"]] * 70_000, 0], "70000 events, bound 65536"),
    ],
)
def test_values_no_publisher_sends_are_out_of_bounds(batch: list, detail: str) -> None:
    rejected = reject_of(WireDecoder(for_version(PIN)), enc(batch))
    assert rejected.reason == OUT_OF_BOUNDS and detail in rejected.detail


def test_bounds_are_configured_and_the_payload_bound_comes_before_decoding() -> None:
    tight = WireDecoder(for_version(PIN), WireBounds(max_payload_bytes=64, max_block_size=4, max_tokens=4))
    assert tight.decode(enc([1.0, [STORED], 0]), 0).events[0].block_size == 4
    big = enc([1.0, [STORED] * 10, 0])
    assert "bytes, bound 64" in reject_of(tight, big).detail
    assert "block_size 8" in reject_of(tight, enc([1.0, [[*STORED[:4], 8, *STORED[5:]]], 0])).detail
    # Every real frame of every release decodes under the default bounds.
    for version, cases in FIXTURES.items():
        decoder = WireDecoder(for_version(version))
        for case in cases.values():
            decoder.decode(base64.b64decode(case["payload"]), case["rank"])


def test_a_claimed_huge_array_allocates_nothing_like_its_claim() -> None:
    """An array32 header claiming 4 billion events (or tokens) with a few bytes behind it."""
    claims = [b"\x93\xcb" + msgspec.msgpack.encode(1.0)[1:] + b"\xdd\xff\xff\xff\xff",
              enc([1.0, [["BlockStored", [1], None, []]]])[:-2] + b"\xdd\xff\xff\xff\xff\x01"]
    tracemalloc.start()
    try:
        for data in claims:
            for decoder in DECODERS:
                assert reject_of(decoder, data).reason in (DECODE_ERROR, "schema_mismatch")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


def test_a_jump_far_ahead_is_a_bounded_resync() -> None:
    seq = Sequencer(max_replay=100)
    seq.step(0)
    far = seq.step(2**63)  # a len(range) of this would overflow; a list of it would never end
    assert (far.continuity, far.clear, far.resync, far.must_fill) == (Continuity.GAP, True, True, False)
    assert far.hole == range(2**63 - 100, 2**63) and not far.unfilled(None)
    near = seq.step(2**63 + 50)  # within the bound: an ordinary gap, replayed whole
    assert (near.resync, near.clear, len(near.hole), near.must_fill) == (False, False, 49, True)
    first = Sequencer(max_replay=100).step(2**64 - 1)  # first contact far out: best effort, nothing to clear
    assert (first.clear, first.resync, len(first.hole)) == (False, False, 100)


def test_the_feed_resyncs_from_the_newest_batches_past_the_bound() -> None:
    stored = base64.b64decode(FIXTURES[PIN]["stored_page"]["payload"])  # stores block 11
    asked: list[range] = []

    class Router:
        def fetch(self, hole: range) -> Replayed:
            asked.append(hole)
            return Replayed(ReplayStatus.DONE, [(hole.stop - 1, stored)])

    index: BlockIndex[tuple[str, int]] = BlockIndex()
    feed = Feed(("w", 0), for_version(PIN), replayer=Router(), index=index, max_replay=1000)
    feed.on_live(0, stored)
    feed.on_live(10**15, stored)
    assert asked[-1] == range(10**15 - 1000, 10**15)
    c = feed.counters
    assert (c.gaps, c.resyncs, c.clears, c.replays, c.replay_failures) == (1, 1, 1, 1, 0)
    assert index.longest_prefix([11]) == {("w", 0): 1}  # cleared, then rebuilt from what came back


def test_a_router_repeating_itself_cannot_grow_a_replay() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = ReplayClient(ctx, f"tcp://127.0.0.1:{port}", for_version(PIN).replay_framing, b"",
                          max_frame_bytes=1 << 20, timeout_s=30)
    try:
        def answer() -> None:
            ident, _, _start = router.recv_multipart()
            for _ in range(500):  # under the sockets' default high-water mark (1000): none dropped
                router.send_multipart([ident, b"", (3).to_bytes(8, "big"), b"x"])
            router.send_multipart([ident, b"", END_SEQ, b""])

        t = threading.Thread(target=answer)
        t.start()
        got = client.fetch(range(2, 5))
        t.join(10)
    finally:
        client.close()
        router.close(linger=0)
        ctx.term()
    assert got.status is ReplayStatus.DONE and got.batches == [(3, b"x")]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A real frame with bytes flipped, inserted, deleted, or an array header blown up."""
    cases = [c for v in FIXTURES.values() for c in v.values()]
    data = bytearray(base64.b64decode(draw(st.sampled_from(cases))["payload"]))
    for _ in range(draw(st.integers(1, 6))):
        pos = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["flip", "insert", "delete", "nest", "grow"]))
        if action == "flip" and pos < len(data):
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif action == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete":
            del data[pos:pos + draw(st.integers(1, 8))]
        elif action == "nest":
            data[pos:pos] = b"\x91" * draw(st.integers(1, 200_000))
        else:
            data[pos:pos] = b"\xdd" + draw(st.binary(min_size=4, max_size=4))
    return bytes(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(mutated(), min_size=1, max_size=4))
def test_mutated_real_frames_through_a_feed_never_raise_nor_half_apply(frames: list[bytes]) -> None:
    for contract in CONTRACTS:
        index: BlockIndex[tuple[str, int]] = BlockIndex()
        feed = Feed(("w", 0), contract, index=index)
        for seq, frame in enumerate(frames):
            before, refused = index.held(("w", 0)), sum(feed.counters.rejects.values())
            feed.on_live(seq, frame)  # never raises
            assert sum(feed.counters.rejects.values()) + feed.counters.batches == seq + 1
            if sum(feed.counters.rejects.values()) > refused:
                assert index.held(("w", 0)) == before  # refused whole: the index never saw it


def test_gaps_resyncs_and_refusals_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    stored = base64.b64decode(FIXTURES[PIN]["stored_page"]["payload"])
    feed = Feed(("w", 0), for_version(PIN), index=BlockIndex(), max_replay=10)
    with caplog.at_level(logging.DEBUG, logger="cacheon.kv"):
        feed.on_live(3, stored)  # first contact: a slow-joiner hole, DEBUG
        feed.on_live(6, stored)  # a gap, no replay endpoint: cleared
        feed.on_live(1000, stored)  # past max_replay: a resync
        for seq in range(1001, 1012):
            feed.on_live(seq, b"\xc1")  # refused: logged the 1st and 10th time only
    events = [(r.levelno, r.fields["event"] if "event" in r.fields else r.fields["reason"])  # type: ignore[attr-defined]
              for r in caplog.records]
    assert events == [(logging.DEBUG, "first"), (logging.WARNING, "gap"), (logging.WARNING, "resync"),
                      (logging.WARNING, "decode_error"), (logging.WARNING, "decode_error")]
    gap = caplog.records[1].fields  # type: ignore[attr-defined]
    assert (gap["worker"], gap["seq"], gap["missing"], gap["replay"], gap["cleared"]) == ("w", 6, 2, "skipped", True)
