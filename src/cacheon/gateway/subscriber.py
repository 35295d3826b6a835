"""ZMQ ingest of SGLang KV events: one SUB per (worker, DP rank), replay through its ROUTER.

Sequence numbers are the truth about completeness. Per publisher: the next expected ``seq``
arrives -> apply; a jump -> replay the hole from the publisher's ROUTER, then apply; a step
back -> the worker restarted: clear that rank's blocks first. A dropped and re-made TCP
connection (seen on the SUB's monitor) is treated like a restart, since a new process can
already be past the old sequence. On first contact the hole before the first message (slow
joiner) is replayed the same way. A hole that cannot be replayed leaves the rank's inventory
unknown, so it is cleared rather than trusted.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import zmq
from zmq.utils.monitor import recv_monitor_message

from cacheon.errors import UsageError
from cacheon.gateway.contracts import WireContract
from cacheon.gateway.index import BlockIndex
from cacheon.gateway.wire import DECODE_ERROR, DecodedBatch, WireDecoder, WireReject

END_SEQ = b"\xff" * 8  # SGLang's replay terminator: (-1).to_bytes(8, "big", signed=True)
_RECV_HWM = 100_000  # SGLang's default PUB high-water mark


def rank_endpoint(base: str, rank: int) -> str:
    """``tcp://host:port`` of DP rank ``rank``: SGLang binds rank r on ``base_port + r``."""
    host, sep, port = base.rpartition(":")
    if not base.startswith("tcp://") or not sep or not port.isdigit() or not host[len("tcp://") :]:
        raise UsageError(f"endpoint {base!r} is not tcp://HOST:PORT")
    if rank < 0 or int(port) + rank > 65535:
        raise UsageError(f"rank {rank} does not fit a port above {base!r}")
    return f"{host}:{int(port) + rank}"


@dataclass
class FeedCounters:
    """What one publisher's stream did; the gateway reads these to decide what to trust."""

    batches: int = 0  # accepted batches (live and replayed)
    events: int = 0  # events in accepted batches
    skipped_events: int = 0  # accepted events on a non-device medium, not indexed
    rejects: Counter[str] = field(default_factory=Counter)  # by reason code
    gaps: int = 0  # forward jumps in seq
    replays: int = 0  # replay requests sent
    replay_failures: int = 0  # replays that timed out, were malformed or came back incomplete
    restarts: int = 0  # seq went backwards
    reconnects: int = 0  # the SUB's connection dropped and came back
    clears: int = 0  # times this rank's blocks were dropped (restart, unrecoverable hole)

    def as_dict(self) -> dict[str, object]:
        out = {k: v for k, v in vars(self).items() if k != "rejects"}
        out["rejects"] = dict(sorted(self.rejects.items()))
        return out


@dataclass(frozen=True)
class Delivery:
    """One batch as the feed saw it: accepted (``batch``) or refused whole (``reject``)."""

    source: Hashable
    seq: int
    batch: DecodedBatch | None
    reject: WireReject | None
    replayed: bool


