"""The gateway's plane consumer against a real server, no relay: what lands on a worker's subjects is checked."""

from __future__ import annotations

import asyncio
import threading
import time

import msgspec
from nats.js.object_store import ObjectStore

from cacheon.fleet import consumer as consumer_module
from cacheon.fleet import subjects
from cacheon.fleet.consumer import PlaneConsumer
from cacheon.fleet.envelope import Envelope, Heartbeat, Kind, RankBlocks, RankCursor, Snapshot, envelope_encoder
from cacheon.fleet.plane import connect
from cacheon.fleet.relay import ensure_stream
from cacheon.kv.contracts import for_version
from cacheon.kv.index import BlockIndex
from cacheon.kv.wire import WireBounds
from cacheon.sim.launch import wait_until
from tests.fleet.test_replica import _payload

PIN = for_version("0.5.13.post1")
A = "worker-a"


async def _publish(url: str, stream: str, items: list[tuple[str, bytes]]) -> None:
    plane = await connect(url, "test")
    try:
        await ensure_stream(plane, stream, 60, 60)
        for subject, data in items:
            if subject.startswith(stream + "."):
                await plane.js.publish(subject, data)
            else:
                await plane.nc.publish(subject, data)
        await plane.nc.flush()
    finally:
        await plane.close()


def test_only_this_workers_well_formed_envelopes_reach_the_index(nats_shared, plane_names) -> None:
    stream = plane_names["stream"]
    asyncio.run(_publish(nats_shared.url, stream, []))  # the stream exists before the consumer follows
    index: BlockIndex[tuple[str, int]] = BlockIndex()
    consumer = PlaneConsumer(nats_shared.url, stream, plane_names["snapshot_bucket"], staleness_s=0.5)
    try:
        feed = consumer.follow(A, "w0", PIN, 1, index, lambda d: None, WireBounds())
        wait_until(lambda: feed.subscribed, "the consumer to follow", 10)
        assert feed.stale(time.time())  # nothing heard yet: not routed to
        on_a = subjects.batches(stream, A, 0)
        reset = Envelope(Kind.RESET, A, 0, "r", PIN.id)
        asyncio.run(_publish(nats_shared.url, stream, [
            (on_a, envelope_encoder.encode(reset)),
            (on_a, envelope_encoder.encode(Envelope(Kind.BATCH, A, 0, "r", PIN.id, epoch=1, seq=0,
                                                    payloads=(_payload(11, 12),)))),
            (on_a, envelope_encoder.encode(Envelope(Kind.BATCH, "worker-b", 0, "r", PIN.id, epoch=1, seq=1,
                                                    payloads=(_payload(99),)))),  # another worker's, on A's subject
            (on_a, b"\x93not an envelope"),
        ]))
        wait_until(lambda: consumer.malformed == 2, f"both refused: {consumer.malformed}", 10)
        assert index.held(("w0", 0)) == {11, 12} and not feed.stale(time.time())
        time.sleep(0.7)
        assert feed.stale(time.time())  # quiet past staleness_s
        beat = msgspec.msgpack.encode(Heartbeat(A, "r", time.time()))
        asyncio.run(_publish(nats_shared.url, stream, [(subjects.heartbeat(stream, A), beat)]))
        wait_until(lambda: not feed.stale(time.time()), "the heartbeat to count", 5)
        assert consumer.status()["stale_workers"] == []
    finally:
        consumer.close()


def test_a_worker_added_while_the_plane_connects_is_followed_once_connected(nats_shared, plane_names,
                                                                             monkeypatch) -> None:
    """A starting gateway registers its workers while its plane connection is still opening: each is followed
    as soon as it is up, not a retry period later (a restarted replica waited up to 0.5 s so)."""
    stream = plane_names["stream"]
    asyncio.run(_publish(nats_shared.url, stream, []))
    gate = threading.Event()

    async def held(url: str, name: str) -> object:
        await asyncio.to_thread(gate.wait, 10)
        return await connect(url, name)

    monkeypatch.setattr(consumer_module, "connect", held)
    monkeypatch.setattr(consumer_module, "RETRY_S", 60.0)  # a wait by retry periods would outlast the test
    consumer = PlaneConsumer(nats_shared.url, stream, plane_names["snapshot_bucket"], staleness_s=5)
    try:
        feed = consumer.follow(A, "w0", PIN, 1, BlockIndex(), lambda d: None, WireBounds())
        time.sleep(0.2)
        assert consumer.plane is None and not feed.subscribed  # the worker came first
        gate.set()
        wait_until(lambda: feed.subscribed, "the worker followed once the plane connected", 10)
    finally:
        consumer.close()


def _snapshot(stream_seq: int, blocks: list[int]) -> bytes:
    return msgspec.msgpack.encode(Snapshot(A, PIN.id, stream_seq, [RankBlocks(0, RankCursor(1, len(blocks)), blocks)]))


async def _put_snapshot(url: str, stream: str, bucket: str, data: bytes) -> None:
    plane = await connect(url, "test")
    try:
        await ensure_stream(plane, stream, 60, 60)
        store = await plane.js.create_object_store(bucket)
        await store.put(subjects.token(A), data)
    finally:
        await plane.close()


def test_a_snapshot_replaced_while_it_is_read_is_read_again(nats_shared, plane_names, monkeypatch) -> None:
    """A relay rewrites each snapshot every ``snapshot_interval_s`` and purges the old object's chunks: a replica
    that had just read the old object's description waited for those chunks forever, and never followed the
    worker (2 of 72 restarts in ``benchmarks/fleet_restart.py``). The read is bounded; the next finds the new one."""
    stream, bucket = plane_names["stream"], plane_names["snapshot_bucket"]
    asyncio.run(_put_snapshot(nats_shared.url, stream, bucket, _snapshot(1, [11])))
    real = ObjectStore.get_info
    replaced: list[bool] = []

    async def racing(self: ObjectStore, name: str, *args: object, **kwargs: object) -> object:
        info = await real(self, name, *args, **kwargs)
        if not replaced:  # the relay's next snapshot lands between the description and the chunks
            replaced.append(True)
            await self.put(name, _snapshot(2, [11, 12]))
        return info

    monkeypatch.setattr(ObjectStore, "get_info", racing)
    monkeypatch.setattr(consumer_module, "SNAPSHOT_TIMEOUT_S", 1.0)
    index: BlockIndex[tuple[str, int]] = BlockIndex()
    consumer = PlaneConsumer(nats_shared.url, stream, bucket, staleness_s=5)
    try:
        feed = consumer.follow(A, "w0", PIN, 1, index, lambda d: None, WireBounds())
        wait_until(lambda: feed.subscribed, "the worker followed from the new snapshot", 15)
        assert replaced and feed.snapshot_seq == 2 and index.held(("w0", 0)) == {11, 12}
    finally:
        consumer.close()
