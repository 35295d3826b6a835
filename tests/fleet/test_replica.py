"""The replica applier shared by relays and gateways: epochs, gaps, duplicates, a zombie relay, snapshots.

No server here: envelopes are built as a relay builds them and applied in the order a stream holds them.
"""

from __future__ import annotations

import msgspec
import pytest

from cacheon.fleet import subjects
from cacheon.fleet.envelope import Envelope, Kind, snapshot_decoder
from cacheon.fleet.relay import GROUP_BYTES, envelope_groups
from cacheon.fleet.replica import WorkerReplica
from cacheon.kv.contracts import for_version
from cacheon.kv.feed import Delivery
from cacheon.kv.index import BlockIndex
from cacheon.kv.wire import WireDecoder

PIN = for_version("0.5.13.post1")
W = "http://10.0.0.7:30000"


def _payload(*hashes: int, parent: int | None = None, rank: int = 0) -> bytes:
    """The pin's wire: one BlockStored per page (page size 1), chained."""
    events, prev = [], parent
    for h in hashes:
        events.append(["BlockStored", [h], prev, [h % 1000], 1, None, None])
        prev = h
    return msgspec.msgpack.encode([1.0, events, rank])


def _reset(rank: int = 0) -> Envelope:
    return Envelope(Kind.RESET, W, rank, "r1", PIN.id, reason="relay_start")


def _batch(epoch: int, seq: int, *hashes: int, parent: int | None = None, relay: str = "r1") -> Envelope:
    return Envelope(Kind.BATCH, W, 0, relay, PIN.id, epoch=epoch, seq=seq,
                    payloads=(_payload(*hashes, parent=parent),))


def _replica() -> tuple[WorkerReplica, BlockIndex[tuple[str, int]]]:
    index: BlockIndex[tuple[str, int]] = BlockIndex()
    return WorkerReplica(W, PIN, index, source_id="w0"), index


def test_batches_of_an_epoch_apply_in_order_and_redeliveries_are_skipped() -> None:
    rep, index = _replica()
    rep.apply(_reset(), 1)
    rep.apply(_batch(1, 0, 11, 12), 2)
    rep.apply(_batch(1, 1, 13, parent=12), 3)
    rep.apply(_batch(1, 1, 13, parent=12), 3)  # the same stream message again
    rep.apply(_batch(1, 1, 13, parent=12), 4)  # the same batch republished past the duplicate window
    assert index.held(("w0", 0)) == {11, 12, 13}
    assert rep.duplicates == 2 and rep.counters.gaps == 0 and rep.counters.batches == 2


def test_an_envelope_of_several_batches_applies_as_they_would_one_by_one() -> None:
    """Batches 0..2 in one envelope and then 2..3 in another (a relay that regrouped a republish): each batch at its
    own publisher sequence, the repeat skipped as a duplicate, none taken as a gap."""
    rep, index = _replica()
    one, alone = _replica()
    payloads = [_payload(11, 12), _payload(13, parent=12), _payload(14, parent=13), _payload(15, parent=14)]
    rep.apply(_reset(), 1), one.apply(_reset(), 1)
    rep.apply(Envelope(Kind.BATCH, W, 0, "r1", PIN.id, epoch=1, seq=0, payloads=tuple(payloads[:3])), 2)
    rep.apply(Envelope(Kind.BATCH, W, 0, "r1", PIN.id, epoch=1, seq=2, payloads=tuple(payloads[2:])), 3)
    for seq, p in enumerate(payloads):
        one.apply(Envelope(Kind.BATCH, W, 0, "r1", PIN.id, epoch=1, seq=seq, payloads=(p,)), seq + 2)
    assert index.held(("w0", 0)) == alone.held(("w0", 0)) == {11, 12, 13, 14, 15}
    assert rep.counters.batches == one.counters.batches == 4 and rep.duplicates == 1 and rep.counters.gaps == 0
    assert rep.cursors[0].last == one.cursors[0].last == 3


def test_a_lost_envelope_clears_the_rank_instead_of_trusting_it() -> None:
    rep, index = _replica()
    rep.apply(_reset(), 1)
    rep.apply(_batch(1, 0, 11), 2)
    rep.apply(_batch(1, 2, 31), 4)  # seq 1 (a removal, say) is not in the stream any more
    assert index.held(("w0", 0)) == {31} and rep.counters.gaps == 1


def test_joining_mid_epoch_without_its_reset_starts_from_nothing() -> None:
    rep, index = _replica()
    rep.apply(_batch(5, 7, 71), 9)  # the reset at 5 aged out and there is no snapshot
    assert index.held(("w0", 0)) == {71} and rep.counters.gaps == 1


def test_a_new_epoch_clears_and_an_older_epochs_batch_is_ignored() -> None:
    rep, index = _replica()
    rep.apply(_reset(), 1)
    rep.apply(_batch(1, 0, 11), 2)
    rep.apply(_reset(), 3)  # another relay took the worker over: epoch 3
    rep.apply(_batch(3, 0, 21), 4)
    rep.apply(_batch(1, 1, 12, parent=11, relay="zombie"), 5)  # the old relay, still publishing
    assert index.held(("w0", 0)) == {21} and rep.stale_epochs == 1


