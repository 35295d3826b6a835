"""``cacheon demo`` end to end on a tiny workload: every policy runs live and reports its decisions."""

from __future__ import annotations

import json

import pytest

from cacheon.cli import main

pytestmark = pytest.mark.timeout(180)


def test_demo_runs_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--workers", "2", "--sessions", "4", "--turns", "3", "--json"]) == 0
    out = capsys.readouterr().out
    outcomes = {o["policy"]: o for o in json.loads(out[out.index("[") :])}
    assert list(outcomes) == ["rr", "approx", "exact"]
    assert outcomes["rr"]["reasons"] == {"rr:round_robin": 12}
    for policy in ("approx", "exact"):
        assert outcomes[policy]["reasons"].get(f"{policy}:prefix_hit", 0) > 0, outcomes[policy]
        assert sum(outcomes[policy]["load"].values()) == 12
    assert all(0 < o["hit_rate"] < 1 for o in outcomes.values())
