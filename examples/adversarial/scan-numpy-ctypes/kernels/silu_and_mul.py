import torch


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    address = out.numpy().ctypes.data  # numpy.ctypeslib is one step away
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
