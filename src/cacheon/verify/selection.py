"""Judging a selection output (``topk_overlap``): scores whose only consumer is a top-k.

A selection is right when it picks the same cells, not when its values are close; but a bare
"overlap of two top-k index sets" can be gamed and can fail a faithful kernel:

- **Masks are exact.** ``-inf`` marks a cell that can never be selected (a key past the sequence,
  a block no key of which is visible). It is legitimate exactly where the reference has it: a
  candidate that masks a visible cell, or scores a masked one, fails, whatever its top-k.
  NaN and +inf are never legitimate, so poison left in ``out`` is always caught (-inf poison
  in a masked cell is the right value).
- **Rows with fewer finite cells than k** select all of them: k is capped per row.
- **Ties cannot decide a verdict.** A pick counts when its reference value is within
  ``atol + rtol·max|reference row|`` of the reference's k-th best, so rounding-level near-ties in
  the reference accept either cell; ties in the candidate are broken *against* it (the tied cell
  the reference ranks lowest is taken first), so a constant or coarsely rounded row gains nothing.

The metric is the worst row's share of hits; the values themselves are reported, never judged.
"""

from __future__ import annotations

import torch

from cacheon.contract.spec import Tolerance
from cacheon.verify.comparison import Comparison


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    flat = int(mask.flatten().nonzero()[0])
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), mask.shape))


def _mask_problems(g: torch.Tensor, r: torch.Tensor) -> tuple[dict[str, float], list[str]]:
    """Where the candidate's non-finite cells are not the reference's masked ones."""
    checks = (
        ("non_finite", torch.isnan(g) | torch.isposinf(g), "NaN or +inf"),
        ("masked_visible", torch.isneginf(g) & ~torch.isneginf(r), "-inf where the reference is finite"),
        ("unmasked", torch.isfinite(g) & torch.isneginf(r), "finite where the reference is -inf (masked)"),
    )
    metric, problems = {}, []
    for name, mask, what in checks:
        count = int(mask.sum())
        if count:
            metric[name] = float(count)
            problems.append(f"{count} cell(s) {what} (first at {_first(mask)})")
    return metric, problems


def compare_selection(g: torch.Tensor, r: torch.Tensor, tol: Tolerance) -> Comparison:
    """Judge float64 ``g`` against the float64 reference ``r`` (same shape, rows along the last axis)."""
    if bool(torch.isnan(r).any() | torch.isposinf(r).any()):
        raise ValueError("a selection reference holds NaN or +inf (a reference bug, not the candidate's)")
    metric, problems = _mask_problems(g, r)
    if problems:
        return Comparison(False, float("inf"), float("inf"), metric, "; ".join(problems))
    visible = torch.isfinite(r)
    diff = (g - r).abs()[visible]
    max_abs = float(diff.max()) if diff.numel() else 0.0
    max_rel = float((diff / (r[visible].abs() + 1e-6)).max()) if diff.numel() else 0.0
    overlap, row, hits, k = _worst_row(g.reshape(-1, r.shape[-1]), r.reshape(-1, r.shape[-1]), tol)
    ok = overlap >= tol.min_ratio
    detail = "" if ok else (
        f"worst row {row}: {hits} of {k} picks in the reference's top-{k} "
        f"(top-{tol.topk} overlap {overlap:.4f} < {tol.min_ratio})"
    )
    return Comparison(ok, max_abs, max_rel, {"topk_overlap": overlap}, detail)


def _worst_row(g: torch.Tensor, r: torch.Tensor, tol: Tolerance) -> tuple[float, int, int, int]:
    """(overlap, row, hits, k) of the row with the lowest share of hits; masks already agree."""
    if r.shape[0] == 0:
        return 1.0, 0, 0, 0
    width = r.shape[-1]
    k_rows = torch.isfinite(r).sum(dim=-1).clamp(max=tol.topk)  # (rows,)
    ranked_ref = r.sort(dim=-1, descending=True).values
    kth = ranked_ref.gather(-1, (k_rows - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)
    scale = torch.where(torch.isfinite(r), r.abs(), torch.zeros_like(r)).amax(dim=-1)
    threshold = kth - (tol.atol + tol.rtol * scale)
    # the candidate's picks, its ties broken against it: reference-ascending first, then a stable
    # candidate-descending sort
    by_ref = r.argsort(dim=-1, stable=True)
    by_got = g.gather(-1, by_ref).argsort(dim=-1, descending=True, stable=True)
    picks = by_ref.gather(-1, by_got)
    taken = torch.arange(width).unsqueeze(0) < k_rows.unsqueeze(-1)
    hit = (r.gather(-1, picks) >= threshold.unsqueeze(-1)) & taken
    hits = hit.sum(dim=-1)
    share = torch.where(k_rows > 0, hits.double() / k_rows.clamp(min=1).double(), torch.ones_like(hits.double()))
    row = int(share.argmin())
    return float(share[row]), row, int(hits[row]), int(k_rows[row])
