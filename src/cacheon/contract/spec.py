"""Typed slot contracts.

A slot is a validator-owned tensor boundary: the harness generates every input, allocates every
output, calls the candidate's entry with a fixed argument order, and judges the result against a
trusted high-precision reference. Everything here is plain data plus two callables (input
generation is generic; the reference is per slot), so a slot can be described as canonical JSON.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # torch is imported where tensors are made (verify), not by slots, new, scan or package
    import torch

SlotKind = Literal["op", "block", "collective"]
CompareMode = Literal["allclose", "matched_ratio", "cosine", "topk_overlap"]

#: dtype names a slot may run in (torch's attribute names); "act" in a TensorSpec means "the dtype of this run".
DTYPE_NAMES = ("float32", "float16", "bfloat16", "int32", "int64", "bool")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a slot's dtype name stands for (KeyError for a name not in DTYPE_NAMES)."""
    if name not in DTYPE_NAMES:
        raise KeyError(name)
    import torch

    dtype: torch.dtype = getattr(torch, name)
    return dtype


@dataclass(frozen=True)
class TensorSpec:
    """One tensor argument: symbolic shape over the case dims, dtype, and how inputs are filled."""

    name: str
    shape: tuple[str, ...]
    dtype: str = "act"
    init: str = "normal"
    per_rank: bool = False  # collectives: each rank holds its own partial (else replicated)

    def resolve_shape(self, dims: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(eval_dim(expr, dims) for expr in self.shape)

    def resolve_dtype(self, act: str) -> torch.dtype:
        return torch_dtype(act if self.dtype == "act" else self.dtype)

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "name": self.name, "shape": list(self.shape), "dtype": self.dtype, "init": self.init
        }
        if self.per_rank:
            described["per_rank"] = True
        return described


@dataclass(frozen=True)
class Tolerance:
    """Per-dtype acceptance bounds; which fields matter depends on the comparator mode."""

    atol: float = 0.0
    rtol: float = 0.0
    min_ratio: float = 1.0
    min_cosine: float = 1.0
    norm_rtol: float = 0.0
    topk: int = 0
    #: times the reference's own float32 rounding on the call's input (its largest error against float64,
    #: per output) added to ``atol``: where honest error grows with the input through cancelling sums (MoE
    #: experts under heavy-tailed activations), which a fixed atol cannot bound. 0: a fixed bound.
    rounding: float = 0.0

    def describe(self) -> dict[str, str]:
        # Floats are not canonical JSON; repr() is exact and stable for Python floats. A rounding left at 0 is
        # not described, so the slots that do not use it keep the digest they had before it existed.
        return {k: repr(v) for k, v in sorted(self.__dict__.items()) if k != "rounding" or v}


@dataclass(frozen=True)
class Comparator:
    mode: CompareMode
    tolerances: Mapping[str, Tolerance]

    def tolerance(self, dtype: str) -> Tolerance:
        return self.tolerances[dtype]

    def describe(self) -> dict[str, Any]:
        return {"mode": self.mode, "tolerances": {k: v.describe() for k, v in sorted(self.tolerances.items())}}


