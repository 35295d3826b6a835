"""exact's cost choice, in-process and deterministic: a real index and chain cache, a fake clock.

Prompts here are 8 tokens at page 2 (4 blocks); a cost is in prefill tokens (module docstring of
``cacheon.gateway.policy``), so each expectation below is worked out in the test's comments.
"""

from __future__ import annotations

from collections import Counter

import pytest

from cacheon.gateway.config import WorkerSpec
from cacheon.gateway.policy import Exact, InFlight, RunTimes
from cacheon.gateway.workers import Discovery, Worker, WorkerState
from cacheon.kv.hashing import page_hashes
from cacheon.kv.index import BlockIndex
from cacheon.tokens.chains import ChainCache
from tests.gateway.snapshots import choose

TOKENS = list(range(8))
CHAIN = page_hashes(TOKENS, 2)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _worker(wid: str, in_flight: int = 0, max_running: int | None = None) -> Worker:
    w = Worker(wid, WorkerSpec(url=f"http://{wid}:1"),
               discovery=Discovery("0.5.22", "demo", 2, 1, 1, max_running=max_running))
    w.state, w.in_flight = WorkerState.READY, in_flight
    return w


def _exact(**kw) -> tuple[Exact, BlockIndex, Clock]:
    index, clock = BlockIndex(), Clock()
    return Exact(index, ChainCache(), clock=clock, **kw), index, clock


def test_the_deepest_holder_wins_an_idle_pool_and_a_miss_spreads() -> None:
    policy, index, _ = _exact()
    index.apply(("a", 0), [("store", CHAIN[:1], None)])
    index.apply(("b", 0), [("store", CHAIN[:3], None)])
    a, b, c = _worker("a"), _worker("b"), _worker("c")
    chosen = choose(policy, [a, b, c], TOKENS)
    assert (chosen.worker, chosen.reason, chosen.held) == (b, "prefix_hit", 6)  # 3 pages of 2 tokens
    fresh = [choose(policy, [a, b, c], [90 + i, 91, 92, 93]) for i in range(3)]
    assert {d.reason for d in fresh} == {"fallback_miss"} and {d.worker.id for d in fresh} == {"a", "b", "c"}
    b.state = WorkerState.FENCED
    assert choose(policy, [b], TOKENS).reason == "fallback_not_ready"


def test_a_full_worker_loses_once_its_slot_wait_costs_more_than_the_prefill_it_saves() -> None:
    # b holds 6 of the 8 tokens, a holds 2; one sequence slot each. Before any request has ended,
    # a waiting position costs a slot's share of the mean prompt (8 tokens); a busy slot's decode
    # costs a quarter of that share.
    policy, index, _ = _exact()
    index.apply(("a", 0), [("store", CHAIN[:1], None)])
    index.apply(("b", 0), [("store", CHAIN[:3], None)])
    a, b, c = (_worker(w, max_running=1) for w in "abc")
    b.in_flight = 1  # position 1 past its slot: 8 tokens of wait + 2 of decode + 2 uncached = 12
    # a: 6 uncached + 2 x the 4 tokens of b's private prefix it would prefill again = 14; c: 8 + 2 x 6 = 20
    assert choose(policy, [a, b, c], TOKENS)[:3] == (b, "prefix_hit", 6)
    b.in_flight = 2  # 16 + 2 + 2 = 20 > 14
    assert choose(policy, [a, b, c], TOKENS)[:3] == (a, "fallback_overload", 2)


def test_queued_prefill_counts_until_the_workers_kv_events_show_it() -> None:
    policy, index, _ = _exact(private_weight=1.0)
    a, b = _worker("a"), _worker("b")
    first = choose(policy, [a, b], TOKENS)  # turn 0: an idle tie goes to a; 8 tokens to prefill there
    assert first.worker is a
    choose(policy, [a], list(range(100, 200)))  # 100 more queued on a
    # Turn 2 would break a tie towards a again; but a: 108 queued + 8, b: 8.
    assert choose(policy, [a, b], list(range(300, 308))).worker is b
    assert policy._queued("a", policy._flying["a"]) == 108
    index.apply(("a", 0), [("store", CHAIN, None)])  # the first one's prefill is over
    assert policy._queued("a", policy._flying["a"]) == 100
    policy.released(first)
    assert len(policy._flying["a"]) == 1


def test_a_sibling_follows_a_request_in_flight_before_its_kv_events_arrive() -> None:
    sibling = [*TOKENS, 50, 51]  # the first one's prompt and a page of its own
    for overlay in (True, False):
        policy, _, _ = _exact(overlay=overlay)
        a, b = _worker("a"), _worker("b")
        first = choose(policy, [a, b], TOKENS)
        follow = choose(policy, [a, b], sibling)
        if overlay:  # there: 8 queued + 2 uncached; elsewhere 10; a tie, and the deeper cache wins it
            assert (follow.worker, follow.reason, follow.held) == (first.worker, "prefix_hit", 8)
        else:  # the index knows nothing yet: there 8 queued + 10, elsewhere 10
            assert follow.worker is not first.worker and follow.reason == "fallback_miss"