class RankFeed:
    """One publisher: SUB on its live port, DEALER to its replay ROUTER when it has one."""

    def __init__(
        self,
        ctx: zmq.Context,
        source: Hashable,
        rank: int,
        endpoint: str,
        contract: WireContract,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        index: BlockIndex | None = None,
        on_delivery: Callable[[Delivery], None] | None = None,
        replay_timeout_s: float = 2.0,
        backoff_s: tuple[float, float] = (0.1, 5.0),
    ) -> None:
        self.source, self.rank, self.contract = source, rank, contract
        self.decoder = WireDecoder(contract)
        self.counters = FeedCounters()
        self.expected: int | None = None
        self._ctx, self._index, self._on_delivery = ctx, index, on_delivery
        self._topic = topic.encode("utf-8")
        self._replay_endpoint = replay_endpoint
        self._replay_timeout_s = replay_timeout_s
        self._backoff_min, self._backoff_max = backoff_s
        self._backoff = self._backoff_min
        self._replay_not_before = 0.0
        self.sub = ctx.socket(zmq.SUB)
        # libzmq reconnects by itself; these make it back off from 100 ms up to 5 s.
        self.sub.setsockopt(zmq.RECONNECT_IVL, int(self._backoff_min * 1000))
        self.sub.setsockopt(zmq.RECONNECT_IVL_MAX, int(self._backoff_max * 1000))
        self.sub.setsockopt(zmq.RCVHWM, _RECV_HWM)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        self.monitor = self.sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.sub.connect(endpoint)
        self._dealer: zmq.Socket | None = None
        self._disconnected = self._resync = False

    def watch(self) -> None:
        """Drain connection events: a reconnect makes the next message start over."""
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._disconnected = True
            elif event["event"] == zmq.EVENT_CONNECTED and self._disconnected:
                self._disconnected = False
                self._resync = True
                self.counters.reconnects += 1

    def receive(self, limit: int = 1000) -> int:
        """Handle up to ``limit`` waiting live messages without blocking; returns how many."""
        handled = 0
        while handled < limit:
            try:
                frames = self.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            handled += 1
            if len(frames) != 3 or len(frames[1]) != 8:
                self._reject(-1, WireReject(DECODE_ERROR, f"live message has {len(frames)} frames"), False)
                continue
            self._on_live(int.from_bytes(frames[1], "big"), frames[2])
        return handled

    def close(self) -> None:
        self.sub.disable_monitor()
        self.monitor.close(linger=0)
        self.sub.close(linger=0)
        if self._dealer is not None:
            self._dealer.close(linger=0)

    # -- sequence tracking ---------------------------------------------------------------

    def _on_live(self, seq: int, payload: bytes) -> None:
        cleared = False
        if self._resync and self.expected is not None:
            self._clear()
            cleared, self.expected = True, None
        self._resync = False
        # On first contact the history is best effort; after that, a hole must be filled.
        must_fill = self.expected is not None
        if self.expected is None:
            start = 0
        elif seq >= self.expected:
            self.counters.gaps += seq > self.expected
            start = self.expected
        else:
            self.counters.restarts += 1
            if not cleared:
                self._clear()
            cleared, start = True, 0
        if seq > start:
            missed = self._replay(start, seq)
            complete = missed is not None and [s for s, _ in missed] == list(range(start, seq))
            if must_fill and not complete:
                self.counters.replay_failures += missed is not None  # timeouts count themselves
                if not cleared:
                    self._clear()
            for s, p in missed or ():
                self._deliver(s, p, replayed=True)
        self._deliver(seq, payload, replayed=False)
        self.expected = seq + 1

    def _clear(self) -> None:
        self.counters.clears += 1
        if self._index is not None:
            self._index.clear(self.source)

    def _deliver(self, seq: int, payload: bytes, replayed: bool) -> None:
        try:
            batch = self.decoder.decode(payload, self.rank)
        except WireReject as reject:
            self._reject(seq, reject, replayed)
            return
        ops, skipped = self.decoder.operations(batch.events)
        if self._index is not None:
            self._index.apply(self.source, ops)
        self.counters.batches += 1
        self.counters.events += len(batch.events)
        self.counters.skipped_events += skipped
        if self._on_delivery is not None:
            self._on_delivery(Delivery(self.source, seq, batch, None, replayed))

    def _reject(self, seq: int, reject: WireReject, replayed: bool) -> None:
        self.counters.rejects[reject.reason] += 1
        if self._on_delivery is not None:
            self._on_delivery(Delivery(self.source, seq, None, reject, replayed))

    # -- replay --------------------------------------------------------------------------

    def _replay(self, start: int, stop: int) -> list[tuple[int, bytes]] | None:
        """Batches ``start <= seq < stop`` from the ROUTER; None when none could be had."""
        if self._replay_endpoint is None or time.monotonic() < self._replay_not_before:
            return None
        if self._dealer is None:
            self._dealer = self._ctx.socket(zmq.DEALER)
            self._dealer.setsockopt(zmq.LINGER, 0)
            self._dealer.connect(self._replay_endpoint)
        self.counters.replays += 1
        self._dealer.send_multipart([b"", start.to_bytes(8, "big")])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + self._replay_timeout_s
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not self._dealer.poll(remaining_ms):
                return self._replay_failed()
            reply = self._parse_reply(self._dealer.recv_multipart())
            if reply is None:
                return self._replay_failed()
            if reply[0] < 0:
                break
            if start <= reply[0] < stop:
                got.append(reply)
        self._backoff = self._backoff_min
        return got

    def _parse_reply(self, frames: list[bytes]) -> tuple[int, bytes] | None:
        """``(seq, payload)``, ``(-1, b"")`` at the end marker, None for a foreign framing."""
        if self.contract.replay_framing == "topic-seq":  # [b"", topic, seq, payload]
            if len(frames) != 4 or frames[0] != b"":
                return None
            topic, seq, payload = frames[1:]
            if topic == b"" and seq == END_SEQ and payload == b"":
                return (-1, b"")
            if not topic.startswith(self._topic):
                return None
        else:  # [b"", seq, payload]
            if len(frames) != 3 or frames[0] != b"":
                return None
            seq, payload = frames[1:]
            if seq == END_SEQ and payload == b"":
                return (-1, b"")
        if len(seq) != 8:
            return None
        return int.from_bytes(seq, "big"), payload

    def _replay_failed(self) -> None:
        """Drop the DEALER (late replies die with it) and back off before the next try."""
        self.counters.replay_failures += 1
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None
        self._replay_not_before = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self._backoff_max)
        return None


