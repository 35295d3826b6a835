"""The hash challenge's echo sink: only the challenge's pages are kept, and a run of them is one the worker
published together (``gateway/attest.py``: ``Echoes``, ``_echoed``)."""

from __future__ import annotations

import msgspec
import pytest

from cacheon.gateway.attest import Echoes, Fence, _echoed
from cacheon.kv.events import BlockStoredV1
from cacheon.kv.feed import Delivery
from cacheon.kv.wire import DecodedBatch


def _stored(hashes: list[int], tokens: list[int], size: int) -> BlockStoredV1:
    return BlockStoredV1(hashes, None, msgspec.Raw(msgspec.msgpack.encode(tokens)), size, None)


def _deliver(echoes: Echoes, *events: BlockStoredV1, rank: int = 0) -> None:
    echoes.on_delivery("w", Delivery(("w", rank), 0, DecodedBatch(0.0, rank, list(events)), None, False))


def test_a_challenge_armed_during_a_backlog_keeps_only_its_pages() -> None:
    """A restarted gateway arms its challenge while it replays the plane's backlog: the sink must not hold it."""
    echoes, pages, chain = Echoes(), [(1, 2), (3, 4)], [11, 12]
    echoes.arm("w", pages)
    backlog = [_stored([1000 + 2 * i, 1001 + 2 * i], [100 + i, 7, 200 + i, 9], 2) for i in range(2000)]
    _deliver(echoes, *backlog)
    assert len(echoes.take("w")) == 1  # one gap for the whole backlog (every page kept: 4,000)
    _deliver(echoes, _stored(chain, [1, 2, 3, 4], 2))
    assert _echoed(echoes.take("w"), pages, chain)
    echoes.take("w", disarm=True)
    _deliver(echoes, *backlog)
    assert echoes.take("w") == []


def test_a_page_that_only_starts_like_the_challenges_is_not_kept() -> None:
    """The first-token test is a quick reject; a page is kept only when it is one of the challenge's."""
    echoes, pages = Echoes(), [(1, 2), (3, 4)]
    echoes.arm("w", pages)
    _deliver(echoes, *[_stored([10 * i, 10 * i + 1], [1, 9, 3, 9], 2) for i in range(100)])
    assert echoes.take("w") == [(None, 0, ())]  # one gap (every page kept: 200)


def test_pages_published_apart_are_not_taken_for_the_challenge() -> None:
    """Page size 1: the challenge's tokens on another prompt's pages, with another page between them, are
    not the challenge's run (its ids would differ, a false CHALLENGE_FAILED); the real echo is."""
    echoes, pages, chain = Echoes(), [(5,), (6,)], [51, 52]
    echoes.arm("w", pages)
    _deliver(echoes, _stored([111], [5], 1), _stored([333], [9], 1), _stored([222], [6], 1))
    assert not _echoed(echoes.take("w"), pages, chain)
    _deliver(echoes, _stored(chain, [5, 6], 1))
    assert _echoed(echoes.take("w"), pages, chain)


def test_a_gap_on_one_rank_does_not_split_another() -> None:
    echoes, pages, chain = Echoes(), [(5,), (6,)], [51, 52]
    echoes.arm("w", pages)
    _deliver(echoes, _stored([51], [5], 1), rank=1)
    _deliver(echoes, _stored([900], [9], 1), rank=0)  # another rank's page left out
    _deliver(echoes, _stored([52], [6], 1), rank=1)
    assert _echoed(echoes.take("w"), pages, chain)


def test_the_challenge_pages_with_other_ids_fence() -> None:
    echoes, pages, chain = Echoes(), [(5,), (6,)], [51, 52]
    echoes.arm("w", pages)
    _deliver(echoes, _stored([51, 99], [5, 6], 1))
    with pytest.raises(Fence, match="page 1 echoed block id 99, predicted 52"):
        _echoed(echoes.take("w"), pages, chain)
