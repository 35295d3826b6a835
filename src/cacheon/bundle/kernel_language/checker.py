"""One pass over a parsed source after its names are bound: every use judged against the allow-list.

Each expression is resolved once, bottom up (an attribute chain costs one step per link, however
long), and its kinds are memoised for the expression around it.
"""

from __future__ import annotations

import ast
import time

from cacheon.bundle.kernel_language import allowlist, syntax
from cacheon.bundle.kernel_language.names import (
    MODULE_LIKE,
    PYTHON_BUILTINS,
    REFUSED,
    VALUE,
    Binder,
    Kind,
    Scope,
    evaluate,
    imported,
    is_dunder,
    jit_refusal,
    lookup,
    step,
)  # fmt: skip

Hit = tuple[int, str, str]  # (line, rule, message)
DOC = "docs/contributing/scan.md#the-kernel-language"
MAX_NODES = 50_000  # AST nodes per source; a large kernel has a few thousand
MAX_SECONDS = 10.0  # wall-clock per source, a backstop: the work is linear in the nodes


class BudgetExceeded(Exception):
    """The source is past the scanner's work budget: refused, not analysed further."""


def _short(node: ast.AST, limit: int = 80) -> str:
    text = ast.unparse(node) if not isinstance(node, ast.arg) else node.arg
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _pairs(target: ast.expr, value: ast.expr) -> list[tuple[ast.expr, ast.expr]]:
    """(target, value) of each plain binding, unpacking equal-length tuples as the binder does."""
    if (isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List))
            and len(target.elts) == len(value.elts)):
        return [p for t, v in zip(target.elts, value.elts, strict=True) for p in _pairs(t, v)]
    return [(target, value)]


