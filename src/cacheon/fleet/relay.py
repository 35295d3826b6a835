"""``cacheon kv relay``: follow workers' ZMQ publishers and publish each accepted batch to JetStream.

Each worker is followed by exactly the gateway's ingest (``Subscriber``: same contracts, strict
decode, replay on gap) in a thread of its own; its accepted batches and its clears go, in order,
to one publisher task that writes them to ``<stream>.<worker token>.<rank>`` and waits for the
stream's acknowledgement (retrying with the same message id across a server restart: the
duplicate window makes that idempotent). What was acknowledged is applied to the relay's own
replica of the worker's index (``WorkerReplica``, the code a gateway runs), and that replica is
what the periodic snapshots write: each covers exactly the stream sequence it names.

Ownership: a JetStream KV bucket ``<stream>-leases`` with a TTL holds one key per worker, the
relay that follows it. A relay creates a free key (an atomic create), renews its own with a
revision check, and stops following a worker whose key it could not renew; a dead relay's keys
expire and another relay's next round takes them. Every relay may list every worker: the leases
spread them. A relay starting to follow a worker opens a new epoch per rank (a reset) before its
first batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.js.api import StorageType, StreamConfig
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

from cacheon.aio import Outbox
from cacheon.fleet import subjects
from cacheon.fleet.envelope import Envelope, Heartbeat, Kind, envelope_encoder
from cacheon.fleet.plane import Plane, connect
from cacheon.fleet.replica import WorkerReplica
from cacheon.kv.contracts import WireContract
from cacheon.kv.feed import Delivery, Source
from cacheon.kv.index import BlockIndex
from cacheon.kv.subscriber import Subscriber
from cacheon.kv.wire import WireBounds

log = logging.getLogger("cacheon.fleet")
WINDOW = 256  # batches published before their acknowledgements are collected
GROUP_BYTES = 256 << 10  # payload bytes one envelope carries at most (nats-server refuses a message past 1 MiB)
ACK_TIMEOUT_S = 2.0
PUBLISH_ERRORS = (nats.errors.Error, nats.js.errors.Error, asyncio.TimeoutError, OSError)


@dataclass(frozen=True)
class Followed:
    """Where to subscribe to a worker (its discovered geometry), found by the relay's ``resolve``."""

    worker: str
    endpoint_base: str
    replay_base: str | None
    contract: WireContract
    dp_size: int


def default_relay_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class RelaySettings:
    url: str
    stream: str = "CACHEON_KV"
    snapshot_bucket: str = "cacheon-snapshots"
    relay_id: str = field(default_factory=default_relay_id)
    lease_s: float = 6.0
    heartbeat_s: float = 1.0
    snapshot_interval_s: float = 10.0
    retention_s: float = 3600.0  # the stream's max_age
    duplicate_window_s: float = 120.0
    bounds: WireBounds = field(default_factory=WireBounds)
    max_replay: int = 10_000


async def ensure_stream(plane: Plane, stream: str, retention_s: float, duplicate_window_s: float) -> None:
    """Create the KV stream if it is missing (an existing one is used as configured)."""
    try:
        await plane.js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        await plane.js.add_stream(StreamConfig(
            name=stream, subjects=subjects.stream_subjects(stream), max_age=retention_s,
            duplicate_window=min(duplicate_window_s, retention_s), storage=StorageType.FILE))


def _acked(ack: asyncio.Future[Any] | None) -> int | None:
    """The stream sequence an acknowledgement gave; None when none came in time or it failed (published again)."""
    if ack is None or not ack.done():
        if ack is not None:
            ack.cancel()
        return None
    if ack.cancelled() or isinstance(ack.exception(), PUBLISH_ERRORS):
        return None
    return int(ack.result().seq)


def envelope_groups(run: list[Delivery]) -> list[list[Delivery]]:
    """``run`` cut into envelopes: consecutive batches of one rank, each following the one before (a hole, which
    a rejected batch leaves, starts a new envelope, so a gateway sees it as a direct feed would), ``GROUP_BYTES``
    of payload at most (a larger batch goes alone)."""
    groups: list[list[Delivery]] = []
    size = 0
    for d in run:
        last = groups[-1][-1] if groups else None
        if (last is None or d.source != last.source or d.seq != last.seq + 1
                or size + len(d.payload) > GROUP_BYTES):
            groups.append([d])
            size = len(d.payload)
        else:
            groups[-1].append(d)
            size += len(d.payload)
    return groups


