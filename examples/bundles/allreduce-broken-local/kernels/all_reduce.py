import torch


def all_reduce(x: torch.Tensor, out: torch.Tensor, group) -> None:
    out.copy_(x)
