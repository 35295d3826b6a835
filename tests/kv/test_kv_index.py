"""The block index against a plain set-per-source model, plus its capacity bound."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheon.kv.index import BlockIndex

IDS = st.sampled_from([0, 1, -1, 7, 2**63 - 1, -(2**63), *range(100, 140)])
SOURCES = st.sampled_from([("a", 0), ("a", 1), ("b", 0), *[(f"w{i}", 0) for i in range(70)]])
OPS = st.lists(
    st.tuples(SOURCES, st.sampled_from(["store", "remove", "clear", "drop"]), st.lists(IDS, max_size=12)),
    max_size=40,
)


def model_prefix(model: dict, chain: list[int]) -> dict:
    out = {}
    for source, held in model.items():
        n = 0
        while n < len(chain) and chain[n] in held:
            n += 1
        if n:
            out[source] = n
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS, st.lists(st.lists(IDS, min_size=1, max_size=10), min_size=1, max_size=4))
def test_matches_a_set_model(ops: list, chains: list[list[int]]) -> None:
    index = BlockIndex(capacity_per_source=25)  # small: evictions happen too
    model: dict = {}
    fifo: dict = {}
    for source, op, ids in ops:
        held = model.setdefault(source, set())
        order = fifo.setdefault(source, [])
        if op == "drop":
            index.drop(source)
        else:
            index.apply(source, [(op, ids)])
        if op == "store":
            for h in ids:
                if h not in held:
                    held.add(h)
                    order.append(h)
            while len(order) > 25:  # the bound counts stores: oldest first, stale ones too
                held.discard(order.pop(0))
        elif op == "remove":
            held.difference_update(ids)
        else:  # clear, or drop: the source is gone and a later store starts it afresh
            held.clear()
            order.clear()
    for source, held in model.items():
        assert index.blocks(source) == len(held)
    assert len(index) == len(set().union(*model.values())) if model else len(index) == 0
    for chain in chains:
        assert index.longest_prefix(chain) == model_prefix(model, chain)


def test_a_batch_applies_in_order() -> None:
    index = BlockIndex()
    index.apply("w", [("store", [1, 2, 3]), ("remove", [2]), ("clear", []), ("store", [4]), ("remove", [9])])
    assert index.longest_prefix([4]) == {"w": 1}
    assert index.longest_prefix([1]) == {}
    assert index.blocks("w") == 1


def test_dropped_columns_are_reused_and_start_empty() -> None:
    index = BlockIndex()
    index.apply("keep", [("store", [1, 2])])
    for i in range(500):  # worker churn: register, index, remove
        index.apply(f"gone{i}", [("store", [1, 2, 3, 100 + i])])
        index.drop(f"gone{i}")
    assert index.sources() == 1
    assert index._bits[-1] < 1 << 2  # the point: no new column (bit) per worker ever seen
    index.apply("new", [("store", [5])])
    assert index.longest_prefix([1, 2, 3]) == {"keep": 2}
    assert index.longest_prefix([5]) == {"new": 1} and index.blocks("new") == 1
    index.drop("never-seen")  # a no-op, not an error


def test_capacity_evicts_oldest_first() -> None:
    index = BlockIndex(capacity_per_source=100)
    index.apply("w", [("store", list(range(100)))])
    index.apply("v", [("store", list(range(50)))])
    index.apply("w", [("store", list(range(100, 130)))])
    assert index.blocks("w") == 100 and index.evictions == 30
    assert index.longest_prefix(list(range(30))) == {"v": 30}  # w's oldest 30 went, v kept its own
    assert index.longest_prefix(list(range(30, 130))) == {"w": 100, "v": 20}
    index.apply("w", [("store", list(range(1000, 1250)))])  # one batch larger than the bound
    assert index.blocks("w") == 100
    assert index.longest_prefix(list(range(1150, 1250))) == {"w": 100}


def test_churn_stays_within_the_bound() -> None:
    index = BlockIndex(capacity_per_source=1000)
    rng = np.random.default_rng(0)
    for _ in range(200):
        ids = rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64).tolist()
        index.apply("w", [("store", ids), ("remove", ids[:100])])
    assert index.blocks("w") == len(index) <= 1000
    assert index.evictions > 0


def test_many_sources_use_wider_masks() -> None:
    index = BlockIndex()
    for i in range(200):
        index.apply(("w", i), [("store", [1, 2, 3][: 1 + i % 3])])
    result = index.longest_prefix([1, 2, 3])
    assert len(result) == 200 and sorted(set(result.values())) == [1, 2, 3]


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        BlockIndex(capacity_per_source=0)
    with pytest.raises(ValueError):
        BlockIndex().apply("w", [("evict", [1])])
