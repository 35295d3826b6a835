import torch


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    raise ValueError("x" * (8 << 20))
