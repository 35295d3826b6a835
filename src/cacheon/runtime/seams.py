"""THE seam table: every SGLang symbol Cacheon relies on, listed once.

The canary checks each row; activation arms the rows whose gate is ``bundle`` or ``all_ranks`` through
the adapter registered for the installed pin. A row names the stock computation an adapter stands in
for (``chokepoint``) and the parameter names the adapter's call translation relies on. When upstream
moves a symbol, the adapter changes (or a row here), never a slot contract.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum

from cacheon.runtime.surface import Surface


class Gate(Enum):
    """When a seam is armed."""

    CHECK_ONLY = "check_only"  # checked by the canary; Cacheon calls or configures it but never patches it
    BUNDLE = "bundle"  # armed in every process whose bundle implements one of the seam's slots
    ALL_RANKS = "all_ranks"  # collective: armed only if every rank arms the same bundle digest, else all abort


@dataclass(frozen=True)
class Seam(Surface):
    slots: tuple[str, ...] = ()
    gate: Gate = Gate.CHECK_ONLY


SEAMS: tuple[Seam, ...] = (
    Seam(
        name="activation.SiluAndMul",
        module="sglang.srt.layers.activation",
        chokepoint="SiluAndMul.forward_native",
        params=("x",),
        slots=("activation.silu_and_mul",),
        gate=Gate.BUNDLE,
    ),
    Seam(
        name="layernorm.RMSNorm",
        module="sglang.srt.layers.layernorm",
        chokepoint="RMSNorm.forward_native",
        params=("x", "residual", "post_residual_addition"),
        slots=("norm.rmsnorm",),
        gate=Gate.BUNDLE,
    ),
    Seam(
        name="attention.RadixAttention",
        module="sglang.srt.layers.radix_attention",
        chokepoint="RadixAttention.forward",
        params=("q", "k", "v", "forward_batch", "save_kv_cache"),
        slots=("attention.sdpa", "attention.decode"),  # forward_batch.forward_mode: extend or decode
    ),
    Seam(
        name="attention.FlashInferBackend",
        module="sglang.srt.layers.attention.flashinfer_backend",
        chokepoint="FlashInferAttnBackend.forward_extend",
        params=("q", "k", "v", "layer", "forward_batch", "save_kv_cache"),
        requires="flashinfer",
        slots=("attention.sdpa",),
    ),
    Seam(
        name="moe.FusedMoE",
        module="sglang.srt.layers.moe.fused_moe_triton.layer",
        chokepoint="FusedMoE.forward",
        params=("hidden_states", "topk_output"),
        slots=("moe.fused_experts",),
    ),
    Seam(
        # dispatch, the experts (quant_method.apply), combine, then tensor_model_parallel_all_reduce
        # when the layer was built with reduce_results and moe_tp_size or moe_ep_size > 1
        name="moe.FusedMoE.forward_impl",
        module="sglang.srt.layers.moe.fused_moe_triton.layer",
        chokepoint="FusedMoE.forward_impl",
        params=("hidden_states", "topk_output"),
        slots=("moe.fused_experts_reduce",),
    ),
    Seam(
        name="distributed.GroupCoordinator.all_reduce",
        module="sglang.srt.distributed.parallel_state",
        chokepoint="GroupCoordinator.all_reduce",
        params=("input_",),
        slots=("collective.all_reduce",),
        gate=Gate.ALL_RANKS,
    ),
    Seam(
        # RMSNorm with a residual, in a multi-rank group: all-reduce + residual + RMSNorm in one call
        # (flashinfer_allreduce_residual_rmsnorm, or AITER's fused all-reduce on AMD)
        name="layernorm.allreduce_fusion",
        module="sglang.srt.layers.layernorm",
        chokepoint="_forward_with_allreduce_fusion",
        params=("norm_module", "x", "residual", "post_residual_addition", "weight"),
        slots=("collective.ar_residual_rmsnorm",),
    ),
    Seam(
        name="server_args.ServerArgs",
        module="sglang.srt.server_args",
        chokepoint="ServerArgs",
        params=(
            "model_path",
            "host",
            "port",
            "tp_size",
            "dp_size",
            "page_size",
            "kv_events_config",
            "random_seed",
            "attention_backend",
            "disable_cuda_graph",
            "mem_fraction_static",
            "device",
        ),
    ),
    Seam(
        name="engine.Engine.generate",
        module="sglang.srt.entrypoints.engine",
        chokepoint="Engine.generate",
        params=("prompt", "sampling_params", "input_ids"),
    ),
    Seam(
        # Every SGLang process (engine and each TP rank's scheduler) runs this; cacheon.runtime.plugin
        # rides on it to arm a bundle everywhere.
        name="plugins.load_plugins",
        module="sglang.srt.plugins",
        chokepoint="load_plugins",
    ),
)


#: registered slots the pin has no call site for, and what its source does instead (read from the
#: 0.5.13.post1 wheel; re-read on any bump). Verifiable with ``cacheon verify``; armable nowhere here.
NO_CALL_SITE: Mapping[str, str] = {
    "attention.msa_block_score": (
        "its sparse-attention indexers (layers/attention/dsa/dsa_indexer.py Indexer._get_topk_paged, "
        "dsv4/indexer.py C4Indexer) score single tokens (head-weighted ReLU logits) and keep the top-k "
        "tokens; no per-block max of index scores"
    ),
    "attention.msa_prefill_block_score": (
        "its prefill indexer (layers/attention/dsa/dsa_indexer.py Indexer._get_topk_ragged) scores single "
        "tokens and keeps the top-k tokens; no causal per-block max of index scores"
    ),
    "collective.moe_finalize_ar_rmsnorm": (
        "the finalize (moe_sum_reduce in moe_runner/triton_utils/fused_moe.py) runs inside FusedMoE before "
        "any all-reduce; the fused all-reduce + residual + RMSNorm (layernorm.py "
        "_forward_with_allreduce_fusion) receives the finalized output, never gemm_out, a row map and scales"
    ),
}


class Standing(StrEnum):
    """What the pin offers a slot."""

    ARMABLE = "armable"  # an adapter arms it into SGLang at the pin
    CHECKED_ONLY = "call_site_checked"  # its call site is in the seam table (the canary checks it), unarmed
    NO_CALL_SITE = "no_call_site"  # the pin has nowhere to arm it


def standing(slot: str) -> tuple[Standing, tuple[Seam, ...], str]:
    """The slot's standing at the pin, the seams naming it, and (without a call site) the reason."""
    named = tuple(s for s in SEAMS if slot in s.slots)
    if any(s.gate is not Gate.CHECK_ONLY for s in named):
        return Standing.ARMABLE, named, ""
    if named:
        return Standing.CHECKED_ONLY, named, ""
    return Standing.NO_CALL_SITE, (), NO_CALL_SITE.get(slot, "no seam of the table names it")


def seams_for_slot(slot: str) -> tuple[Seam, ...]:
    """The armable seams serving ``slot`` (check-only rows are never armed)."""
    return tuple(s for s in SEAMS if slot in s.slots and s.gate is not Gate.CHECK_ONLY)
