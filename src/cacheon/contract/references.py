"""Trusted references, computed in float64 from the exact (already dtype-rounded) inputs.

Truth is never the stock kernel: each reference is the textbook formula in double precision, so a
candidate is judged against mathematics, not against another implementation's rounding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=torch.float64)


def silu_and_mul(inputs: Mapping[str, torch.Tensor], scalars: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    x = _f64(inputs["x"])
    d = x.shape[-1] // 2
    gate, up = x[..., :d], x[..., d:]
    return {"out": gate * torch.sigmoid(gate) * up}


def rmsnorm(inputs: Mapping[str, torch.Tensor], scalars: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    x, weight = _f64(inputs["x"]), _f64(inputs["weight"])
    inv_rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + float(scalars["eps"]))
    return {"out": x * inv_rms * weight}


def attention(inputs: Mapping[str, torch.Tensor], scalars: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Softmax attention with GQA/MQA; causal queries sit at the end of the key sequence (offset S-T)."""
    q, k, v = _f64(inputs["q"]), _f64(inputs["k"]), _f64(inputs["v"])
    t, hq, _ = q.shape
    s, hkv, _ = k.shape
    group = hq // hkv
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q, k) * float(scalars["sm_scale"])
    if scalars["causal"]:
        query_pos = torch.arange(t).unsqueeze(1) + (s - t)
        key_pos = torch.arange(s).unsqueeze(0)
        scores = scores.masked_fill(key_pos > query_pos, -math.inf)
    probs = torch.softmax(scores, dim=-1)
    return {"out": torch.einsum("hts,shd->thd", probs, v)}


def attention_decode(inputs: Mapping[str, torch.Tensor], scalars: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """One new query per sequence against its first ``seq_lens[b]`` cached keys (GQA)."""
    q, k, v = _f64(inputs["q"]), _f64(inputs["k_cache"]), _f64(inputs["v_cache"])
    lens = inputs["seq_lens"].to("cpu", torch.int64)
    group = q.shape[1] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,blhd->bhl", q, k) * float(scalars["sm_scale"])
    beyond = torch.arange(k.shape[1]).unsqueeze(0) >= lens.unsqueeze(1)  # (B, L)
    scores = scores.masked_fill(beyond.unsqueeze(1), -math.inf)
    return {"out": torch.einsum("bhl,blhd->bhd", torch.softmax(scores, dim=-1), v)}


def fused_experts(inputs: Mapping[str, torch.Tensor], scalars: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Top-k MoE with SiLU-gated experts: out_t = Σ_k w_tk · W2[e] (silu(g) ⊙ u), [g; u] = W13[e] x_t."""
    x, w13, w2 = _f64(inputs["x"]), _f64(inputs["w13"]), _f64(inputs["w2"])
    ids = inputs["topk_ids"].to("cpu", torch.int64)
    weights = _f64(inputs["topk_weights"])
    inter = w2.shape[-1]
    gate_up = torch.einsum("tkoh,th->tko", w13[ids], x)  # (T, K, 2I)
    hidden = torch.nn.functional.silu(gate_up[..., :inter]) * gate_up[..., inter:]
    expert_out = torch.einsum("tkhi,tki->tkh", w2[ids], hidden)
    return {"out": (weights.unsqueeze(-1) * expert_out).sum(dim=1)}


def all_reduce(inputs: Mapping[str, torch.Tensor], scalars: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """``x`` is stacked over ranks (the collective's view): the exact sum of every partial."""
    return {"out": _f64(inputs["x"]).sum(dim=0)}


def ar_residual_rmsnorm(inputs: Mapping[str, torch.Tensor], scalars: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """All-reduce the partials, add the residual, then RMSNorm; both the sum and the norm are outputs."""
    total = _f64(inputs["x"]).sum(dim=0) + _f64(inputs["residual"])
    normed = rmsnorm({"x": total, "weight": inputs["weight"]}, scalars)["out"]
    return {"out_norm": normed, "out_residual": total}


def gpt_oss_swiglu(inputs: Mapping[str, torch.Tensor], scalars: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """GPT-OSS's clamped SwiGLU: g = min(gate, limit), u = clip(up, ±limit); g·σ(α·g)·(u + 1)."""
    x = _f64(inputs["x"])
    d = x.shape[-1] // 2
    alpha, limit = float(scalars["alpha"]), float(scalars["limit"])
    gate = x[..., :d].clamp(max=limit)
    up = x[..., d:].clamp(min=-limit, max=limit)
    return {"out": gate * torch.sigmoid(alpha * gate) * (up + 1)}
