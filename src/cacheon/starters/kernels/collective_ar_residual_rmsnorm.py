"""Faithful all-reduce + residual + RMSNorm.

A starter written by `cacheon new`: the harness allocates every output and judges what this
function writes into it (a return value is ignored). Replace the body with your kernel and rerun
`cacheon verify` on the bundle; each case line names an id that `--case` reruns alone.
"""

import torch
import torch.distributed as dist


def ar_residual_rmsnorm(x, residual, weight, eps: float, out_norm, out_residual, group) -> None:
    total = x.float().clone()  # x.float() aliases x in float32, and inputs are read-only
    dist.all_reduce(total, group=group)
    total += residual.float()
    out_residual.copy_(total)
    out_norm.copy_(total * torch.rsqrt(total.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float())