class _Follow:
    """One worker followed: its ZMQ thread, its ordered outbox, its publisher task and its replica."""

    def __init__(self, relay: Relay, found: Followed, loop: asyncio.AbstractEventLoop) -> None:
        self.relay, self.found = relay, found
        self.replica = WorkerReplica(found.worker, found.contract, relay.index, bounds=relay.settings.bounds)
        self.outbox: Outbox[tuple[Source, str] | Delivery] = Outbox(loop)
        self.epochs: dict[int, int] = {}
        self.published = 0  # batches and resets
        self.envelopes = 0  # batch envelopes (several batches each where they came together)
        self.resets = 0
        self.snapshot_at = 0
        for rank in range(found.dp_size):  # a new epoch before the first batch this relay publishes
            self.outbox.put(((found.worker, rank), "relay_start"))
        push = self.outbox.put
        self.subscriber = Subscriber(None, lambda d: push(d) if d.batch is not None else None,
                                     on_clear=lambda s, why: push((s, why)),
                                     bounds=relay.settings.bounds, max_replay=relay.settings.max_replay)
        self.subscriber.add_worker(found.worker, found.endpoint_base, found.contract, range(found.dp_size),
                                   replay_base=found.replay_base)
        self.thread = threading.Thread(target=self.subscriber.run, daemon=True, name=f"relay-{found.worker}")
        self.thread.start()
        self.task = asyncio.create_task(self._publish_loop())

    async def _publish_loop(self) -> None:
        """What the ZMQ thread handed over, in order: batches pipelined up to ``WINDOW`` at a time, each reset
        alone (the batches after it carry its stream sequence as their epoch)."""
        while True:
            run: list[Delivery] = []
            for item in await self.outbox.get():
                if not isinstance(item, Delivery):
                    await self._publish_run(run)
                    run = []
                    await self._publish_reset(*item)
                    continue
                run.append(item)
                if len(run) >= WINDOW:
                    await self._publish_run(run)
                    run = []
            await self._publish_run(run)

    async def _publish_reset(self, source: Source, why: str) -> None:
        s, rank = self.relay.settings, source[1]
        self.resets += 1
        env = Envelope(Kind.RESET, self.found.worker, rank, s.relay_id, self.found.contract.id, reason=why)
        seq = await self.relay.publish(subjects.batches(s.stream, self.found.worker, rank),
                                       envelope_encoder.encode(env), subjects.reset_id(self.found.worker, rank,
                                                                                       s.relay_id, self.resets))
        self.epochs[rank] = seq
        self.replica.apply(env, seq)
        self.published += 1

    async def _publish_run(self, run: list[Delivery]) -> None:
        """Publish without waiting for each acknowledgement, then collect them; one that fails or times out is
        published again alone (its id: the stream keeps one copy). Applied to the replica in stream order, as a
        gateway will see them (a retried one lands after the others: the gateway and the replica both see the gap)."""
        if not run:
            return
        s, worker = self.relay.settings, self.found.worker
        sent = []
        for group in envelope_groups(run):
            rank, first = group[0].source[1], group[0].seq
            env = Envelope(Kind.BATCH, worker, rank, s.relay_id, self.found.contract.id, epoch=self.epochs[rank],
                           seq=first, payloads=tuple(d.payload for d in group))
            subject, data = subjects.batches(s.stream, worker, rank), envelope_encoder.encode(env)
            msg_id = subjects.batch_id(worker, rank, env.epoch, first, group[-1].seq)
            ack: asyncio.Future[Any] | None = None
            assert self.relay.plane is not None
            with contextlib.suppress(*PUBLISH_ERRORS):
                ack = await self.relay.plane.js.publish_async(subject, data, stream=s.stream,
                                                              headers={"Nats-Msg-Id": msg_id})
            sent.append((group, env, subject, data, msg_id, ack))
        pending = [ack for *_, ack in sent if ack is not None]
        if pending:  # one timer for the window, not one per acknowledgement
            await asyncio.wait(pending, timeout=ACK_TIMEOUT_S)
        applied = []
        for group, env, subject, data, msg_id, ack in sent:
            seq = _acked(ack)
            if seq is None:
                seq = await self.relay.publish(subject, data, msg_id)
            applied.append((seq, env, group))
        for seq, env, group in sorted(applied, key=lambda t: t[0]):
            self.replica.apply(env, seq, [d.batch for d in group])  # the feed decoded these very bytes: not twice
        self.published += len(run)
        self.envelopes += len(applied)

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.subscriber.stop()
        await asyncio.to_thread(self.thread.join, 5)
        self.subscriber.close()
        for rank in range(self.found.dp_size):
            self.relay.index.drop((self.found.worker, rank))


