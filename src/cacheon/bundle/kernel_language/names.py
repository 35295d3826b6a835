"""What each name of a source may hold, resolved statically, scope by scope.

A name holds a set of *kinds*: an allowed module or member (by dotted path), a function of the
bundle (``jit`` when ``@triton.jit``), an allowed builtin, one of the bundle's own modules, or an
untracked value (a parameter, a call's result, a constant). Scopes follow Python's: a name bound
anywhere in a function is local to all of it (no ``global``/``nonlocal`` in the language). Aliases
(``F = torch.nn.functional``) are settled to a fixpoint, a bounded number of passes.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from dataclasses import dataclass, field

from cacheon.bundle.kernel_language import allowlist, syntax

Kind = tuple[str, str]  # (what, path): module/member/function/jit/builtin/local/value/refused
VALUE: Kind = ("value", "")
REFUSED: Kind = ("refused", "")  # already reported where it was named: silent from then on
MODULE_LIKE = frozenset({"module"})  # a bundle module is checked file by file: its names are values
MAX_PASSES = 12  # ordinary code settles in two or three
MAX_KINDS = 16  # what one name may hold; bounds the work per use
#: every builtin name; a bundle may not bind one that the language does not allow (no shadowing)
PYTHON_BUILTINS = frozenset(dir(builtins))
SCOPES = (ast.Module, ast.FunctionDef, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


@dataclass
class Scope:
    node: ast.AST
    parent: Scope | None
    jit: bool = False
    names: dict[str, set[Kind]] = field(default_factory=dict)

    def bind(self, name: str, kinds: set[Kind] | frozenset[Kind]) -> bool:
        """Add what ``name`` may hold here; True if that grew."""
        held = self.names.setdefault(name, set())
        if kinds <= held:
            return False
        held.update(kinds)
        return True

    def function_scope(self) -> Scope:
        """Where a walrus binds: the nearest scope that is not a comprehension."""
        scope = self
        while isinstance(scope.node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)) and scope.parent:
            scope = scope.parent
        return scope


def lookup(scope: Scope, name: str) -> frozenset[Kind] | None:
    """What ``name`` holds where it is read; None when it is neither bound nor an allowed builtin."""
    current: Scope | None = scope
    while current is not None:
        if name in current.names:
            return frozenset(current.names[name])
        current = current.parent
    return frozenset({("builtin", name)}) if name in allowlist.BUILTINS else None


def step(kind: Kind, attr: str, jit: bool) -> Kind | str:
    """What ``<kind>.attr`` holds, or why it is refused."""
    what, path = kind
    dotted = f"{path}.{attr}"
    if what == "module":
        if dotted in allowlist.MODULES:
            return ("module", dotted)
        if attr in allowlist.MEMBERS.get(path, ()):
            return ("member", dotted)
        return f"{dotted} is not on the kernel allow-list"
    if what == "member" and attr in allowlist.MEMBERS.get(path, ()):
        return ("member", dotted)
    if what in ("member", "value"):
        allowed = allowlist.JIT_ATTRS if jit else allowlist.VALUE_ATTRS
        if attr in allowed:
            return VALUE
        where = "a value inside @triton.jit" if jit else "a tensor or other untracked value"
        return f".{attr} is not an attribute of {where} on the kernel allow-list"
    if what == "local":
        return VALUE
    if what == "refused":
        return REFUSED
    return f".{attr} of {what} {path}: a bundle function or builtin has no attributes in the kernel language"


def jit_refusal(kind: Kind) -> str | None:
    """Why ``kind`` may not be named inside a ``@triton.jit`` body, or None."""
    what, path = kind
    if what == "module" and (path == "triton" or path.startswith("triton.language")):
        return None
    if what == "member" and path.startswith("triton.language."):
        return None
    if what in ("value", "jit", "refused") or (what == "builtin" and path in allowlist.JIT_BUILTINS):
        return None
    return f"{path or what} inside @triton.jit: only triton.language, the bundle's jit functions and constants"


def imported(node: ast.Import | ast.ImportFrom, roots: frozenset[str]) -> Iterator[tuple[str, str, Kind]]:
    """(bound name, what is imported, the kind bound) for each alias; the kind is REFUSED when the
    import is not allowed (the checker reports it)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            top = alias.name.split(".")[0]
            if top in roots:
                yield alias.asname or top, alias.name, ("local", alias.asname or top)
            elif alias.name not in allowlist.MODULES:
                yield alias.asname or top, alias.name, REFUSED
            else:
                yield alias.asname or top, alias.name, ("module", alias.name if alias.asname else top)
        return
    module = node.module or ""
    local = node.level > 0 or module.split(".")[0] in roots
    for alias in node.names:
        bound, subject = alias.asname or alias.name, f"{module}.{alias.name}".lstrip(".")
        if alias.name == "*":
            yield "*", module, REFUSED
        elif local:
            yield bound, subject, ("local", bound)
        elif subject in allowlist.MODULES:
            yield bound, subject, ("module", subject)
        elif alias.name in allowlist.MEMBERS.get(module, ()) and module in allowlist.MODULES:
            yield bound, subject, ("member", subject)
        else:
            yield bound, subject, REFUSED


