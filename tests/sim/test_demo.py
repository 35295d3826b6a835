"""``cacheon demo`` end to end on a small trace: every policy runs live; exact keeps sessions on their cache."""

from __future__ import annotations

import json

import pytest

from cacheon.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # slow: the demo: workers and gateways as processes

SESSIONS, TURNS = 8, 4


def test_demo_exact_beats_round_robin(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--workers", "4", "--sessions", str(SESSIONS), "--turns", str(TURNS), "--arrivals", "4", "--seed", "3",
            "--json"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    outcomes = {o["policy"]: o for o in json.loads(out[out.index("[") :])}
    requests = SESSIONS * TURNS
    assert list(outcomes) == ["rr", "approx", "exact"]
    assert {o["seed"] for o in outcomes.values()} == {3}
    assert outcomes["rr"]["reasons"] == {"rr:round_robin": requests}
    assert all(sum(o["load"].values()) == requests and 0 < o["hit_rate"] < 1 for o in outcomes.values())
    exact = outcomes["exact"]
    # Follow-up turns (3 of 4) carry a private document only the previous turn's worker has cached.
    assert exact["reasons"].get("exact:prefix_hit", 0) > requests // 2, exact
    assert exact["hit_rate"] > 1.5 * outcomes["rr"]["hit_rate"], outcomes
    assert outcomes["approx"]["reasons"].get("approx:prefix_hit", 0) > 0, outcomes["approx"]


def test_the_seed_draws_the_workload() -> None:
    from cacheon.sim.demo import conversations

    assert conversations(4, 3, seed=5) == conversations(4, 3, seed=5)
    assert conversations(4, 3, seed=5) != conversations(4, 3, seed=6)
