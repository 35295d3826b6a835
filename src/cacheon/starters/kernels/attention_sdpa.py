"""Faithful causal/non-causal GQA attention in plain torch (fp32 math).

A starter written by `cacheon new`: the harness allocates every output and judges what this
function writes into it (a return value is ignored). Replace the body with your kernel and rerun
`cacheon verify` on the bundle; each case line names an id that `--case` reruns alone.
"""

import torch


def attention(q, k, v, out, sm_scale: float, causal: bool) -> None:
    t, hq, _ = q.shape
    s, hkv, _ = k.shape
    group = hq // hkv
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), kf) * sm_scale
    if causal:
        # queries are the last t positions of the s-long sequence
        allowed = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=s - t)
        scores = scores.masked_fill(~allowed, float("-inf"))
    out.copy_(torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), vf))
