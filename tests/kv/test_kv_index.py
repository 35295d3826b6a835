"""The block index against a set-per-source model, over block ids that form real chains.

Block ids are hashes of their whole prefix, so every id has one parent; the worlds here keep that
(a random forest of ids; a query is a root-to-node path, perhaps with foreign ids after it). The
model is a set per source with the index's two rules spelled out plainly: a store whose parent the
source does not hold is left out, and the capacity bound removes the most recent stores first.
"""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheon.kv.hashing import page_hashes
from cacheon.kv.index import BlockIndex, ReferenceBlockIndex
from cacheon.sim.cache import PrefixCache

EDGE_IDS = [0, 1, -1, 7, 2**63 - 1, -(2**63)]
CAPACITY = 6
# Every test runs on both: the native index and the pure-Python reference it must match.
EACH = pytest.mark.parametrize("Index", [BlockIndex, ReferenceBlockIndex], ids=["native", "reference"])


class Forest:
    """``size`` block ids, each with one parent (or none: a root), from a seed."""

    def __init__(self, seed: int, size: int = 40) -> None:
        rng = random.Random(seed)
        self.ids = EDGE_IDS + [rng.getrandbits(64) - 2**63 for _ in range(size - len(EDGE_IDS))]  # distinct: 2^-58
        rng.shuffle(self.ids)
        # Mostly deep chains (a recent node's child), some branches off anything, a few roots.
        self.parent: list[int | None] = [
            None if i == 0 or rng.random() < 0.1 else rng.randrange(max(0, i - 3) if rng.random() < 0.7 else 0, i)
            for i in range(size)]
        self.foreign = [rng.getrandbits(62) + 8 for _ in range(8)]  # ids no forest block has (2^-55)

    def path(self, node: int) -> list[int]:
        """The node's chain: ids from its root down to it."""
        out = []
        at: int | None = node
        while at is not None:
            out.append(self.ids[at])
            at = self.parent[at]
        return out[::-1]


class Model:
    """A set per source, stores in order for the bound; the index's rules, spelled out."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held: dict[object, set[int]] = {}
        self.order: dict[object, list[int]] = {}

    def store(self, source: object, run: list[int], parent: int | None) -> None:
        held, order = self.held.setdefault(source, set()), self.order.setdefault(source, [])
        if parent is not None and parent not in held:
            return
        for h in run:
            if h not in held:
                held.add(h)
                order.append(h)
        while len(held) > self.capacity:
            held.discard(order.pop())

    def remove(self, source: object, ids: list[int]) -> None:
        self.held.setdefault(source, set()).difference_update(ids)

    def clear(self, source: object) -> None:
        self.held[source], self.order[source] = set(), []

    def leaves(self, source: object, forest: Forest) -> list[int]:
        """The source's blocks with no held child: what a radix cache may evict."""
        held = self.held.get(source, set())
        parents = {forest.ids[p] for i, p in enumerate(forest.parent) if p is not None and forest.ids[i] in held}
        return sorted(held - parents)

    def prefix(self, chain: list[int]) -> dict[object, int]:
        out = {}
        for source, held in self.held.items():
            n = 0
            while n < len(chain) and chain[n] in held:
                n += 1
            if n:
                out[source] = n
        return out


SOURCES = [("a", 0), ("a", 1), ("b", 0), *[(f"w{i}", 0) for i in range(70)]]
STEP = st.tuples(st.sampled_from(SOURCES[:5]) | st.sampled_from(SOURCES),
                 st.sampled_from(["store", "store", "store", "evict", "clear", "drop", "noop_remove"]),
                 st.integers(0, 39), st.integers(0, 8), st.integers(0, 2**32))


