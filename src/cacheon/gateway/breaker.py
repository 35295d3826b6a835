"""A worker's circuit breaker: consecutive failures open it, for a while; a success or a passed
health check after an outage closes it. The one place a worker's failures are counted."""

from __future__ import annotations

import time


class Breaker:
    """Opens on the ``threshold``-th consecutive failure, for ``open_s``; requests skip it while open."""

    __slots__ = ("answered_at", "failures", "open_s", "open_until", "threshold")

    def __init__(self, threshold: int = 3, open_s: float = 30.0) -> None:
        self.threshold, self.open_s = threshold, open_s
        self.failures = 0
        self.open_until = 0.0
        self.answered_at = -float("inf")  # time.monotonic() of the last answer, for the health check

    def failed(self) -> None:
        self.failures += 1
        if self.failures >= self.threshold:
            self.open_until = time.time() + self.open_s

    def succeeded(self, served: bool) -> None:
        """An answer came: the count starts again (an open breaker stays open until its time is up).
        ``served``: a 2xx, which the health check takes for a passed probe; a 4xx says only that the
        server parses requests (a client could keep a worker whose engine is gone unprobed with bad ones)."""
        self.failures = 0
        if served:
            self.answered_at = time.monotonic()

    def reset(self) -> None:
        """The worker came back (its health check passed after failing): closed at once."""
        self.failures, self.open_until = 0, 0.0

    def closed(self, now: float) -> bool:
        return now >= self.open_until
