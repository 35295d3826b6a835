"""The registered slots. Entry signatures and argument orders here are the ABI."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cacheon.canonical import digest
from cacheon.contract.spec import Comparator, ShapeCase, SlotSpec, TensorSpec, Tolerance
from cacheon.errors import UsageError, did_you_mean

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
    serving_tokens=8192,
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
    serving_tokens=8192,
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
    serving_tokens=1024,
    summary="softmax(q k^T * sm_scale [causal, offset S-T]) v with GQA/MQA; S = P + T",
)

def _decode_scalars(case: ShapeCase) -> dict[str, Any]:
    return {"sm_scale": 1.0 / math.sqrt(case.dims["D"])}


ATTENTION_DECODE = SlotSpec(
    name="attention.decode",
    kind="block",
    entry="attention_decode",
    args=("q", "k_cache", "v_cache", "seq_lens", "sm_scale", "out"),
    inputs=(
        TensorSpec("q", ("B", "Hq", "D")),
        TensorSpec("k_cache", ("B", "L", "Hkv", "D")),
        TensorSpec("v_cache", ("B", "L", "Hkv", "D")),
        TensorSpec("seq_lens", ("B",), dtype="int32", init="seq_lens"),
    ),
    outputs=(TensorSpec("out", ("B", "Hq", "D")),),
    scalars=_decode_scalars,
    scalar_names=("sm_scale",),
    reference_id="cacheon.contract.references.attention_decode@float64",
    comparator=_ATTENTION,
    dtypes=FLOAT_DTYPES,
    shapes=(
        ShapeCase({"B": 1, "L": 16, "Hq": 8, "Hkv": 8, "D": 64}),
        ShapeCase({"B": 4, "L": 128, "Hq": 8, "Hkv": 2, "D": 128}),
        ShapeCase({"B": 13, "L": 300, "Hq": 16, "Hkv": 1, "D": 64}),
    ),
    token_dim="B",
    graph_dynamic=("q", "k_cache", "v_cache", "seq_lens"),
    graph_safe=True,
    serving_tokens=256,
    summary="per sequence b: softmax(q_b K_b[:seq_lens[b]]^T * sm_scale) V_b[:seq_lens[b]], GQA",
)

# Expert sums reorder many products; judge by the share of elements within tolerance. In float32 the bound also
# grows with the input's own rounding (verify/rounding.py): under heavy-tailed draws an honest kernel's error
# reached 1.7x the fixed bound; over 3,000 such draws its largest error was at most 6.3x that of the reference
# evaluated in float32 (p99.9 4.8x), hence 8x.
_MOE = Comparator(
    "matched_ratio",
    {
        "float32": Tolerance(atol=1e-4, rtol=1e-4, min_ratio=0.999, rounding=8.0),
        "bfloat16": Tolerance(atol=2e-2, rtol=2e-2, min_ratio=0.99),
        "float16": Tolerance(atol=3e-3, rtol=3e-3, min_ratio=0.99),
    },
)

MOE_FUSED_EXPERTS = SlotSpec(
    name="moe.fused_experts",
    kind="block",
    entry="fused_experts",
    args=("x", "topk_ids", "topk_weights", "prepared", "out"),
    inputs=(
        TensorSpec("x", ("T", "H")),
        TensorSpec("w13", ("E", "2*I", "H"), init="fan_in"),
        TensorSpec("w2", ("E", "H", "I"), init="fan_in"),
        TensorSpec("topk_ids", ("T", "K"), dtype="int32", init="topk_ids"),
        TensorSpec("topk_weights", ("T", "K"), dtype="float32", init="topk_weights"),
    ),
    outputs=(TensorSpec("out", ("T", "H")),),
    scalars=_no_scalars,
    scalar_names=(),
    reference_id="cacheon.contract.references.fused_experts@float64",
    comparator=_MOE,
    dtypes=FLOAT_DTYPES,
    shapes=(
        ShapeCase({"T": 1, "E": 8, "K": 2, "H": 256, "I": 128}),
        ShapeCase({"T": 7, "E": 8, "K": 2, "H": 512, "I": 256}),
        ShapeCase({"T": 64, "E": 16, "K": 4, "H": 256, "I": 384}),
    ),
    token_dim="T",
    graph_dynamic=("x", "topk_ids", "topk_weights"),
    graph_safe=False,
    serving_tokens=2048,
    summary="Σ_k w_tk · W2[e](silu(g) ⊙ u), [g; u] = W13[e] x_t; prepare(w13, w2) runs once on raw weights",
    prepare_inputs=("w13", "w2"),
)

_COLLECTIVE = Comparator(
    "allclose",
    {
        "float32": Tolerance(atol=1e-5, rtol=1e-5),
        "bfloat16": Tolerance(atol=1.6e-2, rtol=1.6e-2),
    },
)

ALL_REDUCE = SlotSpec(
    name="collective.all_reduce",
    kind="collective",
    entry="all_reduce",
    args=("x", "out", "group"),
    inputs=(TensorSpec("x", ("T", "H"), per_rank=True),),
    outputs=(TensorSpec("out", ("T", "H")),),
    scalars=_no_scalars,
    scalar_names=(),
    reference_id="cacheon.contract.references.all_reduce@float64",
    comparator=_COLLECTIVE,
    dtypes=("float32", "bfloat16"),
    shapes=(ShapeCase({"T": 1, "H": 1024}), ShapeCase({"T": 7, "H": 2880}), ShapeCase({"T": 128, "H": 1024})),
    token_dim="T",
    graph_dynamic=("x",),
    graph_safe=False,
    serving_tokens=8192,
    summary="out = Σ_ranks x (every rank receives the full sum); group is the harness-owned process group",
)

AR_RESIDUAL_RMSNORM = SlotSpec(
    name="collective.ar_residual_rmsnorm",
    kind="collective",
    entry="ar_residual_rmsnorm",
    args=("x", "residual", "weight", "eps", "out_norm", "out_residual", "group"),
    inputs=(
        TensorSpec("x", ("T", "H"), per_rank=True),
        TensorSpec("residual", ("T", "H")),
        TensorSpec("weight", ("H",), init="near_one"),
    ),
    outputs=(TensorSpec("out_norm", ("T", "H")), TensorSpec("out_residual", ("T", "H"))),
    scalars=_rmsnorm_scalars,
    scalar_names=("eps",),
    reference_id="cacheon.contract.references.ar_residual_rmsnorm@float64",
    comparator=_COLLECTIVE,
    dtypes=("float32", "bfloat16"),
    shapes=(ShapeCase({"T": 1, "H": 1024}), ShapeCase({"T": 7, "H": 2880}), ShapeCase({"T": 128, "H": 1024})),
    token_dim="T",
    graph_dynamic=("x", "residual"),
    graph_safe=False,
    serving_tokens=8192,
    summary="s = Σ_ranks x + residual; out_residual = s; out_norm = rmsnorm(s) * weight",
)

MOE_FUSED_EXPERTS_REDUCE = SlotSpec(
    name="moe.fused_experts_reduce",
    kind="collective",
    entry="fused_experts_reduce",
    args=("x", "topk_ids", "topk_weights", "prepared", "out", "group"),
    inputs=(
        TensorSpec("x", ("T", "H")),
        # each rank's shard of every expert (tensor parallel: I is the per-rank intermediate size)
        TensorSpec("w13", ("E", "2*I", "H"), init="fan_in", per_rank=True),
        TensorSpec("w2", ("E", "H", "I"), init="fan_in", per_rank=True),
        TensorSpec("topk_ids", ("T", "K"), dtype="int32", init="topk_ids"),
        TensorSpec("topk_weights", ("T", "K"), dtype="float32", init="topk_weights"),
    ),
    outputs=(TensorSpec("out", ("T", "H")),),
    scalars=_no_scalars,
    scalar_names=(),
    reference_id="cacheon.contract.references.fused_experts_reduce@float64",
    comparator=_MOE,
    dtypes=("float32", "bfloat16"),
    shapes=(
        ShapeCase({"T": 1, "E": 8, "K": 2, "H": 128, "I": 64}),
        ShapeCase({"T": 7, "E": 8, "K": 2, "H": 512, "I": 128}),
        ShapeCase({"T": 64, "E": 16, "K": 4, "H": 256, "I": 96}),
    ),
    token_dim="T",
    graph_dynamic=("x", "topk_ids", "topk_weights"),
    graph_safe=False,
    serving_tokens=2048,
    summary="out = Σ_ranks Σ_k w_tk · W2_r[e](silu(g) ⊙ u), [g; u] = W13_r[e] x_t over each rank's expert shard, "
    "then the all-reduce the kernel owns; x and routing replicated; prepare(w13, w2) once per rank, on its shard",
    prepare_inputs=("w13", "w2"),
)

# The finalize sums K scaled rows per rank, then ranks' partials travel in the run dtype: each is rounded
# before the sum, and a ring all-reduce rounds at every hop (at world size 3 a bf16 ring reaches 1.3x
# the plain collective bound; this one keeps it at 0.66x, and a wrong row map is off by O(1)).
_MOE_FINALIZE = Comparator(
    "allclose",
    {
        "float32": Tolerance(atol=2e-5, rtol=2e-5),
        "bfloat16": Tolerance(atol=3.2e-2, rtol=3.2e-2),
    },
)

MOE_FINALIZE_AR_RMSNORM = SlotSpec(
    name="collective.moe_finalize_ar_rmsnorm",
    kind="collective",
    entry="moe_finalize_ar_rmsnorm",
    args=("gemm_out", "row_map", "scales", "residual", "weight", "eps", "out_norm", "out_residual", "group"),
    inputs=(
        # T_exp = T + Tpad expanded tokens (CUDA-graph padding): only the first T are finalized
        TensorSpec("gemm_out", ("(T+Tpad)*K", "H"), per_rank=True),
        TensorSpec("row_map", ("(T+Tpad)*K",), dtype="int32", init="row_map"),
        TensorSpec("scales", ("T+Tpad", "K"), dtype="float32", init="topk_weights"),
        TensorSpec("residual", ("T", "H")),
        TensorSpec("weight", ("H",), init="near_one"),
    ),
    outputs=(TensorSpec("out_norm", ("T", "H")), TensorSpec("out_residual", ("T", "H"))),
    scalars=_rmsnorm_scalars,
    scalar_names=("eps",),
    reference_id="cacheon.contract.references.moe_finalize_ar_rmsnorm@float64",
    comparator=_MOE_FINALIZE,
    dtypes=("float32", "bfloat16"),
    shapes=(
        ShapeCase({"T": 1, "Tpad": 7, "K": 2, "H": 1024}),
        ShapeCase({"T": 7, "Tpad": 0, "K": 4, "H": 2880}),
        ShapeCase({"T": 33, "Tpad": 15, "K": 8, "H": 256}),
        ShapeCase({"T": 100, "Tpad": 28, "K": 4, "H": 512}),
    ),
    token_dim="T",
    graph_dynamic=("gemm_out", "row_map", "scales", "residual"),
    graph_safe=False,
    serving_tokens=8192,
    summary="f_r[t] = Σ_k scales[t, k] · gemm_out_r[row_map[t + k·T_exp]] for t < T (T_exp = T + Tpad, K-major); "
    "s = Σ_ranks f_r + residual; out_residual = s; out_norm = rmsnorm(s) * weight",
)

# Block selection: the output only feeds a top-k, so it is judged as a selection (verify/selection.py):
# -inf is a masked cell and must match the reference's exactly; then the worst row's share of the
# reference's top-8 blocks picked, where a pick within atol + rtol·(the row's largest |score|) of the
# reference's 8th best counts (ties and rounding-level near-ties cannot decide a verdict).
SELECTION_TOPK = 8
_SELECTION = Comparator(
    "topk_overlap",
    {
        "float32": Tolerance(atol=1e-6, rtol=1e-5, min_ratio=0.875, topk=SELECTION_TOPK),
        "bfloat16": Tolerance(atol=1e-6, rtol=1e-2, min_ratio=0.875, topk=SELECTION_TOPK),
        "float16": Tolerance(atol=1e-6, rtol=2e-3, min_ratio=0.875, topk=SELECTION_TOPK),
    },
)


def _msa_scalars(case: ShapeCase) -> dict[str, Any]:
    return {"block_size": case.dims["bs"]}


def _msa_prefill_scalars(case: ShapeCase) -> dict[str, Any]:
    return {"prefix_len": case.dims["P"], "scale": 1.0 / math.sqrt(case.dims["D"]), "block_size": case.dims["bs"]}


# Every shape keeps at least 2 × SELECTION_TOPK blocks per row at any token count (tests/unit/test_catalog.py):
# with 8 blocks or fewer any output would select them all.
ATTENTION_MSA_BLOCK_SCORE = SlotSpec(
    name="attention.msa_block_score",
    kind="block",
    entry="msa_block_score",
    args=("q", "index_k", "seq_lens", "block_size", "out"),
    inputs=(
        TensorSpec("q", ("B", "Hq", "D")),
        TensorSpec("index_k", ("B", "S", "1", "D")),
        TensorSpec("seq_lens", ("B",), dtype="int32", init="key_lens"),
    ),
    outputs=(TensorSpec("out", ("B", "S//bs"), dtype="float32"),),
    scalars=_msa_scalars,
    scalar_names=("block_size",),
    reference_id="cacheon.contract.references.msa_block_score@float64",
    comparator=_SELECTION,
    dtypes=FLOAT_DTYPES,
    shapes=(
        ShapeCase({"B": 1, "Hq": 16, "D": 128, "S": 1024, "bs": 64}),
        ShapeCase({"B": 4, "Hq": 8, "D": 64, "S": 300, "bs": 16}),
        ShapeCase({"B": 13, "Hq": 4, "D": 128, "S": 1100, "bs": 64}),
        ShapeCase({"B": 7, "Hq": 16, "D": 64, "S": 2048, "bs": 32}),
    ),
    token_dim="B",
    graph_dynamic=("q", "index_k", "seq_lens"),
    graph_safe=True,
    serving_tokens=256,
    summary="s[b, n] = (Σ_h q[b, h]) · index_k[b, n] for n < seq_lens[b], else -inf; out[b, j] = max of s over "
    "block j (S // block_size whole blocks); judged by the top-8 blocks per row",
)

ATTENTION_MSA_PREFILL_BLOCK_SCORE = SlotSpec(
    name="attention.msa_prefill_block_score",
    kind="block",
    entry="msa_prefill_block_score",
    args=("q", "index_k", "prefix_len", "scale", "block_size", "out"),
    inputs=(TensorSpec("q", ("T", "D")), TensorSpec("index_k", ("P+T", "D"))),
    outputs=(TensorSpec("out", ("T", "cdiv(P+T,bs)"), dtype="float32"),),
    scalars=_msa_prefill_scalars,
    scalar_names=("prefix_len", "scale", "block_size"),
    reference_id="cacheon.contract.references.msa_prefill_block_score@float64",
    comparator=_SELECTION,
    dtypes=FLOAT_DTYPES,
    shapes=(
        ShapeCase({"T": 1, "P": 1100, "D": 128, "bs": 64}),
        ShapeCase({"T": 7, "P": 250, "D": 64, "bs": 16}),
        ShapeCase({"T": 64, "P": 1000, "D": 128, "bs": 64}),
        ShapeCase({"T": 128, "P": 2000, "D": 64, "bs": 128}),
    ),
    token_dim="T",
    graph_dynamic=("q", "index_k"),
    graph_safe=False,
    serving_tokens=1024,
    summary="s[m, n] = scale · q[m] · index_k[n], key n visible to row m iff n <= prefix_len + m (S = P + T); "
    "out[m, j] = max of the visible s over block j (ceil(S / block_size) blocks, the tail ragged), -inf if none; "
    "judged by the top-8 blocks per row",
)

SLOTS: Mapping[str, SlotSpec] = {
    s.name: s
    for s in (
        SILU_AND_MUL,
        RMSNORM,
        ATTENTION_SDPA,
        ATTENTION_DECODE,
        MOE_FUSED_EXPERTS,
        ALL_REDUCE,
        AR_RESIDUAL_RMSNORM,
        MOE_FUSED_EXPERTS_REDUCE,
        MOE_FINALIZE_AR_RMSNORM,
        ATTENTION_MSA_BLOCK_SCORE,
        ATTENTION_MSA_PREFILL_BLOCK_SCORE,
    )
}


def get_slot(name: str) -> SlotSpec:
    try:
        return SLOTS[name]
    except KeyError:
        known = ", ".join(sorted(SLOTS))
        raise UsageError(f"unknown slot {name!r} (registered slots: {known}){did_you_mean(name, SLOTS)}") from None


def describe_catalog() -> dict[str, Any]:
    return {"abi_version": ABI_VERSION, "slots": [SLOTS[n].describe() for n in sorted(SLOTS)]}


def catalog_digest() -> str:
    """Stable digest over the canonical catalog description (changes iff the ABI changes)."""
    return digest(CATALOG_DOMAIN, describe_catalog())
