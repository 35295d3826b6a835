"""The harness side of an armed call: the harness allocates ``out``, the bundle only fills it, and the
harness re-checks ``out`` afterwards. Version-independent; used by every pin's adapter."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from cacheon.runtime.receipts import Receipt

Disarm = Callable[[], None]


class SeamViolation(RuntimeError):
    """The bundle broke the boundary inside a live layer (fail closed: the call raises)."""


@dataclass(frozen=True)
class ArmRequest:
    """What an armer needs: the admitted entry, the receipt to sign, and the dtypes the op declared."""

    entry: Callable[..., Any]
    receipt: Receipt
    dtypes: frozenset[torch.dtype]


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device)


def call_entry(entry: Callable[..., Any], args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
    """Call the entry and revalidate ``out``: same storage, shape, strides, dtype and device, and the
    entry returned nothing (or ``out`` itself). Anything else raises :class:`SeamViolation`."""
    before = _layout(out)
    result = entry(*args)
    if result is not None and result is not out:
        raise SeamViolation("the entry returned a tensor instead of filling the harness-allocated out")
    if _layout(out) != before:
        raise SeamViolation("the entry replaced or reshaped the harness-allocated out")
    return out


def patch_attribute(owner: type, name: str, value: Any) -> Disarm:
    """Set ``owner.name``; the returned function restores exactly what was there (own or inherited)."""
    had_own = name in owner.__dict__
    previous = owner.__dict__.get(name)
    setattr(owner, name, value)

    def restore() -> None:
        if had_own:
            setattr(owner, name, previous)
        else:
            delattr(owner, name)

    return restore
