"""One worker's KV feeds in a thread of their own: the subscriber for its discovered geometry."""

from __future__ import annotations

import threading
from collections.abc import Callable

from cacheon.kv.contracts import WireContract
from cacheon.kv.feed import Delivery, FeedCounters, Source
from cacheon.kv.index import PrefixIndex
from cacheon.kv.subscriber import Subscriber
from cacheon.kv.wire import WireBounds


class WorkerFeeds:
    """A ``Subscriber`` with one feed per DP rank, polled by a daemon thread until ``close``."""

    def __init__(self, worker_id: str, endpoint_base: str, contract: WireContract, dp_size: int,
                 replay_base: str | None, index: PrefixIndex[Source],
                 echo: Callable[[Delivery], None], bounds: WireBounds, max_replay: int) -> None:
        self.contract = contract
        self.dp_size = dp_size
        self._index = index
        self.subscriber = Subscriber(index, echo, bounds=bounds, max_replay=max_replay)
        try:
            self.subscriber.add_worker(worker_id, endpoint_base, contract, range(dp_size), replay_base=replay_base)
        except BaseException:
            self.subscriber.close()  # its context, pipe and the ranks' sockets made so far
            raise
        self._thread = threading.Thread(target=self.subscriber.run, daemon=True, name=f"kv-{worker_id}")
        self._thread.start()

    def serves(self, contract: WireContract, dp_size: int) -> bool:
        """Whether these feeds already match that geometry."""
        return contract.id == self.contract.id and dp_size == self.dp_size

    def totals(self) -> FeedCounters:
        return self.subscriber.totals()

    def alive(self) -> bool:
        """Whether the thread polling the sockets still runs."""
        return self._thread.is_alive()

    def lag_s(self) -> float | None:
        """The largest event lag over the ranks (None before any live batch)."""
        lags = [f.lag_s for f in self.subscriber.feeds if f.lag_s is not None]
        return max(lags) if lags else None

    def stale(self, now: float) -> bool:
        """Direct feeds are never stale: the gateway hears the worker itself."""
        return False

    def last_seq(self) -> dict[int, int | None]:
        return {f.rank: None if f.expected is None else f.expected - 1 for f in self.subscriber.feeds}

    def close(self) -> None:
        """Stop the thread, forget the worker's blocks, close the sockets."""
        self.subscriber.stop()
        self._thread.join(timeout=5)
        for feed in self.subscriber.feeds:
            self._index.drop(feed.source)
        self.subscriber.close()

