"""Which (worker, rank) sources hold which KV blocks, and the longest cached prefix of a chain.

One dict maps a block id to a bit mask of the sources holding it, so a prefix query is one
lookup per block and one AND per change of holders, however many workers there are; a block
held by one source shares that source's bit object. Each source keeps a FIFO of the ids it
stored, which bounds its inventory (oldest out first) and makes clearing it proportional to its
own size. The index knows nothing about SGLang versions: it takes store / remove / clear
operations on 64-bit ids.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from enum import StrEnum
from itertools import compress, count, islice, repeat, takewhile
from operator import ne
from typing import Generic, Protocol, TypeVar


class IndexOp(StrEnum):
    STORE = "store"
    REMOVE = "remove"
    CLEAR = "clear"


Operation = tuple[IndexOp, Sequence[int]]
S = TypeVar("S", bound=Hashable)


class PrefixIndex(Protocol[S]):
    """What the KV feeds write and the router reads; ``BlockIndex`` is the in-memory one."""

    def apply(self, source: S, ops: Iterable[Operation]) -> None: ...

    def clear(self, source: S) -> None: ...

    def drop(self, source: S) -> None: ...

    def longest_prefix(self, chain: Sequence[int]) -> dict[S, int]: ...

    def blocks(self, source: S) -> int: ...

    def held(self, source: S) -> set[int]: ...


class BlockIndex(Generic[S]):
    """Block inventory per source with a per-source capacity bound.

    Thread-safe: ``apply`` changes a source under one lock, so a query never sees half a batch.
    The capacity is a memory safety net: SGLang reports its own evictions as removals, the bound
    only trims a source whose removals were lost. It counts stores, so a source holds at most
    ``capacity_per_source`` blocks.
    """

    def __init__(self, capacity_per_source: int = 1 << 20) -> None:
        if capacity_per_source < 1:
            raise ValueError("capacity_per_source must be >= 1")
        self.capacity_per_source = capacity_per_source
        self.evictions = 0
        self._holders: dict[int, int] = {}
        self._columns: dict[S, int] = {}
        self._sources: list[S | None] = []  # None: a dropped source's column, free for reuse
        self._free: list[int] = []
        self._bits: list[int] = []
        self._fifos: list[deque[int]] = []
        self._counts: list[int] = []
        self._lock = threading.Lock()

    def apply(self, source: S, ops: Iterable[Operation]) -> None:
        """Apply one batch's operations for ``source``, in order, as one step."""
        with self._lock:
            col = self._column(source)
            for op, hashes in ops:
                if op == IndexOp.STORE:
                    self._store(col, hashes)
                elif op == IndexOp.REMOVE:
                    self._remove(col, hashes)
                elif op == IndexOp.CLEAR:
                    self._clear(col)
                else:
                    raise ValueError(f"unknown index operation {op!r}")

    def clear(self, source: S) -> None:
        """Forget everything ``source`` holds (worker restart, unrecoverable gap)."""
        self.apply(source, [(IndexOp.CLEAR, ())])

    def drop(self, source: S) -> None:
        """Forget ``source`` entirely (worker removed): its blocks, and its column for the next source.

        Without this a pool with worker churn would grow one column (one bit in every mask) per
        worker ever registered.
        """
        with self._lock:
            col = self._columns.pop(source, None)
            if col is None:
                return
            self._clear(col)
            self._sources[col] = None
            self._free.append(col)

    def sources(self) -> int:
        """How many sources have a column now (dropped ones excluded)."""
        with self._lock:
            return len(self._columns)

    def longest_prefix(self, chain: Sequence[int]) -> dict[S, int]:
        """For each source holding the chain's first block: how many leading blocks it holds.

        The holder masks are read at C speed up to the first block nobody holds (no source's run
        can pass it). The running AND of the masks only changes where a mask differs from the one
        before, so only those positions, found at C speed too, are visited in Python: the sources
        that drop out there get that depth. No Python step per block.
        """
        out: dict[S, int] = {}
        with self._lock:
            masks = list(takewhile(bool, map(self._holders.get, chain, repeat(0))))
            if not masks:
                return out
            alive = masks[0]
            for i in compress(count(1), map(ne, masks, islice(masks, 1, None))):
                kept = alive & masks[i]
                if kept != alive:
                    self._record(alive ^ kept, i, out)
                    alive = kept
                    if not alive:
                        return out
            self._record(alive, len(masks), out)
        return out

    def blocks(self, source: S) -> int:
        """How many blocks ``source`` holds now."""
        with self._lock:
            col = self._columns.get(source)
            return 0 if col is None else self._counts[col]

    def held(self, source: S) -> set[int]:
        """The ids ``source`` holds now, a snapshot (O(its stores): for digests, not for routing)."""
        with self._lock:
            col = self._columns.get(source)
            if col is None:
                return set()
            bit, get = self._bits[col], self._holders.get
            return {h for h in self._fifos[col] if get(h, 0) & bit}

    def __len__(self) -> int:
        """Distinct block ids held by any source."""
        return len(self._holders)

    def _column(self, source: S) -> int:
        col = self._columns.get(source)
        if col is not None:
            return col
        if self._free:  # a dropped column holds nothing: its bit is in no mask
            col = self._free.pop()
            self._sources[col] = source
        else:
            col = len(self._sources)
            self._sources.append(source)
            self._bits.append(1 << col)
            self._fifos.append(deque())
            self._counts.append(0)
        self._columns[source] = col
        return col

    def _record(self, mask: int, length: int, out: dict[S, int]) -> None:
        while mask:
            low = mask & -mask
            source = self._sources[low.bit_length() - 1]
            assert source is not None  # a bit still set in a mask belongs to a live column
            out[source] = length
            mask ^= low

    def _store(self, col: int, hashes: Sequence[int]) -> None:
        bit, holders, fifo = self._bits[col], self._holders, self._fifos[col]
        get = holders.get
        added = 0
        for h in hashes:
            held = get(h)
            if held is None:
                holders[h] = bit  # the shared bit object: no new int for a single holder
            elif held & bit:
                continue
            else:
                holders[h] = held | bit
            fifo.append(h)
            added += 1
        self._counts[col] += added
        excess = len(fifo) - self.capacity_per_source
        if excess > 0:
            before = self._counts[col]
            self._remove(col, [fifo.popleft() for _ in range(excess)])
            self.evictions += before - self._counts[col]

    def _remove(self, col: int, hashes: Iterable[int]) -> None:
        bit, holders = self._bits[col], self._holders
        get = holders.get
        removed = 0
        for h in hashes:
            held = get(h)
            if held is None or not held & bit:
                continue
            if held == bit:
                del holders[h]
            else:
                holders[h] = held ^ bit
            removed += 1
        self._counts[col] -= removed

    def _clear(self, col: int) -> None:
        fifo = self._fifos[col]  # every block the source holds has an entry here
        self._remove(col, fifo)
        fifo.clear()
        self._counts[col] = 0
