import torch

ALPHA = 1.702
LIMIT = 7.0


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    d = x.shape[-1] // 2
    gate = x[..., :d].float().clamp(max=LIMIT)
    up = x[..., d:].float().clamp(min=-LIMIT, max=LIMIT)
    out.copy_(gate * torch.sigmoid(ALPHA * gate) * (up + 1))
