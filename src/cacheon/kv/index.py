"""Which (worker, rank) sources hold which KV blocks, and the longest cached prefix of a chain.

One dict maps a block id to a bit mask of the sources holding it; a block held by one source
shares that source's bit object. The index knows nothing about SGLang versions: it takes store /
remove / clear operations on 64-bit ids, a store naming the parent of its first block.

**The prefix property.** A block id is the hash of its whole prefix, so a block has one parent,
and an engine that caches pages in a radix tree (SGLang) holds a page only while it holds its
parent and evicts leaves first. Each source's blocks are then closed under parents, so along any
chain the holders can only thin out: holders(chain[i]) ⊇ holders(chain[i + 1]). A query uses
that: it finds where the holders change by bisection, O(k log n) dict probes for k distinct holder
sets along an n-block chain, instead of one probe per block.

How the index keeps the property for every source:

- A stored run is indexed only if its parent is None (a chain's root) or held by that source. A
  run whose parent the source does not hold here (its ancestors were trimmed by the bound below,
  evicted before the gateway subscribed, or reported out of order) could never extend a prefix
  from the root in this index, and would break the property: it is left out and counted
  (``orphans``).
- The capacity bound trims a source's most recent stores first. A store needs its parent held, so
  every held block was stored after its parent and the newest entry never has a held child:
  newest-first trims only leaves. (Oldest-first would trim a chain's root and leave its
  descendants held but unreachable, where a bisection would find them.)
- Removals apply as reported: the engine evicts leaves first (not checked here). Clears drop all.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable, Sequence
from enum import StrEnum
from itertools import repeat
from typing import Generic, Protocol, TypeVar


class IndexOp(StrEnum):
    STORE = "store"
    REMOVE = "remove"
    CLEAR = "clear"


# The members bound once: on Python 3.11 each ``IndexOp.X`` is a descriptor call (~0.1 us).
_STORE, _REMOVE, _CLEAR = IndexOp.STORE, IndexOp.REMOVE, IndexOp.CLEAR

# (op, block ids, parent): a store's ids are one chain, its first block's parent named (None: a
# root); removals and clears name no parent.
Operation = tuple[IndexOp, Sequence[int], int | None]
S = TypeVar("S", bound=Hashable)


class PrefixIndex(Protocol[S]):
    """What the KV feeds write and the router reads; ``BlockIndex`` is the in-memory one."""

    def apply(self, source: S, ops: Iterable[Operation]) -> None: ...

    def clear(self, source: S) -> None: ...

    def drop(self, source: S) -> None: ...

    def longest_prefix(self, chain: Sequence[int]) -> dict[S, int]: ...

    def blocks(self, source: S) -> int: ...

    def held(self, source: S) -> set[int]: ...


class ReferenceBlockIndex(Generic[S]):
    """Block inventory per source with a per-source capacity bound, in pure Python: the reference the
    native ``BlockIndex`` (``_blockindex.pyx``) is tested against, op for op.

    Thread-safe: ``apply`` changes a source under one lock, so a query never sees half a batch.
    The capacity is a memory safety net: SGLang reports its own evictions as removals, the bound
    only trims a source whose removals were lost or whose cache is larger than the bound.
    Each source keeps its ids in store order (a list, 8 bytes an entry): the bound trims from its
    end, a clear walks it; entries of blocks removed since are skipped and compacted away.
    """

    def __init__(self, capacity_per_source: int = 1 << 20) -> None:
        if capacity_per_source < 1:
            raise ValueError("capacity_per_source must be >= 1")
        self.capacity_per_source = capacity_per_source
        self.evictions = 0  # blocks the capacity bound trimmed
        self.orphans = 0  # stored blocks left out: their run's parent was not held by the source
        self._holders: dict[int, int] = {}
        self._columns: dict[S, int] = {}
        self._sources: list[S | None] = []  # None: a dropped source's column, free for reuse
        self._free: list[int] = []
        self._bits: list[int] = []
        self._single: dict[int, int] = {}  # each column's bit -> that very object, to share it again
        self._stored: list[list[int]] = []  # per column: ids in store order, stale entries included
        self._counts: list[int] = []
        self._lock = threading.Lock()

    def apply(self, source: S, ops: Iterable[Operation]) -> None:
        """Apply one batch's operations for ``source``, in order, as one step."""
        with self._lock:
            col = self._column(source)
            for op, hashes, parent in ops:
                if op == _STORE:
                    self._store(col, hashes, parent)
                elif op == _REMOVE:
                    self._remove(col, hashes)
                elif op == _CLEAR:
                    self._clear(col)
                else:
                    raise ValueError(f"unknown index operation {op!r}")

    def clear(self, source: S) -> None:
        """Forget everything ``source`` holds (worker restart, unrecoverable gap)."""
        self.apply(source, [(IndexOp.CLEAR, (), None)])

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

        Holders only thin out along a chain (the module's prefix property), so where two probed
        positions have the same holders, every position between them has those holders too.
        First the end of the held run (the first block nobody holds) by bisection, then every
        change of holders inside it, each by bisection between two probes that differ.
        """
        out: dict[S, int] = {}
        n = len(chain)
        if not n:
            return out
        with self._lock:
            get = self._holders.get
            first = get(chain[0], 0)
            if not first:
                return out
            last = get(chain[n - 1], 0)
            end = n
            if not last:  # held at lo, nobody at hi
                lo, hi = 0, n - 1
                while hi - lo > 1:
                    mid = (lo + hi) >> 1
                    if get(chain[mid], 0):
                        lo = mid
                    else:
                        hi = mid
                end, last = hi, get(chain[lo], 0)
            # Spans (a, holders at a, b, holders at b), a < b, whose ends differ: a change lies inside.
            spans = [(0, first, end - 1, last)] if first != last else []
            pop, push = spans.pop, spans.append
            while spans:
                a, at_a, b, at_b = pop()
                if b - a == 1:
                    self._record(at_a ^ at_b, b, out)  # they hold blocks 0..a: a prefix of b blocks
                    continue
                mid = (a + b) >> 1
                at_mid = get(chain[mid], 0)
                if at_mid != at_b:
                    push((mid, at_mid, b, at_b))
                if at_a != at_mid:
                    push((a, at_a, mid, at_mid))
            self._record(last, end, out)
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
            return {h for h in self._stored[col] if get(h, 0) & bit}

    def inventory(self, source: S) -> list[int]:
        """The ids ``source`` holds, each once, in store order: stored again as one root run (a snapshot's
        load), they rebuild the same holdings, parents before children."""
        with self._lock:
            col = self._columns.get(source)
            if col is None:
                return []
            self._compact(col)
            return list(self._stored[col])

    def __len__(self) -> int:
        """Distinct block ids held by any source."""
        return len(self._holders)

    def width(self) -> int:
        """Columns ever allocated: the width of a mask (a dropped source's column is reused, not added)."""
        with self._lock:
            return len(self._sources)

    def stored_entries(self, source: S) -> int:
        """Store-order entries ``source`` keeps, stale ones included (what compaction bounds)."""
        with self._lock:
            col = self._columns.get(source)
            return 0 if col is None else len(self._stored[col])

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
            bit = 1 << col
            self._bits.append(bit)
            self._single[bit] = bit
            self._stored.append([])
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

    def _store(self, col: int, hashes: Sequence[int], parent: int | None) -> None:
        bit, holders = self._bits[col], self._holders
        if parent is not None and not holders.get(parent, 0) & bit:
            self.orphans += len(hashes)
            return
        stored = self._stored[col]
        size = len(holders)
        if not any(map(holders.__contains__, hashes)):  # blocks new to the index: at C speed
            holders.update(zip(hashes, repeat(bit)))
            added = len(holders) - size
            # An id repeated within the run (no real chain has one) keeps its first place: the trim must
            # not take the repeat as the newest store and evict a block whose child stays held.
            stored += hashes if added == len(hashes) else dict.fromkeys(hashes)
        else:
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
                stored.append(h)
                added += 1
        count = self._counts[col] = self._counts[col] + added
        if count > self.capacity_per_source:
            self._trim(col, count - self.capacity_per_source)
        # After a trim too: a full source that removes old blocks and stores new ones leaves its stale entries in the
        # middle, where the trim (from the end) never reaches them.
        if len(stored) > 2 * self._counts[col] + 64:
            self._compact(col)

    def _trim(self, col: int, excess: int) -> None:
        """Remove ``excess`` held blocks, most recently stored first (only leaves: module docstring)."""
        bit, holders, single, stored = self._bits[col], self._holders, self._single, self._stored[col]
        get = holders.get
        trimmed = 0
        while trimmed < excess:
            h = stored.pop()
            held = get(h)
            if held is None or not held & bit:
                continue  # removed since it was stored
            if held == bit:
                del holders[h]
            else:
                kept = held ^ bit
                holders[h] = single.get(kept, kept)
            trimmed += 1
        self._counts[col] -= trimmed
        self.evictions += trimmed

    def _compact(self, col: int) -> None:
        """Keep only the newest entry of each block the source still holds, in store order."""
        bit, get, stored = self._bits[col], self._holders.get, self._stored[col]
        seen: set[int] = set()
        kept: list[int] = []
        for h in reversed(stored):
            if h not in seen and get(h, 0) & bit:
                seen.add(h)
                kept.append(h)
        kept.reverse()
        stored[:] = kept

    def _remove(self, col: int, hashes: Iterable[int]) -> None:
        bit, holders, single = self._bits[col], self._holders, self._single
        get = holders.get
        removed = 0
        for h in hashes:
            held = get(h)
            if held is None or not held & bit:
                continue
            if held == bit:
                del holders[h]
            else:
                kept = held ^ bit
                holders[h] = single.get(kept, kept)
            removed += 1
        self._counts[col] -= removed

    def _clear(self, col: int) -> None:
        stored = self._stored[col]  # every block the source holds has an entry here
        self._remove(col, stored)
        stored.clear()
        self._counts[col] = 0


try:
    from cacheon.kv._blockindex import BlockIndex as BlockIndex
except ImportError as exc:  # a source tree nobody built
    raise ImportError("cacheon.kv: the native block index is not built; `pip install -e .` compiles it "
                      "(it needs a C compiler; Cython comes as a build requirement)") from exc
