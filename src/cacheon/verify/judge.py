"""The parent's judgement of one raw answer from a candidate process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from cacheon.contract.inputs import output_layout
from cacheon.contract.spec import ShapeCase, SlotSpec
from cacheon.verify.compare import compare


@dataclass
class Judgement:
    failures: list[str] = field(default_factory=list)
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    metric: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures


def last_line(text: Any) -> str:
    lines = str(text).strip().splitlines()
    return lines[-1] if lines else "(no message)"


def _has_result_shape(payload: Any) -> bool:
    return (
        isinstance(payload, dict)
        and isinstance(payload.get("outputs"), dict)
        and isinstance(payload.get("inputs_after"), dict)
        and isinstance(payload.get("violations"), list)
        and isinstance(payload.get("harness"), list)
    )


def judge(
    slot: SlotSpec,
    case: ShapeCase,
    dtype: str,
    expected_inputs: dict[str, torch.Tensor],
    reference: dict[str, torch.Tensor],
    kind: str,
    payload: Any,
) -> Judgement:
    """Inputs the child must still hold unchanged, outputs against the float64 ``reference``."""
    if kind == "raised":
        return Judgement([f"entry raised: {last_line(payload)}"])
    if kind != "result" or not _has_result_shape(payload):
        return Judgement(["the candidate process returned a malformed result"])
    result = Judgement([str(v) for v in [*payload["harness"], *payload["violations"]]])
    for name, original in expected_inputs.items():
        after = payload["inputs_after"].get(name)
        if not isinstance(after, torch.Tensor) or after.shape != original.shape or not torch.equal(after, original):
            result.failures.append(f"input {name} was modified by the candidate (inputs are read-only)")
    tol = slot.comparator.tolerance(dtype)
    for name, (shape, out_dtype) in output_layout(slot, case, dtype).items():
        got = payload["outputs"].get(name)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != shape or got.dtype != out_dtype:
            result.failures.append(f"output {name}: missing or wrong shape/dtype")
            continue
        compared = compare(slot.comparator.mode, tol, got, reference[name])
        if result.max_abs_err is None or compared.max_abs_err > result.max_abs_err:
            result.max_abs_err, result.max_rel_err = compared.max_abs_err, compared.max_rel_err
        result.metric.update({f"{name}.{k}" if len(slot.outputs) > 1 else k: v for k, v in compared.metric.items()})
        if not compared.ok:
            result.failures.append(f"output {name}: {compared.detail}")
    return result