def test_a_batch_under_another_contract_is_refused_whole() -> None:
    rep, index = _replica()
    rep.apply(_reset(), 1)
    rep.apply(msgspec.structs.replace(_batch(1, 0, 11), contract=for_version("0.5.23").id), 2)
    assert index.held(("w0", 0)) == set() and rep.counters.rejects["schema_mismatch"] == 1


def test_an_envelope_for_a_rank_the_worker_does_not_have_is_refused() -> None:
    index: BlockIndex[tuple[str, int]] = BlockIndex()
    rep = WorkerReplica(W, PIN, index, source_id="w0", dp_size=1)
    for n, rank in enumerate((3, -1)):
        rep.apply(msgspec.structs.replace(_reset(), rank=rank), 2 * n + 1)
        rep.apply(Envelope(Kind.BATCH, W, rank, "r1", PIN.id, epoch=2 * n + 1, seq=0,
                           payloads=(_payload(41, rank=rank),)), 2 * n + 2)
    assert index.sources() == 0 and rep.counters.rejects["rank_mismatch"] == 4


def test_a_snapshot_rebuilds_the_same_index_and_cursor() -> None:
    rep, index = _replica()
    rep.apply(_reset(), 1)
    rep.apply(_batch(1, 0, 11, 12, 13), 2)
    snap = snapshot_decoder.decode(msgspec.msgpack.encode(rep.snapshot(index)))
    other, other_index = _replica()
    other.load(snap)
    assert other_index.held(("w0", 0)) == {11, 12, 13} and other.stream_seq == 2
    other.apply(_batch(1, 1, 14, parent=13), 3)  # continues the epoch: no gap
    assert other.counters.gaps == 0 and other_index.held(("w0", 0)) == {11, 12, 13, 14}


def test_worker_tokens_are_subject_safe_and_distinct() -> None:
    names = ["http://10.0.0.7:30000", "http://10.0.0.7:30001", "a.b", "a_b", "a b", "ü/*>"]
    tokens = [subjects.token(n) for n in names]
    assert len(set(tokens)) == len(names)
    assert all(t.replace("_", "").replace("-", "").isalnum() and t.isascii() for t in tokens)
    assert subjects.batches("KV", "a.b", 3).count(".") == 2


def test_the_relays_replica_applies_what_its_feed_decoded_as_a_gateway_decodes_it() -> None:
    decoder = WireDecoder(PIN)
    envs = [_reset(), _batch(1, 0, 11, 12), _batch(1, 1, 13, parent=12)]
    (relayed, relayed_index), (gateway, gateway_index) = _replica(), _replica()
    for seq, env in enumerate(envs, 1):
        relayed.apply(env, seq, [decoder.decode(env.payloads[0], 0)] if env.kind is Kind.BATCH else None)
        gateway.apply(env, seq)
    assert relayed_index.held(("w0", 0)) == gateway_index.held(("w0", 0)) == {11, 12, 13}
    assert relayed.counters == gateway.counters
    # The contract is still checked: a batch relayed under another is refused whatever was decoded.
    other = msgspec.structs.replace(_batch(1, 2, 14, parent=13), contract=for_version("0.5.23").id)
    relayed.apply(other, 4, [decoder.decode(other.payloads[0], 0)])
    assert 14 not in relayed_index.held(("w0", 0)) and sum(relayed.counters.rejects.values()) == 1


def test_a_relay_groups_only_consecutive_batches_of_one_rank_within_the_size_bound() -> None:
    def d(rank: int, seq: int, size: int = 10) -> Delivery:
        return Delivery((W, rank), seq, None, None, False, b"x" * size)

    run = [d(0, 5), d(0, 6), d(0, 7), d(1, 8), d(1, 9), d(0, 8), d(0, 10), d(0, 11, GROUP_BYTES - 10), d(0, 12),
           d(0, 13, GROUP_BYTES + 1), d(0, 14)]
    assert [[(x.source[1], x.seq) for x in g] for g in envelope_groups(run)] == [
        [(0, 5), (0, 6), (0, 7)], [(1, 8), (1, 9)], [(0, 8)],  # another rank, then back: three envelopes
        [(0, 10), (0, 11)],  # seq 9 was refused: the hole starts an envelope
        [(0, 12)], [(0, 13)], [(0, 14)]]  # past the byte bound: a new one; a batch larger than it goes alone


def test_a_snapshot_with_a_block_id_outside_int64_does_not_decode() -> None:
    """Block ids are int64 on the wire and in a snapshot alike: a snapshot claiming another is malformed (the
    consumer counts it and replays the stream instead), never handed to the index."""
    snap = {"worker": W, "contract": PIN.id, "stream_seq": 5,
            "ranks": [{"rank": 0, "cursor": {"epoch": 1, "last": 0}, "blocks": [1, 2, 2**64 - 1]}]}
    with pytest.raises(msgspec.ValidationError, match="blocks"):
        snapshot_decoder.decode(msgspec.msgpack.encode(snap))