class Checker(ast.NodeVisitor):
    """Collects hits for one module; ``steps`` counts attribute resolutions (linear in the source)."""

    def __init__(self, rel: str, roots: frozenset[str], tree: ast.Module) -> None:
        self.max_level = rel.count("/") + 1  # deepest relative import that stays inside the bundle
        self.roots = roots
        self.binder = Binder(roots)
        self.binder.run(tree)
        self.scope: Scope = self.binder.scopes[id(tree)]
        self.kinds: dict[int, frozenset[Kind]] = {}
        self.module_ok: set[int] = set()  # ids of expressions where a module may stand (`m.attr`, `F = m`)
        self.hits: list[Hit] = []
        self.steps = 0
        self.nodes = 0
        self.deadline = time.monotonic() + MAX_SECONDS
        if self.binder.overflow is not None:
            self._hit(self.binder.overflow, "scan-budget", "aliases that do not settle; cannot analyse")

    def _hit(self, node: ast.AST, rule: str, message: str) -> None:
        self.hits.append((getattr(node, "lineno", 0), rule, message))

    def _refuse(self, node: ast.AST, rule: str, message: str) -> None:
        self._hit(node, rule, f"{message} (allowed surface: {DOC})")

    def visit(self, node: ast.AST) -> None:
        self.nodes += 1
        if self.nodes & 1023 == 0 and time.monotonic() > self.deadline:
            raise BudgetExceeded(f"took over {MAX_SECONDS:g}s to analyse")
        if not syntax.allowed(node):
            self._refuse(node, "not-allowed-syntax", f"{syntax.describe(node)} is not in the kernel language")
            return
        if getattr(node, "type_comment", None):
            self._hit(node, "annotation", "a type comment: annotations are names on the allow-list or absent")
        super().visit(node)

    # names and attributes

    def _result(self, node: ast.expr, kinds: frozenset[Kind]) -> None:
        if self.scope.jit:
            refusal = next((r for k in sorted(kinds) if (r := jit_refusal(k))), None)
            if refusal:
                self._refuse(node, "jit-body", f"{_short(node)}: {refusal}")
                kinds = frozenset({REFUSED})
        if any(k[0] in MODULE_LIKE for k in kinds) and id(node) not in self.module_ok:
            self._hit(node, "module-value", f"module {_short(node)} used as a value (only `module.name` and "
                      "`alias = module` are)")
            kinds = frozenset({REFUSED})
        self.kinds[id(node)] = kinds

    def _binding(self, node: ast.AST, name: str) -> None:
        if is_dunder(name):
            self._hit(node, "dunder-name", f"binds {name}: names of the form __x__ are Python's own")
        elif self.scope.parent is None and name in PYTHON_BUILTINS and name not in allowlist.BUILTINS:
            self._refuse(node, "not-allowed-name", f"binds the builtin name {name} at module level (where a "
                         "read falls back to the builtin)")

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            self._binding(node, node.id)
            return
        kinds = lookup(self.scope, node.id)
        if kinds is None:
            if is_dunder(node.id):
                self._hit(node, "dunder-name", f"{node.id}: names of the form __x__ are Python's own")
            else:
                self._refuse(node, "not-allowed-name", f"{node.id} is not a builtin of the kernel language, "
                             "nor bound by this source")
            kinds = frozenset({REFUSED})
        self._result(node, kinds)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.module_ok.add(id(node.value))
        self.visit(node.value)
        kinds: frozenset[Kind] = frozenset({REFUSED})
        if node.attr.startswith("_"):
            if self.kinds.get(id(node.value)) != frozenset({REFUSED}):  # once per chain
                self._refuse(node, "private-attribute", f"{_short(node)}: attributes starting with _ are private")
        elif not isinstance(node.ctx, ast.Load):
            verb = "deletion of" if isinstance(node.ctx, ast.Del) else "assignment to"
            self._hit(node, "attribute-assignment", f"{verb} {_short(node)}: a kernel sets no attributes")
        else:
            out, refusal = set(), None
            for kind in sorted(self.kinds.get(id(node.value), frozenset({VALUE}))):
                self.steps += 1
                result = step(kind, node.attr, self.scope.jit)
                if isinstance(result, str):
                    refusal = refusal or result
                    out.add(REFUSED)
                else:
                    out.add(result)
            if refusal:
                self._refuse(node, "not-allowed-attribute", f"{_short(node)}: {refusal}")
            kinds = frozenset(out)
        self._result(node, kinds)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self.generic_visit(node)
        held = self.kinds.get(id(node.value), frozenset())
        if not isinstance(node.ctx, ast.Load) and any(k[0] in ("member", "builtin", "function", "jit") for k in held):
            self._hit(node, "attribute-assignment", f"item assignment into {_short(node.value)}")

    # bindings

    def visit_Assign(self, node: ast.Assign | ast.AnnAssign) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if node.value is not None:
                for t, v in _pairs(target, node.value):
                    if isinstance(t, ast.Name) and isinstance(v, (ast.Name, ast.Attribute)):
                        self.module_ok.add(id(v))
            self.visit(target)
        if isinstance(node, ast.AnnAssign):
            self._annotation(node.annotation)
        if node.value is not None:
            self.visit(node.value)

    visit_AnnAssign = visit_Assign

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.ImportFrom) and node.level > self.max_level:
            self._refuse(node, "not-allowed-import", f"relative import of level {node.level} leaves the bundle")
        for bound, subject, kind in imported(node, self.roots):
            if bound == "*":
                self._hit(node, "star-import", f"from {subject} import *: hides what it binds")
                continue
            if kind == REFUSED:
                self._refuse(node, "not-allowed-import", f"{subject} is not importable by a kernel")
            self._binding(node, bound)

    visit_ImportFrom = visit_Import

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self._binding(node, node.name)
        self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> None:
        self._binding(node, node.arg)

    # scopes

    def _enter(self, node: ast.AST) -> Scope:
        outer, self.scope = self.scope, self.binder.scopes[id(node)]
        return outer

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        top = self.scope.parent is None
        for decorator in node.decorator_list:
            kinds = evaluate(decorator.func if isinstance(decorator, ast.Call) else decorator, self.scope, False)
            if not top or not kinds or any(k[0] != "member" or k[1] not in allowlist.DECORATORS for k in kinds):
                where = "" if top else " (decorators are allowed on top-level functions only)"
                self._refuse(decorator, "decorator", f"@{_short(decorator)}: only "
                             f"{', '.join(sorted(allowlist.DECORATORS))}{where}")
            if isinstance(decorator, ast.Call):
                for part in [*decorator.args, *decorator.keywords]:
                    self.visit(part)
        self._binding(node, node.name)
        self._defaults(node.args)
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None:
                self._annotation(arg.annotation)
        self._annotation(node.returns)
        outer = self._enter(node)
        self.visit(node.args)
        for stmt in node.body:
            self.visit(stmt)
        self.scope = outer

    def _defaults(self, args: ast.arguments) -> None:
        for expr in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            self.visit(expr)

    def visit_arguments(self, node: ast.arguments) -> None:
        for arg in [*node.posonlyargs, *node.args, *node.kwonlyargs, node.vararg, node.kwarg]:
            if arg is not None:
                self.visit(arg)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._defaults(node.args)
        outer = self._enter(node)
        self.visit(node.args)
        self.visit(node.body)
        self.scope = outer

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp) -> None:
        self.visit(node.generators[0].iter)
        outer = self._enter(node)
        for i, gen in enumerate(node.generators):
            self.visit(gen.target)
            if i:
                self.visit(gen.iter)
            for cond in gen.ifs:
                self.visit(cond)
        for part in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):
            self.visit(part)
        self.scope = outer

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    # annotations

    def _annotation(self, expr: ast.expr | None) -> None:
        if expr is None:
            return
        refusal = self._annotation_refusal(expr)
        if refusal:
            self._refuse(expr, "annotation", f"annotation {_short(expr)}: {refusal}")

    def _annotation_refusal(self, expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Constant):
            if isinstance(expr.value, str):
                return "a string annotation is code that typing and functools evaluate"
            return None if expr.value is None or expr.value is Ellipsis else "a constant"
        if isinstance(expr, (ast.Name, ast.Attribute)):
            kinds = evaluate(expr, self.scope, False)
            if all(k[0] == "member" or (k[0] == "builtin" and k[1] in allowlist.ANNOTATION_BUILTINS) for k in kinds):
                return None
            return "not an allowed type name"
        if isinstance(expr, ast.Subscript):
            parts = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
            return next((r for p in [expr.value, *parts] if (r := self._annotation_refusal(p))), None)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
            return self._annotation_refusal(expr.left) or self._annotation_refusal(expr.right)
        return "only allowed type names, X[...] and X | Y"