def run_world(index: Any, model: Model, forest: Forest, steps: list) -> None:
    for source, kind, node, cut, salt in steps:
        if kind == "store":  # a run along a real chain: from depth `cut`, its parent named (maybe not held)
            path = forest.path(node)
            cut = min(cut, len(path) - 1)
            run, parent = path[cut:], path[cut - 1] if cut else None
            index.apply(source, [("store", run, parent)])
            model.store(source, run, parent)
        elif kind == "evict":  # as a radix cache does: a leaf at a time, so maybe then its parent, in one batch
            rng, victims = random.Random(salt), []
            for _ in range(1 + cut % 4):
                leaves = model.leaves(source, forest)
                if leaves:
                    victims.append(rng.choice(leaves))
                    model.remove(source, victims[-1:])
            index.apply(source, [("remove", victims, None)])
        elif kind == "noop_remove":
            index.apply(source, [("remove", forest.foreign[:2], None)])
        elif kind == "clear":
            index.clear(source)
            model.clear(source)
        else:  # drop: the source is gone and a later store starts it afresh
            index.drop(source)
            model.clear(source)


def check(index: Any, model: Model, forest: Forest, extra: list[int]) -> None:
    for source, held in model.held.items():
        assert index.blocks(source) == len(held), source
    assert len(index) == len(set().union(*model.held.values()))
    for node in range(len(forest.ids)):
        for chain in (forest.path(node), forest.path(node) + extra, forest.path(node)[:1] + extra):
            assert index.longest_prefix(chain) == model.prefix(chain), chain


@EACH
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.lists(STEP, max_size=60), st.lists(st.integers(0, 7), max_size=3))
def test_matches_the_model_with_orphans_trims_evictions_and_clears(Index: type, seed: int, steps: list, tails: list[int]) -> None:
    forest = Forest(seed)
    index, model = Index(capacity_per_source=CAPACITY), Model(CAPACITY)
    run_world(index, model, forest, steps)
    check(index, model, forest, [forest.foreign[t] for t in tails])


@EACH
def test_orphans_and_trims_are_counted(Index: type) -> None:
    index = Index(capacity_per_source=3)
    index.apply("w", [("store", [5, 6], 4)])  # parent 4 not held: left out
    assert index.orphans == 2 and index.blocks("w") == 0 and len(index) == 0
    index.apply("w", [("store", [1, 2, 3, 4], None)])  # one over the bound: the newest goes
    assert index.evictions == 1 and index.longest_prefix([1, 2, 3, 4]) == {"w": 3}
    index.apply("w", [("store", [4, 5], 3)])  # 3 is held: accepted, then trimmed back to 3 blocks
    assert index.longest_prefix([1, 2, 3, 4, 5]) == {"w": 3} and index.evictions == 3


@EACH
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.integers(1, 4), st.integers(8, 64))
def test_a_radix_caches_stream_is_indexed_exactly_as_reported(Index: type, seed: int, page: int, capacity_pages: int) -> None:
    """A real radix cache (the simulator's: LRU leaves first) under a random workload: what it reports,
    applied to plain sets (no rules), is what the index answers; nothing is an orphan or trimmed."""
    rng = random.Random(seed)
    caches = {s: PrefixCache(page, capacity_pages * page) for s in ("a", "b", "c")}
    index = Index(capacity_per_source=1 << 16)
    plain: dict[str, set[int]] = {s: set() for s in caches}
    prompts = [[rng.randrange(6) for _ in range(rng.randrange(1, 40))] for _ in range(12)]
    asked = []
    for _ in range(40):
        tokens = rng.choice(prompts)[: rng.randrange(1, 41)] + [rng.randrange(6) for _ in range(rng.randrange(4))]
        source = rng.choice(list(caches))
        stored, evicted = caches[source].insert(tokens)
        ops: list = [("remove", evicted, None)] if evicted else []
        for p in stored:  # runs of pages that continue each other, each naming its parent
            if ops and ops[-1][0] == "store" and ops[-1][1][-1] == p.parent:
                ops[-1][1].append(p.block_hash)
            else:
                ops.append(("store", [p.block_hash], p.parent))
        index.apply(source, ops)
        plain[source].difference_update(evicted)
        plain[source].update(p.block_hash for p in stored)
        asked.append(page_hashes(tokens, page))
    assert index.orphans == index.evictions == 0
    model = Model(1 << 16)
    model.held = plain
    for chain in asked:
        assert index.longest_prefix(chain) == model.prefix(chain)
    assert {s: index.blocks(s) for s in caches} == {s: len(held) for s, held in plain.items()}


