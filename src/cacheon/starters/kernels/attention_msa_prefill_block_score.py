"""Faithful MSA prefill block scores: causal with the prefix offset, scaled, ragged tail block.

A starter written by `cacheon new`: the harness allocates every output and judges what this
function writes into it (a return value is ignored). Replace the body with your kernel and rerun
`cacheon verify` on the bundle; each case line names an id that `--case` reruns alone.
"""

import torch
import torch.nn.functional as F


def msa_prefill_block_score(q, index_k, prefix_len: int, scale: float, block_size: int, out) -> None:
    rows, keys = q.shape[0], index_k.shape[0]
    blocks = out.shape[1]
    scores = (q.float() @ index_k.float().T) * scale
    key = torch.arange(keys, device=q.device).unsqueeze(0)
    row = torch.arange(rows, device=q.device).unsqueeze(1)
    scores = scores.masked_fill(key > prefix_len + row, float("-inf"))
    # pad the ragged tail block with -inf: its max is over its real keys only
    scores = F.pad(scores, (0, blocks * block_size - keys), value=float("-inf"))
    out.copy_(scores.reshape(rows, blocks, block_size).amax(dim=-1))
