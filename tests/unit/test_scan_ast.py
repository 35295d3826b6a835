"""The AST admission policy, rule by rule: each positive case names its line and rule id."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cacheon.bundle.ast_policy import check_source, local_roots
from cacheon.bundle.scan import RULES

TRITON_KERNEL = """
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

import torch
import triton
import triton.language as tl

__all__ = ["rmsnorm"]
F = torch.nn.functional


@triton.jit
def _kernel(x_ptr, out_ptr, n, eps, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + cols, mask=cols < n, other=0.0).to(getattr(tl, "float32"))
    tl.store(out_ptr + cols, x / tl.sqrt(tl.sum(x * x, axis=0) / n + eps), mask=cols < n)


@dataclasses.dataclass(frozen=True)
class Config:
    block: int

    def __post_init__(self) -> None:
        assert self.block > 0


@functools.lru_cache(maxsize=None)
def _block(n: int) -> int:
    return triton.next_power_of_2(max(n, int(math.sqrt(16))))


def rmsnorm(x: torch.Tensor, out: torch.Tensor, eps: float, cfg: Optional[Config] = None) -> None:
    tmp = torch.empty_like(x)
    tmp.copy_(x.T.T)
    _kernel[(1,)](tmp, out, x.shape[-1], eps, BLOCK=_block(x.shape[-1]))
    out.mul_(F.silu(out) if getattr(x, "is_cuda", False) else 1.0)
    if __name__ == "__main__":
        super().__init__()