@EACH
def test_a_batch_applies_in_order(Index: type) -> None:
    index = Index()
    index.apply("w", [("store", [1, 2, 3], None), ("remove", [3], None), ("clear", [], None), ("store", [4], None),
                      ("remove", [9], None)])
    assert index.longest_prefix([4]) == {"w": 1}
    assert index.longest_prefix([1]) == {}
    assert index.blocks("w") == 1


@EACH
def test_dropped_columns_are_reused_and_start_empty(Index: type) -> None:
    index = Index()
    index.apply("keep", [("store", [1, 2], None)])
    for i in range(500):  # worker churn: register, index, remove
        index.apply(f"gone{i}", [("store", [1, 2, 3, 100 + i], None)])
        index.drop(f"gone{i}")
    assert index.sources() == 1
    assert index.width() == 2  # the point: no new column (bit) per worker ever seen
    index.apply("new", [("store", [5], None)])
    assert index.longest_prefix([1, 2, 3]) == {"keep": 2}
    assert index.longest_prefix([5]) == {"new": 1} and index.blocks("new") == 1
    index.drop("never-seen")  # a no-op, not an error


@EACH
def test_store_order_is_compacted_and_churn_stays_within_the_bound(Index: type) -> None:
    index = Index(capacity_per_source=1000)
    rng = np.random.default_rng(0)
    for _ in range(200):  # a worker that evicts what it stored: stale entries must not pile up
        ids = rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64).tolist()
        index.apply("w", [("store", ids, None), ("remove", ids[100:], None)])
    assert index.blocks("w") == len(index) <= 1000
    assert index.evictions > 0
    assert index.stored_entries("w") <= 2 * index.blocks("w") + 64 + 500


@EACH
def test_many_sources_use_wider_masks(Index: type) -> None:
    index = Index()
    for i in range(200):
        index.apply(("w", i), [("store", [1, 2, 3][: 1 + i % 3], None)])
    result = index.longest_prefix([1, 2, 3])
    assert len(result) == 200 and sorted(set(result.values())) == [1, 2, 3]


@EACH
def test_bad_input_is_refused(Index: type) -> None:
    with pytest.raises(ValueError):
        Index(capacity_per_source=0)
    with pytest.raises(ValueError):
        Index().apply("w", [("evict", [1], None)])


# Ids a hostile or odd publisher may send, and ids placed to collide in a table keyed by the id itself
# (multiples of a power of two share every low bit).
ODD_IDS = [*EDGE_IDS, *(k << 40 for k in range(1, 64)), *(-(k << 52) for k in range(1, 32))]
DIFF_STEP = st.tuples(
    st.integers(0, 5),  # source
    st.sampled_from(["store", "store", "store", "remove", "clear", "drop"]),
    st.lists(st.sampled_from(ODD_IDS) | st.integers(-(2**63), 2**63 - 1), max_size=24),  # a run, repeats allowed
    st.none() | st.sampled_from(ODD_IDS),  # parent
)


def observed(index: Any, sources: list[str], chains: list[list[int]]) -> tuple:
    return (len(index), index.evictions, index.orphans, index.sources(), index.width(),
            [(index.blocks(s), index.held(s), index.inventory(s)) for s in sources],
            [index.longest_prefix(c) for c in chains])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(DIFF_STEP, max_size=80), st.integers(1, 40))
def test_native_answers_as_the_reference_op_for_op(steps: list, capacity: int) -> None:
    """The same batches to both, every observable compared after each: holdings, store order (a snapshot's
    inventory), counters, prefix answers, including chains with ids outside int64 (held by nobody)."""
    native, reference = BlockIndex(capacity_per_source=capacity), ReferenceBlockIndex(capacity_per_source=capacity)
    sources = [f"w{i}" for i in range(6)]
    for source, op, run, parent in steps:
        s = sources[source]
        if op == "clear":
            native.clear(s), reference.clear(s)
        elif op == "drop":
            native.drop(s), reference.drop(s)
        else:
            batch = [(op, run, parent if op == "store" else None)]
            native.apply(s, batch), reference.apply(s, batch)
        chains = [run, ODD_IDS[:8], [*run[:3], 2**64, *run[3:]], [-(2**63) - 1, *run]]
        assert observed(native, sources, chains) == observed(reference, sources, chains)


