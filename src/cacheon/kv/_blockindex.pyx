# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""``BlockIndex`` with its table in C: the same rules and answers as ``cacheon.kv.index.ReferenceBlockIndex``
(whose docstrings say what the index keeps and why), tested against it op for op.

Where the reference keeps a dict of Python ints (an id object, a dict entry and its index: ~80 bytes a
block) and a list of those ids per source, this keeps an open-addressing table of (int64 id, mask)
slots, 16 bytes each at a load of 1/4 to 3/4, and each source's store order as an int64 array. The
masks stay Python ints (a source's bit object shared by every block it alone holds), so any number of
sources fits. Slots are placed by a seeded mix of the id: the ids come from workers, and a table
placed by the id itself (as a dict of ints is) lets crafted ids collide.

Memory comes from ``PyMem_Raw*``, which tracemalloc sees, so the memory benchmark counts it.

The table grows incrementally: a doubling allocates the new table and leaves the entries in the old one,
which every lookup reads too; each insert (and removal) then moves a few whole clusters of the old table
(whole: what stays there is still a valid linear-probing table) until none are left, long before the next
doubling. A doubling at once stopped every apply and query for the rehash and the first touch of each page
of the new table (most of it: ~1 ms per MiB on a small VM): 30 ms at 800k blocks, in the relay and in every
gateway at the same batch, which was the event plane's p99 lag at 100k block events/s. A shrink (after
removals) is still done at once; it waits for a growth under way to end.
"""

import os
import threading

from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_Check
from cpython.mem cimport PyMem_RawCalloc, PyMem_RawFree, PyMem_RawRealloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.stdint cimport int64_t, uint64_t

cdef enum:
    MIN_SLOTS = 64
    MOVE_SLOTS = 16  # old slots scanned per insert (or removal) while growing: done after 1/16 of its slots of
                     # inserts, where the next doubling is 3/4 of them away (a few µs a batch meanwhile)

cdef struct Slot:
    int64_t key
    PyObject* mask  # NULL: an empty slot; otherwise a strong reference


cdef inline size_t _home(int64_t key, uint64_t seed, size_t last) noexcept nogil:
    """splitmix64's finaliser over the seeded id: a bijection, so distinct ids spread evenly."""
    cdef uint64_t z = (<uint64_t>key) ^ seed
    z = (z ^ (z >> 30)) * <uint64_t>0xbf58476d1ce4e5b9
    z = (z ^ (z >> 27)) * <uint64_t>0x94d049bb133111eb
    return <size_t>((z ^ (z >> 31)) & last)


cdef inline bint _as_id(object value, int64_t* out) except -1:
    """``value`` as an int64 id; False where it is not an int or is outside int64 (no block can have it). Only an
    int's own value is read: no ``__index__`` runs, so no Python code can change the table mid-query."""
    cdef int overflow = 0
    if not PyLong_Check(value):
        return False
    cdef long long got = PyLong_AsLongLongAndOverflow(value, &overflow)
    if overflow:
        return False
    out[0] = got
    return True


cdef inline int _check_id(object value) except -1:
    """Refuse an id the table cannot hold (the reference would store any hashable; the types say int64)."""
    cdef int64_t key
    if not PyLong_Check(value):
        raise TypeError(f"block id {value!r} is not an int")
    if not _as_id(value, &key):
        raise OverflowError(f"block id {value} is outside int64")
    return 0


cdef class _Ids:
    """One source's ids in store order (removed ones included until compacted): an int64 array."""

    cdef int64_t* ids
    cdef Py_ssize_t n, cap

    def __dealloc__(self):
        PyMem_RawFree(self.ids)

    cdef int append(self, int64_t key) except -1:
        cdef Py_ssize_t cap
        cdef int64_t* grown
        if self.n == self.cap:
            cap = self.cap + (self.cap >> 1) + 16
            grown = <int64_t*>PyMem_RawRealloc(self.ids, cap * sizeof(int64_t))
            if grown == NULL:
                raise MemoryError()
            self.ids, self.cap = grown, cap
        self.ids[self.n] = key
        self.n += 1
        return 0

    cdef void reset(self) noexcept:
        PyMem_RawFree(self.ids)
        self.ids, self.n, self.cap = NULL, 0, 0


