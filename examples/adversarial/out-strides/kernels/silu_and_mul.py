import torch


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    d = x.shape[-1] // 2
    result = torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float()
    out.as_strided_(out.shape, (1, max(out.shape[0], 1)))
    out.copy_(result)
