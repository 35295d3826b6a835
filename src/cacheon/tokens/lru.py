"""A small thread-safe LRU bounded both by entries and by total weight (tokens, blocks).

The routing caches hold prompt pieces that arrive from users, so they must stay bounded however
long or varied the prompts get; a count bound alone would let a few huge pieces eat the memory.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class BoundedLRU(Generic[V]):
    """Least recently used entries leave first once ``max_entries`` or ``max_weight`` is exceeded."""

    def __init__(self, max_entries: int, max_weight: int) -> None:
        if max_entries < 1 or max_weight < 1:
            raise ValueError("cache bounds must be >= 1")
        self.max_entries, self.max_weight = max_entries, max_weight
        self.weight = 0
        self._items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.weight = 0

    def get(self, key: Hashable) -> V | None:
        """The value for ``key`` (now the most recently used), or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: Hashable, value: V, weight: int) -> None:
        """Store ``value``; an entry heavier than the whole bound is not kept at all."""
        if weight > self.max_weight:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.weight -= old[1]
            self._items[key] = (value, weight)
            self.weight += weight
            while len(self._items) > self.max_entries or self.weight > self.max_weight:
                self.weight -= self._items.popitem(last=False)[1][1]
