import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor, out: torch.Tensor, group) -> None:
    low = x.to(torch.float16)
    dist.all_reduce(low, group=group)
    out.copy_(low)
