"""What the harness asks a kernel with, so the asking does not give it away: serving token counts,
heavy-tailed inputs, stale-data poison, a varied call depth, a process group, every call judged."""

import dataclasses
import inspect
import random

import pytest
import torch

from cacheon.contract.catalog import ALL_REDUCE, ATTENTION_SDPA, MOE_FUSED_EXPERTS, SILU_AND_MUL
from cacheon.contract.inputs import OUTLIER_RANGE, draw_statistics, make_inputs
from cacheon.contract.serving import CHUNKED_PREFILL_SIZES, chosen_counts, cuda_graph_batch_sizes, serving_counts
from cacheon.verify import channel, poison
from cacheon.verify.child import nested
from cacheon.verify.messages import Poison
from cacheon.verify.plan import CaseKind, StabilityCall, eager_cases, stability_plan


def test_serving_counts_are_the_pins():
    counts = serving_counts(8192)
    assert {2048, 4096, 8192} <= set(counts) and 16384 not in counts  # chunked prefill, within the slot's range
    assert {1, 2, 4, 8, 12, 16, 24, 256, 272, 496, 512} <= set(counts)  # CUDA-graph capture sizes
    assert {1 << k for k in range(14)} <= set(counts)
    assert cuda_graph_batch_sizes()[-1] == 512 and 16384 in CHUNKED_PREFILL_SIZES


@pytest.mark.parametrize("seed", range(5))
def test_every_run_asks_for_the_extremes_and_a_few_drawn(seed):
    chosen = chosen_counts(8192, random.Random(seed))
    assert chosen[0] == 1 and chosen[-1] == 8192 and 3 <= len(chosen) <= 5
    assert chosen == chosen_counts(8192, random.Random(seed))  # reproducible from the seed


@pytest.mark.parametrize("seed", range(3))
def test_eager_plan_has_the_largest_serving_count_and_a_heavy_tailed_draw(seed):
    planned = eager_cases(SILU_AND_MUL, "float32", seed)
    by_kind = {p.kind: p for p in planned}
    assert by_kind[CaseKind.SERVING].case.dims["T"] == 8192
    assert any(p.kind is CaseKind.COUNT and p.case.dims["T"] == 1 for p in planned)
    drawn = by_kind[CaseKind.DRAWN].statistics
    assert drawn is not None and drawn.heavy


def test_heavy_tails_reach_massive_outliers_and_stay_finite():
    stats = draw_statistics(SILU_AND_MUL, random.Random(0), heavy=True)
    x = make_inputs(SILU_AND_MUL, SILU_AND_MUL.shapes[2], "float16", 1, stats)["x"].float()
    assert bool(torch.isfinite(x).all()) and float(x.abs().max()) <= OUTLIER_RANGE[1]
    assert float(x.abs().max()) >= OUTLIER_RANGE[0] > 8 * float(x.abs().median())
    plain = make_inputs(SILU_AND_MUL, SILU_AND_MUL.shapes[2], "float16", 1, None)["x"].float()
    assert float(plain.abs().max()) < OUTLIER_RANGE[0] / 2


def test_heavy_tails_only_where_serving_has_them():
    assert draw_statistics(MOE_FUSED_EXPERTS, random.Random(0), heavy=True).heavy
    for slot in (ALL_REDUCE, ATTENTION_SDPA):  # partial sums; q/k/v after a norm and RoPE
        assert not draw_statistics(slot, random.Random(0), heavy=True).heavy


def _filled(kind: poison.PoisonKind, pool: torch.Tensor | None, inputs: list[torch.Tensor]) -> torch.Tensor:
    out = torch.empty(64, 48)
    poison.fill(out, Poison(kind.value, 7, channel.to_wire(pool) if pool is not None else None), inputs)
    return out


def test_stale_poison_is_earlier_outputs_or_this_calls_inputs():
    pool = torch.arange(1000, dtype=torch.float32) + 0.5
    got = _filled(poison.PoisonKind.STALE_OUTPUT, pool, [])
    assert set(got.flatten().tolist()) <= set(pool.tolist())
    x = torch.randn(64, 96)
    got = _filled(poison.PoisonKind.STALE_INPUT, None, [x])
    assert set(got.flatten().tolist()) <= set(x.flatten().tolist())


def test_mixed_poison_combines_sources_and_no_pool_means_no_stale_outputs():
    kinds = {poison.draw_poison(random.Random(s)).kind for s in range(200)}
    assert poison.PoisonKind.STALE_OUTPUT.value not in kinds and poison.PoisonKind.STALE_INPUT.value in kinds
    pool = torch.full((100,), 3.0)
    kinds = {poison.draw_poison(random.Random(s), pool).kind for s in range(200)}
    assert kinds == {k.value for k in poison.PoisonKind}
    segments = []
    for seed in range(20):
        out = torch.empty(64, 48)
        poison.fill(out, Poison(poison.PoisonKind.MIXED.value, seed, channel.to_wire(pool)), [torch.randn(64, 96)])
        segments.append(bool((out == 3.0).any()) and bool((out != 3.0).any()))
    assert any(segments)  # pieces of an earlier output next to other memory, as in a reused block


def test_the_reference_pool_is_bounded():
    ref = {"out": torch.randn(100, 100, dtype=torch.float64)}
    pool = poison.reference_pool(ref)
    assert pool.dtype == torch.float32 and pool.numel() == poison.POOL_ELEMENTS


def test_nested_frames_deepen_the_call():
    def depth() -> int:
        return len(inspect.stack(0))

    assert nested(40, depth) == nested(0, depth) + 40


def test_every_stability_call_is_judged():
    plan = stability_plan(SILU_AND_MUL, ["float32"], 1, 50)
    assert len(plan.calls) == 50
    assert "checked" not in {f.name for f in dataclasses.fields(StabilityCall)}


def test_stale_own_poison_is_the_candidates_last_output_in_place():
    previous = torch.randn(64, 48)
    out = torch.empty(64, 48)
    poison.fill(out, Poison(poison.PoisonKind.STALE_OWN.value, 3), [], poison.kept([previous]))
    assert torch.equal(out, previous)  # what an allocator hands back: the same block, as it was left
    poison.fill(out, Poison(poison.PoisonKind.STALE_OWN.value, 3), [], None)
    assert bool(torch.isfinite(out).all())  # nothing kept yet: Gaussian values
