import torch


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    out.fill_(float("nan"))
