"""The parent's judgement of the candidate's raw answers to one call."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from cacheon.contract.inputs import Inputs, output_layout
from cacheon.contract.spec import ShapeCase, SlotSpec
from cacheon.verify import channel
from cacheon.verify.compare import bounds_in_force, compare, worst_elements
from cacheon.verify.messages import Poison, Raised, Reply, Result
from cacheon.verify.poison import left_in_place
from cacheon.verify.report import Mismatch
from cacheon.verify.rounding import widened
from cacheon.verify.untrusted import one_line


@dataclass
class Judgement:
    failures: list[str] = field(default_factory=list)
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    metric: dict[str, float] = field(default_factory=dict)
    detail: str = ""  # the candidate's traceback when it raised (shown with --debug only)
    tolerance: dict[str, float] = field(default_factory=dict)  # the bounds the outputs were judged by
    worst: list[Mismatch] = field(default_factory=list)  # of each output that failed its comparison
    returned: str = ""  # the child's description of what the entry returned: a hint, never evidence

    @property
    def ok(self) -> bool:
        return not self.failures


def judge(
    slot: SlotSpec, case: ShapeCase, dtype: str, expected_inputs: Inputs, reference: Inputs, reply: Reply,
    poison: Poison | None = None, rounding: Mapping[str, float] | None = None,
) -> Judgement:
    """Inputs the child must still hold unchanged, outputs against the float64 ``reference``; with the
    call's ``poison``, non-finite outputs the kernel never wrote are named as such. ``rounding``: per output,
    the reference's float32 rounding on this input, for a tolerance that scales with it (verify/rounding.py)."""
    if isinstance(reply, Raised):
        return Judgement([f"entry raised: {one_line(reply.reason)}"], detail=reply.detail)
    if not isinstance(reply, Result):
        return Judgement([f"the candidate process answered a call with {type(reply).__name__}"])
    # the reply's text was escaped as it was decoded; its tensors are rebuilt only if they are the
    # buffers the parent declared (names, dtypes, shapes), so no shape of the child's reaches torch
    result = Judgement([*reply.harness, *reply.violations], returned=one_line(reply.returned) if reply.returned else "")
    layout = output_layout(slot, case, dtype)
    try:
        inputs_after = channel.tensors_from_wire(reply.inputs_after, channel.layout_of(expected_inputs))
        outputs = channel.tensors_from_wire(reply.outputs, layout)
    except channel.ChannelError as exc:
        result.failures.append(f"the candidate process returned a malformed result ({exc})")
        return result
    for name, original in expected_inputs.items():
        if not torch.equal(inputs_after[name], original):
            result.failures.append(f"input {name} was modified by the candidate (inputs are read-only)")
    base = slot.comparator.tolerance(dtype)
    errors = rounding or {}
    result.tolerance = bounds_in_force(slot.comparator.mode, widened(base, max(errors.values(), default=0.0)))
    for name in layout:
        got = outputs[name]
        tol = widened(base, errors.get(name, 0.0))
        compared = compare(slot.comparator.mode, tol, got, reference[name])
        if result.max_abs_err is None or compared.max_abs_err > result.max_abs_err:
            result.max_abs_err, result.max_rel_err = compared.max_abs_err, compared.max_rel_err
        result.metric.update({f"{name}.{k}" if len(slot.outputs) > 1 else k: v for k, v in compared.metric.items()})
        if not compared.ok:
            left = "" if poison is None or not compared.metric.get("non_finite") else \
                left_in_place(got, poison, list(expected_inputs.values()))
            result.failures.append(f"output {name}: {compared.detail}{left}")
            result.worst += worst_elements(name, slot.comparator.mode, tol, got, reference[name])
    return result


def judge_ranks(
    slot: SlotSpec, case: ShapeCase, dtype: str, ranks: list[Inputs], reference: Inputs, replies: list[Reply],
    poison: Poison | None = None, rounding: Mapping[str, float] | None = None,
) -> Judgement:
    """Every rank judged against the same reference; one rank's failure fails the call."""
    verdicts = [judge(slot, case, dtype, ranks[r], reference, reply, poison, rounding)
                for r, reply in enumerate(replies)]
    if len(verdicts) == 1:
        return verdicts[0]
    failing = [(r, v) for r, v in enumerate(verdicts) if not v.ok]
    merged = Judgement([f"rank {r}: {f}" for r, v in failing for f in v.failures],
                       detail=next((v.detail for v in verdicts if v.detail), ""), tolerance=verdicts[0].tolerance,
                       returned=next((f"{v.returned} on rank {r}" for r, v in enumerate(verdicts) if v.returned), ""))
    if failing:  # the first failing rank's worst elements, named by rank
        r, first = failing[0]
        merged.worst = [replace(m, output=f"rank{r}.{m.output}") for m in first.worst]
    measured = [v for v in verdicts if v.max_abs_err is not None]
    if measured:
        worst = max(measured, key=lambda v: v.max_abs_err or 0.0)
        merged.max_abs_err, merged.max_rel_err, merged.metric = worst.max_abs_err, worst.max_rel_err, worst.metric
    return merged
