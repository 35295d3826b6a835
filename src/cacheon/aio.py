"""Event-loop hygiene shared by the loops Cacheon runs on threads of its own."""

from __future__ import annotations

import asyncio
import threading
from typing import Generic, TypeVar

T = TypeVar("T")


async def cancel_pending(timeout_s: float = 2.0) -> None:
    """Cancel every task on the running loop but the caller's and wait (at most ``timeout_s``) for them
    to end, as ``asyncio.run`` does before it closes its loop. A task left pending is destroyed with the
    loop, and asyncio logs each one, later, into whatever stderr is then (another command's output)."""
    me = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not me]
    for task in rest:
        task.cancel()
    if rest:
        await asyncio.wait(rest, timeout=timeout_s)


class Outbox(Generic[T]):
    """Items handed from a thread to a loop, in order, with one wake-up per burst rather than one per item:
    each ``call_soon_threadsafe`` writes the loop's self-pipe, a tenth of the relay's CPU at 100k events/s."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: list[T] = []
        self._lock = threading.Lock()
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> None:
        """From any thread; wakes the loop only when the outbox was empty (a wake-up is pending otherwise)."""
        with self._lock:
            self._items.append(item)
            wake = len(self._items) == 1
        if wake:
            self._loop.call_soon_threadsafe(self._ready.set)

    async def get(self) -> list[T]:
        """Everything put since the last ``get``, waiting for at least one (on the loop)."""
        while True:
            with self._lock:
                items, self._items = self._items, []
            if items:
                return items
            self._ready.clear()  # a put after the swap scheduled its set() behind this
            await self._ready.wait()