@dataclass(frozen=True)
class ShapeCase:
    """A registered problem size: integer dims plus non-tensor parameters (e.g. ``causal``)."""

    dims: Mapping[str, int]
    params: Mapping[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        parts = [f"{k}={v}" for k, v in self.dims.items()]
        parts += [f"{k}={v}" for k, v in self.params.items()]
        return " ".join(parts)

    def describe(self) -> dict[str, Any]:
        return {"dims": dict(self.dims), "params": {k: repr(v) for k, v in self.params.items()}}


Reference = Callable[[Mapping[str, "torch.Tensor"], Mapping[str, Any]], dict[str, "torch.Tensor"]]
ScalarFn = Callable[[ShapeCase], dict[str, Any]]


@dataclass(frozen=True)
class SlotSpec:
    """A registered slot: the ABI a bundle entry must implement."""

    name: str
    kind: SlotKind
    entry: str
    args: tuple[str, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    scalars: ScalarFn
    scalar_names: tuple[str, ...]
    #: ``module.function@precision...``: names the trusted reference (imported on first use, with torch)
    reference_id: str
    comparator: Comparator
    dtypes: tuple[str, ...]
    shapes: tuple[ShapeCase, ...]
    token_dim: str
    graph_dynamic: tuple[str, ...]
    graph_safe: bool
    #: the largest ``token_dim`` a real serving batch reaches: verify draws shapes up to it
    serving_tokens: int
    summary: str
    #: inputs handed once to the bundle's ``prepare`` entry; its result is passed as ``prepared``
    prepare_inputs: tuple[str, ...] = ()

    @property
    def reference(self) -> Reference:
        """The function ``reference_id`` names: the id is the one record of which reference judges."""
        module, _, name = self.reference_id.partition("@")[0].rpartition(".")
        function: Reference = getattr(importlib.import_module(module), name)
        return function

    def signature(self) -> str:
        return f"{self.entry}({', '.join(self.args)})"

    @property
    def static_inputs(self) -> tuple[str, ...]:
        """Inputs that stay fixed across graph replays and refill trials (weights, not activations)."""
        return tuple(t.name for t in self.inputs if t.name not in self.graph_dynamic)

    def requires_graph_proof(self) -> bool:
        """``op`` slots always need CUDA-graph replay proof; ``block`` slots when declared graph-safe."""
        return self.kind == "op" or (self.kind == "block" and self.graph_safe)

    def describe(self) -> dict[str, Any]:
        """Canonical description; part of the catalog digest, so ABI changes change the digest."""
        return {
            "name": self.name,
            "kind": self.kind,
            "entry": self.entry,
            "args": list(self.args),
            "signature": self.signature(),
            "inputs": [t.describe() for t in self.inputs],
            "outputs": [t.describe() for t in self.outputs],
            "scalars": list(self.scalar_names),
            "reference": self.reference_id,
            "comparator": self.comparator.describe(),
            "dtypes": list(self.dtypes),
            "shapes": [s.describe() for s in self.shapes],
            "token_dim": self.token_dim,
            "graph_dynamic": list(self.graph_dynamic),
            "graph_safe": self.graph_safe,
            "serving_tokens": self.serving_tokens,
            "summary": self.summary,
            "prepare": f"prepare({', '.join(self.prepare_inputs)})" if self.prepare_inputs else None,
        }


_ALLOWED_DIM_NODES = (
    ast.Expression, ast.BinOp, ast.Name, ast.Constant, ast.Call, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Load,
)


def _cdiv(a: int, b: int) -> int:
    """Ceiling division: how many blocks of ``b`` cover ``a``."""
    return -(-a // b)


def _floordiv(a: int, b: int) -> int:
    return a // b


@lru_cache(maxsize=1024)
def _parse_dim(expr: str) -> ast.Expression:
    """The checked tree of a dimension expression, parsed once (verify resolves shapes per call)."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise ValueError(f"unsupported dimension expression {expr!r}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_DIM_NODES):
            raise ValueError(f"unsupported dimension expression {expr!r}")
    return tree


def eval_dim(expr: str, dims: Mapping[str, int]) -> int:
    """Evaluate a dimension expression such as ``"2*d"``, ``"P+T"``, ``"S//bs"`` (floor division) or
    ``"cdiv(P+T, bs)"`` (ceiling division) over the case dims. Nothing else parses (no attribute,
    no other call, no true division); a divisor must be positive and the result non-negative."""
    tree = _parse_dim(expr)

    def divide(a: int, b: int, op: Callable[[int, int], int]) -> int:
        if b <= 0:
            raise ValueError(f"dimension expression {expr!r} divides by {b} (a divisor must be positive)")
        return op(a, b)

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            return int(dims[node.id])
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id == "cdiv" and len(node.args) == 2
                    and not node.keywords):
                raise ValueError(f"unsupported dimension expression {expr!r} (only cdiv(a, b) may be called)")
            return divide(ev(node.args[0]), ev(node.args[1]), _cdiv)
        if isinstance(node, ast.BinOp):
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if isinstance(node.op, ast.FloorDiv):
                return divide(left, right, _floordiv)
        raise ValueError(f"unsupported dimension expression {expr!r}")

    value = ev(tree)
    if value < 0:
        raise ValueError(f"dimension expression {expr!r} is negative ({value}) for dims {dict(dims)}")
    return value
