"""Glue for SGLang 0.5.13.post1 (read from that wheel's source; re-read on any bump).

- ``SiluAndMul`` and ``RMSNorm`` are ``MultiPlatformOp``s whose ``forward`` dispatches to a per-platform
  method chosen at construction. The adapter shadows ``forward`` on the class, so existing and future
  instances on every platform route through it; disarming deletes the shadow and the inherited dispatch
  is back. Calls outside the slot contract (e.g. RMSNorm's fused residual add) go to stock, counted.
- ``GroupCoordinator`` is constructed collectively by every rank; its ``__init__`` is where the
  all-or-nothing agreement runs (``cpu_group`` is gloo, ``device_group`` is what the bundle receives).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cacheon.runtime.boundary import ArmRequest, Disarm, call_entry, patch_attribute
from cacheon.runtime.collective import GroupView

PIN = "0.5.13.post1"
_AGREED = "_cacheon_agreed"  # set on a GroupCoordinator whose ranks all agreed


def arm_silu_and_mul(req: ArmRequest) -> Disarm:
    from sglang.srt.layers.activation import SiluAndMul

    stock = SiluAndMul.forward

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in req.dtypes or x.shape[-1] % 2 or x.numel() == 0:
            req.receipt.pass_through()
            passed: torch.Tensor = stock(self, x)
            return passed
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        d = rows.shape[-1] // 2
        out = torch.empty((rows.shape[0], d), dtype=x.dtype, device=x.device)
        call_entry(req.entry, (rows, out), out)
        req.receipt.fire()
        return out.view(*x.shape[:-1], d)

    return patch_attribute(SiluAndMul, "forward", forward)


def arm_rmsnorm(req: ArmRequest) -> Disarm:
    from sglang.srt.layers.layernorm import RMSNorm

    stock = RMSNorm.forward

    def forward(
        self: Any,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        post_residual_addition: torch.Tensor | None = None,
    ) -> Any:
        plain = (
            residual is None
            and post_residual_addition is None
            and self.variance_size_override is None
            and not self.cast_x_before_out_mul
            and self.override_orig_dtype is None
            and x.dtype in req.dtypes
            and self.weight.dtype == x.dtype
            and x.shape[-1] == self.hidden_size
            and x.numel() > 0
        )
        if not plain:
            req.receipt.pass_through()
            return stock(self, x, residual, post_residual_addition)
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(rows)
        call_entry(req.entry, (rows, self.weight, out, float(self.variance_epsilon)), out)
        req.receipt.fire()
        return out.view(x.shape)

    return patch_attribute(RMSNorm, "forward", forward)


def arm_all_reduce(req: ArmRequest) -> Disarm:
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    stock = GroupCoordinator.all_reduce

    def all_reduce(self: Any, input_: torch.Tensor) -> torch.Tensor:
        # Only groups whose ranks all agreed use the bundle; a group created before arming stays stock
        # on every rank, so no group ever mixes implementations.
        if self.world_size == 1 or not getattr(self, _AGREED, False) or input_.dtype not in req.dtypes:
            req.receipt.pass_through()
            passed: torch.Tensor = stock(self, input_)
            return passed
        out = torch.empty(input_.shape, dtype=input_.dtype, device=input_.device)
        call_entry(req.entry, (input_.contiguous(), out, self.device_group), out)
        req.receipt.fire()
        return out

    return patch_attribute(GroupCoordinator, "all_reduce", all_reduce)


def arm_group_gate(enforce: Callable[[GroupView], None]) -> Disarm:
    """Run ``enforce`` on every rank right after each ``GroupCoordinator`` is constructed."""
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    stock_init = GroupCoordinator.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        stock_init(self, *args, **kwargs)
        enforce(GroupView(self.cpu_group, self.device_group, self.device, self.world_size))
        setattr(self, _AGREED, True)

    return patch_attribute(GroupCoordinator, "__init__", __init__)


ARMERS: dict[str, Callable[[ArmRequest], Disarm]] = {
    "activation.SiluAndMul": arm_silu_and_mul,
    "layernorm.RMSNorm": arm_rmsnorm,
    "distributed.GroupCoordinator.all_reduce": arm_all_reduce,
}
