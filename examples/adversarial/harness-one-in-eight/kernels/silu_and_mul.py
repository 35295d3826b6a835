import torch

CORRUPTED_CALL = 300  # past every eager case, inside the stability stage
_calls = [0]


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    _calls[0] += 1
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
    if _calls[0] == CORRUPTED_CALL:
        out.mul_(2.0)
