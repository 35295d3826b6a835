"""The rounding an honest kernel makes on one call's input, for tolerances that scale with it.

A fixed ``atol`` assumes outputs of O(1) computed from O(1) terms. An MoE expert sums hundreds of
products; under the heavy-tailed activations verify draws (Cauchy bulk, massive outliers) those terms
reach thousands while the output stays small, and float32 rounding alone puts an honest kernel past
1e-4 (seen in about 1 of 10 runs of the honest example, 1 call in 1,000). The scale of that rounding on
*this* input is measured, not guessed: the slot's own reference evaluated in float32, against float64.
A tolerance with ``rounding = k`` allows k times it on top of ``atol`` (the approach of TorchInductor's
accuracy check, which compares a result's error with that of a float64-checked low-precision reference).

What a candidate could hide under it is at most k times float32's own rounding on the harness's input:
no lower-precision shortcut (bf16, fp16, tf32 are 2^8 to 2^13 times coarser) and no dropped term larger
than that rounding. The input is the harness's; the candidate influences none of this.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from cacheon.contract.inputs import Inputs
from cacheon.contract.references import evaluated_in
from cacheon.contract.spec import SlotSpec, Tolerance


def rounding_errors(slot: SlotSpec, dtype: str, inputs: Inputs, scalars: Mapping[str, Any],
                    reference: Inputs) -> dict[str, float]:
    """Per output, the largest error of the reference evaluated in float32 on ``inputs``; empty where the slot's
    tolerance for ``dtype`` does not scale with it. A non-finite float32 evaluation widens nothing (0)."""
    if not slot.comparator.tolerance(dtype).rounding:
        return {}
    with evaluated_in(torch.float32):
        rough = slot.reference(inputs, scalars)
    errors = {}
    for name, exact in reference.items():
        error = float((rough[name].to(torch.float64) - exact).abs().max()) if exact.numel() else 0.0
        errors[name] = error if math.isfinite(error) else 0.0
    return errors


def widened(tol: Tolerance, error: float) -> Tolerance:
    """``tol`` with its atol widened by ``rounding`` times ``error`` (the bound in force for one output)."""
    return replace(tol, atol=tol.atol + tol.rounding * error) if tol.rounding and error else tol