def test_a_private_prefix_stays_and_a_hot_one_spreads() -> None:
    # b holds the whole prompt; one sequence slot each. Before any request has ended a waiting
    # position costs the mean prompt (8 tokens here) over the slots (1).
    policy, index, _ = _exact()
    index.apply(("b", 0), [("store", CHAIN, None)])
    a, b = _worker("a", max_running=1), _worker("b", max_running=1)
    b.in_flight = 1  # b: 8 of slot wait + 2 of decode + 0 uncached; a: 8 uncached + 2 x the 8 private tokens = 24
    assert choose(policy, [a, b], TOKENS).worker is b
    policy._flying.clear()
    longer = choose(policy, [a, b], [*TOKENS, 60, 61])  # b: 8 + 2 + 2; a: 10 + 16
    assert longer.worker is b  # in flight on b now, 2 tokens to prefill: it shares the 8-token prefix
    b.in_flight = 2  # b: 2 queued + 16 of slot wait + 2; a: 8 uncached and no penalty, the prefix is a hot one
    assert choose(policy, [a, b], TOKENS)[:2] == (a, "fallback_overload")


def test_below_the_slot_bound_the_decode_already_running_counts() -> None:
    # Both hold the whole prompt; four slots each; a runs three sequences: 0.25 x 3/4 x 8 = 1.5 tokens.
    for weight, expected in ((0.25, "b"), (0.0, "a")):  # without the term: a tie, which turn 0 gives to a
        policy, index, _ = _exact(decode_weight=weight)
        for source in ("a", "b"):
            index.apply((source, 0), [("store", CHAIN, None)])
        a, b = _worker("a", in_flight=3, max_running=4), _worker("b", max_running=4)
        assert choose(policy, [a, b], TOKENS).worker.id == expected


def test_released_requests_teach_the_run_time_line() -> None:
    runtimes = RunTimes(min_samples=4)
    for work in (0, 100, 200, 300):
        assert runtimes.line() is None or work == 300
        runtimes.add(work, 0.05 + 1e-4 * work)
    a, b = runtimes.line()  # type: ignore[misc]
    assert (a, b) == (pytest.approx(0.05), pytest.approx(1e-4))
    flat = RunTimes(min_samples=2)
    for _ in range(5):
        flat.add(100, 0.2)
    assert flat.line() is None  # all the same work: no slope to learn


def test_a_line_whose_slope_is_uncertain_is_not_used() -> None:
    """A burst's first ends scatter about the line (the work queued ahead is the gateway's estimate): the slot
    wait divides by the slope, so one fitted from them is refused until the ends pin it down."""
    noisy = RunTimes(min_samples=4)
    for i, work in enumerate((0, 100, 200, 300) * 2):  # 0.1 ms a token, each end off by +-30 ms
        noisy.add(work, 0.05 + 1e-4 * work + (0.03 if i % 3 else -0.03))
    assert noisy.line() is None
    for work in (0, 100, 200, 300) * 40:  # what the later ends say, exactly
        noisy.add(work, 0.05 + 1e-4 * work)
    a, b = noisy.line()  # type: ignore[misc]
    assert (a, b) == (pytest.approx(0.05, rel=0.05), pytest.approx(1e-4, rel=0.05))


def test_the_slope_error_bound_is_what_refuses_a_noisy_line() -> None:
    """The negative control of the test above: the same ends with no bound on the slope's error give a line."""
    loose = RunTimes(min_samples=4, max_slope_error=float("inf"))
    for i, work in enumerate((0, 100, 200, 300) * 2):
        loose.add(work, 0.05 + 1e-4 * work + (0.03 if i % 3 else -0.03))
    assert loose.line() is not None


def test_the_slot_wait_is_the_expected_end_of_the_earliest_request() -> None:
    policy, _, clock = _exact()
    for work in (0, 100, 200, 300, 0, 100, 200, 300):  # taught: 50 ms of decode, 0.1 ms a prefill token
        policy.runtimes.add(work, 0.05 + 1e-4 * work)
    a, b = _worker("a", max_running=1), _worker("b", max_running=1)
    early = choose(policy, [a, b], list(range(300, 308))).worker  # routed at 100.000, 8 tokens: ends 100.0508
    late = b if early is a else a
    early.in_flight = late.in_flight = 1
    clock.now += 0.04
    assert choose(policy, [late], TOKENS).worker is late  # routed at 100.040: ends at 100.0908
    clock.now += 0.01
    sibling = [*TOKENS[:2], 70, 71, 72, 73, 74, 75]  # shares one page with the late one's prompt
    # late: 8 queued + (100.0908 - 100.05) / 0.1 ms = 408 of wait + 2 of decode + 6 uncached = 424
    # early: 8 queued + 8 of wait + 2 + 8 uncached (the shared page is hot: no penalty) = 26
    assert choose(policy, [a, b], sibling)[:2] == (early, "fallback_overload")
    clock.now += 0.05  # both should have ended by now
    cousin = [*TOKENS[:2], 80, 81, 82, 83, 84, 85]  # the same one page with both: late 8 queued + 0 + 6, early 16 + 0 + 6
    assert choose(policy, [a, b], cousin).worker is late
    assert policy.runtimes.samples == 8


