"""The selection comparator (topk_overlap): masks exact, ties and poison never a way to pass."""

import math

import pytest
import torch

from cacheon.contract.spec import Tolerance
from cacheon.verify.compare import compare
from cacheon.verify.messages import Poison
from cacheon.verify.poison import PoisonKind, fill

TOL = Tolerance(atol=1e-6, rtol=1e-5, min_ratio=0.875, topk=8)
NEG = -math.inf


def reference(rows: int = 4, blocks: int = 20, masked_from: tuple[int, ...] = (20, 12, 5, 1)) -> torch.Tensor:
    """Distinct scores per row; row r is -inf from block ``masked_from[r]`` on (fewer finite than k too)."""
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(rows, blocks, generator=gen, dtype=torch.float64)
    for r, start in enumerate(masked_from):
        ref[r, start:] = NEG
    return ref


def judge(got: torch.Tensor, ref: torch.Tensor, tol: Tolerance = TOL):
    return compare("topk_overlap", tol, got, ref)


def test_the_reference_itself_and_a_monotone_rescaling_pass():
    ref = reference()
    assert judge(ref.clone(), ref).ok
    assert judge(ref.float(), ref).ok  # the fp32 the harness allocates
    scaled = judge(3 * ref + 1, ref)  # a selection ignores a positive affine map of the scores
    assert scaled.ok and scaled.metric["topk_overlap"] == 1.0


def test_a_candidate_that_masks_a_visible_cell_fails_even_outside_the_top_k():
    ref = reference()
    got = ref.clone()
    lowest = int(ref[0].argmin())  # not among row 0's top-8: masking it changes no pick
    got[0, lowest] = NEG
    result = judge(got, ref)
    assert not result.ok and "-inf where the reference is finite (first at (0, " in result.detail
    assert result.metric["masked_visible"] == 1


def test_a_candidate_that_scores_a_masked_cell_fails():
    ref = reference()
    got = ref.clone()
    got[1, 15] = -1e30  # finite, below every real score: still not the mask
    result = judge(got, ref)
    assert not result.ok and "finite where the reference is -inf (masked) (first at (1, 15))" in result.detail


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("where", [(0, 0), (3, 7)])  # a visible cell; a masked one
def test_nan_and_plus_inf_always_fail(bad, where):
    ref = reference()
    got = ref.clone()
    got[where] = bad
    result = judge(got, ref)
    assert not result.ok and "NaN or +inf" in result.detail


@pytest.mark.parametrize("kind", list(PoisonKind))
def test_a_row_left_unwritten_keeps_its_poison_and_fails_unless_that_poison_is_the_right_mask(kind):
    ref = reference()
    got = torch.empty_like(ref)
    fill(got, Poison(kind.value, 7))
    got[:3] = ref[:3]  # row 3 (one visible block, then masked) never written
    result = judge(got, ref)
    assert not result.ok, kind
    # rows whose every cell is masked are the one place a -inf poison is already the right value
    masked_row = reference(masked_from=(20, 12, 5, 0))
    got[3] = NEG if kind is PoisonKind.NEG_INF else got[3]
    assert judge(got, masked_row).ok == (kind is PoisonKind.NEG_INF)


def test_a_constant_row_gains_nothing_from_ties():
    ref = reference()
    got = ref.clone()
    got[0] = 0.5  # every pick tied: broken against the candidate
    result = judge(got, ref)
    assert not result.ok and result.metric["topk_overlap"] == 0.0
    assert "worst row 0: 0 of 8 picks" in result.detail


def test_rounding_ties_in_the_candidate_pass_when_the_tied_cells_are_near_ties_of_the_reference():
    ref = torch.tensor([[float(i) for i in range(20)]], dtype=torch.float64)
    ref[0, 11] = 12.0 - 1e-7  # 11 and 12 differ in the reference by less than its tolerance ...
    got = ref.clone()
    got[0, 11] = got[0, 12] = 12.0  # ... and a low-precision kernel rounds both to one value
    bf16 = Tolerance(atol=1e-6, rtol=1e-2, min_ratio=1.0, topk=8)
    assert judge(got, ref, bf16).ok
    got[0, 4] = 12.0  # a tie that pulls in a cell the reference ranks far lower
    assert not judge(got, ref, bf16).ok


def test_ties_in_the_reference_at_the_boundary_accept_either_cell():
    ref = torch.tensor([[9.0, 8, 7, 6, 5, 4, 3, 2, 2, 1, 0, -1, -2, -3, -4, -5, -6]], dtype=torch.float64)
    exact = Tolerance(atol=0.0, rtol=0.0, min_ratio=1.0, topk=8)
    first, second = ref.clone(), ref.clone()
    first[0, 8] = 1.5  # picks block 7 as the 8th
    second[0, 7] = 1.5  # picks block 8 as the 8th
    assert judge(first, ref, exact).ok and judge(second, ref, exact).ok


def test_rows_with_fewer_finite_cells_than_k_select_all_of_them():
    ref = reference(masked_from=(3, 1, 20, 20))
    got = ref.clone()
    got[0, :3] = torch.tensor([1.0, 2.0, 3.0])  # reordered, but all three selected either way
    assert judge(got, ref).ok


def test_the_worst_row_decides_and_one_miss_in_eight_is_the_allowance():
    ref = torch.arange(40, dtype=torch.float64).reshape(2, 20)
    got = ref.clone()
    got[1, 11] = 100.0  # row 1's 9th best becomes its first pick: 7 of 8 right
    one = judge(got, ref)
    assert one.ok and one.metric["topk_overlap"] == 0.875
    got[1, 10] = 101.0  # two misses
    two = judge(got, ref)
    assert not two.ok and "worst row 1: 6 of 8 picks" in two.detail


def test_a_reversed_selection_fails_and_values_are_reported_not_judged():
    ref = reference(masked_from=(20, 20, 20, 20))
    result = judge(-ref, ref)
    assert not result.ok and result.metric["topk_overlap"] == 0.0
    assert math.isfinite(result.max_abs_err) and result.max_abs_err > 0


def test_a_reference_with_nan_is_a_harness_bug():
    ref = reference()
    ref[0, 0] = math.nan
    with pytest.raises(ValueError, match="reference bug"):
        judge(ref.clone(), ref)
