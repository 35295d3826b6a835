"""Faithful all_reduce through torch.distributed on the harness-owned group.

A starter written by `cacheon new`: the harness allocates every output and judges what this
function writes into it (a return value is ignored). Replace the body with your kernel and rerun
`cacheon verify` on the bundle; each case line names an id that `--case` reruns alone.
"""

import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor, out: torch.Tensor, group) -> None:
    out.copy_(x)
    dist.all_reduce(out, group=group)
