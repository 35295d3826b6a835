"""Static admission of a bundle's Python: the kernel language, a default-deny subset of Python.

This scan guards serving, not only ``verify``: ``runtime/activation`` loads an admitted bundle
inside the SGLang process with no sandbox. So nothing is refused for being on a list of bad
things; everything is refused unless it is on the kernel language's allow-lists
(``kernel_language/allowlist.py``): its syntax, its modules and their members, its builtins, the
attributes a tensor or other value may have read, and ``triton.language`` inside ``@triton.jit``.
Names are resolved statically, scope by scope; nothing of the bundle is imported or run. The work
is bounded (source size, AST nodes, time) and a source past it is refused, not analysed.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections.abc import Iterable
from pathlib import PurePosixPath

from cacheon.bundle.kernel_language import allowlist
from cacheon.bundle.kernel_language.checker import DOC, MAX_NODES, BudgetExceeded, Checker, Hit

__all__ = ["RULES", "Hit", "check_source", "local_roots", "top_level_functions"]

MAX_SOURCE_BYTES = 256 * 1024  # a large kernel is a few tens of KiB
#: modules a bundle may import (its own declared modules too)
IMPORTABLE_ROOTS = frozenset(m.split(".")[0] for m in allowlist.MODULES)

RULES: dict[str, str] = {
    "not-allowed-syntax": "a construct outside the kernel language: class, match, async, yield, global/nonlocal, "
    "except*, type alias, ...",
    "not-allowed-import": "an import of a module or member that is not on the allow-list, or a relative import "
    "above the bundle root",
    "star-import": "`from M import *` (it hides what it binds)",
    "not-allowed-name": "a name that is neither bound by the source nor an allowed builtin (getattr, type, vars, "
    "open, eval, super, __import__, ...), or a module-level binding of a builtin's name",
    "not-allowed-attribute": "an attribute not on the allow-list of what it is read from: a module's members, "
    "or the attributes of a tensor and the other values a kernel holds (`.numpy`, `.storage`, `.register_hook`, "
    "`.grad_fn`, `.random_` are not)",
    "private-attribute": "an attribute whose name starts with `_` (`torch._C`, `x.__class__`, `e.__traceback__`)",
    "dunder-name": "a name of the form `__x__`, read (`__builtins__`, `__loader__`) or bound (`__getattr__`)",
    "attribute-assignment": "assigning or deleting an attribute (a kernel sets none), or an item of a module member",
    "module-value": "a module used as a value (`f(torch)`, `(torch,)[0]`): only `module.name` and `alias = module`",
    "decorator": "a decorator other than triton.jit, triton.autotune or triton.heuristics on a top-level function",
    "annotation": "an annotation that is not an allowed type name, `X[...]` or `X | Y` (a string, a call), "
    "or a type comment",
    "jit-body": "inside @triton.jit, a name other than triton.language, the bundle's jit functions, its module "
    "constants, the kernel's parameters and locals and range/min/max/abs/len/int/float/bool",
    "scan-budget": f"a source past the scanner's work budget ({MAX_SOURCE_BYTES // 1024} KiB, {MAX_NODES} AST "
    "nodes, a time limit) or whose aliases do not settle: refused, not analysed",
    "source-encoding": "a coding cookie other than UTF-8 (what Python runs differs from what reviewers read)",
    "syntax-error": "the source does not parse, or is too deeply nested to analyse",
}
_TOO_DEEP: Hit = (0, "syntax-error", "nested too deeply to analyse")


def local_roots(declared: Iterable[str]) -> frozenset[str]:
    """Top-level names of the bundle's declared modules that an absolute import may use.

    Names of stdlib or allow-listed modules are left out: the host's module would win.
    """
    roots = set()
    for path in declared:
        parts = PurePosixPath(path).parts
        if parts and parts[-1].endswith(".py"):
            top = parts[0].removesuffix(".py")
            if top.isidentifier() and top not in sys.stdlib_module_names and top not in IMPORTABLE_ROOTS:
                roots.add(top)
    return frozenset(roots)


def check_source(data: bytes, rel: str, roots: frozenset[str]) -> list[Hit]:
    """Every violation of the kernel language in one source; ``rel`` is its bundle-relative path.

    Parses the bytes, so a coding cookie is honoured exactly as the interpreter would honour it.
    """
    if len(data) > MAX_SOURCE_BYTES:
        return [(0, "scan-budget", f"{len(data)} bytes: a kernel source is at most {MAX_SOURCE_BYTES} "
                 f"(see {DOC})")]
    try:
        encoding, cookie_lines = tokenize.detect_encoding(io.BytesIO(data).readline)
        tree = ast.parse(data, filename=rel, type_comments=True)
    except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes, on some 3.11 releases
        return [(getattr(exc, "lineno", None) or 0, "syntax-error", str(getattr(exc, "msg", exc)))]
    except (RecursionError, MemoryError):
        return [_TOO_DEEP]
    nodes = sum(1 for _ in zip(range(MAX_NODES + 1), ast.walk(tree), strict=False))
    if nodes > MAX_NODES:
        return [(0, "scan-budget", f"over {MAX_NODES} AST nodes: refused, not analysed (see {DOC})")]
    try:
        checker = Checker(rel, roots, tree)
        checker.visit(tree)
    except RecursionError:
        return [_TOO_DEEP]
    except BudgetExceeded as exc:
        return [(0, "scan-budget", f"{exc}: refused, not analysed")]
    hits = checker.hits
    if encoding not in ("utf-8", "utf-8-sig"):
        hits.append((len(cookie_lines), "source-encoding", f"declares coding {encoding}"))
    return hits


def top_level_functions(data: bytes) -> frozenset[str] | None:
    """Names of the functions a source defines at module level; None if it does not parse."""
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return frozenset(n.name for n in tree.body if isinstance(n, ast.FunctionDef))
