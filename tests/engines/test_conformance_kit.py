"""Known-answer tests over the conformance kit (tests/fixtures/engines/): frames real SGLang servers
published, replayed without a server. Fast; part of every run.

Each file must decode under its release's wire contract, and Cacheon's ``page_hashes`` must give
exactly the block ids the engine published, for every stored page and every request's full pages.
Salted chains are predicted from the salt's seed where the release's contract declares it
(``SaltedIds.SEEDED``); at the pin they are the plain chain, which is why the gateway refuses them there.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from cacheon.kv.contracts import CONTRACTS, SaltedIds, for_version
from cacheon.kv.events import BlockStored
from cacheon.kv.hashing import page_hashes, salt_seed
from cacheon.kv.wire import WireDecoder
from tests.engines import captures, kit
from tests.engines.server import RELEASES

FILES = [kit.kit_path(release, page) for release in RELEASES for page in kit.PAGE_SIZES]


def test_the_kit_covers_every_release_at_both_page_sizes() -> None:
    missing = [str(p.relative_to(kit.KIT.parent.parent.parent)) for p in FILES if not p.is_file()]
    assert not missing, f"re-record with scripts/record_engine_captures.py: {missing}"


def test_a_contract_claims_a_real_engine_exactly_where_the_kit_holds_its_captures() -> None:
    """`cacheon kv contracts` says REAL ENGINE for a release only while this kit proves it (both page
    sizes, replayed by the tests below), and every release the kit proves is claimed."""
    claimed = {v for c in CONTRACTS for v in c.engine_proven}
    recorded = {release for release in RELEASES
                if all(kit.kit_path(release, page).is_file() for page in kit.PAGE_SIZES)}
    assert claimed == recorded
    for c in CONTRACTS:
        assert set(c.engine_proven) <= set(c.versions), c.id


@pytest.fixture(params=FILES, ids=lambda p: p.stem)
def capture(request) -> dict:
    path: Path = request.param
    if not path.is_file():
        pytest.fail(f"{path} is missing: re-record with scripts/record_engine_captures.py")
    data = kit.load(path)
    data["payloads"] = [base64.b64decode(f["payload"]) for f in data["frames"]]
    data["pages"] = captures.pages(data["payloads"])
    return data


def test_frames_are_a_gapless_sequence_that_decodes_under_the_release_contract(capture) -> None:
    assert [f["seq"] for f in capture["frames"]] == list(range(len(capture["frames"])))
    decoder = WireDecoder(for_version(capture["release"]))
    stored = 0
    for payload in capture["payloads"]:
        batch = decoder.decode(payload, rank=0)
        stored += sum(isinstance(e, BlockStored) for e in batch.events)
    assert stored > 0


def test_every_unsalted_published_id_is_the_predicted_one(capture) -> None:
    page = capture["page_size"]
    prefixes = captures.prefixes(capture["pages"])
    checked = 0
    for stored in capture["pages"]:
        if stored.salt is None:
            assert page_hashes(list(prefixes[stored.block]), page)[-1] == stored.block
            checked += 1
    assert checked >= 3


def test_every_request_full_pages_have_the_published_ids(capture) -> None:
    page = capture["page_size"]
    for step in capture["steps"]:
        tokens = step["input_ids"]
        assert len(step["published"]) == len(tokens) // page, step["name"]
        plain = page_hashes(tokens, page)
        if step["cache_salt"] is None:
            assert step["published"] == plain, step["name"]
        elif for_version(capture["release"]).salted_ids is SaltedIds.SEEDED:
            assert step["salt_on_wire"]
            assert step["published"] == page_hashes(tokens, page, salt_seed(step["cache_salt"])), step["name"]
            assert not set(step["published"]) & set(plain), step["name"]  # control: never the plain ids
        else:
            assert not step["salt_on_wire"] and step["published"] == plain, step["name"]


def test_one_changed_token_changes_every_later_id(capture) -> None:
    """The known answers can fail: a prediction from slightly different tokens misses them."""
    page = capture["page_size"]
    cold = next(s for s in capture["steps"] if s["name"] == "cold")
    tokens = list(cold["input_ids"])
    tokens[page] += 1  # the first token of the second page
    wrong = page_hashes(tokens, page)
    assert wrong[0] == cold["published"][0]
    assert not set(wrong[1:]) & set(cold["published"][1:])


def test_the_repeat_reports_every_full_page_but_the_last_token_cached(capture) -> None:
    repeat = next(s for s in capture["steps"] if s["name"] == "repeat")
    assert repeat["cached_tokens"] == (repeat["prompt_tokens"] - 1) // capture["page_size"] * capture["page_size"]