cdef class BlockIndex:
    """Block inventory per source with a per-source capacity bound (``ReferenceBlockIndex``'s, natively)."""

    cdef Slot* _slots
    cdef size_t _size, _used  # slots (a power of two), blocks held (in either table while growing)
    cdef Slot* _old  # the table being grown out of (NULL: none): whole clusters, each moved at once
    cdef size_t _old_size, _old_used, _cursor, _unscanned  # its slots, its entries, the next slot to scan, slots left
    cdef uint64_t _seed
    cdef readonly Py_ssize_t capacity_per_source
    cdef readonly Py_ssize_t evictions, orphans
    cdef dict _columns, _single
    cdef list _sources, _free, _bits, _stored, _counts
    cdef object _lock

    def __cinit__(self, Py_ssize_t capacity_per_source=1 << 20):
        if capacity_per_source < 1:
            raise ValueError("capacity_per_source must be >= 1")
        self._slots = <Slot*>PyMem_RawCalloc(MIN_SLOTS, sizeof(Slot))
        if self._slots == NULL:
            raise MemoryError()
        self._size, self._used = MIN_SLOTS, 0
        self._old, self._old_size, self._old_used, self._cursor, self._unscanned = NULL, 0, 0, 0, 0
        self._seed = int.from_bytes(os.urandom(8), "little")
        self.capacity_per_source = capacity_per_source
        self.evictions = self.orphans = 0
        self._columns, self._single = {}, {}
        self._sources, self._free, self._bits, self._stored, self._counts = [], [], [], [], []
        self._lock = threading.Lock()

    def __dealloc__(self):
        cdef size_t i
        if self._slots != NULL:
            for i in range(self._size):
                if self._slots[i].mask != NULL:
                    Py_DECREF(<object>self._slots[i].mask)
            PyMem_RawFree(self._slots)
        if self._old != NULL:
            for i in range(self._old_size):
                if self._old[i].mask != NULL:
                    Py_DECREF(<object>self._old[i].mask)
            PyMem_RawFree(self._old)

    def __class_getitem__(cls, item):
        return cls  # BlockIndex[Source] in annotations, as the reference's Generic

    # -- the table ---------------------------------------------------------------------------------

    cdef inline Slot* _slot(self, int64_t key) noexcept:
        """Where ``key`` is (in the old table while growing, if it was not moved yet), or the empty slot of the
        table where it would go."""
        cdef size_t last, i
        cdef Slot* s
        if self._old != NULL:
            last = self._old_size - 1
            i = _home(key, self._seed, last)
            s = &self._old[i]
            while s.mask != NULL:
                if s.key == key:
                    return s
                i = (i + 1) & last
                s = &self._old[i]
        last = self._size - 1
        i = _home(key, self._seed, last)
        s = &self._slots[i]
        while s.mask != NULL and s.key != key:
            i = (i + 1) & last
            s = &self._slots[i]
        return s

    cdef inline PyObject* _get(self, object value) except? NULL:
        """The mask of a block id (any int), NULL where nobody holds it."""
        cdef int64_t key
        if not _as_id(value, &key):
            return NULL
        return self._slot(key).mask

    cdef int _resize(self, size_t size) except -1:
        cdef Slot* old = self._slots
        cdef size_t n = self._size, i, j, last = size - 1
        cdef Slot* fresh = <Slot*>PyMem_RawCalloc(size, sizeof(Slot))
        if fresh == NULL:
            raise MemoryError()
        for i in range(n):
            if old[i].mask != NULL:
                j = _home(old[i].key, self._seed, last)
                while fresh[j].mask != NULL:
                    j = (j + 1) & last
                fresh[j] = old[i]
        PyMem_RawFree(old)
        self._slots, self._size = fresh, size
        return 0

    cdef int _room(self) except -1:
        """Before an insert: move on with a growth under way; grow (start one) before it would pass a load of 3/4."""
        if self._old != NULL:
            self._move(MOVE_SLOTS)
        if (self._used + 1) * 4 > self._size * 3:
            self._move(self._old_size)  # never two old tables (the moves are done by far before this)
            self._grow()
        return 0

    cdef int _grow(self) except -1:
        """Double the table, the entries left in the old one (no rehash here, no page of the new one touched)."""
        cdef size_t size = self._size * 2, i = 0
        cdef Slot* fresh = <Slot*>PyMem_RawCalloc(size, sizeof(Slot))
        if fresh == NULL:
            raise MemoryError()
        while self._slots[i].mask != NULL:  # a load under 3/4: an empty slot, the start of the first whole cluster
            i += 1
        self._old, self._old_size, self._old_used = self._slots, self._size, self._used
        self._cursor, self._unscanned = i, self._size
        self._slots, self._size = fresh, size
        return 0

    cdef int _move(self, size_t budget) except -1:
        """Scan ``budget`` slots of the old table (at least) from the cursor, moving each cluster met whole; free it
        once every slot was scanned. A cluster starts after an empty slot and the old table only loses entries
        (a backward shift stays inside its cluster), so what is left there is always whole clusters."""
        cdef size_t last, last_new = self._size - 1, j
        cdef Slot* s
        if self._old == NULL:
            return 0
        last = self._old_size - 1
        while budget and self._unscanned:
            s = &self._old[self._cursor]
            if s.mask != NULL:
                j = _home(s.key, self._seed, last_new)
                while self._slots[j].mask != NULL:
                    j = (j + 1) & last_new
                self._slots[j] = s[0]
                s.mask = NULL
                self._old_used -= 1
            self._cursor = (self._cursor + 1) & last
            self._unscanned -= 1
            budget -= 1
            if not budget and self._old[self._cursor].mask != NULL:
                budget = 1  # not in the middle of a cluster: its rest would be unreachable past the emptied slots
        if not self._unscanned or not self._old_used:  # every slot scanned, or nothing left to move
            PyMem_RawFree(self._old)
            self._old, self._old_size, self._old_used = NULL, 0, 0
        return 0

    cdef int _shrink(self) except -1:
        """After removals, below a load of 1/4: halve until it is at least that (a table that held a cleared
        source's blocks). Growth leaves a load of 3/8 and a shrink one under 1/2, so a resize is always a
        quarter of the table's slots of stores or removals away from the next: churn at a boundary costs no
        rehash per batch (a shrink at 3/8 did: storing and removing two blocks there rebuilt 2M slots each time)."""
        cdef size_t size = self._size
        if self._old != NULL:
            return 0  # once the growth under way has ended (its moves come with inserts and removals)
        while size > MIN_SLOTS and self._used * 4 < size:
            size >>= 1
        if size < self._size:
            self._resize(size)
        return 0

    cdef void _delete(self, Slot* at) noexcept:
        """Empty ``at`` (its reference already given up) by backward shift in its table: linear probing needs no
        tombstones."""
        cdef Slot* table = self._slots
        cdef size_t last = self._size - 1
        if self._old != NULL and self._old <= at < self._old + self._old_size:
            table, last = self._old, self._old_size - 1
            self._old_used -= 1
        cdef size_t hole = at - table, j = hole, home
        while True:
            j = (j + 1) & last
            if table[j].mask == NULL:
                break
            home = _home(table[j].key, self._seed, last)
            if ((j - home) & last) >= ((j - hole) & last):  # the hole lies on its probe path: move it back
                table[hole] = table[j]
                hole = j
        table[hole].mask = NULL
        self._used -= 1

    cdef inline void _set(self, Slot* at, object mask) noexcept:
        Py_INCREF(mask)
        Py_DECREF(<object>at.mask)
        at.mask = <PyObject*>mask

    cdef bint _take(self, Slot* at, object bit) except -1:
        """Take ``bit`` out of the block at ``at``; False if it did not have it."""
        cdef object held
        if at.mask == NULL:
            return False
        held = <object>at.mask
        if not held & bit:
            return False
        if held == bit:
            Py_DECREF(held)
            self._delete(at)
        else:
            kept = held ^ bit
            self._set(at, self._single.get(kept, kept))
        return True

    # -- the index ---------------------------------------------------------------------------------

    def apply(self, source, ops):
        """Apply one batch's operations for ``source``, in order, as one step: every id is checked first (an int
        within int64), so a batch this table cannot hold changes nothing."""
        ops = list(ops)  # gone through twice: checked, then applied
        for op, hashes, parent in ops:
            if op != "store" and op != "remove" and op != "clear":
                raise ValueError(f"unknown index operation {op!r}")
            if parent is not None:
                _check_id(parent)
            for h in hashes:
                _check_id(h)
        with self._lock:
            col = self._column(source)
            for op, hashes, parent in ops:
                if op == "store":
                    self._store(col, hashes, parent)
                elif op == "remove":
                    self._remove(col, hashes)
                else:
                    self._clear(col)

    def clear(self, source):
        """Forget everything ``source`` holds (worker restart, unrecoverable gap)."""
        self.apply(source, [("clear", (), None)])

    def drop(self, source):
        """Forget ``source`` entirely (worker removed): its blocks, and its column for the next source."""
        with self._lock:
            col = self._columns.pop(source, None)
            if col is None:
                return
            self._clear(col)
            self._sources[col] = None
            self._free.append(col)

    def sources(self):
        """How many sources have a column now (dropped ones excluded)."""
        with self._lock:
            return len(self._columns)

    def longest_prefix(self, chain):
        """For each source holding the chain's first block: how many leading blocks it holds (the
        reference's bisection over the prefix property)."""
        cdef Py_ssize_t n = len(chain), lo, hi, mid, end, a, b
        cdef PyObject* got
        cdef PyObject* at_lo
        out = {}
        if not n:
            return out
        with self._lock:
            got = at_lo = self._get(chain[0])
            if got == NULL:
                return out
            first = <object>got
            got = self._get(chain[n - 1])
            end = n
            if got == NULL:  # held at lo, nobody at hi
                lo, hi = 0, n - 1
                while hi - lo > 1:
                    mid = (lo + hi) >> 1
                    got = self._get(chain[mid])
                    if got != NULL:
                        lo, at_lo = mid, got
                    else:
                        hi = mid
                end = hi
                last = <object>at_lo
            else:
                last = <object>got
            spans = [(0, first, end - 1, last)] if first != last else []
            while spans:
                a, at_a, b, at_b = spans.pop()
                if b - a == 1:
                    self._record(at_a ^ at_b, b, out)
                    continue
                mid = (a + b) >> 1
                got = self._get(chain[mid])
                at_mid = 0 if got == NULL else <object>got
                if at_mid != at_b:
                    spans.append((mid, at_mid, b, at_b))
                if at_a != at_mid:
                    spans.append((a, at_a, mid, at_mid))
            self._record(last, end, out)
        return out

    def blocks(self, source):
        """How many blocks ``source`` holds now."""
        with self._lock:
            col = self._columns.get(source)
            return 0 if col is None else self._counts[col]

    def held(self, source):
        """The ids ``source`` holds now, a snapshot (for digests, not for routing)."""
        cdef _Ids ids
        cdef Py_ssize_t i
        cdef PyObject* got
        with self._lock:
            col = self._columns.get(source)
            if col is None:
                return set()
            bit, ids = self._bits[col], self._stored[col]
            out = set()
            for i in range(ids.n):
                got = self._slot(ids.ids[i]).mask
                if got != NULL and <object>got & bit:
                    out.add(ids.ids[i])
            return out

    def inventory(self, source):
        """The ids ``source`` holds, each once, in store order (a snapshot's load rebuilds the same holdings)."""
        cdef _Ids ids
        cdef Py_ssize_t i
        with self._lock:
            col = self._columns.get(source)
            if col is None:
                return []
            self._compact(col)
            ids = self._stored[col]
            return [ids.ids[i] for i in range(ids.n)]

    def __len__(self):
        """Distinct block ids held by any source."""
        return self._used

    def slots(self):
        """The table's slot count (16 bytes each): its memory, and what its resizes change (while it grows, the
        old table's ``slots() // 2`` are held too, until ``unmoved()`` is 0)."""
        return self._size

    def unmoved(self):
        """Blocks still in the table being grown out of (0: no growth under way)."""
        return self._old_used

    def width(self):
        """Columns ever allocated: the width of a mask (a dropped source's column is reused, not added)."""
        with self._lock:
            return len(self._sources)

    def stored_entries(self, source):
        """Store-order entries ``source`` keeps, stale ones included (what compaction bounds)."""
        cdef _Ids ids
        with self._lock:
            col = self._columns.get(source)
            if col is None:
                return 0
            ids = self._stored[col]
            return ids.n

    cdef object _column(self, object source):
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
            self._stored.append(_Ids())
            self._counts.append(0)
        self._columns[source] = col
        return col

    cdef int _record(self, object mask, Py_ssize_t length, dict out) except -1:
        while mask:
            low = mask & -mask
            out[self._sources[low.bit_length() - 1]] = length
            mask ^= low
        return 0

    cdef int _store(self, Py_ssize_t col, object hashes, object parent) except -1:
        cdef object bit = self._bits[col]
        cdef _Ids ids = self._stored[col]
        cdef Py_ssize_t added = 0, count
        cdef int64_t key
        cdef Slot* at
        cdef PyObject* got
        if parent is not None:
            got = self._get(parent)
            if got == NULL or not <object>got & bit:
                self.orphans += len(hashes)
                return 0
        for h in hashes:
            _as_id(h, &key)  # apply checked every id first
            at = self._slot(key)
            if at.mask == NULL:
                self._room()
                at = self._slot(key)  # the table may have grown
                Py_INCREF(bit)  # the shared bit object: no new int for a single holder
                at.key, at.mask = key, <PyObject*>bit
                self._used += 1
            elif <object>at.mask & bit:
                continue
            else:
                self._set(at, <object>at.mask | bit)
            ids.append(key)
            added += 1
        count = self._counts[col] + added
        self._counts[col] = count
        if count > self.capacity_per_source:
            self._trim(col, count - self.capacity_per_source)
        if ids.n > 2 * self._counts[col] + 64:  # after a trim too (the reference says why)
            self._compact(col)
        return 0

    cdef int _trim(self, Py_ssize_t col, Py_ssize_t excess) except -1:
        """Remove ``excess`` held blocks, most recently stored first (only leaves: the reference says why)."""
        cdef object bit = self._bits[col]
        cdef _Ids ids = self._stored[col]
        cdef Py_ssize_t trimmed = 0
        while trimmed < excess and ids.n:
            ids.n -= 1
            if self._take(self._slot(ids.ids[ids.n]), bit):
                trimmed += 1
        self._counts[col] -= trimmed
        self.evictions += trimmed
        return 0

    cdef int _compact(self, Py_ssize_t col) except -1:
        """Keep only the newest entry of each block the source still holds, in store order."""
        cdef object bit = self._bits[col]
        cdef _Ids ids = self._stored[col]
        cdef Py_ssize_t i, start = ids.n  # the kept entries, newest first, fill the array from its end
        cdef PyObject* got
        seen = set()
        for i in range(ids.n - 1, -1, -1):
            got = self._slot(ids.ids[i]).mask
            if got != NULL and <object>got & bit and ids.ids[i] not in seen:
                seen.add(ids.ids[i])
                start -= 1
                ids.ids[start] = ids.ids[i]
        ids.n -= start
        for i in range(ids.n):
            ids.ids[i] = ids.ids[start + i]
        return 0

    cdef int _remove(self, Py_ssize_t col, object hashes) except -1:
        cdef object bit = self._bits[col]
        cdef Py_ssize_t removed = 0
        cdef int64_t key
        cdef size_t seen = 0
        for h in hashes:
            seen += 1
            if _as_id(h, &key) and self._take(self._slot(key), bit):
                removed += 1
        self._counts[col] -= removed
        self._move(MOVE_SLOTS * seen)  # a growth under way moves on with removals too, so it ends without inserts
        self._shrink()
        return 0

    cdef int _clear(self, Py_ssize_t col) except -1:
        cdef object bit = self._bits[col]
        cdef _Ids ids = self._stored[col]
        cdef Py_ssize_t i
        for i in range(ids.n):  # every block the source holds has an entry here
            self._take(self._slot(ids.ids[i]), bit)
        self._move(MOVE_SLOTS * <size_t>ids.n)
        ids.reset()
        self._counts[col] = 0
        self._shrink()
        return 0
