import torch


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    torch._C._set_grad_enabled(True)
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
