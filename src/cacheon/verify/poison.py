"""Poison: what an output holds before the candidate writes it, drawn anew for every call.

A constant sentinel tells a kernel which calls are checked (a cheat computes only when ``out``
holds NaN), and so does any one synthetic distribution (i.i.d. Gaussian "plausible" values are
told apart from real stale memory by their moments). In serving, ``out`` holds what that memory
held last: an earlier output of the same op (often the kernel's own, from the layer before), or
another tensor's contents. So each call's poison is drawn from NaN, ±inf, Gaussian values,
**stale data** (earlier reference outputs shipped by the parent, this call's own inputs shifted,
the candidate's own previous output) or a mixture of them in contiguous segments, the way a
reused allocator block holds pieces of several earlier tensors. Whatever a kernel leaves
unwritten still differs from the reference.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from enum import StrEnum

import torch

from cacheon.verify import channel
from cacheon.verify.messages import Poison

POISON_INT = -0x5A5A5A5A
#: elements of earlier reference outputs the parent ships with a call as stale data
POOL_ELEMENTS = 1 << 12
#: elements of the candidate's own last output the child keeps (a same-size block is read from 0)
OWN_ELEMENTS = 1 << 18


class PoisonKind(StrEnum):
    NAN = "nan"
    POS_INF = "+inf"
    NEG_INF = "-inf"
    PLAUSIBLE = "plausible"  # i.i.d. Gaussian values of a typical activation's size
    STALE_OUTPUT = "stale-output"  # earlier reference outputs (what a correct kernel left there)
    STALE_INPUT = "stale-input"  # this call's own inputs, shifted (another tensor's memory)
    STALE_OWN = "stale-own"  # the candidate's own previous output (an allocator's same-size block)
    MIXED = "mixed"  # contiguous segments, each from one of the kinds above

    @classmethod
    def weights(cls, pool: bool) -> dict[PoisonKind, int]:
        """Stale data most often, as in serving; earlier outputs only once there are some."""
        weights = {cls.NAN: 2, cls.POS_INF: 1, cls.NEG_INF: 1, cls.PLAUSIBLE: 2, cls.STALE_OUTPUT: 3,
                   cls.STALE_INPUT: 2, cls.STALE_OWN: 2, cls.MIXED: 3}
        if not pool:
            del weights[cls.STALE_OUTPUT]
        return weights


def reference_pool(reference: dict[str, torch.Tensor]) -> torch.Tensor:
    """Stale data for later calls from one call's reference: its outputs, flattened, capped."""
    flat = torch.cat([t.detach().flatten().to(torch.float32) for t in reference.values()])
    return flat[:POOL_ELEMENTS].contiguous()


