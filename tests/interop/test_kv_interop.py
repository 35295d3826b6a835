"""Every supported SGLang release's own ZmqEventPublisher against Cacheon's subscriber.

For each release: decode exactly under its contract (2 DP ranks), reject whole under a wrong
contract, recover a deliberate gap through that release's replay ROUTER, survive a publisher
restart, and drop a rank whose hole can no longer be replayed.
"""

from __future__ import annotations

import pytest

from cacheon.kv.contracts import CONTRACTS, INTEROP_RELEASES, for_version
from cacheon.kv.index import BlockIndex
from cacheon.kv.subscriber import Delivery, Subscriber
from cacheon.kv.wire import event_json
from tests.interop.kv_interop import (
    LossyHop,
    ReleasePublisher,
    cleared,
    expected_json,
    join,
    pump_until,
    removed,
    stored,
)

pytestmark = pytest.mark.slow  # each release's publisher in a child process

A = [101, -102, 103]  # rank 0's chain
B = [201, 202]  # rank 1, cleared later
C = [2**63 - 1, -(2**63)]  # rank 1 after the clear: int64 extremes


@pytest.fixture(scope="module", params=INTEROP_RELEASES)
def release(request: pytest.FixtureRequest):
    publisher = ReleasePublisher(request.param)
    yield publisher
    publisher.close()


@pytest.fixture
def harness():
    subscribers: list[Subscriber] = []
    hops: list[LossyHop] = []

    def make(index: BlockIndex | None = None) -> tuple[Subscriber, list[Delivery]]:
        seen: list[Delivery] = []
        subscriber = Subscriber(index, seen.append, replay_timeout_s=10.0)
        subscribers.append(subscriber)
        return subscriber, seen

    def hop(upstream: str) -> LossyHop:
        h = LossyHop(upstream)
        h.start()
        hops.append(h)
        return h

    yield make, hop
    for s in subscribers:
        s.close()
    for h in hops:
        h.close()


def _extras(version: str) -> dict[str, object]:
    """The optional BlockStored fields this release's contract declares, with values."""
    optional = for_version(version).stored_optional
    extras = {"cache_salt": "tenant-7"} if {"metadata", "cache_salt"} & set(optional) else {}
    if "session_id" in optional:
        extras["session_id"] = "s-1"
    if "lora_name" in optional:
        extras["lora_name"] = "adapter-a"
    return extras


def test_decodes_exactly_under_its_contract(release: ReleasePublisher, harness) -> None:
    make, _ = harness
    release.start(ranks=2, topic="kv")
    index = BlockIndex()
    subscriber, seen = make(index)
    feeds = subscriber.add_worker(
        "w",
        release.endpoint,
        for_version(release.version),
        range(2),
        replay_base=release.replay_endpoint,
        topic="kv",
    )
    join(subscriber, release, feeds)
    salted = stored([301], None, **_extras(release.version))
    rank0 = [
        stored(A[:2], None),
        stored(A[2:], A[1]),
        removed([A[2]]),
        stored([401], None, medium="CPU_PINNED"),
    ]
    rank1 = [stored(B, None, page=16), cleared(), stored(C, None, medium=None), salted]
    release.publish(0, *rank0[:2])
    release.publish(0, *rank0[2:])
    release.publish(1, *rank1)
    pump_until(subscriber, lambda: sum(d.batch is not None and bool(d.batch.events) for d in seen) == 3, "3 batches")

    batches = [d for d in seen if d.batch is not None and d.batch.events]
    assert [[event_json(e) for e in d.batch.events] for d in batches] == [
        [expected_json(e) for e in rank0[:2]],
        [expected_json(e) for e in rank0[2:]],
        [expected_json(e) for e in rank1],
    ]
    assert [d.source for d in batches] == [("w", 0), ("w", 0), ("w", 1)]
    assert index.longest_prefix(A) == {("w", 0): 2}
    assert index.longest_prefix(B) == {}
    assert index.longest_prefix(C) == {("w", 1): 2}
    assert index.longest_prefix([301]) == {("w", 1): 1}  # salted ids are indexed as published
    assert index.longest_prefix([401]) == {}  # a host-tier store does not make a GPU prefix
    counters = subscriber.counters()
    assert counters["rejects"] == {} and counters["gaps"] == 0 and counters["clears"] == 0
    assert counters["skipped_events"] == 1