def decorators(node: ast.FunctionDef, scope: Scope) -> list[frozenset[Kind]]:
    """What each decorator (or the callee of a decorator call) resolves to."""
    return [evaluate(d.func if isinstance(d, ast.Call) else d, scope, False) for d in node.decorator_list]


def evaluate(node: ast.expr, scope: Scope, jit: bool) -> frozenset[Kind]:
    """The kinds a name or attribute chain holds; anything else is an untracked value."""
    if isinstance(node, ast.Name):
        return lookup(scope, node.id) or frozenset({REFUSED})
    if isinstance(node, ast.Attribute):
        if node.attr.startswith("_"):
            return frozenset({REFUSED})
        out = set()
        for kind in evaluate(node.value, scope, jit):
            result = step(kind, node.attr, jit)
            out.add(REFUSED if isinstance(result, str) else result)
        return frozenset(out)
    return frozenset({VALUE})


class Binder:
    """Builds the scopes of a module and binds every name, then settles the aliases."""

    def __init__(self, roots: frozenset[str]) -> None:
        self.roots = roots
        self.scopes: dict[int, Scope] = {}  # id(scope node) -> its scope
        self.aliases: list[tuple[Scope, str, ast.expr]] = []
        self.overflow: ast.AST | None = None

    def run(self, tree: ast.Module) -> None:
        root = Scope(tree, None)
        self.scopes[id(tree)] = root
        self._body(tree, root)
        self._settle()

    def _body(self, node: ast.AST, scope: Scope) -> None:
        for child in ast.iter_child_nodes(node):
            self._node(child, scope)

    def _new(self, node: ast.AST, parent: Scope, jit: bool = False) -> Scope:
        scope = Scope(node, parent, jit or parent.jit)
        self.scopes[id(node)] = scope
        return scope

    def _node(self, node: ast.AST, scope: Scope) -> None:
        if not syntax.allowed(node):
            return  # refused where it stands; it binds nothing
        if isinstance(node, ast.FunctionDef):
            for expr in [*node.decorator_list, *node.args.defaults, *(d for d in node.args.kw_defaults if d)]:
                self._node(expr, scope)
            is_jit = any(("member", allowlist.JIT) in kinds for kinds in decorators(node, scope))
            scope.bind(node.name, {("jit" if is_jit else "function", node.name)})
            inner = self._new(node, scope, is_jit)
            self._arguments(node.args, inner)
            for stmt in node.body:
                self._node(stmt, inner)
            return
        if isinstance(node, ast.Lambda):
            for expr in [*node.args.defaults, *(d for d in node.args.kw_defaults if d)]:
                self._node(expr, scope)
            inner = self._new(node, scope)
            self._arguments(node.args, inner)
            self._node(node.body, inner)
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            self._node(node.generators[0].iter, scope)  # evaluated in the enclosing scope
            inner = self._new(node, scope)
            for i, gen in enumerate(node.generators):
                self._targets(gen.target, inner)
                if i:
                    self._node(gen.iter, inner)
                for cond in gen.ifs:
                    self._node(cond, inner)
            for part in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):
                self._node(part, inner)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for bound, _, kind in imported(node, self.roots):
                if bound != "*":
                    scope.bind(bound, {kind})
            return
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._assign(target, node.value, scope)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self._assign(node.target, node.value, scope)
        elif isinstance(node, ast.NamedExpr):
            self._assign(node.target, node.value, scope.function_scope())
            self._node(node.value, scope)
            return
        elif isinstance(node, (ast.AugAssign, ast.For)):
            self._targets(node.target, scope)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            self._targets(node.optional_vars, scope)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            scope.bind(node.name, {VALUE})
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            scope.names.setdefault(node.id, set())  # local here (a Del, or a store bound above)
        self._body(node, scope)

    def _arguments(self, args: ast.arguments, scope: Scope) -> None:
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None:
                scope.bind(arg.arg, {VALUE})

    def _targets(self, target: ast.expr, scope: Scope) -> None:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name) and not isinstance(sub.ctx, ast.Load):
                scope.bind(sub.id, {VALUE})

    def _assign(self, target: ast.expr, value: ast.expr, scope: Scope) -> None:
        if isinstance(target, ast.Name):
            scope.names.setdefault(target.id, set())
            if isinstance(value, (ast.Name, ast.Attribute)):
                self.aliases.append((scope, target.id, value))
            else:
                scope.bind(target.id, {VALUE})
        elif (isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List))
              and len(target.elts) == len(value.elts) and not any(isinstance(e, ast.Starred) for e in target.elts)):
            for t, v in zip(target.elts, value.elts, strict=True):
                self._assign(t, v, scope)
        else:
            self._targets(target, scope)

    def _settle(self) -> None:
        """Bind each alias to what its value holds, until nothing grows (or fail closed); a name
        left holding nothing (``a = b; b = a``) is an untracked value."""
        self._fixpoint()
        for scope in self.scopes.values():
            for held in scope.names.values():
                held.update(() if held else (VALUE,))

    def _fixpoint(self) -> None:
        for _ in range(MAX_PASSES):
            grew = False
            for scope, name, value in self.aliases:
                kinds = evaluate(value, scope, scope.jit)
                if scope.bind(name, kinds):
                    grew = True
                    if len(scope.names[name]) > MAX_KINDS:
                        self.overflow = value
                        return
            if not grew:
                return
        self.overflow = self.aliases[0][2] if self.aliases else None