class Subscriber:
    """All feeds of a gateway, polled from one thread (ZMQ sockets are not thread-safe)."""

    def __init__(
        self,
        index: BlockIndex | None = None,
        on_delivery: Callable[[Delivery], None] | None = None,
        *,
        replay_timeout_s: float = 2.0,
    ) -> None:
        self.index = index
        self.feeds: list[RankFeed] = []
        self._ctx = zmq.Context()
        self._poller = zmq.Poller()
        self._on_delivery = on_delivery
        self._replay_timeout_s = replay_timeout_s

    def add_worker(
        self,
        worker: str,
        endpoint_base: str,
        contract: WireContract,
        ranks: range | list[int],
        *,
        replay_base: str | None = None,
        topic: str = "",
    ) -> list[RankFeed]:
        """One feed per DP rank: live ``base + rank``, replay ``replay_base + rank``."""
        feeds = []
        for rank in ranks:
            feed = RankFeed(
                self._ctx,
                (worker, rank),
                rank,
                rank_endpoint(endpoint_base, rank),
                contract,
                replay_endpoint=rank_endpoint(replay_base, rank) if replay_base else None,
                topic=topic,
                index=self.index,
                on_delivery=self._on_delivery,
                replay_timeout_s=self._replay_timeout_s,
            )
            self._poller.register(feed.sub, zmq.POLLIN)
            self._poller.register(feed.monitor, zmq.POLLIN)
            self.feeds.append(feed)
            feeds.append(feed)
        return feeds

    def poll(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for traffic, then handle what is there; returns messages."""
        ready = dict(self._poller.poll(int(timeout_s * 1000)))
        for feed in self.feeds:
            if feed.monitor in ready:
                feed.watch()  # before messages, so a reconnect is known when its data arrives
        return sum(feed.receive() for feed in self.feeds if feed.sub in ready)

    def run(self, stop: threading.Event, tick_s: float = 0.1) -> None:
        """Poll until ``stop`` is set (for a background thread)."""
        while not stop.is_set():
            self.poll(tick_s)

    def counters(self) -> dict[str, object]:
        """Counters summed over every feed."""
        total = FeedCounters()
        for feed in self.feeds:
            for name, value in vars(feed.counters).items():
                setattr(total, name, getattr(total, name) + value)
        return total.as_dict()

    def close(self) -> None:
        for feed in self.feeds:
            feed.close()
        self._ctx.term()