def _wrong_contracts(version: str) -> list[tuple[str, dict]]:
    """(contract id, a stored event it must refuse) for this release's payloads: every contract
    of the other encoding, and a same-encoding sibling that lacks a field this release sends."""
    own = for_version(version)
    extras = _extras(version)
    used = {"metadata" if k == "cache_salt" and own.encoding == "tagged-array" else k for k in extras}
    out = []
    for c in CONTRACTS:
        if c.encoding != own.encoding:
            out.append((c.id, stored([7], None)))
        elif used - set(c.stored_optional):
            out.append((c.id, stored([7], None, **extras)))
    return out


def test_rejects_whole_under_a_wrong_contract(release: ReleasePublisher, harness) -> None:
    make, _ = harness
    release.start(ranks=1)
    for contract_id, event in _wrong_contracts(release.version):
        index = BlockIndex()
        subscriber, seen = make(index)
        contract = next(c for c in CONTRACTS if c.id == contract_id)
        (feed,) = subscriber.add_worker("w", release.endpoint, contract, [0])
        join(subscriber, release, [feed])
        release.publish(0, stored([5], None), event, removed([9]))
        pump_until(
            subscriber,
            lambda seen=seen: any(d.reject and d.reject.reason == "schema_mismatch" for d in seen),
            f"a reject under {contract_id}",
        )
        assert index.longest_prefix([5]) == {}, f"{contract_id} half-applied a rejected batch"
        assert subscriber.counters()["batches"] == sum(d.batch is not None for d in seen)


def test_rank_mismatch_is_rejected(release: ReleasePublisher, harness) -> None:
    make, _ = harness
    release.start(ranks=1)
    index = BlockIndex()
    subscriber, seen = make(index)
    contract = for_version(release.version)
    # A feed configured as rank 1 dialing rank 0's port: every batch says attn_dp_rank=0.
    subscriber.add_worker("w", f"tcp://127.0.0.1:{release.base - 1}", contract, [1])

    def rejected() -> bool:
        release.publish(0, stored([5], None))
        return any(d.reject for d in seen)

    pump_until(subscriber, rejected, "a rejected batch")
    assert {d.reject.reason for d in seen if d.reject} == {"rank_mismatch"}
    assert index.longest_prefix([5]) == {}


def test_recovers_a_gap_through_replay(release: ReleasePublisher, harness) -> None:
    make, hop = harness
    release.start(ranks=2, topic="kv-events")  # a topic, so 0.5.22+ replay replies carry one
    lossy = hop(f"tcp://127.0.0.1:{release.base + 1}")
    index = BlockIndex()
    subscriber, seen = make(index)
    contract = for_version(release.version)
    # rank 1 through the lossy hop: dial port (hop - 1) + rank 1.
    (feed,) = subscriber.add_worker(
        "w", f"tcp://127.0.0.1:{lossy.port - 1}", contract, [1], replay_base=release.replay_endpoint, topic="kv"
    )
    join(subscriber, release, [feed])
    release.publish(1, stored(A[:1], None))
    # Through before the hop drops (publishing is asynchronous): a lost first batch makes no hole.
    pump_until(subscriber, lambda: index.longest_prefix(A[:1]) != {}, "the batch before the hole")
    lossy.drop_next(2)
    release.publish(1, stored(A[1:2], A[0]))
    release.publish(1, stored(A[2:], A[1]), removed([A[0]]))
    release.publish(1, stored([9], A[2]))
    pump_until(subscriber, lambda: index.longest_prefix([9]) != {}, "the batch after the hole")

    assert len(lossy.dropped) == 2
    assert sorted(d.seq for d in seen if d.replayed and d.seq in lossy.dropped) == lossy.dropped
    counters = subscriber.counters()
    assert counters["gaps"] == 1 and counters["replay_failures"] == 0 and counters["clears"] == 0
    assert index.longest_prefix(A) == {}  # A[0] was removed inside the hole
    assert index.longest_prefix(A[1:]) == {("w", 1): 2}


