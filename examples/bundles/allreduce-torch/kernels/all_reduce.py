import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor, out: torch.Tensor, group) -> None:
    out.copy_(x)
    dist.all_reduce(out, group=group)
