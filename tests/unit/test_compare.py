import torch

from cacheon.contract.spec import Tolerance
from cacheon.verify.compare import compare

REF = torch.linspace(-2, 2, 100, dtype=torch.float64).reshape(10, 10)


def test_allclose_accepts_rounding_and_rejects_a_wrong_element():
    tol = Tolerance(atol=1e-2, rtol=1e-2)
    assert compare("allclose", tol, REF.bfloat16(), REF).ok
    bad = REF.clone()
    bad[3, 4] += 1
    result = compare("allclose", tol, bad, REF)
    assert not result.ok and "(3, 4)" in result.detail and result.metric["mismatched"] == 1


def test_non_finite_always_fails():
    got = REF.clone()
    got[0, 0] = float("nan")
    result = compare("allclose", Tolerance(atol=1e9, rtol=1e9), got, REF)
    assert not result.ok and "non-finite" in result.detail


def test_matched_ratio():
    got = REF.clone()
    got[0, :5] += 1  # 5% of elements off
    assert compare("matched_ratio", Tolerance(atol=1e-3, min_ratio=0.95), got, REF).ok
    assert not compare("matched_ratio", Tolerance(atol=1e-3, min_ratio=0.96), got, REF).ok


def test_cosine_has_a_norm_guard():
    tol = Tolerance(min_cosine=0.999, norm_rtol=0.01)
    assert compare("cosine", tol, REF * 1.001, REF).ok
    scaled = compare("cosine", tol, REF * 2, REF)
    assert not scaled.ok and "norm ratio" in scaled.detail


def test_topk_overlap():
    tol = Tolerance(topk=3, min_ratio=1.0)
    assert compare("topk_overlap", tol, REF + 1e-9, REF).ok
    flipped = REF.flip(-1)
    assert not compare("topk_overlap", tol, flipped, REF).ok


def test_shape_mismatch_fails():
    assert not compare("allclose", Tolerance(), REF[:5], REF).ok
