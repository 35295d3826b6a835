"""All-or-nothing collective arming with SGLang's OWN GroupCoordinator on CPU (gloo), two real processes.

Each rank is armed the way a server's TP rank is: ``$CACHEON_BUNDLE`` plus the ``sglang.srt.plugins``
entry point (SGLang's ``load_plugins`` for the first scenario). Constructing the coordinator is where
every rank must agree on one digest and complete one call; if any rank cannot, every rank aborts and
is left disarmed, so no group ever runs mixed implementations.
"""

from __future__ import annotations

import pytest

from tests.runtime.collective_worker import launch, write_rank1_failing_bundle
from tests.runtime.sglang_tier import EXAMPLES, sglang_or_skip

pytestmark = pytest.mark.slow  # gloo ranks over the pinned SGLang

FAITHFUL = str(EXAMPLES / "allreduce-torch")
BROKEN = str(EXAMPLES / "allreduce-broken-local")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    sglang_or_skip()
    rank1_fails = str(write_rank1_failing_bundle(tmp_path_factory.mktemp("bundles") / "rank1-fails"))
    scenarios = [
        {"name": "agree", "bundles": [FAITHFUL, FAITHFUL]},
        {"name": "differ", "bundles": [FAITHFUL, BROKEN]},
        {"name": "refused", "bundles": [FAITHFUL, "/nonexistent/cacheon-bundle"]},
        {"name": "incomplete", "bundles": [rank1_fails, rank1_fails]},
    ]
    return launch("sglang", scenarios, tmp_path_factory.mktemp("out"))


def test_every_rank_arms_the_same_digest_and_reduces_through_the_bundle(ranks):
    expected = [[float(2 * (3 * row + col) + 1) for col in range(3)] for row in range(2)]
    for rank in ranks:
        agree = rank["agree"]
        assert agree["armed"], "SGLang's load_plugins did not arm cacheon: reinstall it (pip install -e .)"
        assert agree["ok"], agree
        assert agree["sum"] == expected
        assert agree["fired"] >= 1  # the receipt: GroupCoordinator.all_reduce went through the bundle
        assert agree["left_armed"]


@pytest.mark.parametrize(
    ("scenario", "reason"),
    [
        ("differ", "ranks armed different bundles"),
        ("refused", "rank 1 could not arm: cannot arm /nonexistent/cacheon-bundle"),
        ("incomplete", "rank 1 could not complete the call: RuntimeError: rank 1 cannot complete all_reduce"),
    ],
)
def test_if_any_rank_cannot_every_rank_aborts_and_is_left_stock(ranks, scenario, reason):
    for rank in ranks:
        result = rank[scenario]
        assert result["ok"] is False, result
        assert result["error"].startswith("CollectiveAbort: ") and reason in result["error"]
        assert result["fired"] == 0 and not result["left_armed"]
