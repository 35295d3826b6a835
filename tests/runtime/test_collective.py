"""The all-or-nothing protocol on a real gloo world of two processes, without SGLang (plain groups).

The same protocol inside SGLang's own GroupCoordinator is tests/sglang/test_activation_collective.py.
"""

from __future__ import annotations

import pytest

from cacheon.bundle.digest import bundle_digest
from tests.runtime.collective_worker import launch, write_rank1_failing_bundle
from tests.runtime.sglang_tier import EXAMPLES

pytestmark = pytest.mark.slow  # gloo rank processes

FAITHFUL = EXAMPLES / "allreduce-torch"
BROKEN = EXAMPLES / "allreduce-broken-local"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    rank1_fails = write_rank1_failing_bundle(tmp_path_factory.mktemp("bundles") / "rank1-fails")
    f, r = str(FAITHFUL), str(rank1_fails)
    df, dr, db = bundle_digest(FAITHFUL), bundle_digest(rank1_fails), bundle_digest(BROKEN)
    scenarios = [
        {"name": "same", "bundles": [f, f], "digests": [df, df]},
        {"name": "differ", "bundles": [f, str(BROKEN)], "digests": [df, db]},
        {"name": "refused", "bundles": [f, ""], "digests": [df, None]},
        {"name": "incomplete", "bundles": [r, r], "digests": [dr, dr]},
        {"name": "broken", "bundles": [str(BROKEN), str(BROKEN)], "digests": [db, db]},
    ]
    return launch("plain", scenarios, tmp_path_factory.mktemp("out"))


def test_same_digest_and_completed_call_arms_everywhere(ranks):
    assert [r["same"] for r in ranks] == [{"ok": True}, {"ok": True}]


@pytest.mark.parametrize(
    ("scenario", "reason"),
    [
        ("differ", "ranks armed different bundles"),
        ("refused", "rank 1 could not arm: no bundle on this rank"),
        ("incomplete", "rank 1 could not complete the call: RuntimeError: rank 1 cannot complete all_reduce"),
        ("broken", "rank 0 could not complete the call: SeamViolation: all_reduce probe"),
    ],
)
def test_any_rank_failing_aborts_every_rank(ranks, scenario, reason):
    for rank in ranks:
        assert rank[scenario]["ok"] is False
        assert rank[scenario]["error"].startswith("CollectiveAbort: ")
        assert reason in rank[scenario]["error"]
