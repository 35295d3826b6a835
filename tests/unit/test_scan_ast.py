"""The kernel language, rule by rule: what kernels need stays clean, every named attack and the
shapes we thought of ourselves are refused with an actionable rule id."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheon.bundle import ast_policy
from cacheon.bundle.ast_policy import MAX_SOURCE_BYTES, check_source, local_roots
from cacheon.bundle.kernel_language import allowlist
from cacheon.bundle.kernel_language.checker import MAX_NODES, Checker
from cacheon.bundle.scan import RULES
from tests.conftest import REPO

TRITON_KERNEL = '''
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

F = torch.nn.functional
SCALE = 0.5


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4)], key=["n"])
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def _kernel(x_ptr, out_ptr, n, eps, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + cols, mask=cols < n, other=0.0).to(tl.float32)
    for _ in tl.static_range(2):
        x = x * SCALE
    y = libdevice.tanh(x / tl.sqrt(tl.sum(x * x, axis=0) / n + eps))
    tl.store(out_ptr + cols, y.to(out_ptr.dtype.element_ty), mask=cols < n)


def _block(n: int) -> int:
    return triton.next_power_of_2(max(n, int(math.sqrt(16))))


def rmsnorm(x: torch.Tensor, out: torch.Tensor, eps: float, w: Optional[torch.Tensor] = None) -> None:
    tmp = torch.empty_like(x)
    tmp.copy_(x.T.T)
    grid = lambda meta: (triton.cdiv(x.shape[-1], meta["BLOCK"]),)
    _kernel[grid](tmp, out, x.shape[-1], eps)
    out.mul_(F.silu(out) if x.is_cuda and x.dtype.is_floating_point else 1.0)
    scores = {k: v for k, v in zip(("a", "b"), (1, 2))}
    cache: dict[str, int] = {}
    cache.setdefault("k", scores.get("a", 0))
    values, indices = torch.topk(out, 2).values, torch.topk(out, 2).indices
    with torch.cuda.stream(torch.cuda.current_stream()):
        out[..., :1] = values[..., :1] * float(torch.finfo(out.dtype).eps)
    if (n := len(indices)) > 0:
        print(f"{n:>{4}} rows", flush=True)
'''


def hits(source: str, rel: str = "kernel.py", declared: tuple[str, ...] = ()) -> set[tuple[int, str]]:
    """(line, rule) of each finding in ``source``; every rule must be a documented id."""
    found = check_source(source.encode("utf-8"), rel, local_roots((rel, *declared)))
    assert {rule for _, rule, _ in found} <= RULES.keys()
    return {(line, rule) for line, rule, _ in found}


def rules(source: str) -> set[str]:
    return {rule for _, rule in hits(source)}


def test_legit_triton_kernel_is_clean():
    assert hits(TRITON_KERNEL) == set()


KERNEL_SOURCES = sorted(
    p for root in ("examples/bundles", "src/cacheon/starters/kernels") for p in (REPO / root).rglob("*.py")
    if p.parent.name != "silu-scan-violation" and "silu-scan-violation" not in p.parts
)


@pytest.mark.parametrize("path", KERNEL_SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_example_and_starter_is_clean(path: Path):
    assert check_source(path.read_bytes(), "kernels/k.py", frozenset()) == []


@pytest.mark.parametrize(
    ("source", "rule"),
    [
        # match/case: class patterns read attributes, captures bind them
        ("import torch\ndef f(x):\n    match x:\n        case torch.Tensor(grad_fn=g):\n            return g",
         "not-allowed-syntax"),
        ("def f(x):\n    match x:\n        case {'__class__': c}:\n            return c", "not-allowed-syntax"),
        # stdlib reached through an allowed module, or imported directly
        ("import typing\ntyping.re.compile('x')", "not-allowed-attribute"),
        ("from typing import get_type_hints", "not-allowed-import"),
        ("import typing\nt = typing.io", "not-allowed-attribute"),
        ("import operator\nget = operator.attrgetter('x')", "not-allowed-import"),
        ("from types import CodeType", "not-allowed-import"),
        ("import warnings\nwarnings.simplefilter('ignore')", "not-allowed-import"),
        ("import torch\ntorch.nn.functional.warnings.simplefilter('ignore')", "not-allowed-attribute"),
        # attribute writes that are not syntactic stores
        ("import functools\nimport torch\nfunctools.update_wrapper(torch.allclose, len)", "not-allowed-import"),
        ("from dataclasses import dataclass\nimport torch\ndataclass(torch.Tensor)", "not-allowed-import"),
        ("import torch\n@torch.no_grad()\ndef f(x):\n    pass", "decorator"),
        # annotations that something evaluates
        ("import functools\n@functools.singledispatch\ndef f(x: 'eval(\"1\")'):\n    pass", "not-allowed-import"),
        ("def f(x: 'os.system(\"id\")'):\n    pass", "annotation"),
        ("def f(x: print('x')):\n    pass", "annotation"),
        ("x: 'torch.Tensor' = 1", "annotation"),
        ("def f(x):  # type: (int) -> None\n    pass", "annotation"),
        # getattr and friends on values the checker does not track
        ("def f(x):\n    return getattr(x, 'numpy')()", "not-allowed-name"),
        ("def f(x):\n    return hasattr(x, 'y')", "not-allowed-name"),
        ("def f(x):\n    return type(x)", "not-allowed-name"),
        ("def f(x):\n    return vars(x)", "not-allowed-name"),
        ("def f():\n    return super()", "not-allowed-name"),
        # private members of torch objects
        ("import torch\ntorch._C._set_grad_enabled(True)", "private-attribute"),
        ("import torch\ntorch.multiprocessing._start()", "not-allowed-attribute"),
        ("def f(x):\n    return x._version", "private-attribute"),
        ("from torch import _C", "not-allowed-import"),
        # .numpy() into numpy.ctypeslib
        ("def f(x):\n    return x.numpy().ctypes.data", "not-allowed-attribute"),
        ("import numpy.ctypeslib", "not-allowed-import"),
        # reseeding (or reading) torch's default generator
        ("import torch\ntorch.manual_seed(0)", "not-allowed-attribute"),
        ("import torch\ntorch.default_generator.manual_seed(0)", "not-allowed-attribute"),
        ("import torch\ntorch.random.manual_seed(0)", "not-allowed-attribute"),
        ("import torch\ntorch.cuda.manual_seed_all(0)", "not-allowed-attribute"),
        ("def f(x):\n    x.random_()", "not-allowed-attribute"),
        ("import torch\ng = torch.Generator()", "not-allowed-attribute"),
        ("def f(g):\n    g.manual_seed(0)", "not-allowed-attribute"),
    ],
)
def test_issue_20_attacks_are_refused(source: str, rule: str):
    assert rule in rules(source)


@pytest.mark.parametrize(
    ("source", "rule"),
    [
        ("def f(x):\n    return x.data_ptr().to_bytes(8, 'little')", "not-allowed-attribute"),
        ("import torch\nclass T(torch.Tensor):\n    pass", "not-allowed-syntax"),
        ("import torch\ntorch.Tensor.__torch_function__ = classmethod(len)", "private-attribute"),
        ("import torch\ntorch.Tensor.add = len", "attribute-assignment"),
        ("import torch\ntorch.utils.checkpoint", "not-allowed-attribute"),
        ("def f(x):\n    x.register_hook(print)", "not-allowed-attribute"),
        ("def f(x):\n    return x.storage()", "not-allowed-attribute"),
        ("def f(x):\n    return x.untyped_storage()", "not-allowed-attribute"),
        ("import torch\ntorch.from_numpy(a)", "not-allowed-attribute"),
        ("def f(x):\n    x.apply_(print)", "not-allowed-attribute"),
        ("def f(x):\n    x.map_(x, print)", "not-allowed-attribute"),
        ("import torch\nsetattr(torch.Tensor, 'add', len)", "not-allowed-name"),
        ("def f(x):\n    return x.__class__", "private-attribute"),
        ("'{0.__class__}'.format(1)", "not-allowed-attribute"),
        ("def f(x):\n    try:\n        pass\n    except Exception as e:\n        return e.__traceback__",
         "private-attribute"),
        ("def f(x):\n    return x.grad_fn.next_functions", "not-allowed-attribute"),
        ("import torch\ntorch.cuda.memory.caching_allocator_alloc(1)", "not-allowed-attribute"),
        ("import torch\ntorch.cuda.caching_allocator_alloc(1)", "not-allowed-attribute"),
        ("import torch\ntorch.set_default_dtype(torch.half)", "not-allowed-attribute"),
        ("import torch\ntorch.use_deterministic_algorithms(True)", "not-allowed-attribute"),
        ("import torch.distributed as dist\ndist.new_group([0, 1])", "not-allowed-attribute"),
        ("import torch.distributed as dist\ndist.destroy_process_group()", "not-allowed-attribute"),
        ("import torch\ntorch.is_grad_enabled()", "not-allowed-attribute"),
        ("import torch\nx = [torch][0]", "module-value"),
        ("import torch\ndef f(m=torch):\n    pass", "module-value"),
        ("def f():\n    global g", "not-allowed-syntax"),
        ("async def f():\n    pass", "not-allowed-syntax"),
        ("def f():\n    yield 1", "not-allowed-syntax"),
        ("b = __builtins__", "dunder-name"),
        ("def __getattr__(name):\n    return name", "dunder-name"),
        ("if False:\n    getattr = print\ngetattr(1, 'real')", "not-allowed-name"),
        ("from torch import *", "star-import"),
        ("import os", "not-allowed-import"),
        ("from .. import x", "not-allowed-import"),
        ("def f(x):\n    x.data = x", "attribute-assignment"),
        ("def f(x):\n    del x.grad", "attribute-assignment"),
        ("import torch\ntorch.float32[0] = 1", "attribute-assignment"),
        ("import torch\n@triton.jit\ndef k(x):\n    pass", "decorator"),
        ("def helper(x):\n    @triton.jit\n    def k(y):\n        pass", "decorator"),
        ("import torch\nimport triton\n@triton.jit\ndef k(x_ptr):\n    torch.empty(1)", "jit-body"),
        ("import triton\ndef h(x):\n    return x\n@triton.jit\ndef k(x_ptr):\n    h(x_ptr)", "jit-body"),
        ("import triton\n@triton.jit\ndef k(x_ptr):\n    x_ptr.data_ptr()", "not-allowed-attribute"),
        ("import triton\n@triton.jit\ndef k(x_ptr):\n    print(x_ptr)", "jit-body"),
        ("import torch\nf = (lambda: torch)()", "module-value"),
        ("def f(p):\n    return p._private", "private-attribute"),
        ("[f for f in (print,) if (g := getattr)]", "not-allowed-name"),
        ("def f(x):\n    return x.numpy", "not-allowed-attribute"),
        ("def f(p):\n    return p.torch.load", "not-allowed-attribute"),
    ],
)
def test_shapes_the_issue_did_not_name_are_refused(source: str, rule: str):
    assert rule in rules(source)


@pytest.mark.parametrize(
    "source",
    [
        "def load(p):\n    return p\nload(1)",
        "import triton.language as tl\nx = tl.load",
        "import torch\nisinstance(1, torch.Tensor)\ntorch.float32",
        "import torch\ns = torch.cuda.current_stream()\nc = torch.cuda.is_current_stream_capturing()",
        "import torch.distributed as dist\ndef f(x, g):\n    dist.all_reduce(x, op=dist.ReduceOp.SUM, group=g)",
        "import triton.language.extra.libdevice as ld",
        "import torch\ny = torch.linalg.vector_norm(torch.ones(2))",
        "from . import helper\nhelper.run()",
        "def f(type, input, id):\n    return type(input) + id",  # local names shadow builtins inside a function
        "def f(x):\n    try:\n        x.float()\n    except (ValueError, RuntimeError) as e:\n        raise TypeError('no') from e",
        "import torch\ndef f(x):\n    assert x.dim() == 2, 'rows'\n    return [r.sum() for r in x.unbind(0)]",
        "import torch\ndef f(torch):\n    return torch.size(0)",
        "import torch as T\nM = T\nM.zeros(1)",
        "import torch\ndef k(p): return L(p)\n\nL = torch.relu",  # a use before its alias: settled first
        "import torch\nx = 1.0\nx += torch.tensor(1.0).item()\ndel x",
    ],
)
def test_what_kernels_need_stays_clean(source: str):
    assert hits(source) == set()


def test_findings_name_line_and_the_allowed_surface_doc():
    [(line, rule, message)] = check_source(b"import torch\n\ntorch.load('w.pt')\n", "k.py", frozenset())
    assert (line, rule) == (3, "not-allowed-attribute")
    assert "torch.load is not on the kernel allow-list" in message and "docs/contributing/scan.md" in message


def test_relative_import_depth_follows_the_file():
    assert hits("from .. import common", rel="pkg/kernel.py") == set()
    assert hits("from ... import common", rel="pkg/kernel.py") == {(1, "not-allowed-import")}


def test_declared_sibling_modules_are_importable():
    source = "import helper\nfrom pkg.util import f\nhelper.f()\nf()"
    assert hits(source, declared=("helper.py", "pkg/util.py")) == set()


def test_a_sibling_cannot_shadow_stdlib_or_allowed_roots():
    assert local_roots(["os.py", "torch/__init__.py", "helper.py", "pkg/a.py", "manifest.toml"]) == {"helper", "pkg"}


def test_source_encoding_and_syntax_errors():
    assert hits("# -*- coding: latin-1 -*-\nx = 1") == {(1, "source-encoding")}
    assert hits("def broken(:\n    pass") == {(1, "syntax-error")}
    assert hits("# coding: no-such-codec\nx = 1") == {(0, "syntax-error")}
    assert hits("x = 1\n# type: int") == {(2, "syntax-error")}


def test_too_deep_to_analyse_fails_closed():
    assert hits("x = " + "+".join(["a"] * 3000)) == {(0, "syntax-error")}


# The work budget: a 0.9 MB source of long attribute chains once kept the scan busy for an hour.

def _chains(count: int, length: int) -> str:
    return "import torch\n" + "".join(f"y{i} = torch" + ".cuda" * length + "\n" for i in range(count))


def test_a_source_past_the_size_budget_is_refused_unread():
    source = _chains(30_000, 5).encode()
    assert len(source) > 900_000 > MAX_SOURCE_BYTES
    assert check_source(source, "k.py", frozenset())[0][:2] == (0, "scan-budget")


def test_a_source_past_the_node_budget_is_refused():
    source = "x = [" + ",".join(["1"] * MAX_NODES) + "]"  # flat: under the size cap, over the node cap
    assert len(source) < MAX_SOURCE_BYTES
    assert hits(source) == {(0, "scan-budget")}


def test_resolution_is_linear_in_the_chains():
    """Every attribute step is resolved once: the count is the number of attribute nodes."""
    import ast

    source = "def f(x):\n" + "".join(f"    y{i} = x.view" + ".T" * 40 + "\n" for i in range(500))
    tree = ast.parse(source)
    checker = Checker("k.py", frozenset(), tree)
    checker.visit(tree)
    assert checker.hits == []
    assert checker.steps == sum(isinstance(n, ast.Attribute) for n in ast.walk(tree)) == 500 * 41


def test_a_name_bound_to_too_many_objects_fails_closed():
    members = sorted(allowlist.MEMBERS["torch"])[:20]
    source = "import torch\n" + "".join(f"x = torch.{m}\n" for m in members)
    assert "scan-budget" in rules(source)
    assert "scan-budget" not in rules(source.replace("x = torch.", "x = torch.", 10).split("x = torch." + members[12])[0])


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_never_raises_on_arbitrary_input(data: bytes):
    for line, rule, message in check_source(data, "k.py", frozenset()):
        assert line >= 0 and rule in RULES and message


# The allow-list itself: names that exist, and no untracked path that reaches past a module's list.

def _module(path: str):
    try:
        return importlib.import_module(path)
    except ImportError:
        return None


@pytest.mark.parametrize("module", sorted(allowlist.MEMBERS))
def test_every_listed_member_exists(module: str):
    parent, _, last = module.rpartition(".")
    obj = _module(module)
    if obj is None and parent and (holder := _module(parent)) is not None:
        obj = inspect.getattr_static(holder, last, None)  # a class such as torch.distributed.ReduceOp
    if obj is None:
        pytest.skip(f"{module} is not importable here")
    missing = sorted(m for m in allowlist.MEMBERS[module] if not hasattr(obj, m))
    assert not missing, f"{module} has no {missing}: drop them from the allow-list"


#: reviewed: reachable through an untracked value, harmless there, and not worth listing
REVIEWED = {"torch.distributed": {"log"}}  # a logging.Logger: only its .name and .log are value attributes


@pytest.mark.parametrize("module", sorted(allowlist.MODULES - {"__future__"}))
def test_untracked_attributes_reach_nothing_a_module_refuses(module: str):
    """A module can reach a function as an untracked value (``from .helper import torch as t``);
    ``t.cuda`` must then be no more than ``torch.cuda`` is."""
    obj = _module(module)
    if obj is None:
        pytest.skip(f"{module} is not importable here")
    allowed = allowlist.MEMBERS.get(module, frozenset()) | REVIEWED.get(module, set()) | {
        m.rpartition(".")[2] for m in allowlist.MODULES if m.rpartition(".")[0] == module}
    names = allowlist.VALUE_ATTRS | allowlist.JIT_ATTRS
    leaks = sorted(n for n in names if inspect.getattr_static(obj, n, None) is not None and n not in allowed)
    assert not leaks, f"{module}.{leaks} reachable through an untracked value but not on its list"


def test_rule_ids_are_the_scan_rules():
    assert ast_policy.RULES.keys() <= RULES.keys()