class Relay:
    """Follow the workers this relay holds leases for; ``resolve`` finds a worker's geometry (None: not now)."""

    def __init__(self, settings: RelaySettings, workers: list[str],
                 resolve: Callable[[str], Awaitable[Followed | None]]) -> None:
        self.settings, self.workers, self.resolve = settings, workers, resolve
        self.index: BlockIndex[Source] = BlockIndex()
        self.follows: dict[str, _Follow] = {}
        self.revisions: dict[str, int] = {}
        self.plane: Plane | None = None
        self.publish_retries = 0
        self._leases: KeyValue | None = None
        self._snapshots: ObjectStore | None = None
        self.last_status: dict[str, object] | None = None  # status() as the relay stopped

    async def start(self) -> None:
        s = self.settings
        self.plane = await connect(s.url, f"cacheon-relay-{s.relay_id}")
        await ensure_stream(self.plane, s.stream, s.retention_s, s.duplicate_window_s)
        self._leases = await self.plane.js.create_key_value(bucket=subjects.leases_bucket(s.stream), ttl=s.lease_s)
        self._snapshots = await self.plane.js.create_object_store(s.snapshot_bucket)

    async def run(self, stop: asyncio.Event) -> None:
        """Lease, heartbeat and snapshot rounds until ``stop``; then let the workers go."""
        await self.start()
        last_snapshot = time.monotonic()
        try:
            while not stop.is_set():
                await self.lease_round()
                await self.heartbeat()
                if time.monotonic() - last_snapshot >= self.settings.snapshot_interval_s:
                    last_snapshot = time.monotonic()
                    await self.snapshot_round()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), min(self.settings.heartbeat_s, self.settings.lease_s / 3))
        finally:
            await self.close()

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> int:
        """Publish until the stream acknowledges (the same id each time: one copy whatever the retries)."""
        assert self.plane is not None
        delay = 0.05
        while True:
            try:
                ack = await self.plane.js.publish(subject, payload, timeout=2.0, stream=self.settings.stream,
                                                  headers={"Nats-Msg-Id": msg_id})
                return int(ack.seq)
            except PUBLISH_ERRORS as exc:
                self.publish_retries += 1
                log.warning("relay publish retried", extra={"fields": {"subject": subject, "error": str(exc)[:200]}})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def lease_round(self) -> None:
        """Renew what this relay holds, drop what it lost, take what is free."""
        assert self._leases is not None and self.plane is not None
        me = self.settings.relay_id.encode()
        for worker in self.workers:
            key = subjects.token(worker)
            try:
                if worker in self.revisions:
                    self.revisions[worker] = await self._leases.update(key, me, last=self.revisions[worker])
                    continue
                found = await self.resolve(worker)
                if found is None:
                    continue
                self.revisions[worker] = await self._leases.create(key, me)
            except nats.js.errors.KeyWrongLastSequenceError:
                await self._release(worker, "lease held by another relay")
                continue
            except PUBLISH_ERRORS as exc:
                if worker in self.revisions and not self.plane.connected:
                    continue  # the plane is away: keep following, the lease is checked when it is back
                await self._release(worker, f"lease: {str(exc)[:200]}")
                continue
            log.info("relay follows worker", extra={"fields": {"worker": worker, "relay": self.settings.relay_id}})
            self.follows[worker] = _Follow(self, found, asyncio.get_running_loop())

    async def _release(self, worker: str, why: str) -> None:
        self.revisions.pop(worker, None)
        follow = self.follows.pop(worker, None)
        if follow is not None:
            log.warning("relay lets worker go", extra={"fields": {"worker": worker, "why": why}})
            await follow.close()

    async def heartbeat(self) -> None:
        assert self.plane is not None
        if not self.plane.connected:
            return
        for worker in self.follows:
            beat = Heartbeat(worker, self.settings.relay_id, time.time())
            with contextlib.suppress(*PUBLISH_ERRORS):
                await self.plane.nc.publish(subjects.heartbeat(self.settings.stream, worker),
                                            msgspec.msgpack.encode(beat))

    async def snapshot_round(self) -> None:
        """Write each followed worker's replica if it moved since its last snapshot."""
        assert self._snapshots is not None
        for worker, follow in list(self.follows.items()):
            replica = follow.replica
            if replica.stream_seq == follow.snapshot_at:
                continue
            snap = replica.snapshot(self.index)
            try:
                await self._snapshots.put(subjects.token(worker), msgspec.msgpack.encode(snap))
            except PUBLISH_ERRORS as exc:
                log.warning("snapshot not written", extra={"fields": {"worker": worker, "error": str(exc)[:200]}})
                continue
            follow.snapshot_at = snap.stream_seq

    def status(self) -> dict[str, object]:
        return {"relay": self.settings.relay_id, "connected": self.plane is not None and self.plane.connected,
                "publish_retries": self.publish_retries,
                "workers": {w: {"published": f.published, "envelopes": f.envelopes,
                                "stream_seq": f.replica.stream_seq,
                                "snapshot_seq": f.snapshot_at, "queued": len(f.outbox),
                                "ingest": f.subscriber.counters()} for w, f in sorted(self.follows.items())}}

    async def close(self) -> None:
        """Let every worker go and delete its lease, so another relay takes it on its next round, not after lease_s."""
        self.last_status = self.status()
        for worker in list(self.follows):
            revision = self.revisions.get(worker)
            await self._release(worker, "relay stopping")
            if self._leases is not None and revision is not None and self.plane is not None and self.plane.connected:
                with contextlib.suppress(*PUBLISH_ERRORS):
                    await self._leases.delete(subjects.token(worker), last=revision)
        if self.plane is not None:
            await self.plane.close()
