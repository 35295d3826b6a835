"""Shared in-flight load: each gateway replica publishes its routing decisions and their ends over
NATS core pub/sub, and counts the other replicas' requests in flight in its own cost model.

Core pub/sub, not JetStream: load is ephemeral. A request in flight matters for seconds, a
late replica needs only what is in flight now (it asks for it: ``hello``), and nothing should
be replayed after a restart. Each replica publishes batches on ``cacheon.load.<stream>.<replica>``
from one connection, so every peer gets them in order; that makes the heartbeat exact: it
carries the ids of the requests still in flight, and a peer drops any of that replica's entries
not in it (a lost end counts at most one heartbeat).

Staleness is bounded. A replica not heard from for ``expiry_s`` (it died, or its link did) loses
its entries at the next sweep (within ``expiry_s`` + ``heartbeat_s``); losing the plane drops
every remote entry at once, and the replica routes on its own load only, saying so in its log,
``/readyz`` detail and ``cacheon_fleet_load_plane_up``. The delay from a decision to a peer
applying it is measured on every batch (``cacheon_fleet_load_delay_seconds``; wall clocks, so
across hosts it includes their skew).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from cacheon.fleet.plane import servers

log = logging.getLogger("cacheon.fleet.load")
DELAY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RETRY_S = 1.0  # between attempts to reach a plane that was not there at start
DELAY_WEIGHT = 0.2  # of each batch in the moving average of the publish -> applied delay


class Routed(msgspec.Struct, tag="r", array_like=True, frozen=True):
    """A request a replica routed: its worker, its prompt's chain (the predicted prefix blocks), the
    prefill it costs there (uncached tokens) and its whole work (queued ahead of it + its own)."""

    seq: int  # the request's id within its replica
    worker: str
    chain: list[int]
    page: int
    uncached: int
    work: int


class Ended(msgspec.Struct, tag="e", array_like=True, frozen=True):
    seq: int


class Batch(msgspec.Struct, array_like=True, frozen=True):
    replica: str
    sent: float  # wall time of the batch's oldest event: the delay a peer measures is the worst in it
    events: list[Routed | Ended]
    live: list[int] | None = None  # a heartbeat: every request of the replica still in flight
    hello: bool = False  # the replica (re)joined: peers publish what they have in flight again


class Ticket(Protocol):
    """What a policy's in-flight entry tells the plane."""

    worker: str
    chain: list[int]
    page: int
    uncached: int
    work: int


T = TypeVar("T")
Make = Callable[[Routed, float], T]  # a peer's request as the policy's own kind of entry, routed at (monotonic)


class Plane(StrEnum):
    CONNECTING = "connecting"
    UP = "up"
    DOWN = "down"


class Dropped(StrEnum):
    """Why remote entries were dropped (``cacheon_fleet_load_dropped_total``)."""

    SILENT = "silent"  # their replica was not heard from within expiry_s
    RECONCILED = "reconciled"  # their replica's heartbeat no longer lists them (an end was lost)
    PLANE_LOST = "plane_lost"  # this replica lost the plane


@dataclass
class Peer(Generic[T]):
    heard: float  # monotonic
    entries: dict[int, tuple[str, T]] = field(default_factory=dict)  # seq -> (worker, entry)


class _Metrics:
    def __init__(self, registry: CollectorRegistry, share: LoadShare[Any]) -> None:
        self.up = Gauge("cacheon_fleet_load_plane_up", "1 while the event plane carries this replica's load "
                        "sharing; 0: it routes on its own load only", registry=registry)
        Gauge("cacheon_fleet_load_peers", "other replicas heard from within expiry_s",
              registry=registry).set_function(lambda: len(share.peers))
        Gauge("cacheon_fleet_load_remote_in_flight", "other replicas' requests in flight, as counted here",
              registry=registry).set_function(share.remote_in_flight)
        self.delay = Histogram("cacheon_fleet_load_delay_seconds", "from a peer's routing decision (or end) "
                               "to its application here (wall clocks)", buckets=DELAY_BUCKETS, registry=registry)
        self.dropped = Counter("cacheon_fleet_load_dropped_total", "remote requests dropped before their end "
                               "arrived, by why", ["reason"], registry=registry)
        self.rejected = Counter("cacheon_fleet_load_rejected_total", "load messages that did not decode",
                                registry=registry)


def replica_id() -> str:
    """Unique per process start: a restarted replica is a new peer; its old self expires."""
    return f"{socket.gethostname()[:32]}-{os.getpid()}-{os.urandom(3).hex()}"


