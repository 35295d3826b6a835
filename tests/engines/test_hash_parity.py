"""Hash parity against real SGLang servers: every block id a real server publishes over ZMQ is the id
Cacheon predicts from the tokens, for each release that serves here, at page size 1 and 16.

Each server runs one fixed scenario (tests/engines/captures.py): a cold prompt, its repeat, a branch,
and a salted copy. The ids are read from the server's own frames; the prediction is
``page_hashes`` over the tokens those frames (and the request) name.
"""

from __future__ import annotations

import base64

import pytest

from cacheon.kv.contracts import SaltedIds, for_version
from cacheon.kv.hashing import page_hashes, salt_seed
from cacheon.kv.wire import WireDecoder
from tests.engines import captures
from tests.engines.conftest import serve
from tests.engines.server import RELEASES, EngineSpec

# Qwen2 on one release, Llama elsewhere: both families a real server loads from the tiny-model tool.
# Ordered so the pool (two live servers) ends on the pin and 0.5.23 at page 16, the two wire families
# the gateway tier (test_real_gateway.py) routes over next: no boot of their own.
_FIRST = ("0.5.13.post1", 1)
_LAST = [("0.5.13.post1", 16), ("0.5.23", 16)]
_ORDER = [_FIRST, *sorted({(r, p) for r in RELEASES for p in (1, 16)} - {_FIRST, *_LAST}), *_LAST]
SPECS = [EngineSpec(r, p, "qwen2" if r == "0.5.19" else "llama") for r, p in _ORDER]


@pytest.fixture(scope="module", params=SPECS, ids=lambda s: s.label)
def run(request, engine_pool):
    server = serve(engine_pool, request.param)
    capture = captures.run(server, salted=True)
    return server, capture, captures.pages(capture.payloads())


def test_every_published_block_id_is_predicted(run) -> None:
    server, capture, pages = run
    page = capture.page_size
    prefixes = captures.prefixes(pages)
    unsalted = [p for p in pages if p.salt is None]
    assert unsalted, "the server published no BlockStored"
    for stored in unsalted:
        tokens = prefixes[stored.block]
        assert len(tokens) % page == 0
        assert page_hashes(list(tokens), page)[-1] == stored.block, f"{server.spec.label}: {tokens}"


def test_every_full_prompt_page_is_published_with_the_predicted_id(run) -> None:
    _, capture, pages = run
    page = capture.page_size
    for step in capture.steps:
        if step["cache_salt"] is not None:
            continue
        tokens = step["input_ids"]
        published = captures.engine_chain(pages, tokens, page)
        assert len(published) == len(tokens) // page, f"{step['name']}: only {len(published)} pages published"
        assert published == page_hashes(tokens, page), step["name"]


def test_every_frame_decodes_under_the_release_wire_contract(run) -> None:
    server, capture, _ = run
    decoder = WireDecoder(for_version(server.spec.release))
    for frame in capture.frames:
        decoder.decode(base64.b64decode(frame["payload"]), rank=0)


def test_the_feed_is_gapless_and_replay_returns_exactly_what_was_published(run) -> None:
    server, capture, _ = run
    frames = [(f["seq"], base64.b64decode(f["payload"])) for f in capture.frames]
    assert [seq for seq, _ in frames] == list(range(len(frames)))
    assert {topic for topic, _, _ in server.feed.since(0)} == {b"kv"}
    live = {seq: payload for _, seq, payload in server.feed.since(0)}
    assert all(live[seq] == payload for seq, payload in frames if seq in live)
    # The live SUB saw everything but what a slow joiner can lose: the publisher's first sends (the pin
    # creates its PUB at the first publish and sends at once; a second batch can follow before the
    # connection is up), a leading run, never a hole after a frame that arrived live.
    missed = sorted(server.replayed)
    assert missed == list(range(len(missed))) and len(missed) < len(frames), \
        f"frames {missed} reached the SUB only through replay"
    assert server.replay(0) == frames


def test_a_repeated_prompt_reuses_every_full_page_but_never_its_last_token(run) -> None:
    """The engine caps a prefix match at len - 1 (it must compute the last token's logits), then at
    a page boundary: what a gateway has to predict for an identical repeat."""
    _, capture, _ = run
    page = capture.page_size
    repeat = next(s for s in capture.steps if s["name"] == "repeat")
    assert repeat["cached_tokens"] == (repeat["prompt_tokens"] - 1) // page * page


def test_salted_blocks_are_predicted_from_the_seed_exactly_where_the_contract_declares_it(run) -> None:
    """The pin keeps cache_salt in the radix key's namespace but hashes pages without it (and puts no
    salt on the wire); from 0.5.18 a salted chain starts from ``salt_seed`` (docs/sglang-hashing-facts.md)."""
    server, capture, pages = run
    salted = next(s for s in capture.steps if s["cache_salt"] is not None)
    seeded = for_version(server.spec.release).salted_ids is SaltedIds.SEEDED
    ids = captures.engine_chain(pages, salted["input_ids"], capture.page_size,
                                salt=salted["cache_salt"] if seeded else None)
    plain = page_hashes(salted["input_ids"], capture.page_size)
    assert len(ids) == len(plain), "the salted prompt's pages were not all published"
    if seeded:
        assert ids == page_hashes(salted["input_ids"], capture.page_size, salt_seed(salted["cache_salt"]))
        assert not set(ids) & set(plain), "salted ids collide with the unsalted chain"
    else:
        assert ids == plain