def kept(outputs: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """What the child keeps of a call's outputs as its ``stale-own`` data (bounded, CPU float32)."""
    floats = [t.detach().flatten()[:OWN_ELEMENTS].to("cpu", torch.float32) for t in outputs
              if t.dtype.is_floating_point]
    return torch.cat(floats)[:OWN_ELEMENTS].clone() if floats else None


def draw_poison(rng: random.Random, pool: torch.Tensor | None = None) -> Poison:
    weights = PoisonKind.weights(pool is not None and pool.numel() > 0)
    kind = rng.choices(list(weights), weights=list(weights.values()))[0]
    uses_pool = pool is not None and kind in (PoisonKind.STALE_OUTPUT, PoisonKind.MIXED)
    return Poison(kind.value, rng.getrandbits(63), channel.to_wire(pool) if uses_pool and pool is not None else None)


def _tiled(source: torch.Tensor, n: int, gen: torch.Generator, aligned: bool = False) -> torch.Tensor:
    """``n`` values of ``source`` read from a random offset (``aligned``: from its start when it
    is as large, as a same-size block handed out again), wrapping around."""
    offset = 0 if aligned and source.numel() >= n else int(torch.randint(0, source.numel(), (1,), generator=gen))
    rolled = source.roll(-offset)
    return rolled.repeat(math.ceil(n / source.numel()))[:n]


def _segment(kind: PoisonKind, n: int, gen: torch.Generator, pool: torch.Tensor | None,
             inputs: torch.Tensor | None, own: torch.Tensor | None) -> torch.Tensor:
    if kind is PoisonKind.STALE_OUTPUT and pool is not None and pool.numel():
        return _tiled(pool, n, gen)
    if kind is PoisonKind.STALE_INPUT and inputs is not None and inputs.numel():
        return _tiled(inputs, n, gen)
    if kind is PoisonKind.STALE_OWN and own is not None and own.numel():
        return _tiled(own, n, gen, aligned=True)
    if kind in (PoisonKind.NAN, PoisonKind.POS_INF, PoisonKind.NEG_INF):
        value = {PoisonKind.NAN: math.nan, PoisonKind.POS_INF: math.inf}.get(kind, -math.inf)
        return torch.full((n,), value)
    scale = 10.0 ** (float(torch.rand((), generator=gen)) * 2.0 - 1.0)
    return torch.randn(n, generator=gen).mul_(scale)


def left_in_place(got: torch.Tensor, poison: Poison, inputs: Sequence[torch.Tensor] = ()) -> str:
    """Of ``got``'s non-finite values, those that still hold the poison written there before the call,
    said with their region ("" when none): most likely the kernel never wrote them (a NaN it computed
    where the poison was NaN cannot be told apart, a NaN where the poison was finite or ±inf can).

    The poison is rebuilt here from the call's draw and inputs; ``stale-own`` data (the child's) is not
    known to the parent, so only the non-finite kinds are matched, element by element."""
    if not got.dtype.is_floating_point or got.numel() == 0:
        return ""
    before = torch.empty(got.shape, dtype=got.dtype)
    fill(before, poison, inputs)
    g = got.detach().to("cpu")
    left = (torch.isnan(g) & torch.isnan(before)) | (torch.isinf(g) & (g == before))
    flat = left.flatten().nonzero().flatten()
    if flat.numel() == 0:
        return ""
    lo, hi = int(flat[0]), int(flat[-1])
    values = g[left]
    kinds = "/".join(name for name, hit in (("NaN", torch.isnan(values)), ("+inf", values == math.inf),
                                            ("-inf", values == -math.inf)) if bool(hit.any()))
    where = f"flat elements {lo}..{hi} of {got.numel()}"
    if got.dim() >= 2:
        rows = torch.unique(flat // (got.numel() // got.shape[0]))
        where = f"{rows.numel()} of {got.shape[0]} rows, {int(rows[0])}..{int(rows[-1])}; " + where
    return (f"; {flat.numel()} of them still hold the poison written there before the call ({kinds}): "
            f"most likely never overwritten ({where})")


def fill(tensor: torch.Tensor, poison: Poison, inputs: Sequence[torch.Tensor] = (),
         own: torch.Tensor | None = None) -> None:
    """Write ``poison`` into ``tensor`` in place (its storage and layout untouched); ``inputs`` are
    this call's inputs (the stale data of ``stale-input``), ``own`` what the candidate wrote into
    its outputs last (``stale-own``; the child keeps it). A kind without its data falls back to
    Gaussian values."""
    gen = torch.Generator().manual_seed(poison.seed)
    kind = PoisonKind(poison.kind)
    if not tensor.dtype.is_floating_point:
        if tensor.dtype == torch.bool:
            tensor.copy_(torch.randint(0, 2, tensor.shape, generator=gen).bool())
        else:
            tensor.fill_(POISON_INT)
        return
    n = tensor.numel()
    if n == 0:
        return
    pool = channel.from_wire(poison.pool) if poison.pool is not None else None
    floats = [t.detach().flatten().to("cpu", torch.float32) for t in inputs if t.dtype.is_floating_point]
    stale = torch.cat(floats) if floats else None
    if kind is not PoisonKind.MIXED:
        values = _segment(kind, n, gen, pool, stale, own)
    else:
        parts = sorted(int(c) for c in torch.randint(0, n + 1, (int(torch.randint(1, 4, (1,), generator=gen)),),
                                                     generator=gen))
        kinds = [k for k in PoisonKind if k is not PoisonKind.MIXED]
        bounds = [0, *parts, n]
        values = torch.cat([
            _segment(kinds[int(torch.randint(0, len(kinds), (1,), generator=gen))], hi - lo, gen, pool, stale, own)
            for lo, hi in itertools.pairwise(bounds) if hi > lo
        ])
    tensor.copy_(values.reshape(tensor.shape))
