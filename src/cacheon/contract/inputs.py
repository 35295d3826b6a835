"""Seeded, deterministic input generation and harness-owned output allocation.

Besides the plain initialisation a slot declares, inputs can be drawn with varied statistics
(magnitude, signs, exact and signed zeros, subnormals of the run dtype, and the heavy tails of real
activations: Student-t bulk and rare massive outliers), so that a kernel cannot tell the harness's
calls from a serving batch by looking at the numbers it is given.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

import torch

from cacheon.contract.spec import ShapeCase, SlotSpec, TensorSpec

Inputs = dict[str, torch.Tensor]
Signs = Literal["mixed", "positive", "negative"]
#: initialisations that describe activations: the ones whose statistics a draw may vary
VARIED_INITS = frozenset({"normal", "wide_normal", "row_scaled"})
#: the slot families whose inputs carry heavy tails in serving: the residual stream and MLP
#: activations (norms, activations, MoE experts) hold massive outliers. Attention's q/k/v come after
#: a norm and RoPE, and its float32 tolerance is calibrated for O(1) scores (a softmax over scores in
#: the hundreds is not); collectives sum partials whose rounding scales with their size.
HEAVY_FAMILIES = frozenset({"activation", "norm", "moe"})
#: Student-t degrees of freedom a heavy-tailed draw uses (1: Cauchy; 2: infinite variance); both
#: have a closed-form inverse CDF, so a draw costs one uniform per entry
TAIL_DFS = (1, 2)
#: the absolute size of a massive outlier (real activations reach hundreds of times their median
#: entry in a few channels); bounded so a product of two stays finite in float16
OUTLIER_RANGE = (16.0, 64.0)


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any labels (slot, dtype, case, trial): stable across runs and hosts."""
    text = "\x1f".join(str(p) for p in parts).encode("utf-8")
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 1


@dataclass(frozen=True)
class Statistics:
    """How a draw departs from the slot's plain initialisation of its activations."""

    magnitude: float = 1.0
    signs: Signs = "mixed"
    zeros: float = 0.0  # share of entries set to exactly ±0
    subnormals: float = 0.0  # share of entries set to subnormal values of the run dtype
    tail_df: int = 0  # the bulk drawn Student-t with these degrees of freedom (0: as the slot inits it)
    outliers: float = 0.0  # share of entries set to a massive value (OUTLIER_RANGE, whatever the magnitude)

    @property
    def heavy(self) -> bool:
        return bool(self.tail_df or self.outliers)

    def label(self) -> str:
        tail = f" t{self.tail_df}" if self.tail_df else ""
        tail += f" outliers={self.outliers:.4f}" if self.outliers else ""
        return f"x{self.magnitude:.3g} {self.signs} zeros={self.zeros:.2f} subnormals={self.subnormals:.3f}{tail}"


def draw_statistics(slot: SlotSpec, rng: random.Random, heavy: bool | None = None) -> Statistics:
    """Varied statistics within what the slot's tolerances are calibrated for: sums across ranks
    (collectives) keep magnitudes at most 1, since rounding a partial sum scales with its size;
    heavy tails only in ``HEAVY_FAMILIES``. ``heavy``: force heavy tails on (True) or off (False)
    where the slot takes them; None draws it."""
    collective = slot.kind == "collective"
    tails = not collective and slot.name.partition(".")[0] in HEAVY_FAMILIES
    top = 0.0 if collective else 2.0
    signs: Signs = rng.choice(("mixed", "mixed", "positive", "negative"))
    stats = Statistics(
        magnitude=2.0 ** rng.uniform(-4.0, top),
        signs=signs,
        zeros=rng.uniform(0.0, 0.3) if rng.random() < 0.5 else 0.0,
        subnormals=rng.uniform(0.0, 0.05) if rng.random() < 0.5 else 0.0,
    )
    if not tails or heavy is False or (heavy is None and rng.random() >= 0.4):
        return stats
    return replace(stats, tail_df=rng.choice(TAIL_DFS) if rng.random() < 0.5 else 0,
                   outliers=10.0 ** rng.uniform(-4.0, -2.0))


def _student_t(shape: torch.Size, df: int, gen: torch.Generator) -> torch.Tensor:
    u = torch.rand(shape, generator=gen).clamp(1e-7, 1.0 - 1e-7)
    if df == 1:
        return torch.tan(math.pi * (u - 0.5))
    return (2.0 * u - 1.0) / (2.0 * u * (1.0 - u)).sqrt()


def _heavy(values: torch.Tensor, stats: Statistics, gen: torch.Generator) -> torch.Tensor:
    """A Student-t bulk at the draw's magnitude (the plain initialisation's row scaling kept), then
    massive outliers at a share of entries; every entry within the outlier bound."""
    out = values
    if stats.tail_df:
        out = values.abs() * _student_t(values.shape, stats.tail_df, gen)
    out = out.clamp(-OUTLIER_RANGE[1], OUTLIER_RANGE[1])
    count = max(1, round(stats.outliers * out.numel())) if stats.outliers and out.numel() else 0
    if count:
        low, high = OUTLIER_RANGE
        where = torch.randint(0, out.numel(), (count,), generator=gen)
        size = torch.empty(count).uniform_(low, high, generator=gen)
        out.view(-1)[where] = torch.where(torch.rand(count, generator=gen) < 0.5, size, -size)
    return out


