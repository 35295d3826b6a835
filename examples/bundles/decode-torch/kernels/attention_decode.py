"""Faithful paged-free decode attention with per-sequence lengths and GQA.

A starter written by `cacheon new`: the harness allocates every output and judges what this
function writes into it (a return value is ignored). Replace the body with your kernel and rerun
`cacheon verify` on the bundle; each case line names an id that `--case` reruns alone.
"""

import torch


def attention_decode(q, k_cache, v_cache, seq_lens, sm_scale: float, out) -> None:
    # Masks by length on the device (no host sync), so the kernel can be captured in a CUDA graph.
    group = q.shape[1] // k_cache.shape[2]
    k = k_cache.float().repeat_interleave(group, dim=2)
    v = v_cache.float().repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,blhd->bhl", q.float(), k) * sm_scale
    positions = torch.arange(k_cache.shape[1], device=q.device)
    beyond = positions.unsqueeze(0) >= seq_lens.unsqueeze(1)
    scores = scores.masked_fill(beyond.unsqueeze(1), float("-inf"))
    out.copy_(torch.einsum("bhl,blhd->bhd", torch.softmax(scores, dim=-1), v))
