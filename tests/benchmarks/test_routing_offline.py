"""benchmarks/routing_offline.py replays a trace in virtual time: the same seed gives the same figures.

Not a benchmark: its comparisons between policies are only meaningful if a run is a pure function of
the trace, the seed and the policy (no wall clock, no thread timing).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from cacheon.sim.tokenizer import write_profile
from cacheon.tokens.profile import TokenizerProfile, TokenizerSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import routing_offline  # the benchmark imports its siblings (_traces) by name

ARGS = argparse.Namespace(workers=4, page=4, capacity_tokens=1 << 16, prefill_us_per_token=50.0,
                          decode_ms_per_token=5.0, max_running_requests=2, max_tokens=8)


def test_a_replay_is_a_function_of_trace_seed_and_policy() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer, template = write_profile(Path(tmp))
        profile = TokenizerProfile(TokenizerSpec(tokenizer, template, bos_token="<s>"))
    first, again = (routing_offline.run("forks", "exact", 0, ARGS, profile) for _ in range(2))
    assert first == again
    assert 0 < first.hit_rate < 1 and first.ttft_p50_ms > 0 and first.max_mean >= 1
    rule = routing_offline.run("forks", "cache-aware-rule", 0, ARGS, profile)
    assert rule != first  # the policies do differ on it