def test_a_million_blocks_in_and_out_leave_the_table_small() -> None:
    """Churn through the table (grow, backward-shift deletes, shrink) keeps every answer and gives the
    memory back: a cleared source's slots are not kept."""
    rng = np.random.default_rng(1)
    ids = rng.integers(-(2**63), 2**63 - 1, 1 << 20, dtype=np.int64).tolist()
    tracemalloc.start()  # the native table allocates through PyMem_Raw*, which tracemalloc sees
    try:
        native = BlockIndex(capacity_per_source=1 << 21)
        native.apply("a", [("store", ids, None)])
        native.apply("b", [("store", ids[:1000], None)])
        full = tracemalloc.get_traced_memory()[0]
        assert len(native) == 1 << 20 and native.longest_prefix(ids[:2000]) == {"a": 2000, "b": 1000}
        native.apply("a", [("remove", ids[1000:], None)])
        assert len(native) == 1000 and native.longest_prefix(ids[:2000]) == {"a": 1000, "b": 1000}
        native.clear("a")
        assert native.longest_prefix(ids[:2000]) == {"b": 1000} and native.held("b") == set(ids[:1000])
        left = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert full > 16 << 20 and left < full / 50, (full, left)  # 16 MiB of slots at least, then next to none


def test_churn_at_a_resize_boundary_does_not_rebuild_the_table_each_batch() -> None:
    """Two blocks stored and removed, over and over, just where the table grows: at most one resize, not one a
    batch (a shrink as soon as the load fell under 3/8 of the grown table rebuilt a million slots each time)."""
    native = BlockIndex(capacity_per_source=1 << 22)
    grown = 1 << 20
    native.apply("w", [("store", list(range(1, grown * 3 // 4 + 2)), None)])  # one past 3/4: the table doubles
    assert native.slots() == 2 * grown
    native.apply("w", [("remove", [grown * 3 // 4 + 1, grown * 3 // 4], None)])
    sizes = {native.slots()}
    for i in range(20):
        extra = [-1 - 2 * i, -2 - 2 * i]
        native.apply("w", [("store", extra, None)])
        sizes.add(native.slots())
        native.apply("w", [("remove", extra, None)])
        sizes.add(native.slots())
    assert sizes == {2 * grown}
    native.apply("w", [("remove", list(range(1, grown * 3 // 8)), None)])  # the load under 1/4: now it shrinks
    assert native.slots() < 2 * grown and len(native) * 4 >= native.slots()


@EACH
def test_a_full_source_keeps_its_store_order_bounded(Index: Any) -> None:
    """A source at its bound that removes its oldest block and stores two, over and over (a worker whose cache is
    larger than the bound): each store trims, and the removed blocks' entries, in the middle of the store order where
    the trim never reaches, are compacted away rather than piling up."""
    index = Index(capacity_per_source=100)
    index.apply("w", [("store", list(range(100)), None)])
    oldest, new = 0, 100
    for _ in range(2000):
        index.apply("w", [("remove", [oldest], None), ("store", [new, new + 1], None)])
        oldest, new = oldest + 1, new + 2
    assert index.blocks("w") == 100 and index.stored_entries("w") <= 2 * 100 + 64


def test_the_native_table_refuses_a_batch_it_cannot_hold_and_changes_nothing() -> None:
    """Ids are int64 (the wire's and the snapshot's type): a batch with another id is refused whole, before any of
    its operations, so no count or bound is left half-updated."""
    native = BlockIndex(capacity_per_source=2)
    native.apply("w", [("store", [1, 2], None)])
    for batch, error in [([("store", [3, 4, 2**64], None)], OverflowError),
                         ([("remove", [1], None), ("remove", [2, 1.0], None)], TypeError),
                         ([("remove", [1], None), ("store", [5], "x")], TypeError),
                         ([("clear", (), None), ("evict", [1], None)], ValueError)]:
        with pytest.raises(error):
            native.apply("w", batch)
        assert (len(native), native.blocks("w"), native.held("w"), native.evictions) == (2, 2, {1, 2}, 0)


def test_a_query_reads_only_ints_so_no_python_code_runs_mid_query() -> None:
    """A chain element that is not an int is held by nobody, and its ``__index__`` is never called (one that answered
    differently on a second call once made the bisection read an empty slot)."""
    class Flaky:
        calls = 0

        def __index__(self) -> int:
            Flaky.calls += 1
            return 7 if Flaky.calls == 1 else 8

    native = BlockIndex()
    native.apply("w", [("store", [7], None)])
    assert native.longest_prefix([Flaky(), 7]) == {} and Flaky.calls == 0
    assert native.longest_prefix([7, Flaky()]) == {"w": 1}


def test_a_growth_moves_the_old_table_a_little_at_each_batch() -> None:
    """A doubling leaves the entries where they were and each later batch moves a few clusters (a rehash at once
    stopped every apply and query: 30 ms at 800k blocks, the event plane's p99 lag at 100k block events/s); every
    block is found meanwhile, in whichever table it is, and the old table is gone long before the next doubling."""
    native = BlockIndex(capacity_per_source=1 << 22)
    size = 1 << 16
    first = list(range(1, size * 3 // 4 + 2))  # one past 3/4 of the table: it doubles at the last insert
    native.apply("w", [("store", first, None)])
    assert native.slots() == 2 * size and native.unmoved() > 0.99 * len(first)
    stored, batches, nxt = list(first), 0, len(first) + 1
    while native.unmoved():
        before = native.unmoved()
        batch = list(range(nxt, nxt + 32))
        nxt += 32
        native.apply("w", [("store", batch, stored[-1])])
        stored += batch
        batches += 1
        assert before - native.unmoved() < 2048  # a few slots an insert, and the rest of the cluster it ends in
        if batches % 64 == 1:
            assert native.longest_prefix(stored) == {"w": len(stored)}
            assert native.longest_prefix([stored[0], stored[1], -5]) == {"w": 2}
    assert batches > 64 and native.slots() == 2 * size and len(native) == len(stored)  # 128: size/16 inserts
    assert native.held("w") == set(stored) and native.longest_prefix(stored) == {"w": len(stored)}


def test_a_growing_table_answers_as_the_reference_while_its_entries_move() -> None:
    """Stores, removals (backward shifts in either table), clears and queries while growths are under way: every
    answer is the reference's (a cluster moved in part would lose the blocks past its emptied slots)."""
    rng = random.Random(7)
    pool = [rng.getrandbits(64) - 2**63 for _ in range(6000)]
    native, reference = BlockIndex(capacity_per_source=1 << 20), ReferenceBlockIndex(capacity_per_source=1 << 20)
    sources = ["a", "b", "c"]
    growing = 0
    for step in range(2000):
        s = rng.choice(sources)
        run = rng.sample(pool, rng.randint(1, 40))
        roll = rng.random()
        if roll < 0.01:
            native.clear(s), reference.clear(s)
        else:
            op = "store" if roll < 0.7 else "remove"
            native.apply(s, [(op, run, None)]), reference.apply(s, [(op, run, None)])
        chains = [run, rng.sample(pool, 20)]
        assert len(native) == len(reference)
        assert [native.longest_prefix(c) for c in chains] == [reference.longest_prefix(c) for c in chains]
        if native.unmoved() or step % 100 == 0:  # every block looked up, in whichever table it is
            growing += native.unmoved() > 0
            assert observed(native, sources, []) == observed(reference, sources, [])
    assert observed(native, sources, [pool]) == observed(reference, sources, [pool])
    assert growing > 40  # batches with a growth under way (~70 here)
