"""THE seam table: every SGLang symbol Cacheon relies on, listed once.

The canary checks each row; activation arms the rows whose gate is ``bundle`` or ``all_ranks`` through
the adapter registered for the installed pin. A row names the stock computation an adapter stands in
for (``chokepoint``) and the parameter names the adapter's call translation relies on. When upstream
moves a symbol, the adapter changes (or a row here), never a slot contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

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
        slots=("attention.sdpa",),
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


def seams_for_slot(slot: str) -> tuple[Seam, ...]:
    """The armable seams serving ``slot`` (check-only rows are never armed)."""
    return tuple(s for s in SEAMS if slot in s.slots and s.gate is not Gate.CHECK_ONLY)
