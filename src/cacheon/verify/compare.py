"""Comparators: how a candidate output is judged against the float64 reference."""

from __future__ import annotations

import math

import torch

from cacheon.contract.spec import CompareMode, Tolerance
from cacheon.verify.comparison import Comparison
from cacheon.verify.report import Mismatch
from cacheon.verify.selection import compare_selection

#: floor for the relative-error denominator, so exact zeros in the reference do not divide by zero
REL_EPS = 1e-6


def compare(mode: CompareMode, tol: Tolerance, got: torch.Tensor, ref: torch.Tensor) -> Comparison:
    """Judge ``got`` (any dtype) against ``ref`` (float64) under ``mode`` with ``tol``."""
    g = got.detach().to(device="cpu", dtype=torch.float64)
    r = ref.detach().to(device="cpu", dtype=torch.float64)
    if g.shape != r.shape:
        return Comparison(False, float("inf"), float("inf"), detail=f"shape {tuple(g.shape)} != {tuple(r.shape)}")
    if g.numel() == 0:
        return Comparison(True, 0.0, 0.0)
    if mode == "topk_overlap":  # a selection: -inf is a masked cell, legitimate where the reference has it
        return compare_selection(g, r, tol)
    finite = torch.isfinite(g)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        return Comparison(False, float("inf"), float("inf"), {"non_finite": float(bad)}, f"{bad} non-finite values")
    diff = (g - r).abs()
    max_abs = float(diff.max())
    max_rel = float((diff / (r.abs() + REL_EPS)).max())
    within = diff <= tol.atol + tol.rtol * r.abs()
    if mode == "allclose":
        return _allclose(within, max_abs, max_rel)
    if mode == "matched_ratio":
        ratio = float(within.double().mean())
        ok = ratio >= tol.min_ratio
        detail = "" if ok else f"matched ratio {ratio:.6f} < {tol.min_ratio}"
        return Comparison(ok, max_abs, max_rel, {"matched_ratio": ratio}, detail)
    if mode == "cosine":
        return _cosine(g, r, tol, max_abs, max_rel)
    raise ValueError(f"unknown comparator mode {mode!r}")


def _allclose(within: torch.Tensor, max_abs: float, max_rel: float) -> Comparison:
    mismatched = int((~within).sum())
    if mismatched == 0:
        return Comparison(True, max_abs, max_rel, {"mismatched": 0.0})
    flat = int((~within).flatten().nonzero()[0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), within.shape))
    detail = f"{mismatched}/{within.numel()} elements outside tolerance (first at {index})"
    return Comparison(False, max_abs, max_rel, {"mismatched": float(mismatched)}, detail)


def _cosine(g: torch.Tensor, r: torch.Tensor, tol: Tolerance, max_abs: float, max_rel: float) -> Comparison:
    gn, rn = float(g.norm()), float(r.norm())
    if rn == 0.0:
        ok = gn == 0.0
        return Comparison(ok, max_abs, max_rel, {"cosine": 1.0 if ok else 0.0}, "" if ok else "reference is zero")
    cos = float((g.flatten() @ r.flatten()) / max(gn * rn, 1e-300))
    norm_ratio = gn / rn
    problems = []
    if cos < tol.min_cosine:
        problems.append(f"cosine {cos:.6f} < {tol.min_cosine}")
    # The norm guard: a scaled output has cosine 1, so cosine alone would accept out = 2 * ref.
    if abs(norm_ratio - 1.0) > tol.norm_rtol:
        problems.append(f"norm ratio {norm_ratio:.6f} outside 1±{tol.norm_rtol}")
    return Comparison(not problems, max_abs, max_rel, {"cosine": cos, "norm_ratio": norm_ratio}, "; ".join(problems))


#: the fields of a Tolerance each comparator reads: what a FAIL shows as "the tolerance in force"
BOUNDS: dict[str, tuple[str, ...]] = {
    "allclose": ("atol", "rtol"),
    "matched_ratio": ("atol", "rtol", "min_ratio", "rounding"),
    "cosine": ("min_cosine", "norm_rtol"),
    "topk_overlap": ("topk", "min_ratio", "atol", "rtol"),
}


def bounds_in_force(mode: CompareMode, tol: Tolerance) -> dict[str, float]:
    return {name: getattr(tol, name) for name in BOUNDS[mode]}


def worst_elements(
    name: str, mode: CompareMode, tol: Tolerance, got: torch.Tensor, ref: torch.Tensor, count: int = 3
) -> list[Mismatch]:
    """The ``count`` elements of output ``name`` furthest outside the tolerance.

    Where the comparator bounds each element (allclose, matched_ratio) they are ranked by error over
    what is allowed there, and only those beyond it count; otherwise by absolute error. Equal values
    (equal infinities included) are no error; a non-finite value against a different one is an
    infinite error."""
    g = got.detach().to(device="cpu", dtype=torch.float64).flatten()
    r = ref.detach().to(device="cpu", dtype=torch.float64).flatten()
    if g.shape != r.shape or g.numel() == 0:
        return []
    same = (g == r) | (torch.isnan(g) & torch.isnan(r))
    error = torch.where(same, 0.0, (g - r).abs().nan_to_num(nan=math.inf, posinf=math.inf))
    per_element = mode in ("allclose", "matched_ratio")
    allowed = tol.atol + tol.rtol * r.abs()
    rank = (error / allowed).nan_to_num(nan=math.inf, posinf=math.inf) if per_element else error
    rank = torch.where(same, 0.0, rank)
    floor = 1.0 if per_element else 0.0  # an element within its bound is not "outside the tolerance"
    values, flat = rank.topk(min(count, rank.numel()))
    shape = tuple(got.shape)
    return [
        Mismatch(name, tuple(int(i) for i in torch.unravel_index(index, shape)), float(r[index]), float(g[index]),
                 float(error[index]), float(allowed[index]) if per_element else None)
        for value, index in zip(values.tolist(), flat, strict=True) if value > floor
    ]
