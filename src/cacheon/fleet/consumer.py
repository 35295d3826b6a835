"""The gateway's side of the event plane: each worker's index from its snapshot and the stream after it.

One thread runs an event loop of its own with one NATS connection for all the gateway's workers
(the gateway's loop serves requests; this one applies events, as the direct ZMQ feeds' threads
do). Following a worker loads its latest snapshot, then an ordered consumer replays the stream
from the sequence after the snapshot's and stays live; a core subscription hears the relay's
heartbeats. After a reconnect every worker is followed again from the last sequence applied (the
replica skips what it already has). A worker heard from neither by events nor by heartbeats for
``staleness_s`` is *stale*: the gateway does not route to it until it is heard again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import ConsumerConfig, DeliverPolicy

from cacheon.aio import cancel_pending
from cacheon.fleet import subjects
from cacheon.fleet.envelope import Snapshot, envelope_decoder, heartbeat_decoder, snapshot_decoder
from cacheon.fleet.plane import Plane, connect
from cacheon.fleet.replica import WorkerReplica
from cacheon.kv.contracts import WireContract
from cacheon.kv.feed import Delivery, FeedCounters, Source
from cacheon.kv.index import PrefixIndex
from cacheon.kv.wire import WireBounds

log = logging.getLogger("cacheon.fleet")
ERRORS = (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError, OSError, msgspec.DecodeError)
RETRY_S = 0.5
# A snapshot's read, bounded: the relay rewrites each snapshot and purges the old object's chunks, so a read that
# began on the old object waits for chunks that are gone (nats-py's get has no bound); the next read finds the new.
SNAPSHOT_TIMEOUT_S = 5.0


class PlaneFeed:
    """One worker followed through the plane; the gateway reads it as it reads ``WorkerFeeds``."""

    def __init__(self, consumer: PlaneConsumer, replica: WorkerReplica, dp_size: int) -> None:
        self.consumer, self.replica, self.dp_size = consumer, replica, dp_size
        self.contract = replica.contract
        self.snapshot_seq: int | None = None  # the stream sequence of the snapshot loaded (None: none)
        self.subscribed = False
        self._subs: list[Subscription] = []
        self._closed = False

    def serves(self, contract: WireContract, dp_size: int) -> bool:
        return contract.id == self.contract.id and dp_size == self.dp_size

    def totals(self) -> FeedCounters:
        return self.replica.counters

    def alive(self) -> bool:
        return self.consumer.alive() and self.subscribed

    def lag_s(self) -> float | None:
        return self.replica.lag_s

    def last_seq(self) -> dict[int, int | None]:
        return {rank: c.last for rank, c in sorted(self.replica.cursors.items())}

    def stale(self, now: float) -> bool:
        """Not heard from (events or the relay's heartbeat) within the staleness bound."""
        heard = self.replica.heard
        return heard is None or now - heard > self.consumer.staleness_s

    def close(self) -> None:
        self._closed = True
        self.consumer.call(self._unsubscribe())
        for rank in range(self.dp_size):
            self.replica.index.drop((self.replica.source_id, rank))

    async def follow(self, plane: Plane) -> None:
        """(Re)subscribe from the sequence after the last applied; the snapshot first on first follow."""
        c = self.consumer
        await self._unsubscribe()
        if self.snapshot_seq is None and self.replica.stream_seq == 0:
            snap = await c.snapshot(plane, self.replica.worker)
            if snap is not None and snap.contract == self.contract.id:
                self.replica.load(snap)
                self.snapshot_seq = snap.stream_seq
        if self._closed:
            return
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                opt_start_seq=self.replica.stream_seq + 1)
        batches = await plane.js.subscribe(subjects.worker_filter(c.stream, self.replica.worker), stream=c.stream,
                                           cb=self._on_batch, ordered_consumer=True, config=config,
                                           idle_heartbeat=1.0)
        beats = await plane.nc.subscribe(subjects.heartbeat(c.stream, self.replica.worker), cb=self._on_beat)
        self._subs = [batches, beats]
        self.subscribed = True

    async def _unsubscribe(self) -> None:
        subs, self._subs, self.subscribed = self._subs, [], False
        for sub in subs:
            with contextlib.suppress(*ERRORS):
                await sub.unsubscribe()

    async def _on_batch(self, msg: Msg) -> None:
        try:
            env = envelope_decoder.decode(msg.data)
        except msgspec.DecodeError:
            self.consumer.malformed += 1
            return
        if env.worker != self.replica.worker:
            self.consumer.malformed += 1
            return
        self.replica.apply(env, msg.metadata.sequence.stream)

    async def _on_beat(self, msg: Msg) -> None:
        with contextlib.suppress(msgspec.DecodeError):
            if heartbeat_decoder.decode(msg.data).worker == self.replica.worker:
                self.replica.heartbeat()


