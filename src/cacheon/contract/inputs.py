"""Seeded, deterministic input generation and harness-owned output allocation."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping

import torch

from cacheon.contract.spec import ShapeCase, SlotSpec, TensorSpec


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any labels (slot, dtype, case, trial): stable across runs and hosts."""
    text = "\x1f".join(str(p) for p in parts).encode("utf-8")
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 1


def _fill(spec: TensorSpec, shape: tuple[int, ...], dims: Mapping[str, int], gen: torch.Generator) -> torch.Tensor:
    if spec.init == "normal":
        return torch.randn(shape, generator=gen, dtype=torch.float32)
    if spec.init == "wide_normal":
        return 4.0 * torch.randn(shape, generator=gen, dtype=torch.float32)
    if spec.init == "fan_in":
        # weights scaled like a trained layer's, so matmul outputs stay O(1) in low precision
        return torch.randn(shape, generator=gen, dtype=torch.float32) / math.sqrt(shape[-1])
    if spec.init == "row_scaled":
        # Rows of very different magnitude: a kernel that skips a normalisation cannot hide
        # behind inputs whose RMS happens to be close to 1.
        scale = torch.empty(shape[:1] + (1,) * (len(shape) - 1)).uniform_(-2.3, 2.3, generator=gen).exp()
        return torch.randn(shape, generator=gen, dtype=torch.float32) * scale
    if spec.init == "near_one":
        return 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float32)
    if spec.init == "topk_ids":
        # distinct experts per token, as a router's top-k produces
        scores = torch.rand((shape[0], dims["E"]), generator=gen)
        return scores.topk(shape[1], dim=-1).indices
    if spec.init == "topk_weights":
        return torch.softmax(torch.randn(shape, generator=gen), dim=-1)
    if spec.init == "seq_lens":
        # every length from 1 to the cache size can occur; the longest is always present
        lens = torch.randint(1, dims["L"] + 1, shape, generator=gen)
        lens[torch.randint(0, shape[0], (1,), generator=gen)] = dims["L"]
        return lens
    raise ValueError(f"unknown init {spec.init!r} for tensor {spec.name!r}")


def make_inputs(slot: SlotSpec, case: ShapeCase, dtype: str, seed: int) -> dict[str, torch.Tensor]:
    """Fresh CPU inputs for one trial; generated in fp32, then rounded to the run dtype."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for spec in slot.inputs:
        shape = spec.resolve_shape(case.dims)
        out[spec.name] = _fill(spec, shape, case.dims, gen).to(spec.resolve_dtype(dtype)).contiguous()
    return out


def refresh_dynamic(slot: SlotSpec, previous: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor]):
    """Next call's inputs: new graph-dynamic tensors, the same static ones (weights stay put)."""
    return {n: (fresh[n] if n in slot.graph_dynamic else t) for n, t in previous.items()}


def make_rank_inputs(
    slot: SlotSpec, case: ShapeCase, dtype: str, seed: int, world: int
) -> list[dict[str, torch.Tensor]]:
    """Per-rank inputs for a collective: ``per_rank`` tensors differ by rank, the rest are replicated."""
    shared = make_inputs(slot, case, dtype, seed)
    ranks = []
    for rank in range(world):
        own = make_inputs(slot, case, dtype, derive_seed(seed, "rank", rank))
        ranks.append({t.name: (own if t.per_rank else shared)[t.name] for t in slot.inputs})
    return ranks


def stack_partials(slot: SlotSpec, ranks: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The reference's view of a collective: per-rank tensors stacked on a new leading rank axis."""
    per_rank = {t.name for t in slot.inputs if t.per_rank}
    return {n: (torch.stack([r[n] for r in ranks]) if n in per_rank else t) for n, t in ranks[0].items()}


def output_layout(slot: SlotSpec, case: ShapeCase, dtype: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of every output; the harness allocates them, never the candidate."""
    return {o.name: (o.resolve_shape(case.dims), o.resolve_dtype(dtype)) for o in slot.outputs}


def jitter_case(slot: SlotSpec, case: ShapeCase, seed: int) -> ShapeCase:
    """The same case with a seeded, different token count (catches kernels tuned to one size)."""
    rng = random.Random(seed)
    base = case.dims[slot.token_dim]
    choices = [n for n in range(max(1, base // 2), base + base // 2 + 3) if n != base]
    dims = dict(case.dims)
    dims[slot.token_dim] = rng.choice(choices)
    return ShapeCase(dims, dict(case.params))
