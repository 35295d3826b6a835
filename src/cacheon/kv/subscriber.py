"""ZMQ ingest of SGLang KV events: one feed per (worker, DP rank), all polled from one thread.

The thin socket loop: each ``RankFeed`` joins a live socket (``transport``) and a replay client
(``replay``) to a socket-free ``Feed``, which decides (``sequencer``), decodes (``wire``) and
applies (``index``). ZMQ sockets are not thread-safe, so one thread owns them all, and it sleeps
in the poll until traffic comes or ``stop`` writes to a wake pipe: a followed worker costs no
wake-ups while it is quiet (a 50 ms poll tick was 20 a second per worker, 2.5 % of a core for a
gateway idling beside 8 workers; benchmarks/README.md).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import zmq

from cacheon.kv.contracts import WireContract
from cacheon.kv.feed import Delivery, Feed, FeedCounters, Source
from cacheon.kv.index import PrefixIndex
from cacheon.kv.replay import ReplayClient
from cacheon.kv.transport import Live, LiveSocket, rank_endpoint
from cacheon.kv.wire import WireBounds


class RankFeed(Feed):
    """One publisher: SUB on its live port, DEALER to its replay ROUTER when it has one."""

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        source: Source,
        endpoint: str,
        contract: WireContract,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        index: PrefixIndex[Source] | None = None,
        on_delivery: Callable[[Delivery], None] | None = None,
        on_clear: Callable[[Source, str], None] | None = None,
        replay_timeout_s: float = 2.0,
        bounds: WireBounds | None = None,
        max_replay: int = 10_000,
    ) -> None:
        encoded = topic.encode("utf-8")
        frame = (bounds or WireBounds()).max_payload_bytes  # ZMQ refuses a larger frame before buffering it
        self.replay = None if replay_endpoint is None else ReplayClient(
            ctx, replay_endpoint, contract.replay_framing, encoded, max_frame_bytes=frame, timeout_s=replay_timeout_s)
        super().__init__(source, contract, replayer=self.replay, index=index, on_delivery=on_delivery,
                         on_clear=on_clear, bounds=bounds, max_replay=max_replay)
        self.socket = LiveSocket(ctx, endpoint, encoded, max_frame_bytes=frame)

    def watch(self) -> None:
        """Drain connection events: a reconnect makes the next message start over."""
        for _ in range(self.socket.reconnects()):
            self.on_reconnect()

    def receive(self, limit: int = 1000) -> int:
        """Handle up to ``limit`` waiting live messages without blocking; returns how many."""
        handled = 0
        for message in self.socket.messages(limit):
            handled += 1
            if isinstance(message, Live):
                self.on_live(message.seq, message.payload)
            else:
                self.on_malformed(message.frames)
        return handled

    def close(self) -> None:
        self.socket.close()
        if self.replay is not None:
            self.replay.close()


class Subscriber:
    """All feeds of a gateway (or of ``cacheon kv listen``), polled from one thread."""

    def __init__(
        self,
        index: PrefixIndex[Source] | None = None,
        on_delivery: Callable[[Delivery], None] | None = None,
        *,
        on_clear: Callable[[Source, str], None] | None = None,
        replay_timeout_s: float = 2.0,
        bounds: WireBounds | None = None,
        max_replay: int = 10_000,
    ) -> None:
        self.index = index
        self._bounds, self._max_replay = bounds, max_replay
        self.feeds: list[RankFeed] = []
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._poller = zmq.Poller()
        self._on_delivery, self._on_clear = on_delivery, on_clear
        self._replay_timeout_s = replay_timeout_s
        self._stopping = threading.Event()
        self._closed = False  # the pipe's fds are given back: never written or closed again (the OS reuses them)
        self._wake_read, self._wake_write = os.pipe()  # a pipe: written from any thread, polled beside the sockets
        self._poller.register(self._wake_read, zmq.POLLIN)

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
                rank_endpoint(endpoint_base, rank),
                contract,
                replay_endpoint=rank_endpoint(replay_base, rank) if replay_base else None,
                topic=topic,
                index=self.index,
                on_delivery=self._on_delivery,
                on_clear=self._on_clear,
                replay_timeout_s=self._replay_timeout_s,
                bounds=self._bounds,
                max_replay=self._max_replay,
            )
            self._poller.register(feed.socket.sub, zmq.POLLIN)
            self._poller.register(feed.socket.monitor, zmq.POLLIN)
            self.feeds.append(feed)
            feeds.append(feed)
        return feeds

    def poll(self, timeout_s: float | None) -> int:
        """Wait up to ``timeout_s`` (None: until traffic or ``stop``), then handle what is there; returns messages."""
        ready = dict(self._poller.poll(None if timeout_s is None else int(timeout_s * 1000)))
        if self._wake_read in ready:
            os.read(self._wake_read, 4096)  # stop's byte: the poll said it is there
        for feed in self.feeds:
            if feed.socket.monitor in ready:
                feed.watch()  # before messages, so a reconnect is known when its data arrives
        return sum(feed.receive() for feed in self.feeds if feed.socket.sub in ready)

    def run(self) -> None:
        """Poll until ``stop`` (for a background thread), asleep in between."""
        while not self._stopping.is_set():
            self.poll(None)

    def stop(self) -> None:
        """Make ``run`` return soon, from any thread: it ends the poll through the wake pipe."""
        self._stopping.set()
        if not self._closed:
            os.write(self._wake_write, b"\0")

    def totals(self) -> FeedCounters:
        """Counters summed over every feed."""
        total = FeedCounters()
        for feed in self.feeds:
            total.add(feed.counters)
        return total

    def counters(self) -> dict[str, object]:
        """``totals`` as JSON-ready data."""
        return self.totals().as_dict()

    def close(self) -> None:
        """After ``run`` has returned (sockets belong to the polling thread); once."""
        if self._closed:
            return
        self._closed = True
        for feed in self.feeds:
            feed.close()
        self._ctx.term()
        os.close(self._wake_read)
        os.close(self._wake_write)
