"""The routing benchmark's traces (benchmarks/_traces.py) are deterministic, well-formed and shaped as named.

Not a benchmark: it checks the workload every router is fed, so a figure is not an artefact of a
malformed or drifting trace.
"""

from __future__ import annotations

import pytest

from benchmarks._traces import TRACES, Trace

ROLES = {"system", "user", "assistant"}


@pytest.mark.parametrize("name", sorted(TRACES))
def test_trace_is_deterministic_and_seeded(name: str) -> None:
    assert TRACES[name](0) == TRACES[name](0)
    assert TRACES[name](0) != TRACES[name](1)


@pytest.mark.parametrize("name", sorted(TRACES))
def test_trace_is_well_formed(name: str) -> None:
    trace = TRACES[name](0)
    assert trace.name == name and trace.sessions
    for s in trace.sessions:
        assert s.opening[0]["role"] == "system" and s.opening[-1]["role"] == "user"
        assert all(m["role"] in ROLES and m["content"].strip() for m in s.opening)
        assert all(q.strip() for q in s.follow_ups) and s.start >= 0
    # every wave has work, and every request is in exactly one wave
    assert all(trace.active(w) for w in range(trace.waves))
    assert sum(len(trace.active(w)) for w in range(trace.waves)) == trace.requests


def shared_head(trace: Trace) -> dict[str, int]:
    """How many sessions open with each system prompt."""
    heads: dict[str, int] = {}
    for s in trace.sessions:
        heads[s.opening[0]["content"]] = heads.get(s.opening[0]["content"], 0) + 1
    return heads


def test_shapes() -> None:
    system = TRACES["system"](0)
    assert len(shared_head(system)) == 4 and min(shared_head(system).values()) > 4
    assert all(len(s.opening[0]["content"]) > 10 * len(s.opening[1]["content"]) for s in system.sessions)
    burst = TRACES["burst"](0)
    assert {s.start for s in burst.sessions} == {0} and len({s.opening[1]["content"] for s in burst.sessions}) == 64
    forks = TRACES["forks"](0)
    by_root: dict[str, list[tuple]] = {}
    for s in forks.sessions:
        by_root.setdefault(s.opening[0]["content"], []).append(s.opening)
    assert len(by_root) == 6
    for openings in by_root.values():  # forks of a root share its document and differ in where they branch
        assert len({o[1]["content"] for o in openings}) == 1
        assert len({len(o) for o in openings}) > 1
    chat = TRACES["chat"](0)
    assert len(chat.sessions) == 48 and {s.turns for s in chat.sessions} == {4}