def _vary(values: torch.Tensor, stats: Statistics, run_dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    out = values * stats.magnitude
    if stats.heavy:
        out = _heavy(out, stats, gen)
    if stats.signs != "mixed":
        out = out.abs() if stats.signs == "positive" else -out.abs()
    if stats.zeros:
        signed_zero = torch.where(torch.rand(out.shape, generator=gen) < 0.5, 0.0, -0.0)
        out = torch.where(torch.rand(out.shape, generator=gen) < stats.zeros, signed_zero, out)
    if stats.subnormals:
        tiny = torch.finfo(run_dtype).tiny
        sub = torch.empty(out.shape).uniform_(0.01, 0.99, generator=gen) * tiny
        sub = torch.where(torch.rand(out.shape, generator=gen) < 0.5, sub, -sub)
        out = torch.where(torch.rand(out.shape, generator=gen) < stats.subnormals, sub, out)
    return out


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
        return _lengths(shape, dims["L"], gen)
    if spec.init == "key_lens":
        return _lengths(shape, dims["S"], gen)
    if spec.init == "row_map":
        # a permutation of every row (a MoE's expert-sorted order is one of them)
        return torch.randperm(math.prod(shape), generator=gen).reshape(shape)
    raise ValueError(f"unknown init {spec.init!r} for tensor {spec.name!r}")


def _lengths(shape: tuple[int, ...], longest: int, gen: torch.Generator) -> torch.Tensor:
    """Every length from 1 to ``longest`` can occur; ``longest`` itself is always present."""
    lens = torch.randint(1, longest + 1, shape, generator=gen)
    lens[torch.randint(0, shape[0], (1,), generator=gen)] = longest
    return lens


def make_inputs(
    slot: SlotSpec,
    case: ShapeCase,
    dtype: str,
    seed: int,
    statistics: Statistics | None = None,
    only: frozenset[str] | None = None,
) -> Inputs:
    """Fresh CPU inputs for one trial; generated in fp32 (activations varied by ``statistics``),
    then rounded to the run dtype. ``only`` limits the draw to those inputs (a refill's)."""
    gen = torch.Generator().manual_seed(seed)
    out: Inputs = {}
    for spec in slot.inputs:
        if only is not None and spec.name not in only:
            continue
        shape = spec.resolve_shape(case.dims)
        run_dtype = spec.resolve_dtype(dtype)
        values = _fill(spec, shape, case.dims, gen)
        if statistics is not None and spec.init in VARIED_INITS:
            values = _vary(values, statistics, run_dtype, gen)
        out[spec.name] = values.to(run_dtype).contiguous()
    return out


def refresh_dynamic(slot: SlotSpec, previous: Inputs, fresh: Inputs) -> Inputs:
    """Next call's inputs: new graph-dynamic tensors, the same static ones (weights stay put)."""
    return {n: (fresh[n] if n in slot.graph_dynamic else t) for n, t in previous.items()}


def make_rank_inputs(
    slot: SlotSpec,
    case: ShapeCase,
    dtype: str,
    seed: int,
    world: int,
    statistics: Statistics | None = None,
    only: frozenset[str] | None = None,
) -> list[Inputs]:
    """Per-rank inputs: ``per_rank`` tensors differ by rank, the rest are replicated (world 1: one rank)."""
    shared = make_inputs(slot, case, dtype, seed, statistics, only)
    if world == 1:
        return [shared]
    ranks = []
    for rank in range(world):
        own = make_inputs(slot, case, dtype, derive_seed(seed, "rank", rank), statistics, only)
        ranks.append({n: (own[n] if _per_rank(slot, n) else t) for n, t in shared.items()})
    return ranks


def _per_rank(slot: SlotSpec, name: str) -> bool:
    return any(t.per_rank for t in slot.inputs if t.name == name)


def stack_partials(slot: SlotSpec, ranks: list[Inputs]) -> Inputs:
    """The reference's view of a collective: per-rank tensors stacked on a new leading rank axis."""
    per_rank = {t.name for t in slot.inputs if t.per_rank}
    return {n: (torch.stack([r[n] for r in ranks]) if n in per_rank else t) for n, t in ranks[0].items()}


def reference_inputs(slot: SlotSpec, ranks: list[Inputs]) -> Inputs:
    """What the slot's reference is computed from: the one rank's inputs, or every rank's partials."""
    return stack_partials(slot, ranks) if slot.kind == "collective" else ranks[0]


def output_layout(slot: SlotSpec, case: ShapeCase, dtype: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shape and dtype of every output; the harness allocates them, never the candidate."""
    return {o.name: (o.resolve_shape(case.dims), o.resolve_dtype(dtype)) for o in slot.outputs}


def with_tokens(slot: SlotSpec, case: ShapeCase, tokens: int) -> ShapeCase:
    """``case`` with another token count (the slot's ``token_dim``); every other dim kept."""
    dims = dict(case.dims)
    dims[slot.token_dim] = tokens
    return ShapeCase(dims, dict(case.params))


def input_elements(slot: SlotSpec, case: ShapeCase) -> int:
    """Elements across every input and output of one call (one rank): what a call costs to ship."""
    return sum(math.prod(t.resolve_shape(case.dims)) for t in (*slot.inputs, *slot.outputs))


def jitter_case(slot: SlotSpec, case: ShapeCase, seed: int) -> ShapeCase:
    """The same case with a seeded, different token count (catches kernels tuned to one size)."""
    rng = random.Random(seed)
    base = case.dims[slot.token_dim]
    choices = [n for n in range(max(1, base // 2), base + base // 2 + 3) if n != base]
    return with_tokens(slot, case, rng.choice(choices))
