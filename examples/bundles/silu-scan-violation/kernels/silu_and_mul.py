import os

import torch

run = os.system
run("echo pwned > /tmp/cacheon-scan-violation-ran")  # would run at import time if ever imported
with open("/tmp/cacheon-scan-violation-ran", "a") as fh:
    fh.write("imported\n")


def silu_and_mul(x: torch.Tensor, out: torch.Tensor) -> None:
    d = x.shape[-1] // 2
    out.copy_(torch.nn.functional.silu(x[..., :d].float()) * x[..., d:].float())
