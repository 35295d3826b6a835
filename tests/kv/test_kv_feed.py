"""The ingest path without sockets: the sequencer's decisions, and the feed executing them on an index.

The property drives a feed with a simulated publisher (lost messages, restarts, reconnects, a
replay ROUTER that answers fully, partly, not at all or is backing off) and real fixture payloads,
some of them broken, and checks the index after every live message against a model built from
the sequencer's decisions and the accepted batches only: so a rejected batch that touched the
index, a clear that was decided but not done, or one done but not decided, all fail it.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheon.kv.contracts import for_version
from cacheon.kv.feed import Delivery, Feed
from cacheon.kv.index import BlockIndex, IndexOp
from cacheon.kv.replay import SKIPPED, Replayed, ReplayStatus
from cacheon.kv.sequencer import Continuity, Sequencer, Step
from cacheon.kv.wire import operations

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "kv_wire.json").read_text())
PIN = "0.5.13.post1"
SOURCE = ("w", 0)
# Under the pin's contract: its own rank-0 payloads decode; its other ranks (rank_mismatch), the
# salted 0.5.18 arrays and the 0.5.23 maps (schema_mismatch) and corrupted bytes are rejected.
PAYLOADS = [base64.b64decode(c["payload"]) for v in (PIN, "0.5.18", "0.5.23") for c in FIXTURES[v].values()]
PROBES = sorted({h for cases in FIXTURES.values() for c in cases.values() for e in c["events"]
                 for h in e.get("block_hashes", [])})


def test_sequencer_decisions() -> None:
    seq = Sequencer()
    first = seq.step(5)  # first contact: the hole before it is best effort
    assert first == Step(5, Continuity.FIRST, False, range(0, 5), False)
    assert seq.step(6) == Step(6, Continuity.NEXT, False, range(6, 6), True)
    gap = seq.step(9)
    assert gap == Step(9, Continuity.GAP, False, range(7, 9), True)
    assert gap.unfilled([7, 8]) is False and gap.unfilled([8]) and gap.unfilled(None)
    assert seq.step(2) == Step(2, Continuity.RESTART, True, range(0, 2), True)  # a new process
    seq.reconnected()  # a reconnect after contact: start over, dropping what the rank held
    assert seq.step(40) == Step(40, Continuity.FIRST, True, range(0, 40), False)
    fresh = Sequencer()
    fresh.reconnected()  # before any contact there is nothing to drop
    assert fresh.step(0) == Step(0, Continuity.FIRST, False, range(0, 0), False)
    assert not first.unfilled(None)  # a first-contact hole never makes the rank unknown


class Publisher:
    """What one SGLang publisher sent, by seq, for the fake ROUTER to answer from."""

    def __init__(self) -> None:
        self.next_seq = 0
        self.history: dict[int, bytes] = {}

    def emit(self, payload: bytes) -> int:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        self.history[seq] = payload
        return seq

    def restart(self) -> None:
        self.next_seq, self.history = 0, {}


class Router:
    """A replay ROUTER whose behaviour on each request is drawn by hypothesis."""

    def __init__(self, publisher: Publisher, data: st.DataObject) -> None:
        self.publisher, self.data = publisher, data
        self.answers: list[Replayed] = []

    def fetch(self, hole: range) -> Replayed:
        mode = self.data.draw(st.sampled_from(["full", "partial", "failed", "backing_off"]))
        held = [(s, self.publisher.history[s]) for s in hole if s in self.publisher.history]
        if mode == "partial" and held:
            del held[self.data.draw(st.integers(0, len(held) - 1))]
        answer = {"failed": Replayed(ReplayStatus.FAILED), "backing_off": SKIPPED}.get(
            mode, Replayed(ReplayStatus.DONE, held))
        self.answers.append(answer)
        return answer


def snapshot(index: BlockIndex[tuple[str, int]]) -> tuple[int, int, frozenset[int]]:
    return len(index), index.blocks(SOURCE), frozenset(h for h in PROBES if index.longest_prefix([h]))


def apply(model: set[int], delivery: Delivery) -> None:
    assert delivery.batch is not None
    for op, hashes, parent in operations(delivery.batch.events)[0]:
        if op == IndexOp.CLEAR:
            model.clear()
        elif op == IndexOp.STORE:
            if parent is None or parent in model:  # the index leaves out runs whose parent it lacks
                model.update(hashes)
        else:
            model.difference_update(hashes)


message = st.tuples(
    st.sampled_from(["next", "lose", "restart", "reconnect"]),  # what happens before this live message
    st.integers(1, 3),  # messages lost
    st.sampled_from(PAYLOADS),
    st.booleans(),  # corrupt the live payload
    st.integers(0, 10_000),  # where
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=st.lists(message, min_size=1, max_size=15), data=st.data())
def test_the_index_changes_only_by_decided_clears_and_accepted_batches(stream, data: st.DataObject) -> None:
    publisher = Publisher()
    router = Router(publisher, data)
    index: BlockIndex[tuple[str, int]] = BlockIndex(capacity_per_source=1 << 16)
    seen: list[Delivery] = []
    feed = Feed(SOURCE, for_version(PIN), replayer=router, index=index, on_delivery=seen.append)
    steps: list[Step] = []
    decide = feed.sequencer.step
    feed.sequencer.step = lambda seq: steps.append(decide(seq)) or steps[-1]  # a spy on the decisions
    model: set[int] = set()
    for before, lost, payload, corrupt, where in stream:
        if before == "lose":
            for _ in range(lost):
                publisher.emit(data.draw(st.sampled_from(PAYLOADS)))
        elif before == "restart":
            publisher.restart()
        elif before == "reconnect":
            feed.on_reconnect()
        if corrupt:
            at = where % max(len(payload), 1)
            payload = payload[:at] + b"\xc1" + payload[at:]
        seq = publisher.emit(payload)
        state, delivered, answers = snapshot(index), len(seen), len(router.answers)

        feed.on_live(seq, payload)

        step, arrived = steps[-1], seen[delivered:]
        assert step.seq == seq and feed.expected == seq + 1
        assert arrived[-1].seq == seq and not arrived[-1].replayed  # the live batch comes last
        replayed = router.answers[answers:]
        assert len(replayed) == (1 if step.hole else 0)
        if step.clear or (step.hole and step.unfilled(replayed[0].seqs)):
            model.clear()
        for delivery in arrived:
            if delivery.batch is not None:
                apply(model, delivery)
        assert snapshot(index)[2] == frozenset(model) & frozenset(PROBES)
        assert index.blocks(SOURCE) == len(model)
        if all(d.reject is not None for d in arrived) and not step.clear and not (
                step.hole and step.unfilled(replayed[0].seqs)):
            assert snapshot(index) == state  # a rejected batch never changes the index
    assert feed.counters.batches == sum(d.batch is not None for d in seen)
    assert sum(feed.counters.rejects.values()) == sum(d.reject is not None for d in seen)


def test_an_incomplete_replay_of_a_gap_clears_the_rank_once() -> None:
    """A concrete case of the property: the hole's second batch is gone from the ROUTER."""
    stored = base64.b64decode(FIXTURES[PIN]["stored_page"]["payload"])
    empty = base64.b64decode(FIXTURES[PIN]["cleared"]["payload"])

    class Partial:
        def fetch(self, hole: range) -> Replayed:
            return Replayed(ReplayStatus.DONE, [(hole.start, empty)])

    index: BlockIndex[tuple[str, int]] = BlockIndex()
    feed = Feed(SOURCE, for_version(PIN), replayer=Partial(), index=index)
    feed.on_live(0, stored)
    assert index.blocks(SOURCE) == 1
    feed.on_live(3, empty)  # 1 and 2 lost; replay brings only 1
    counters = feed.counters
    assert (counters.gaps, counters.replays, counters.replay_failures, counters.clears) == (1, 1, 1, 1)
    assert index.blocks(SOURCE) == 0


@pytest.mark.parametrize("status", [ReplayStatus.FAILED, ReplayStatus.SKIPPED])
def test_a_gap_without_replay_clears_the_rank(status: ReplayStatus) -> None:
    stored = base64.b64decode(FIXTURES[PIN]["stored_page"]["payload"])

    class Silent:
        def fetch(self, hole: range) -> Replayed:
            return Replayed(status)

    index: BlockIndex[tuple[str, int]] = BlockIndex()
    feed = Feed(SOURCE, for_version(PIN), replayer=Silent(), index=index)
    feed.on_live(0, stored)
    feed.on_live(2, stored)  # 1 lost: the rank is cleared, then this batch applies
    assert index.blocks(SOURCE) == 1 and feed.counters.clears == 1
    assert feed.counters.replay_failures == (status is ReplayStatus.FAILED)
