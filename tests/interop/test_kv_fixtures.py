"""The committed wire fixtures (tests/kv/fixtures/kv_wire.json) are exactly what each
release's own event classes encode: regenerated here and compared byte for byte.

CACHEON_WRITE_FIXTURES=1 rewrites the file from ``cases()`` before comparing (run it without -n).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cacheon.kv.contracts import INTEROP_RELEASES, for_version
from tests.interop.kv_interop import ReleasePublisher, cleared, removed, stored

pytestmark = pytest.mark.slow  # each release's publisher in a child process

FIXTURES = Path(__file__).resolve().parents[1] / "kv" / "fixtures" / "kv_wire.json"
INT64 = [2**63 - 1, -(2**63), 0, -1]


def cases(version: str) -> dict[str, dict]:
    """Named batches (rank, events) for one release; optional fields only where it has them."""
    optional = for_version(version).stored_optional
    out = {
        "stored_page": (0, [stored([11], None, page=1)]),
        "stored_chain": (0, [stored([12, 13, 14], 11, page=16)]),
        "stored_nil_medium": (0, [stored([15], None, medium=None)]),
        "int64_extremes": (0, [stored(INT64, None, page=1), removed(INT64)]),
        "removed": (0, [removed([12, 13])]),
        "removed_nil_medium": (0, [removed([14], medium=None)]),
        "cleared": (0, [cleared()]),
        "mixed": (2, [removed([1]), stored([2], None), cleared(), stored([3, 4], 2), removed([4])]),
        "host_tier": (1, [stored([21], None, medium="CPU_PINNED"), removed([22], medium="DISK")]),
        "empty": (3, []),
    }
    if {"metadata", "cache_salt"} & set(optional):
        out["salted"] = (0, [stored([31], None, cache_salt="tenant-a")])
    if "session_id" in optional:
        out["session"] = (0, [stored([32], None, cache_salt="t", session_id="s-9")])
    if "lora_name" in optional:
        out["lora_name"] = (0, [stored([33], None, lora_name="adapter-b")])
    return {name: {"rank": rank, "events": events} for name, (rank, events) in out.items()}


@pytest.mark.parametrize("version", INTEROP_RELEASES)
def test_fixtures_match_the_release(version: str) -> None:
    publisher = ReleasePublisher(version)
    try:
        fresh = {
            name: {**case, "payload": publisher.encode(case["rank"], *case["events"])}
            for name, case in cases(version).items()
        }
    finally:
        publisher.close()
    if os.environ.get("CACHEON_WRITE_FIXTURES"):
        data = json.loads(FIXTURES.read_text()) if FIXTURES.exists() else {}
        data[version] = fresh
        FIXTURES.parent.mkdir(parents=True, exist_ok=True)
        FIXTURES.write_text(json.dumps(dict(sorted(data.items())), indent=1, sort_keys=True) + "\n")
    assert json.loads(FIXTURES.read_text())[version] == fresh