def _other_framing(version: str):
    """A contract that decodes this release's plain events but expects the other replay framing."""
    own = for_version(version)
    return next((c for c in CONTRACTS if c.encoding == own.encoding and c.replay_framing != own.replay_framing), None)


@pytest.mark.parametrize("version", [v for v in INTEROP_RELEASES if _other_framing(v)])
def test_wrong_replay_framing_fails_closed(version: str, harness) -> None:
    make, hop = harness
    release = ReleasePublisher(version)
    try:
        release.start(ranks=1)
        lossy = hop(release.endpoint)
        index = BlockIndex()
        subscriber, _ = make(index)
        (feed,) = subscriber.add_worker(
            "w",
            f"tcp://127.0.0.1:{lossy.port}",
            _other_framing(version),
            [0],
            replay_base=release.replay_endpoint,
        )
        join(subscriber, release, [feed])
        release.publish(0, stored([1], None))
        pump_until(subscriber, lambda: index.longest_prefix([1]) != {}, "the batch before the hole")
        lossy.drop_next(1)
        release.publish(0, stored([2], 1))
        release.publish(0, stored([3], 2))
        # Its parent was in the hole: after the clear the index leaves the run out (an orphan).
        pump_until(subscriber, lambda: index.orphans == 1, "the batch after the hole")
    finally:
        release.close()
    counters = subscriber.counters()
    assert counters["gaps"] == 1 and counters["replay_failures"] == 1 and counters["clears"] == 1
    assert index.longest_prefix([1]) == {} and index.longest_prefix([3]) == {}  # the unknown state was dropped


def test_restart_clears_the_rank(release: ReleasePublisher, harness) -> None:
    make, _ = harness
    release.start(ranks=1)
    index = BlockIndex()
    subscriber, _ = make(index)
    (feed,) = subscriber.add_worker(
        "w", release.endpoint, for_version(release.version), [0], replay_base=release.replay_endpoint
    )
    join(subscriber, release, [feed])
    release.publish(0, stored(A, None))
    pump_until(subscriber, lambda: index.longest_prefix(A) != {}, "chain A")
    release.restart(0)  # a new publisher on the same ports: seq starts over at 0

    def b_arrived() -> bool:
        release.publish(0, stored(B, None))
        return index.longest_prefix(B) != {}

    pump_until(subscriber, b_arrived, "chain B from the restarted publisher")
    assert index.longest_prefix(A) == {}
    assert feed.counters.clears >= 1
    assert feed.counters.reconnects + feed.counters.restarts >= 1


def test_unreplayable_hole_drops_the_rank(release: ReleasePublisher, harness) -> None:
    make, hop = harness
    release.start(ranks=1, buffer_steps=2)
    lossy = hop(release.endpoint)
    index = BlockIndex()
    subscriber, _ = make(index)
    (feed,) = subscriber.add_worker(
        "w",
        f"tcp://127.0.0.1:{lossy.port}",
        for_version(release.version),
        [0],
        replay_base=release.replay_endpoint,
    )
    join(subscriber, release, [feed])
    release.publish(0, stored(A, None))
    # A must be through before the hop starts dropping (publishing is asynchronous): otherwise A is the
    # first batch dropped, the hole is found one batch early, and the 2-batch window holds 13.
    pump_until(subscriber, lambda: index.longest_prefix(A) != {}, "the batch before the hole")
    lossy.drop_next(4)  # 11-14 dropped; the ROUTER keeps 2 batches (14, 15): 11-13 are gone for good
    for h in (11, 12, 13, 14, 15):
        release.publish(0, stored([h], None))
    pump_until(subscriber, lambda: index.longest_prefix([15]) != {}, "the batch after the hole")
    counters = subscriber.counters()
    assert counters["gaps"] == 1 and counters["replay_failures"] == 1 and counters["clears"] == 1
    assert index.longest_prefix(A) == {}
    assert index.longest_prefix([11]) == index.longest_prefix([12]) == index.longest_prefix([13]) == {}
    assert index.longest_prefix([14]) == {("w", 0): 1}  # what replay still had is applied
