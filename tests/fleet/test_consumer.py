"""The gateway's plane consumer against a real server, no relay: what lands on a worker's subjects is checked."""

from __future__ import annotations

import asyncio
import time

import msgspec

from cacheon.fleet import subjects
from cacheon.fleet.consumer import PlaneConsumer
from cacheon.fleet.envelope import Envelope, Heartbeat, Kind, envelope_encoder
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