def _hot_on_b(siblings: int, max_running: int | None, **kw) -> str:
    """b holds the 8-token prompt and prefills 16 unrelated tokens and ``siblings`` requests that share the
    prompt (2 tokens of their own each); where does one more sibling go, a idle and empty?"""
    policy, index, _ = _exact(**kw)
    index.apply(("b", 0), [("store", CHAIN, None)])
    a, b = _worker("a", max_running=max_running), _worker("b", max_running=max_running)
    choose(policy, [b], list(range(100, 116)))
    for k in range(siblings):
        choose(policy, [b], [*TOKENS, 50 + k, 60 + k])
    return choose(policy, [a, b], [*TOKENS, 90, 91]).worker.id


def test_a_hot_prefix_is_copied_only_once_its_sharers_outnumber_the_holders_slots() -> None:
    # b: 16 + 2k queued + 2 uncached. a: 10 uncached + (w - 1) x the 8 hot tokens it would prefill again,
    # w = 1 + 2 x min(1, b's 4 slots / (k siblings + this one)): k <= 3: w = 3, a 26 > b 20-24; k = 4: w = 2.6,
    # a 22.8 < b 26.
    assert [_hot_on_b(k, 4) for k in (1, 2, 3, 4)] == ["b", "b", "b", "a"]
    # One slot: with one sibling w = 2, a 18 < b 20; the old plain cost (w = 1) copies it with any.
    assert _hot_on_b(1, 1) == "a"
    assert _hot_on_b(1, 4, spread_by_demand=False) == "a"
    # No slot bound reported: no demand to weigh, the plain cost.
    assert _hot_on_b(1, None) == "a"


class StaleFleet:
    """The other replicas as ``Exact`` sees them: requests of theirs heard of, and how late they are heard."""

    def __init__(self, peers: int, delay: float, seen: dict[str, list[InFlight]] | None = None) -> None:
        self.peers, self.delay, self.seen = peers, delay, seen or {}

    def routed(self, ticket: InFlight) -> None:
        return None

    def ended(self, ticket: InFlight) -> None:
        return None

    def flying(self, worker: str) -> list[InFlight]:
        return self.seen.get(worker, [])

    def staleness(self) -> tuple[int, float]:
        return self.peers, self.delay


def _wave(fleet: StaleFleet, prompts: int = 8) -> list[str]:
    """A cold wave through one replica: distinct 8-token prompts routed as the proxy would (its own in-flight
    count rising on the chosen worker), while the peers' decisions heard of sit on a and b (two each)."""
    policy, _, _ = _exact()
    policy.fleet_load = fleet
    workers = [_worker(w) for w in "abcd"]
    chosen = []
    for p in range(prompts):
        decision = choose(policy, workers, [1000 * p + t for t in range(8)])
        decision.worker.in_flight += 1
        chosen.append(decision.worker.id)
    return chosen


def _seen_on_a_and_b() -> dict[str, list[InFlight]]:
    return {w: [InFlight(w, [9000 + 10 * i + j], 2, 8, 8, 100.0, True) for j in range(2)] for i, w in enumerate("ab")}


def test_replicas_that_hear_each_other_late_spread_their_own_requests_among_near_equal_costs() -> None:
    # Two peers, heard 1 s late: every decision of this replica's wave is within the delay, so as the wave
    # goes each peer may have routed as many unseen. The peers' four requests heard of (on a and b) are a
    # partial view: steering every request around them herds with the peers, who steer around this one's.
    stale = Counter(_wave(StaleFleet(2, 1.0, _seen_on_a_and_b())))
    assert sorted(stale.values()) == [2, 2, 2, 2]
    # Negative controls: heard at once (no delay), or no peers at all, the partial view is taken as whole.
    for fleet in (StaleFleet(2, 0.0, _seen_on_a_and_b()), StaleFleet(0, 1.0, _seen_on_a_and_b())):
        informed = Counter(_wave(fleet))
        assert informed["c"] + informed["d"] > informed["a"] + informed["b"]


def test_the_unseen_margin_never_moves_a_request_away_from_its_prefix() -> None:
    policy, index, _ = _exact()
    policy.fleet_load = StaleFleet(8, 10.0)
    index.apply(("b", 0), [("store", CHAIN, None)])
    a, b, c = _worker("a"), _worker("b"), _worker("c")
    for t in range(6):  # build a large margin: many recent decisions, the peers' unknown
        choose(policy, [a, c], [500 + 10 * t + i for i in range(8)])
    b.in_flight = 5  # this replica's own load is all on b, yet b alone holds the prompt
    assert choose(policy, [a, b, c], TOKENS)[:2] == (b, "prefix_hit")
