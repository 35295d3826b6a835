"""The registered slots. Entry signatures and argument orders here are the ABI."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cacheon.canonical import digest
from cacheon.contract import references
from cacheon.contract.spec import Comparator, ShapeCase, SlotSpec, TensorSpec, Tolerance
from cacheon.errors import UsageError

ABI_VERSION = "cacheon-op-abi-v1"
CATALOG_DOMAIN = "cacheon.slot-catalog.v1"
FLOAT_DTYPES = ("float32", "bfloat16", "float16")

# Output rounding alone costs half an ulp (bf16: 2**-9, fp16: 2**-12); these bounds allow a
# couple of roundings of intermediates in the run dtype, and nothing like a wrong formula.
_ELEMENTWISE = Comparator(
    "allclose",
    {
        "float32": Tolerance(atol=1e-5, rtol=1e-5),
        "bfloat16": Tolerance(atol=1e-2, rtol=1.6e-2),
        "float16": Tolerance(atol=1e-3, rtol=2e-3),
    },
)
_REDUCTION = Comparator(
    "allclose",
    {
        "float32": Tolerance(atol=2e-5, rtol=2e-5),
        "bfloat16": Tolerance(atol=1.6e-2, rtol=1.6e-2),
        "float16": Tolerance(atol=2e-3, rtol=4e-3),
    },
)
_ATTENTION = Comparator(
    "allclose",
    {
        "float32": Tolerance(atol=1e-4, rtol=1e-4),
        "bfloat16": Tolerance(atol=2e-2, rtol=2e-2),
        "float16": Tolerance(atol=3e-3, rtol=3e-3),
    },
)


def _no_scalars(case: ShapeCase) -> dict[str, Any]:
    return {}


def _rmsnorm_scalars(case: ShapeCase) -> dict[str, Any]:
    return {"eps": 1e-6}


def _attention_scalars(case: ShapeCase) -> dict[str, Any]:
    return {"sm_scale": 1.0 / math.sqrt(case.dims["D"]), "causal": bool(case.params["causal"])}


SILU_AND_MUL = SlotSpec(
    name="activation.silu_and_mul",
    kind="op",
    entry="silu_and_mul",
    args=("x", "out"),
    inputs=(TensorSpec("x", ("T", "2*d")),),
    outputs=(TensorSpec("out", ("T", "d")),),
    scalars=_no_scalars,
    scalar_names=(),
    reference=references.silu_and_mul,
    reference_id="cacheon.contract.references.silu_and_mul@float64",
    comparator=_ELEMENTWISE,
    dtypes=FLOAT_DTYPES,
    shapes=(
        ShapeCase({"T": 1, "d": 1024}),
        ShapeCase({"T": 7, "d": 2880}),
        ShapeCase({"T": 128, "d": 4096}),
        ShapeCase({"T": 333, "d": 1024}),
    ),
    token_dim="T",
    graph_dynamic=("x",),
    graph_safe=True,
    summary="out = silu(x[:, :d]) * x[:, d:]",
)

RMSNORM = SlotSpec(
    name="norm.rmsnorm",
    kind="op",
    entry="rmsnorm",
    args=("x", "weight", "out", "eps"),
    inputs=(TensorSpec("x", ("T", "H"), init="row_scaled"), TensorSpec("weight", ("H",), init="near_one")),
    outputs=(TensorSpec("out", ("T", "H")),),
    scalars=_rmsnorm_scalars,
    scalar_names=("eps",),
    reference=references.rmsnorm,
    reference_id="cacheon.contract.references.rmsnorm@float64",
    comparator=_REDUCTION,
    dtypes=FLOAT_DTYPES,
    shapes=(
        ShapeCase({"T": 1, "H": 1024}),
        ShapeCase({"T": 7, "H": 2880}),
        ShapeCase({"T": 128, "H": 4096}),
        ShapeCase({"T": 333, "H": 1024}),
    ),
    token_dim="T",
    graph_dynamic=("x",),
    graph_safe=True,
    summary="out = x / sqrt(mean(x^2, -1) + eps) * weight",
)

ATTENTION_SDPA = SlotSpec(
    name="attention.sdpa",
    kind="block",
    entry="attention",
    args=("q", "k", "v", "out", "sm_scale", "causal"),
    inputs=(
        TensorSpec("q", ("T", "Hq", "D")),
        TensorSpec("k", ("P+T", "Hkv", "D")),
        TensorSpec("v", ("P+T", "Hkv", "D")),
    ),
    outputs=(TensorSpec("out", ("T", "Hq", "D")),),
    scalars=_attention_scalars,
    scalar_names=("sm_scale", "causal"),
    reference=references.attention,
    reference_id="cacheon.contract.references.attention@float64",
    comparator=_ATTENTION,
    dtypes=FLOAT_DTYPES,
    shapes=(
        ShapeCase({"T": 1, "P": 0, "Hq": 8, "Hkv": 8, "D": 64}, {"causal": True}),
        ShapeCase({"T": 7, "P": 12, "Hq": 8, "Hkv": 2, "D": 64}, {"causal": True}),
        ShapeCase({"T": 33, "P": 17, "Hq": 8, "Hkv": 4, "D": 64}, {"causal": False}),
        ShapeCase({"T": 128, "P": 0, "Hq": 4, "Hkv": 1, "D": 128}, {"causal": True}),
        ShapeCase({"T": 64, "P": 269, "Hq": 16, "Hkv": 2, "D": 128}, {"causal": True}),
    ),
    token_dim="T",
    graph_dynamic=("q", "k", "v"),
    graph_safe=False,
    summary="softmax(q k^T * sm_scale [causal, offset S-T]) v with GQA/MQA; S = P + T",
)

SLOTS: Mapping[str, SlotSpec] = {s.name: s for s in (SILU_AND_MUL, RMSNORM, ATTENTION_SDPA)}


def get_slot(name: str) -> SlotSpec:
    try:
        return SLOTS[name]
    except KeyError:
        known = ", ".join(sorted(SLOTS))
        raise UsageError(f"unknown slot {name!r}; registered slots: {known}") from None


def describe_catalog() -> dict[str, Any]:
    return {"abi_version": ABI_VERSION, "slots": [SLOTS[n].describe() for n in sorted(SLOTS)]}


def catalog_digest() -> str:
    """Stable digest over the canonical catalog description (changes iff the ABI changes)."""
    return digest(CATALOG_DOMAIN, describe_catalog())
