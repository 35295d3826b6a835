"""The kernel language's syntax: an allow-list of AST node types.

Anything else (classes, ``match``, ``async``, generators, ``global``/``nonlocal``, ``except*``,
type aliases, ...) is refused where it appears, and its subtree is not analysed further.
"""

from __future__ import annotations

import ast

_STATEMENTS = (
    ast.Module, ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.While, ast.If, ast.With,
    ast.Return, ast.Pass, ast.Break, ast.Continue, ast.Raise, ast.Assert, ast.Try, ast.ExceptHandler,
    ast.Import, ast.ImportFrom, ast.FunctionDef, ast.Delete,
)  # fmt: skip
_EXPRESSIONS = (
    ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.IfExp, ast.Dict, ast.Set, ast.List, ast.Tuple, ast.ListComp,
    ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Compare, ast.Call, ast.Constant, ast.Attribute,
    ast.Subscript, ast.Slice, ast.Starred, ast.Name, ast.JoinedStr, ast.FormattedValue, ast.NamedExpr,
    ast.Lambda,
)  # fmt: skip
_PARTS = (
    ast.comprehension, ast.arguments, ast.arg, ast.keyword, ast.alias, ast.withitem, ast.expr_context,
    ast.operator, ast.boolop, ast.unaryop, ast.cmpop,
)  # fmt: skip
ALLOWED_NODES: tuple[type[ast.AST], ...] = _STATEMENTS + _EXPRESSIONS + _PARTS


def allowed(node: ast.AST) -> bool:
    return isinstance(node, ALLOWED_NODES)


def describe(node: ast.AST) -> str:
    """What a refused node is, in the words of the language reference."""
    names = {
        ast.ClassDef: "class definition", ast.AsyncFunctionDef: "async def", ast.Await: "await",
        ast.AsyncFor: "async for", ast.AsyncWith: "async with", ast.Yield: "yield", ast.YieldFrom: "yield from",
        ast.Global: "global", ast.Nonlocal: "nonlocal", ast.Match: "match statement",
    }  # fmt: skip
    for kind, text in names.items():
        if isinstance(node, kind):
            return text
    return type(node).__name__
