"""Poison: what an output holds before the candidate writes it, drawn anew for every call.

A constant sentinel tells a kernel which calls are checked (a cheat computes only when ``out``
holds NaN). Here each call's poison is drawn from NaN, ±inf, plausible finite values (what a
reused serving buffer holds) or a mixture, so ``out`` says nothing about the call; whatever a
kernel leaves unwritten still differs from the reference.
"""

from __future__ import annotations

import random
from enum import StrEnum

import torch

from cacheon.verify.messages import Poison

POISON_INT = -0x5A5A5A5A


class PoisonKind(StrEnum):
    NAN = "nan"
    POS_INF = "+inf"
    NEG_INF = "-inf"
    PLAUSIBLE = "plausible"  # finite values of a typical activation's size
    MIXED = "mixed"  # plausible values with non-finite ones scattered in

    @classmethod
    def weights(cls) -> dict[PoisonKind, int]:
        return {cls.NAN: 2, cls.POS_INF: 1, cls.NEG_INF: 1, cls.PLAUSIBLE: 3, cls.MIXED: 1}


def draw_poison(rng: random.Random) -> Poison:
    weights = PoisonKind.weights()
    kind = rng.choices(list(weights), weights=list(weights.values()))[0]
    return Poison(kind.value, rng.getrandbits(63))


def fill(tensor: torch.Tensor, poison: Poison) -> None:
    """Write ``poison`` into ``tensor`` in place (its storage and layout untouched)."""
    gen = torch.Generator().manual_seed(poison.seed)
    kind = PoisonKind(poison.kind)
    if not tensor.dtype.is_floating_point:
        if tensor.dtype == torch.bool:
            tensor.copy_(torch.randint(0, 2, tensor.shape, generator=gen).bool())
        else:
            tensor.fill_(POISON_INT)
        return
    if kind in (PoisonKind.NAN, PoisonKind.POS_INF, PoisonKind.NEG_INF):
        tensor.fill_({PoisonKind.NAN: float("nan"), PoisonKind.POS_INF: float("inf")}.get(kind, float("-inf")))
        return
    scale = 10.0 ** (torch.rand((), generator=gen).item() * 2.0 - 1.0)
    values = torch.randn(tensor.shape, generator=gen) * scale
    if kind is PoisonKind.MIXED:
        specials = torch.tensor([float("nan"), float("inf"), float("-inf")])
        picks = specials[torch.randint(0, 3, tensor.shape, generator=gen)]
        values = torch.where(torch.rand(tensor.shape, generator=gen) < 0.1, picks, values)
    tensor.copy_(values)
