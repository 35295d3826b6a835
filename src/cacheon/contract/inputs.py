"""Seeded, deterministic input generation and harness-owned output allocation."""

from __future__ import annotations

import hashlib
import random

import torch

from cacheon.contract.spec import ShapeCase, SlotSpec, TensorSpec


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any labels (slot, dtype, case, trial): stable across runs and hosts."""
    text = "\x1f".join(str(p) for p in parts).encode("utf-8")
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 1


def _fill(spec: TensorSpec, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    if spec.init == "normal":
        return torch.randn(shape, generator=gen, dtype=torch.float32)
    if spec.init == "row_scaled":
        # Rows of very different magnitude: a kernel that skips a normalisation cannot hide
        # behind inputs whose RMS happens to be close to 1.
        scale = torch.empty(shape[:1] + (1,) * (len(shape) - 1)).uniform_(-2.3, 2.3, generator=gen).exp()
        return torch.randn(shape, generator=gen, dtype=torch.float32) * scale
    if spec.init == "near_one":
        return 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float32)
    raise ValueError(f"unknown init {spec.init!r} for tensor {spec.name!r}")


def make_inputs(slot: SlotSpec, case: ShapeCase, dtype: str, seed: int) -> dict[str, torch.Tensor]:
    """Fresh CPU inputs for one trial; generated in fp32, then rounded to the run dtype."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for spec in slot.inputs:
        shape = spec.resolve_shape(case.dims)
        out[spec.name] = _fill(spec, shape, gen).to(spec.resolve_dtype(dtype)).contiguous()
    return out


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