class LoadShare(Generic[T]):
    """This replica's side of the shared load: publishes its tickets, keeps its peers' as ``T``.

    Its own connection, not ``plane.connect``'s: it must hear of a loss at once (its callbacks drop every
    remote entry), hear none of its own messages (``no_echo``) and find a dead link within the expiry
    (the ping interval)."""

    def __init__(self, url: str, stream: str, heartbeat_s: float, expiry_s: float, registry: CollectorRegistry,
                 make: Make[T], replica: str | None = None) -> None:
        self.servers = servers(url)
        self.subject = f"cacheon.load.{stream}"
        self.heartbeat_s, self.expiry_s, self.make = heartbeat_s, expiry_s, make
        self.replica = replica or replica_id()
        self.plane = Plane.CONNECTING
        self.peers: dict[str, Peer[T]] = {}
        self._by_worker: dict[str, dict[tuple[str, int], T]] = {}
        self._live: dict[Any, tuple[int, Routed]] = {}  # this replica's tickets in flight
        self._seq = 0
        self._outbox: list[Routed | Ended] = []
        self._first = 0.0  # wall time of the outbox's oldest event
        self._delay = 0.0  # moving average of the peers' batches' publish -> applied delay, seconds
        self._hello = self._resync = True
        self._wake = asyncio.Event()
        self._nc: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._encode = msgspec.msgpack.Encoder().encode
        self._decode = msgspec.msgpack.Decoder(Batch).decode
        self.metrics = _Metrics(registry, self)

    # -- the policy's side (sync, on the event loop) ----------------------------------------

    def routed(self, ticket: Ticket) -> None:
        self._seq += 1
        event = Routed(self._seq, ticket.worker, ticket.chain, ticket.page, ticket.uncached, ticket.work)
        self._live[ticket] = (self._seq, event)
        self._queue(event)

    def ended(self, ticket: Ticket) -> None:
        live = self._live.pop(ticket, None)
        if live is not None:
            self._queue(Ended(live[0]))

    def flying(self, worker: str) -> list[T]:
        """The other replicas' requests in flight on ``worker``."""
        entries = self._by_worker.get(worker)
        return list(entries.values()) if entries else []

    def staleness(self) -> tuple[int, float]:
        """(peers, delay): how many other replicas route beside this one, and how late their decisions
        arrive here (a moving average, seconds). Decisions they made within that delay are not counted
        yet; (0, 0.0) while the plane is not up: there is nothing to wait for."""
        if self.plane != Plane.UP or not self.peers:
            return 0, 0.0
        return len(self.peers), self._delay

    def remote_in_flight(self) -> int:
        return sum(len(entries) for entries in self._by_worker.values())

    def status(self) -> dict[str, Any]:
        return {"replica": self.replica, "plane": self.plane.value, "peers": len(self.peers),
                "remote_in_flight": self.remote_in_flight(),
                **({"note": "routing on this replica's own load only"} if self.plane != Plane.UP else {})}

    def _queue(self, event: Routed | Ended) -> None:
        if self.plane != Plane.UP:
            return  # nobody hears it; a reconnect publishes what is in flight again
        if not self._outbox:
            self._first = time.time()
            self._wake.set()
        self._outbox.append(event)

    # -- the plane's side ---------------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="fleet-load")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()

    async def _run(self) -> None:
        said = False
        while self._nc is None:
            try:
                self._nc = await nats.connect(
                    self.servers, name=f"cacheon-gateway {self.replica}", no_echo=True, connect_timeout=2,
                    reconnect_time_wait=0.5, max_reconnect_attempts=-1, ping_interval=max(1, round(self.expiry_s)),
                    max_outstanding_pings=2, allow_reconnect=True, disconnected_cb=self._lost,
                    reconnected_cb=self._back, error_cb=self._error)
            except Exception as exc:  # nats-py raises several kinds; any means not reachable
                if not said:
                    log.warning(f"event plane {','.join(self.servers)} unreachable ({type(exc).__name__}): routing "
                                "on this replica's own load only; retrying",
                                extra={"fields": {"replica": self.replica}})
                    self.plane, said = Plane.DOWN, True
                    self.metrics.up.set(0)
                await asyncio.sleep(RETRY_S)
        await self._nc.subscribe(f"{self.subject}.*", cb=self._on_batch)
        await self._nc.flush()  # the server has the subscription before this replica calls itself up
        await self._back()
        await self._send()

    async def _lost(self) -> None:
        if self.plane != Plane.UP or self._task is None:  # a failed reconnect attempt, or stopping
            return
        self.plane = Plane.DOWN
        self.metrics.up.set(0)
        self._drop(list(self.peers), Dropped.PLANE_LOST)
        log.warning("event plane lost: routing on this replica's own load only until it is back",
                    extra={"fields": {"replica": self.replica}})

    async def _back(self) -> None:
        self.plane = Plane.UP
        self.metrics.up.set(1)
        self._hello = self._resync = True
        self._wake.set()
        log.info(f"event plane up: sharing in-flight load on {self.subject}",
                 extra={"fields": {"replica": self.replica}})

    async def _error(self, exc: Exception) -> None:
        log.debug(f"event plane: {type(exc).__name__}: {exc}")

    async def _send(self) -> None:
        """One batch per wake-up (events queued since the last), a heartbeat every ``heartbeat_s``."""
        beat = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.heartbeat_s)
            self._wake.clear()
            now = time.monotonic()
            self._sweep(now)
            beating = now - beat >= self.heartbeat_s
            if self.plane != Plane.UP or not (self._outbox or beating or self._resync):
                continue
            events, self._outbox = self._outbox, []
            sent = self._first if events else time.time()
            resync, self._resync = self._resync, False
            if resync:  # everything in flight again (upserts): a peer joined, or this replica was away
                events, sent = [routed for _, routed in self._live.values()], time.time()
            live = [seq for seq, _ in self._live.values()] if beating or resync else None
            batch = Batch(self.replica, sent, events, live, self._hello)
            self._hello = False
            beat = now if beating else beat
            assert self._nc is not None
            with contextlib.suppress(Exception):  # the connection dropped meanwhile: _lost says so
                await self._nc.publish(f"{self.subject}.{self.replica}", self._encode(batch))

    async def _on_batch(self, msg: Msg) -> None:
        try:
            batch = self._decode(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.metrics.rejected.inc()
            return
        if batch.replica == self.replica or self.plane != Plane.UP:
            return
        now = time.monotonic()
        peer = self.peers.get(batch.replica)
        if peer is None:
            peer = self.peers[batch.replica] = Peer(now)
            if not batch.hello:  # a peer this replica had expired (it stalled) or missed: ask all for theirs
                self._hello = self._resync = True
                self._wake.set()
        peer.heard = now
        delay = max(0.0, time.time() - batch.sent)
        routed = now - min(delay, self.expiry_s)  # a peer's clock far behind must not age its requests more
        for event in batch.events:
            if isinstance(event, Routed):
                self._put(batch.replica, peer, event, routed)
            else:
                self._pop(batch.replica, peer, event.seq)
        if batch.live is not None:
            keep = set(batch.live)
            gone = [seq for seq in peer.entries if seq not in keep]
            for seq in gone:
                self._pop(batch.replica, peer, seq)
            if gone:
                self.metrics.dropped.labels(Dropped.RECONCILED).inc(len(gone))
        if batch.hello:
            self._resync = True
            self._wake.set()
        if batch.events:
            self.metrics.delay.observe(delay)
            self._delay += (min(delay, self.expiry_s) - self._delay) * DELAY_WEIGHT

    def _put(self, replica: str, peer: Peer[T], event: Routed, routed: float) -> None:
        self._pop(replica, peer, event.seq)  # a resync repeats entries: upsert
        entry = self.make(event, routed)
        peer.entries[event.seq] = (event.worker, entry)
        self._by_worker.setdefault(event.worker, {})[(replica, event.seq)] = entry

    def _pop(self, replica: str, peer: Peer[T], seq: int) -> None:
        found = peer.entries.pop(seq, None)
        if found is not None:
            entries = self._by_worker.get(found[0])
            if entries is not None:
                entries.pop((replica, seq), None)
                if not entries:
                    del self._by_worker[found[0]]

    def _sweep(self, now: float) -> None:
        self._drop([r for r, p in self.peers.items() if now - p.heard > self.expiry_s], Dropped.SILENT)

    def _drop(self, replicas: list[str], why: Dropped) -> None:
        for replica in replicas:
            peer = self.peers.pop(replica)
            if peer.entries:
                self.metrics.dropped.labels(why).inc(len(peer.entries))
                log.info(f"dropped {len(peer.entries)} request(s) in flight of replica {replica}: {why}",
                         extra={"fields": {"replica": replica, "reason": why.value}})
            for seq in list(peer.entries):
                self._pop(replica, peer, seq)
