import torch


def silu_and_mul(x: "torch.Tensor", out: "print('evaluated') or torch.Tensor") -> None:
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
