"""Verification results as plain data: what each stage returns, what the CLI prints, what ``--json`` carries."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Literal

Verdict = Literal["PASS", "FAIL", "NUMERICAL_PASS"]


class Stage(StrEnum):
    EAGER = "eager"  # every planned case, two trials each (fresh buffers, then a refill)
    COLLECTIVE = "collective"  # the eager cases at the real world size, every rank judged
    GRAPH = "graph"  # CUDA-graph capture and poisoned replays
    STABILITY = "stability"  # many interleaved calls; a subset the candidate cannot predict is judged


class GraphStatus(StrEnum):
    NOT_REQUIRED = "not_required"
    NOT_RUN = "not_run"
    FAILED = "failed"
    EMULATED = "emulated"  # an injected backend replayed cleanly: no CUDA-graph proof
    PASSED = "passed"


@dataclass(frozen=True)
class GraphResult:
    status: GraphStatus
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.status.value}: {self.detail}" if self.detail else self.status.value


@dataclass(frozen=True)
class Mismatch:
    """One of the elements furthest outside the tolerance: where, what the reference says, what came back."""

    output: str  # the output's name (``rank1.out`` for a collective's rank)
    index: tuple[int, ...]
    expected: float
    got: float
    error: float  # |got - expected|; inf where one side is not finite and they differ
    allowed: float | None  # atol + rtol * |expected| where the comparator bounds each element

    def text(self) -> str:
        where = f"{self.output}[{', '.join(map(str, self.index))}]"
        bound = f" > allowed {self.allowed:.3g}" if self.allowed is not None else ""
        return f"{where} expected {self.expected:.6g} got {self.got:.6g} (|err| {self.error:.3g}{bound})"

    def to_json(self) -> dict[str, Any]:
        """JSON has no inf/NaN: a value that is not finite is written as its name (``"nan"``, ``"-inf"``)."""
        return {k: _named(v) for k, v in asdict(self).items()} | {"index": list(self.index)}


def _named(value: Any) -> Any:
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


@dataclass(frozen=True)
class CaseResult:
    stage: Stage
    dtype: str
    shape: str
    trial: int
    ok: bool
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    metric: dict[str, float] = field(default_factory=dict)
    failures: tuple[str, ...] = ()
    note: str = ""  # how a drawn case's inputs were varied
    detail: str = ""  # the candidate's traceback when it raised: shown with --debug only
    case_id: str = ""  # what --case names (eager and collective cases); "" elsewhere
    tolerance: dict[str, float] = field(default_factory=dict)  # the comparator's bounds in force for this dtype
    worst: tuple[Mismatch, ...] = ()  # on a FAIL: the elements furthest outside the tolerance
    #: what the candidate's process says the entry returned (untrusted, a hint only): entries write ``out``
    returned: str = ""

    def line(self, mode: str) -> str:
        status = "ok" if self.ok else "FAIL"
        errs = ""
        if self.max_abs_err is not None and math.isfinite(self.max_abs_err) and self.max_rel_err is not None:
            errs = f"max_abs={self.max_abs_err:.3e} max_rel={self.max_rel_err:.3e}"
        name = self.case_id or self.dtype
        text = f"  {self.stage.value:<10} {name:<12} {self.shape:<34} #{self.trial}  {errs:<36} {mode} {status}"
        if self.note:
            text += f"  ({self.note})"
        if not self.ok:
            text += "".join(f"\n      {line}" for line in self.diagnosis(mode))
        return text

    def diagnosis(self, mode: str) -> list[str]:
        """Why a case failed, for its author: the failures, the bounds in force, the worst elements."""
        lines = [f"the entry returned {self.returned} (as reported by the candidate's process): the harness "
                 "ignores return values; write the result into the output tensor, e.g. out.copy_(result)"
                 ] if self.returned else []
        lines += [f.splitlines()[0] if f else f for f in self.failures]
        if self.tolerance:
            bounds = " ".join(f"{k}={v:g}" for k, v in self.tolerance.items())
            measured = " ".join(f"{k}={v:.6g}" for k, v in self.metric.items())
            lines.append(f"tolerance ({mode}, {self.dtype}): {bounds}" + (f"; measured {measured}" if measured else ""))
        if self.worst:
            lines.append("worst: " + "; ".join(m.text() for m in self.worst))
        return lines

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "worst": [m.to_json() for m in self.worst]}


@dataclass(frozen=True)
class StageProgress:
    """How far a stage of many calls has got (stability): for the status line, never a result."""

    stage: Stage
    done: int
    total: int


@dataclass(frozen=True)
class StageResult:
    stage: Stage
    cases: tuple[CaseResult, ...] = ()  # what was judged (stability: its failures only)
    stopped: bool = False  # stopped at its first failure (--keep-going runs every case)
    graph: GraphResult | None = None  # the graph stage's standing
    calls: int = 0  # calls made (stability)
    checked: int = 0  # calls judged (stability)
    skipped: str = ""  # why the stage did not run

    @property
    def ok(self) -> bool:
        return not self.skipped and all(c.ok for c in self.cases) and (
            self.graph is None or self.graph.status is not GraphStatus.FAILED
        )

    def summary(self) -> str:
        if self.skipped:
            return f"  {self.stage.value:<10} not run: {self.skipped}"
        failed = sum(not c.ok for c in self.cases)
        verdict = "ok" if self.ok else f"FAIL ({failed} judged call(s) failed)"
        return f"  {self.stage.value:<10} {self.calls} calls in random order, {self.checked} judged: {verdict}"


@dataclass(frozen=True)
class OpReport:
    slot: str
    entry: str
    source: str
    mode: str
    verdict: Verdict
    reason: str
    stages: tuple[StageResult, ...] = ()
    confinement: dict[str, str] = field(default_factory=dict)  # what the child applied
    candidate_output: str = ""  # the end of what the candidate printed: untrusted, escaped, shown, never parsed
    candidate_output_bytes: int = 0  # how much it printed in all (the parent keeps only the end)
    detail: str = ""  # a traceback from the candidate's process: shown with --debug only

    @property
    def cases(self) -> list[CaseResult]:
        return [c for s in self.stages for c in s.cases]

    @property
    def graph(self) -> GraphResult:
        results = [s.graph for s in self.stages if s.graph is not None]
        return results[0] if results else GraphResult(GraphStatus.NOT_REQUIRED)

    def first_failure(self) -> CaseResult | None:
        return next((c for c in self.cases if not c.ok), None)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["stages"] = [{**asdict(s), "cases": [c.to_json() for c in s.cases]} for s in self.stages]
        data["cases"] = [c.to_json() for c in self.cases]
        data["graph"] = asdict(self.graph)
        return data


@dataclass(frozen=True)
class VerifyReport:
    bundle_id: str
    bundle_digest: str
    device: str
    seed: int
    confinement: str  # the confinement in force for every op (bubblewrap or none)
    ops: list[OpReport]
    environment: dict[str, Any]
    verdict: Verdict
    reason: str
    #: ``--case``: the one case that ran; such a run is a check for the author, never a bundle's verdict
    case: str | None = None
    #: ``--dtype`` left out dtypes the manifest declares: the verdict covers the others only (slot -> dtypes left out)
    unjudged: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self, debug: bool = False) -> dict[str, Any]:
        """The report as JSON; tracebacks from the candidate's process only when ``debug``."""
        data = asdict(self)
        data["ops"] = [op.to_json() for op in self.ops]
        if not debug:
            for op in data["ops"]:
                op.pop("detail", None)
                for case in op["cases"]:
                    case.pop("detail", None)
                for stage in op["stages"]:
                    for case in stage["cases"]:
                        case.pop("detail", None)
        return _finite(data)  # type: ignore[no-any-return]  # a dict in, a dict out


def _finite(value: Any) -> Any:
    """JSON has no inf/NaN; an unmeasurable error is ``null``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def combine(ops: list[OpReport]) -> tuple[Verdict, str]:
    """FAIL beats NUMERICAL_PASS beats PASS; the reason names the first op that decided it."""
    for wanted in ("FAIL", "NUMERICAL_PASS"):
        for op in ops:
            if op.verdict == wanted:
                return op.verdict, f"{op.slot}: {op.reason}"
    return "PASS", "every op matched its reference"
