"""Comparators: how a candidate output is judged against the float64 reference."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cacheon.contract.spec import CompareMode, Tolerance
from cacheon.verify.selection import compare_selection

#: floor for the relative-error denominator, so exact zeros in the reference do not divide by zero
REL_EPS = 1e-6


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    metric: dict[str, float] = field(default_factory=dict)
    detail: str = ""


def compare(mode: CompareMode, tol: Tolerance, got: torch.Tensor, ref: torch.Tensor) -> Comparison:
    """Judge ``got`` (any dtype) against ``ref`` (float64) under ``mode`` with ``tol``."""
    g = got.detach().to(device="cpu", dtype=torch.float64)
    r = ref.detach().to(device="cpu", dtype=torch.float64)
    if g.shape != r.shape:
        return Comparison(False, float("inf"), float("inf"), detail=f"shape {tuple(g.shape)} != {tuple(r.shape)}")
    if g.numel() == 0:
        return Comparison(True, 0.0, 0.0)
    if mode == "topk_overlap":  # a selection: -inf is a masked cell, legitimate where the reference has it
        s = compare_selection(g, r, tol)
        return Comparison(s.ok, s.max_abs_err, s.max_rel_err, s.metric, s.detail)
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