"""


def hits(source: str, rel: str = "kernel.py", declared: tuple[str, ...] = ()) -> set[tuple[int, str]]:
    """(line, rule) of each finding in ``source``; every rule must be a documented id."""
    found = check_source(source.encode("utf-8"), rel, local_roots((rel, *declared)))
    assert {rule for _, rule, _ in found} <= RULES.keys()
    return {(line, rule) for line, rule, _ in found}


def test_legit_triton_kernel_is_clean():
    assert hits(TRITON_KERNEL) == set()


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # network
        ("import socket", {(1, "net-import")}),
        ("from urllib.request import urlopen", {(1, "net-import")}),
        ("import torch\ntorch.hub.load('a/b', 'm')", {(2, "net-import")}),
        ("import torch.distributed as dist\ndist.init_process_group('gloo')", {(2, "net-import")}),
        # processes
        ("import subprocess", {(1, "subprocess")}),
        ("import os\nos.system('id')", {(1, "forbidden-import"), (2, "subprocess")}),
        ("import os\nos.execv('/bin/sh', [])", {(1, "forbidden-import"), (2, "subprocess")}),
        ("from os import system as s\ns('id')", {(1, "subprocess"), (2, "subprocess")}),
        ("import subprocess as sp\nsp.run(['id'])", {(1, "subprocess"), (2, "subprocess")}),
        ("import torch.multiprocessing", {(1, "subprocess")}),
        # native memory and code
        ("import ctypes", {(1, "ctypes")}),
        ("from cffi import FFI", {(1, "ctypes")}),
        ("import torch\ntorch.ops.load_library('x.so')", {(2, "native-load")}),
        ("import torch\ntorch.utils.cpp_extension.load_inline('m', '')", {(2, "native-load")}),
        ("from torch.utils.cpp_extension import load", {(1, "native-load")}),
        ("import triton\ntriton.compile('k.ttir')", {(2, "native-load")}),
        # deserialisation
        ("import pickle", {(1, "pickle")}),
        ("import marshal", {(1, "pickle")}),
        ("import torch\nw = 1\ntorch.load('w.pt')", {(3, "pickle")}),
        ("import torch\ngetattr(torch, 'load')('w.pt')", {(2, "pickle")}),
        ("import torch\ntorch.jit.load('m.pt')", {(2, "pickle")}),
        # dynamic import
        ("__import__('os')", {(1, "dynamic-import")}),
        ("import importlib", {(1, "dynamic-import")}),
        ("from importlib import import_module", {(1, "dynamic-import")}),
        ("import torch\ntorch.ops.import_module('os')", {(2, "dynamic-import")}),
        ("help('os')", {(1, "dynamic-import")}),
        # code from strings
        ("eval('1')", {(1, "eval-exec")}),
        ("x = 1\nexec(x)", {(2, "eval-exec")}),
        ("compile('1', 'f', 'eval')", {(1, "eval-exec")}),
        ("import typing\ntyping.get_type_hints(f)", {(2, "eval-exec")}),
        ("import torch.fx", {(1, "eval-exec")}),
        ("breakpoint()", {(1, "eval-exec")}),
        # files
        ("open('/etc/passwd')", {(1, "open-call")}),
        ("import io\nio.open('f')", {(1, "open-call"), (2, "open-call")}),
        ("import torch\ntorch.save(x, 'f')", {(2, "open-call")}),
        ("import torch\ntorch.UntypedStorage.from_file('f')", {(2, "open-call")}),
        # reflection
        ("globals()['x'] = 1", {(1, "reflection")}),
        ("def f():\n    return locals()", {(2, "reflection")}),
        ("import torch\nvars(torch)", {(2, "reflection"), (2, "module-escape")}),
        ("import sys\nsys.modules['torch']", {(1, "forbidden-import"), (2, "reflection")}),
        # monkey-patching modules
        ("import torch\ntorch.allclose = lambda *a, **k: True", {(2, "module-patch")}),
        ("import torch\nsetattr(torch, 'allclose', len)", {(2, "module-patch")}),
        ("import torch\ndel torch.testing", {(2, "module-patch")}),
        ("import torch\ntorch.backends.cuda.matmul.allow_tf32 = True", {(2, "module-patch")}),
        ("import torch\ntorch.Tensor.copy_ = None", {(2, "module-patch")}),
        ("from torch.library import Library", {(1, "module-patch")}),
        ("import torch\ntorch.set_default_dtype(torch.float16)", {(2, "module-patch")}),
        ("import torch\ntorch.set_float32_matmul_precision('medium')", {(2, "module-patch")}),
        ("import torch\ntorch.backends.cuda.enable_flash_sdp(False)", {(2, "module-patch")}),
        # modules reached by untracked paths
        ("import torch\ntorch.os.getcwd()", {(2, "module-escape")}),
        ("import torch\ntorch.os.system('id')", {(2, "subprocess")}),
        ("import torch.nn.functional as F\nF.torch.load('w')", {(2, "pickle")}),
        ("import torch\n(torch,)[0].load('w')", {(2, "module-escape")}),
        ("import torch\nhelper(torch)", {(2, "module-escape")}),
        ("def f(m):\n    return m.os.system('id')", {(2, "module-escape")}),
        # naming torch.utils is itself off the allow-list; its cpp_extension is a native build
        ("import torch\n[torch.utils][0].cpp_extension.load('m')", {(2, "native-load"), (2, "torch-allow-list")}),
        # private API of allowed modules
        ("import torch\ntorch._C._set_grad_enabled(True)", {(2, "private-api")}),
        ("from torch import _C", {(1, "private-api")}),
        ("import torch._dynamo", {(1, "private-api")}),
        # dunder escapes
        ("def f():\n    pass\ng = f.__globals__", {(3, "dunder-escape")}),
        ("x = ().__class__.__bases__[0].__subclasses__()", {(1, "dunder-escape")}),
        ("getattr(f, '__globals__')", {(1, "dunder-escape")}),
        ("b = __builtins__", {(1, "dunder-escape")}),
        ("import torch\nd = torch.nn.__dict__", {(2, "dunder-escape")}),
        ("s = __spec__\nl = __loader__", {(1, "dunder-escape"), (2, "dunder-escape")}),
        ("t = type(x).__mro__", {(1, "dunder-escape")}),
        ("g = (i for i in ()).gi_frame.f_builtins['eval']", {(1, "dunder-escape")}),
        ("getattr(tb, 'tb_frame')", {(1, "dunder-escape")}),
        # computed attribute names
        ("def f(x, name):\n    return getattr(x, name)", {(2, "nonliteral-getattr")}),
        ("def f(x, n):\n    setattr(x, n, 1)", {(2, "nonliteral-getattr"), (2, "attribute-assignment")}),
        ("def f(x, a):\n    return getattr(x, *a)", {(2, "nonliteral-getattr")}),
        ("import functools\nfunctools.reduce(getattr, ['a', 'b'], x)", {(2, "nonliteral-getattr")}),
        # imports outside the allow-list
        ("import numpy", {(1, "forbidden-import")}),
        ("import os.path", {(1, "forbidden-import")}),
        ("from .. import secrets", {(1, "forbidden-import")}),
        ("import helper", {(1, "forbidden-import")}),
        ("from torch import *", {(1, "star-import")}),
        ("from os import *", {(1, "forbidden-import"), (1, "star-import")}),
        # source the interpreter reads differently
        ("# -*- coding: latin-1 -*-\nx = 1", {(1, "source-encoding")}),
        ("#!/usr/bin/env python\n# coding: utf-7\nx = 1", {(2, "source-encoding")}),
        ("def broken(:\n    pass", {(1, "syntax-error")}),
        ("# coding: no-such-codec\nx = 1", {(0, "syntax-error")}),
    ],
)
def test_rule_catches(source: str, expected: set[tuple[int, str]]):
    assert hits(source) == expected


ALIAS = "alias-dangerous"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "import os\nf = os.system\nf('id')",
            {(1, "forbidden-import"), (2, "subprocess"), (2, ALIAS), (3, "subprocess")},
        ),
        ("e = eval\ne('1')", {(1, "eval-exec"), (1, ALIAS), (2, "eval-exec")}),
        ("import torch\na, b = 1, torch.load", {(2, "pickle"), (2, ALIAS)}),
        ("import torch\nif (f := torch.load):\n    f('w')", {(2, "pickle"), (2, ALIAS), (3, "pickle")}),
        ("g = getattr\ng(x, 'a')", {(1, ALIAS)}),
        # the use comes before the binding: the table is settled before the visit
        ("import torch\ndef k(p): return L(p)\n\nL = torch.load", {(2, "pickle"), (4, "pickle"), (4, ALIAS)}),
        (
            "import torch\ndef k(p): return U.cpp_extension.load(p)\n\nU = torch.utils",
            {(2, "native-load"), (4, "torch-allow-list"), (4, ALIAS)},
        ),
        ("import torch as T\nM = T\nM.load('w')", {(3, "pickle")}),
    ],
)
def test_aliasing_is_tracked(source: str, expected: set[tuple[int, str]]):
    assert hits(source) == expected


def test_alias_that_never_settles_fails_closed():
    assert (3, "alias-dangerous") in hits("import torch\na = torch\na = a.x")


def test_string_annotations_are_scanned_as_code():
    assert hits("def f(x: \"__import__('os').system('id')\") -> 'List[\"eval\"]':\n    pass") == {
        (1, "dynamic-import"),
        (1, "eval-exec"),
    }


def test_too_deep_to_analyse_fails_closed():
    assert hits("x = " + "+".join(["a"] * 50_000)) == {(0, "syntax-error")}


def test_relative_import_depth_follows_the_file():
    assert hits("from .. import common", rel="pkg/kernel.py") == set()
    assert hits("from ... import common", rel="pkg/kernel.py") == {(1, "forbidden-import")}


def test_declared_sibling_modules_are_importable():
    source = "import helper\nfrom pkg.util import f\nhelper.f()"
    assert hits(source, declared=("helper.py", "pkg/util.py")) == set()


def test_a_sibling_cannot_shadow_stdlib_or_allowed_roots():
    assert local_roots(["os.py", "torch/__init__.py", "helper.py", "pkg/a.py", "manifest.toml"]) == {
        "helper",
        "pkg",
    }


@pytest.mark.parametrize(
    "source",
    [
        "def load(p):\n    return p\nload(1)",
        "import triton.language as tl\nx = tl.load",
        "class K:\n    def __init__(self):\n        self.x = getattr(self, 'y', None)",
        "import torch\nisinstance(1, torch.Tensor)\ntorch.float32",
        "import torch\ndef f(x: 'torch.Tensor') -> 'torch.Tensor':\n    return x",
        "from . import helper\nhelper.run()",
    ],
)
def test_legit_code_is_clean(source: str):
    assert hits(source) == set()


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_never_raises_on_arbitrary_input(data: bytes):
    for line, rule, message in check_source(data, "k.py", frozenset()):
        assert line >= 0 and rule in RULES and message


def test_a_name_bound_to_too_many_objects_fails_closed():
    source = "import torch\n" + "".join(f"x = torch.f{i}\n" for i in range(20))
    assert (18, "alias-dangerous") in hits(source)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # torch/triton modules outside the allow-list, each refused with the family it reaches
        ("import torch\ntorch.utils.collect_env.run('id')", {(2, "subprocess")}),
        ("from torch.utils import cpp_extension", {(1, "native-load")}),
        ("import torch\ntorch.compile(f)", {(2, "native-load")}),
        ("import torch.onnx", {(1, "open-call")}),
        ("import torch\ntorch.profiler.profile()", {(2, "open-call")}),
        ("import torch\ntorch.cuda.jiterator._create_jit_fn('code')", {(2, "eval-exec")}),
        ("import triton.runtime.cache", {(1, "open-call")}),
        ("import triton\ntriton.testing.do_bench(f)", {(2, "subprocess")}),
        ("import triton\nx = triton.knobs.cache", {(2, "module-patch"), (2, ALIAS)}),
        ("import torch\ntorch.distributed.new_group([0, 1])", {(2, "net-import")}),
        ("import torch.distributed as dist\ndist.destroy_process_group()", {(2, "net-import")}),
        ("import torch\ntorch.testing.assert_close(a, b)", {(2, "torch-allow-list")}),
        ("import torch\nm = torch.nn.Linear(2, 2)", {(2, "torch-allow-list")}),
        # matched by every path a name resolves to, not only as written
        ("import torch\ntorch.cuda.change_current_allocator(a)", {(2, "module-patch")}),  # torch.cuda.memory.*
        ("import torch\ntorch.cuda.CUDAPluggableAllocator('x.so', 'a', 'f')", {(2, "native-load")}),
        ("from torch.serialization import load", {(1, "pickle")}),
        ("import torch.nn.functional as F\nF.torch.serialization.load('w')", {(2, "pickle")}),
        ("import torch\nimport torch.nn.functional as F\nF.warnings.warn('x')", {(3, "module-escape")}),
        # type comments are read as the code they name
        ("def f(x):  # type: (__import__('os').system) -> None\n    pass", {(1, "dynamic-import")}),
        ("x = []  # type: eval('1')", {(1, "eval-exec")}),
        ("x = 1\n# type: int", {(2, "syntax-error")}),
        # dunder names the bundle defines
        ("class K:\n    def __eq__(self, other):\n        return True", {(2, "dunder-definition")}),
        ("def __getattr__(name):\n    return name", {(1, "dunder-definition")}),
        ("class __K__:\n    pass", {(1, "dunder-definition")}),
        ("__builtins__ = {}", {(1, "dunder-definition")}),
        ("def f(__class__):\n    pass", {(1, "dunder-definition")}),
        ("import torch as __t__", {(1, "dunder-definition")}),
        ("class K:\n    def __init__(self):\n        self.__hash__ = None", {(3, "dunder-definition")}),
        # attributes of objects the bundle does not own
        ("def k(x, out):\n    type(out).add_ = None", {(2, "attribute-assignment")}),
        ("def k(x, out):\n    out.data = x", {(2, "attribute-assignment")}),
        ("class K:\n    pass\n\n\nK.attr = 1", {(5, "attribute-assignment")}),
        ("def k(x):\n    del x.grad", {(2, "attribute-assignment")}),
        ("def k(x):\n    setattr(x, 'grad', None)", {(2, "attribute-assignment")}),
        ("class K:\n    @classmethod\n    def make(cls):\n        cls.n = 1", {(4, "attribute-assignment")}),
        # format strings that walk attributes
        ("'{0.__class__.__mro__}'.format(x)", {(1, "dunder-escape")}),
        ("t = '{x.__globals__}'\nt.format_map({'x': f})", {(1, "dunder-escape")}),
        ("'{0:{1.__class__}}'.format(1, x)", {(1, "dunder-escape")}),
        ("'{0.gi_frame}'.format(g)", {(1, "dunder-escape")}),
    ],
)
def test_issue_11_holes_are_closed(source: str, expected: set[tuple[int, str]]):
    assert hits(source) == expected


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nx = torch.einsum('ij,jk->ik', a, b)",  # defined in torch.functional: a math module
        "import torch\nwith torch.no_grad():\n    pass",
        "import torch\ns = torch.cuda.current_stream()\nc = torch.cuda.is_current_stream_capturing()",
        "import torch.distributed as dist\ndist.all_reduce(x, op=dist.ReduceOp.SUM, group=g)",
        "import triton.language as tl\nimport triton.language.extra.libdevice as ld",
        "import torch\ny = torch.linalg.vector_norm(x)",
        "class K:\n    def __init__(self):\n        self.x = 1\n\n\nk = K()\nk.y = 2",
        "'{0} {1:.3f} {name!r}'.format(a, b, name=c)",
        "x = 1  # type: int",
    ],
)
def test_what_kernels_need_stays_clean(source: str):
    assert hits(source) == set()
