"""Non-finite outputs that are the harness's poison, never overwritten, are named with their region
(``verify.poison.left_in_place``): "the kernel skipped these" is not "the kernel computed NaN"."""

from __future__ import annotations

import math

import pytest
import torch

from cacheon.verify.messages import Poison
from cacheon.verify.poison import PoisonKind, fill, left_in_place


def _skip_rows(out: torch.Tensor, every: int) -> None:
    """A kernel that writes every row but each ``every``-th (silu-cheat-skips-rows)."""
    keep = torch.arange(out.shape[0]) % every != every - 1
    out[keep] = 0.5


@pytest.mark.parametrize(("kind", "shown"), [(PoisonKind.NAN, "NaN"), (PoisonKind.POS_INF, "+inf"),
                                             (PoisonKind.NEG_INF, "-inf")])
def test_rows_a_kernel_skipped_are_named(kind: PoisonKind, shown: str) -> None:
    inputs = [torch.randn(128, 64)]
    poison = Poison(kind.value, 11)
    out = torch.empty(128, 32, dtype=torch.bfloat16)
    fill(out, poison, inputs)
    _skip_rows(out, 64)
    said = left_in_place(out, poison, inputs)
    assert said == (f"; 64 of them still hold the poison written there before the call ({shown}): most likely "
                    f"never overwritten (2 of 128 rows, 63..127; flat elements {63 * 32}..{128 * 32 - 1} of {128 * 32})")


def test_values_the_kernel_computed_are_not_called_poison() -> None:
    inputs = [torch.randn(8, 16)]
    poison = Poison(PoisonKind.NEG_INF.value, 3)
    out = torch.full((8, 8), 1.0)  # the kernel wrote every element ...
    out[2, 3] = math.nan  # ... and computed a NaN itself (where the poison was -inf)
    out[4, 4] = math.inf
    assert left_in_place(out, poison, inputs) == ""
    gaussian = Poison(PoisonKind.PLAUSIBLE.value, 3)  # finite poison: whatever is non-finite was computed
    out = torch.empty(8, 8)
    fill(out, gaussian, inputs)
    out[0] = math.inf
    assert left_in_place(out, gaussian, inputs) == ""


def test_mixed_poison_names_only_its_non_finite_segments() -> None:
    inputs = [torch.randn(64, 64)]
    for seed in range(40):
        poison = Poison(PoisonKind.MIXED.value, seed)
        out = torch.empty(64, 64)
        fill(out, poison, inputs)
        expected = int((~torch.isfinite(out)).sum())
        said = left_in_place(out, poison, inputs)  # nothing overwritten: every non-finite value is poison
        assert (said != "") == (expected > 0)
        if expected:
            assert said.startswith(f"; {expected} of them still hold the poison written there before the call (")


def test_the_judgement_names_the_unwritten_rows() -> None:
    """Through ``judge``: the parent's verdict on a reply whose ``out`` kept the poison in two rows."""
    from cacheon.contract.catalog import get_slot
    from cacheon.contract.inputs import make_inputs
    from cacheon.contract.spec import ShapeCase
    from cacheon.verify import channel
    from cacheon.verify.judge import judge
    from cacheon.verify.messages import Result

    slot = get_slot("activation.silu_and_mul")
    case = ShapeCase({"T": 128, "d": 32})
    inputs = make_inputs(slot, case, "float32", seed=1)
    reference = slot.reference(inputs, slot.scalars(case))
    poison = Poison(PoisonKind.NAN.value, 5)
    out = torch.empty(128, 32)
    fill(out, poison, list(inputs.values()))
    keep = torch.arange(128) % 64 != 63
    out[keep] = reference["out"][keep].float()
    reply = Result(0, channel.tensors_to_wire({"out": out}), channel.tensors_to_wire(inputs), [], [])
    verdict = judge(slot, case, "float32", inputs, reference, reply, poison)
    assert verdict.failures == ["output out: 64 non-finite values; 64 of them still hold the poison written there "
                                "before the call (NaN): most likely never overwritten (2 of 128 rows, 63..127; "
                                "flat elements 2016..4095 of 4096)"]
