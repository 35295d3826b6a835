"""Faithful MSA decode block scores: per-block max of the head-summed index scores, masked by seq_lens.

A starter written by `cacheon new`: the harness allocates every output and judges what this
function writes into it (a return value is ignored). Replace the body with your kernel and rerun
`cacheon verify` on the bundle; each case line names an id that `--case` reruns alone.
"""

import torch


def msa_block_score(q, index_k, seq_lens, block_size: int, out) -> None:
    # Masks by length on the device (no host sync), so the kernel can be captured in a CUDA graph.
    batch, keys = index_k.shape[0], index_k.shape[1]
    blocks = out.shape[1]
    scores = torch.einsum("bd,bsd->bs", q.float().sum(dim=1), index_k[:, :, 0].float())
    beyond = torch.arange(keys, device=q.device).unsqueeze(0) >= seq_lens.unsqueeze(1)
    scores = scores.masked_fill(beyond, float("-inf"))
    out.copy_(scores[:, : blocks * block_size].reshape(batch, blocks, block_size).amax(dim=-1))
