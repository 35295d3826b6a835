"""Routing precision's parts: the engine's cached-token count as each endpoint reports it, a stream's
last counting event, and the per-worker score."""

from __future__ import annotations

import pytest

from cacheon.gateway import precision
from cacheon.gateway.precision import Match, Precision, StreamTail, reported_cached
from cacheon.gateway.prediction import NoPrediction


@pytest.mark.parametrize(
    ("kind", "body", "cache_report", "expected"),
    [
        ("completion", b'{"usage": {"prompt_tokens_details": {"cached_tokens": 32}}}', True, 32),
        ("chat", b'{"usage": {"prompt_tokens_details": null}}', True, 0),  # the pin's "nothing cached"
        ("chat", b'{"usage": {"prompt_tokens_details": null}}', False, None),  # no report: unknown, not 0
        ("completion", b'{"choices": []}', True, None),  # a stream chunk without usage
        ("generate", b'{"meta_info": {"cached_tokens": 16}}', True, 16),
        ("generate", b'{"usage": {"prompt_tokens_details": {"cached_tokens": 16}}}', True, None),
        ("completion", b"not json", True, None),
    ],
)
def test_the_reported_count_per_endpoint(kind: str, body: bytes, cache_report: bool, expected: int | None) -> None:
    assert reported_cached(kind, body, cache_report) == expected


def test_a_stream_keeps_its_last_counting_event_across_chunk_boundaries() -> None:
    tail = StreamTail()
    event = b'data: {"choices": [], "usage": {"prompt_tokens_details": {"cached_tokens": 48}}}\n\n'
    for chunk in (b'data: {"choices": [{"text": "a"}]}\n\n', event[:20], event[20:], b"data: [DONE]\n\n"):
        tail.feed(chunk)
    assert tail.last is not None and reported_cached("completion", tail.last, True) == 48
    plain = StreamTail()
    plain.feed(b'data: {"choices": [{"text": "a"}]}\n\ndata: [DONE]\n\n')
    assert plain.last is None  # control: a stream without include_usage reports nothing


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_a_stream_cut_anywhere_gives_the_tail_it_gives_whole(size: int, eol: bytes,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Every cut, the separator's two line ends in different reads included, CRLF ones too (a CR and its LF in
    two reads): the event in progress is kept across reads (joined once it ends: one long event over many
    reads costs its length, not its square), and one past MAX_EVENT_BYTES is skipped to its end, never kept
    (one endless event held the whole stream) and never the tail, whether it came in one read or many."""
    monkeypatch.setattr(precision, "MAX_EVENT_BYTES", 100)
    usage = b'data: {"choices": [], "usage": {"prompt_tokens_details": {"cached_tokens": 48}}}'
    long = b'data: {"usage": "' + b"x" * 120 + b'"}'  # it names usage: only its length keeps it out
    events = [b'data: {"choices": [{"text": "a' + eol + b'b"}]}', long, usage, b'data: {"choices": [1]}', long,
              b"data: [DONE]"]
    stream = b"".join(e + eol + eol for e in events)
    whole, cut = StreamTail(), StreamTail()
    whole.feed(stream)
    for i in range(0, len(stream), size):
        cut.feed(stream[i : i + size])
        assert cut._held <= 100 + size
    assert cut.last == whole.last == usage[6:]


def test_mismatches_are_counted_by_direction_and_the_last_one_kept() -> None:
    p = Precision()
    assert p.score(32, 32, "r1") is Match.EXACT
    assert p.as_dict()["last_mismatch"] is None
    assert p.score(48, 0, "r2") is Match.OVER  # e.g. a cache flushed without an event
    assert p.score(0, 16, "r3") is Match.UNDER
    p.refused(NoPrediction.SALT_NOT_PUBLISHED)
    view = p.as_dict()
    assert (view["scored"], view["exact"], view["over"], view["under"]) == (3, 1, 1, 1)
    assert (view["predicted_tokens"], view["reported_tokens"]) == (80, 48)
    assert view["exact_ratio"] == pytest.approx(1 / 3)
    assert view["refusals"] == {"salt_not_published": 1}
    assert view["last_mismatch"]["request_id"] == "r3"
