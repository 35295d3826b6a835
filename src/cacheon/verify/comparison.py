"""A comparator's verdict on one output: shared by the element-wise comparators and the selection one."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    metric: dict[str, float] = field(default_factory=dict)
    detail: str = ""
