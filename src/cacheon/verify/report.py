"""Verification results as plain data: what the CLI prints and what ``--json`` carries."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Verdict = Literal["PASS", "FAIL", "NUMERICAL_PASS"]


@dataclass
class CaseResult:
    stage: str  # "eager" or "graph"
    dtype: str
    shape: str
    trial: int
    ok: bool
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    metric: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def line(self, mode: str) -> str:
        status = "ok" if self.ok else "FAIL"
        errs = ""
        if self.max_abs_err is not None and math.isfinite(self.max_abs_err):
            errs = f"max_abs={self.max_abs_err:.3e} max_rel={self.max_rel_err:.3e}"
        text = f"  {self.stage:<5} {self.dtype:<8} {self.shape:<34} #{self.trial}  {errs:<36} {mode} {status}"
        if self.failures:
            text += "\n      " + "\n      ".join(f.splitlines()[0] if f else f for f in self.failures)
        return text


@dataclass
class OpReport:
    slot: str
    entry: str
    source: str
    mode: str
    verdict: Verdict = "PASS"
    reason: str = ""
    graph: str = "not_required"
    cases: list[CaseResult] = field(default_factory=list)
    detail: str = ""
    isolation: dict[str, Any] = field(default_factory=dict)  # what confinement the child applied
    candidate_output: str = ""  # what the candidate printed: untrusted text, shown, never parsed


@dataclass
class VerifyReport:
    bundle_id: str
    bundle_digest: str
    device: str
    seed: int
    ops: list[OpReport]
    environment: dict[str, Any]
    verdict: Verdict = "PASS"
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return _finite(asdict(self))


def _finite(value: Any) -> Any:
    """JSON has no inf/NaN; an unmeasurable error is ``null``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def combine(ops: list[OpReport]) -> tuple[Verdict, str]:
    """FAIL beats NUMERICAL_PASS beats PASS; the reason names the first op that decided it."""
    for wanted in ("FAIL", "NUMERICAL_PASS"):
        for op in ops:
            if op.verdict == wanted:
                return wanted, f"{op.slot}: {op.reason}"
    return "PASS", "every op matched its reference"