class PlaneConsumer:
    """The gateway's connection to the event plane and the workers it follows there."""

    def __init__(self, url: str, stream: str, snapshot_bucket: str, staleness_s: float,
                 name: str = "cacheon-gateway") -> None:
        self.url, self.stream, self.snapshot_bucket, self.staleness_s, self.name = (
            url, stream, snapshot_bucket, staleness_s, name)
        self.plane: Plane | None = None
        self.feeds: list[PlaneFeed] = []
        self.malformed = 0  # envelopes that did not decode or named another worker
        self.snapshots_loaded = 0
        self._up = asyncio.Event()  # set once connected: a worker added before then waits on it, not by retry periods
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="kv-plane")
        self._thread.start()
        self._connected = self.call(self._connect())

    def call(self, coro: Coroutine[Any, Any, Any]) -> Future[Any]:
        """Run ``coro`` on the plane's loop (from any thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def connected(self) -> bool:
        return self.plane is not None and self.plane.connected

    def follow(self, worker: str, source_id: str, contract: WireContract, dp_size: int, index: PrefixIndex[Source],
               on_delivery: Callable[[Delivery], None], bounds: WireBounds) -> PlaneFeed:
        """Follow ``worker`` (its plane name) into ``index`` under ``source_id`` (the gateway's worker id)."""
        replica = WorkerReplica(worker, contract, index, bounds=bounds, on_delivery=on_delivery, source_id=source_id,
                                dp_size=dp_size)
        feed = PlaneFeed(self, replica, dp_size)
        self.call(self._add(feed))
        return feed

    async def _add(self, feed: PlaneFeed) -> None:
        self.feeds.append(feed)
        await self._up.wait()
        await self._follow(feed)

    async def _follow(self, feed: PlaneFeed) -> None:
        """Follow until it holds (the stream may not exist yet, the plane may be away)."""
        while not feed._closed and self.plane is not None:
            try:
                await feed.follow(self.plane)
                return
            except ERRORS as exc:
                log.warning("event plane: cannot follow worker yet", extra={"fields": {
                    "worker": feed.replica.worker, "error": str(exc)[:200]}})
                await asyncio.sleep(RETRY_S)

    async def _connect(self) -> None:
        while self.plane is None:
            try:
                plane = await connect(self.url, self.name)
            except ERRORS as exc:
                log.warning("event plane unreachable", extra={"fields": {"url": self.url, "error": str(exc)[:200]}})
                await asyncio.sleep(RETRY_S)
                continue
            plane.on_reconnected.append(self._refollow)
            self.plane = plane
            self._up.set()

    async def _refollow(self) -> None:
        self.feeds = [f for f in self.feeds if not f._closed]
        for feed in self.feeds:
            asyncio.get_running_loop().create_task(self._follow(feed))

    async def snapshot(self, plane: Plane, worker: str) -> Snapshot | None:
        """The worker's latest snapshot; None when there is none (yet) or it does not decode."""
        try:
            store = await plane.js.object_store(self.snapshot_bucket)
            got = await asyncio.wait_for(store.get(subjects.token(worker)), SNAPSHOT_TIMEOUT_S)
        except (nats.js.errors.NotFoundError, nats.js.errors.ObjectNotFoundError, nats.js.errors.BucketNotFoundError):
            return None
        try:
            snap = snapshot_decoder.decode(got.data or b"")
        except msgspec.DecodeError:
            self.malformed += 1
            return None
        if snap.worker != worker:
            self.malformed += 1
            return None
        self.snapshots_loaded += 1
        return snap

    def status(self, now: float | None = None) -> dict[str, object]:
        """For ``/readyz`` detail: connected, and the workers not heard from within the bound."""
        now = time.time() if now is None else now
        stale = sorted(f.replica.worker for f in self.feeds if not f._closed and f.stale(now))
        return {"url": self.url, "stream": self.stream, "connected": self.connected, "stale_workers": stale,
                "index_stale": not self.connected or bool(stale), "staleness_s": self.staleness_s,
                "snapshots_loaded": self.snapshots_loaded}

    def close(self) -> None:
        async def shutdown() -> None:
            for feed in self.feeds:
                await feed._unsubscribe()
            if self.plane is not None:
                await self.plane.close()

        with contextlib.suppress(Exception):
            self.call(shutdown()).result(5)
        with contextlib.suppress(Exception):  # what a plane that is down left running: cancelled, not destroyed
            self.call(cancel_pending()).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
