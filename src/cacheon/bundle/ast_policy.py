"""AST admission policy: what a bundle's Python source may name.

Defense in depth, not trust: the real guard is the isolated child process that loads a bundle.
This policy rejects sources that *name* a way out (network, processes, native code, pickles,
dynamic code, files, reflection, monkey-patching) before any of their code runs. Imports are an
allow-list, and inside torch and triton so are their modules (``surface``); the dangerous
families get their own rule ids so a finding says why, and a name is matched by every path it
resolves to (``torch.load`` is also ``torch.serialization.load``).

Also refused: names the bundle defines with dunder names, assignment to attributes of objects the
bundle does not own, format strings that walk attributes, and whatever a type comment names.

Values are tracked through one module-wide symbol table (imports, plain assignments, literal
``getattr``), settled to a fixpoint so the order of definitions does not matter. Values that
travel through calls or containers are not tracked; to get a dangerous object there a source
must first name it, and the naming is itself a finding.
"""

from __future__ import annotations

import ast
import io
import string
import sys
import tokenize
from collections.abc import Iterable, Iterator
from fnmatch import fnmatchcase
from functools import lru_cache
from pathlib import PurePosixPath

from cacheon.bundle import surface

Hit = tuple[int, str, str]  # (line, rule, message)

LOCAL = "<bundle>"  # root of the qualified names of the bundle's own modules
ALLOWED_ROOTS = frozenset({"__future__", "dataclasses", "functools", "math", "torch", "triton", "typing"})

# Qualified-name patterns (fnmatch, matched against every dotted prefix) for each named rule.
FAMILIES: dict[str, tuple[str, ...]] = {
    "net-import": (
        "socket", "ssl", "asyncio", "urllib", "urllib3", "http", "httpx", "requests", "aiohttp",
        "ftplib", "smtplib", "poplib", "imaplib", "telnetlib", "xmlrpc", "socketserver", "websocket",
        "websockets", "zmq", "grpc", "paramiko", "torch.hub", "torch.distributed.rpc", "torch.utils.model_zoo",
        "torch.distributed.TCPStore", "torch.distributed.init_process_group",
    ),
    "subprocess": (
        "subprocess", "_posixsubprocess", "pty", "multiprocessing", "concurrent", "posix", "nt",
        "pexpect", "sh", "os.system", "os.popen", "os.exec*", "os.spawn*", "os.posix_spawn*",
        "os.fork*", "os.kill*", "os.startfile", "torch.multiprocessing", "torch.utils.data",
        "torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launch*",
        "torch.utils.collect_env", "triton.testing",
    ),
    "ctypes": ("ctypes", "_ctypes", "cffi", "mmap"),
    "native-load": (
        "torch.utils.cpp_extension", "torch.ops.load_library", "torch.classes.load_library",
        "triton.compile", "triton.compiler", "triton.runtime.build", "triton.runtime.driver", "triton.backends",
        "triton.tools", "torch.cuda.memory", "torch.compile", "torch.compiler", "torch.ops", "torch.classes",
        "torch.utils.benchmark", "torch.nativert",
    ),
    "pickle": (
        "pickle", "_pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle", "joblib", "copyreg",
        "torch.load", "torch.serialization", "torch.package", "torch.jit.load", "torch.export.load",
        "torch.utils.show_pickle",
    ),
    "dynamic-import": ("importlib", "imp", "pkgutil", "zipimport", "runpy", "builtins.__import__",
                       "builtins.help", "torch.ops.import_module"),
    "eval-exec": (
        "builtins.eval", "builtins.exec", "builtins.compile", "code", "codeop", "typing.get_type_hints",
        "typing.ForwardRef", "typing.evaluate_forward_ref", "builtins.breakpoint", "torch.jit.CompilationUnit",
        "torch.fx", "torch.jit", "torch.export", "torch.cuda.jiterator",
    ),
    "open-call": (
        "builtins.open", "io", "_io", "os.open", "os.fdopen", "codecs", "pathlib", "shutil", "tempfile",
        "fileinput", "glob", "torch.save", "torch.from_file", "torch.*Storage.from_file",
        "torch.jit.save", "torch.export.save", "torch.onnx", "torch.profiler", "torch.utils.tensorboard",
        "torch.utils.hipify", "torch.utils.file_baton", "torch.utils.model_dump", "torch.utils.viz", "torch.cuda.gds",
        "triton.runtime.cache",
    ),
    "reflection": ("builtins.globals", "builtins.locals", "builtins.vars", "sys.modules", "sys._getframe",
                   "inspect", "gc"),
    "module-patch": (
        "torch.library", "torch.overrides", "torch.set_*", "torch.use_deterministic_algorithms",
        "torch.manual_seed", "torch.seed", "torch.random", "torch.cuda.manual_seed*", "torch.cuda.set_*",
        "torch.backends.*.enable_*", "torch.cuda.memory.change_current_allocator",
        "torch.nn.modules.module.register_module_*", "torch.backends", "torch.cuda.random", "torch.cuda.tunable",
        "torch.utils.deterministic", "torch.utils.backend_registration", "triton.knobs",
    ),
}  # fmt: skip

RULES: dict[str, str] = {
    "forbidden-import": "import of a module outside the allow-list, or relative import above the bundle root",
    "star-import": "`from M import *` of a module outside the bundle (hides what it binds)",
    "net-import": "networking: socket, ssl, http, urllib, requests, asyncio, zmq, torch.hub, torch RPC",
    "subprocess": "processes: subprocess, os.system/popen/exec*/spawn*/fork, pty, multiprocessing",
    "ctypes": "foreign memory and calls: ctypes, cffi, mmap",
    "native-load": "native code: torch.utils.cpp_extension, torch.ops.load_library, triton.compile",
    "pickle": "deserialisation: pickle, marshal, shelve, dill, torch.load, torch.jit.load",
    "dynamic-import": "dynamic import: importlib, __import__, imp, pkgutil, runpy, zipimport",
    "eval-exec": "code from strings: eval, exec, compile, typing.get_type_hints/ForwardRef",
    "open-call": "file access: open, io, os.open, pathlib, shutil, tempfile, torch.save/from_file",
    "reflection": "namespace reflection: globals(), locals(), vars(), sys.modules, inspect, gc",
    "module-patch": "changes process-wide state: assignment/setattr/delattr on a module, torch.library, "
    "torch.overrides, torch.set_*, seeds, backend switches",
    "module-escape": "reaches a module by an untracked path: torch.os, a module used as a plain value, "
    "`.os`/`.sys`/`.torch`/... on an untracked object",
    "private-api": "a private (`_name`) attribute of an imported module, e.g. torch._C",
    "dunder-escape": "introspection: a dunder outside a small safe set (__globals__, __subclasses__, "
    "__builtins__, __dict__, __class__, __mro__, ...) or a frame attribute (f_globals, gi_frame, tb_frame)",
    "nonliteral-getattr": "getattr/setattr/delattr with a computed name, or used as a plain value",
    "alias-dangerous": "a name bound to a forbidden object by assignment (`f = os.system`, `e = eval`)",
    "source-encoding": "a coding cookie other than UTF-8 (what Python runs differs from what reviewers read)",
    "syntax-error": "the source does not parse (type comments included), or is too deeply nested to analyse",
    "torch-allow-list": "a torch/triton module or member outside the kernel allow-list (torch, torch.nn.functional, "
    "torch.linalg/special/fft, torch.cuda, the collective calls of torch.distributed, triton, triton.language)",
    "dunder-definition": "a dunder name defined by the bundle (function, class, attribute, assignment, argument); "
    "only __init__, __post_init__, __all__ and __slots__ may be defined",
    "attribute-assignment": "assignment to an attribute of an object the bundle does not own (a parameter, "
    "type(x), a class, anything but self in a method of a bundle class or an instance it made)",
}

_PATTERNS = tuple((pattern, rule) for rule, patterns in FAMILIES.items() for pattern in patterns)
_EXACT = {p: rule for p, rule in _PATTERNS if "*" not in p}
_GLOBS = tuple((p, rule) for p, rule in _PATTERNS if "*" in p)
_WATCHED = frozenset(p.split(".")[0] for p, _ in _PATTERNS) - ALLOWED_ROOTS
_ANCHORS = _WATCHED | ALLOWED_ROOTS
_REFLECTIVE = frozenset({"builtins.getattr", "builtins.setattr", "builtins.delattr"})
_BUILTINS = frozenset(p.split(".")[1] for p, _ in _PATTERNS if p.startswith("builtins.")) | {
    q.split(".")[1] for q in _REFLECTIVE
}
# Attribute names that lead somewhere forbidden whatever the object they are read from.
_UNTRACKED_ATTRS = {
    **dict.fromkeys(("os", "sys", "builtins", "subprocess", "importlib", "ctypes", "pickle", "marshal",
                     "socket", "posix", "torch"), "module-escape"),
    **dict.fromkeys(("cpp_extension", "load_library", "load_binary", "CUDAPluggableAllocator"), "native-load"),
    **dict.fromkeys(("get_type_hints", "ForwardRef", "CompilationUnit"), "eval-exec"),
    "hub": "net-import", "serialization": "pickle", "multiprocessing": "subprocess", "from_file": "open-call",
    "import_module": "dynamic-import",
}  # fmt: skip
# Frame and code attributes: a way to globals and builtins without a dunder.
_FRAME_ATTRS = frozenset({
    "f_back", "f_builtins", "f_code", "f_globals", "f_locals", "f_trace", "tb_frame", "tb_next", "gi_frame",
    "gi_code", "gi_yieldfrom", "cr_frame", "cr_code", "cr_await", "ag_frame", "ag_code",
})  # fmt: skip
_SAFE_DUNDERS = frozenset({
    "__all__", "__call__", "__contains__", "__debug__", "__doc__", "__enter__", "__eq__", "__exit__",
    "__getitem__", "__hash__", "__init__", "__iter__", "__len__", "__module__", "__name__", "__next__",
    "__post_init__", "__qualname__", "__repr__", "__setitem__", "__slots__", "__str__", "__version__",
})  # fmt: skip
#: dunder names a bundle may define; any other (``__eq__``, ``__getattr__``, ``__del__``...) hooks a
#: protocol that code outside the bundle may run implicitly
_DEFINABLE_DUNDERS = frozenset({"__all__", "__init__", "__post_init__", "__slots__"})
_TOO_DEEP: Hit = (0, "syntax-error", "nested too deeply to analyse")
_IMPORTABLE = ALLOWED_ROOTS | {LOCAL}
_MAX_ALIAS_PASSES = 8  # ordinary code settles in two or three
_MAX_BINDINGS = 16  # objects one name may hold; bounds the work per use


def local_roots(declared: Iterable[str]) -> frozenset[str]:
    """Top-level names of the bundle's declared modules that an absolute import may use.

    Names of stdlib or allow-listed modules are left out: the host's module would win.
    """
    roots = set()
    for path in declared:
        parts = PurePosixPath(path).parts
        if parts and parts[-1].endswith(".py"):
            top = parts[0].removesuffix(".py")
            if top.isidentifier() and top not in sys.stdlib_module_names and top not in ALLOWED_ROOTS:
                roots.add(top)
    return frozenset(roots)


def check_source(data: bytes, rel: str, roots: frozenset[str]) -> list[Hit]:
    """Every policy violation in one Python source file; ``rel`` is its bundle-relative path.

    Parses the bytes, so a coding cookie is honoured exactly as the interpreter would honour it.
    """
    try:
        encoding, cookie_lines = tokenize.detect_encoding(io.BytesIO(data).readline)
        tree = _parse(data, rel)
    except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes, on some 3.11 releases
        return [(getattr(exc, "lineno", None) or 0, "syntax-error", str(getattr(exc, "msg", exc)))]
    except (RecursionError, MemoryError):
        return [_TOO_DEEP]
    checker = _Checker(rel, roots)
    try:
        checker.run(tree)
    except RecursionError:
        return [_TOO_DEEP]
    if encoding not in ("utf-8", "utf-8-sig"):
        checker.hits.append((len(cookie_lines), "source-encoding", f"declares coding {encoding}"))
    return checker.hits


def _parse(data: bytes, rel: str) -> ast.Module:
    """Parse with type comments (they are checked as code); one Python would not place is an error."""
    try:
        return ast.parse(data, filename=rel, type_comments=True)
    except SyntaxError as exc:
        ast.parse(data, filename=rel)  # a plain syntax error is reported as such
        exc.msg = f"{exc.msg} (a type comment in a place Python does not allow one)"
        raise


def top_level_functions(data: bytes) -> frozenset[str] | None:
    """Names of the functions a source defines at module level; None if it does not parse."""
    try:
        tree = ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return frozenset(n.name for n in tree.body if isinstance(n, ast.FunctionDef))


def _format_fields(text: str, depth: int = 0) -> Iterator[str]:
    """The replacement fields of ``text`` read as a str.format template (nested specs included)."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError:
        return
    for _literal, name, spec, _conversion in parsed:
        if name:
            yield name
        if spec and depth < 2:
            yield from _format_fields(spec, depth + 1)


def _format_walks(text: str) -> list[str]:
    """Introspective attributes a format template would read (``{0.__class__}``, ``{x.f_globals}``)."""
    if "{" not in text:
        return []
    walks = []
    for name in _format_fields(text):
        for attr in name.split(".")[1:]:
            attr = attr.split("[")[0]
            if _introspective(attr) or _is_dunder(attr):
                walks.append(attr)
    return walks


@lru_cache(maxsize=8192)
def classify(qname: str) -> tuple[str, str] | None:
    """The rule a qualified name (``torch.load``, ``builtins.eval``) breaks and a short why, or None."""
    parts = qname.split(".")
    for i, segment in enumerate(parts):
        if i == 0 or segment in _ANCHORS:
            suffix = ".".join(parts[i:])
            rule = _family(suffix)
            if rule:
                return rule, suffix if i == 0 else f"{suffix} via {qname}"
    for segment in parts[1:]:
        if segment in _WATCHED:
            return "module-escape", f"module {segment} via {qname}"
    if parts[0] != LOCAL:
        for segment in parts[1:]:
            if segment.startswith("_") and not _is_dunder(segment):
                return "private-api", f"private {segment} in {qname}"
    return _surface(qname)


def _surface(qname: str) -> tuple[str, str] | None:
    """torch/triton names: the families matched against every path, then the allow-list."""
    resolved = surface.resolve(qname)
    if resolved is None:
        return None
    if resolved.escape is not None:
        return "module-escape", f"module {resolved.escape} via {qname}"
    for path in (resolved.written, *resolved.defined):
        rule = _family(path)
        if rule:
            return rule, qname if path == qname else f"{qname} is {path}"
    refused = surface.refused_member(resolved.written)
    if refused is None:
        return None
    module, member = refused
    rule = surface.REFUSED_MEMBER_RULE.get(module, "torch-allow-list")
    return rule, f"{module}.{member} is not on the kernel allow-list"


def _family(qname: str) -> str | None:
    """The rule of the longest dotted prefix of ``qname`` that a family names."""
    parts = qname.split(".")
    for k in range(len(parts), 0, -1):
        prefix = ".".join(parts[:k])
        rule = _EXACT.get(prefix) or next((r for p, r in _GLOBS if fnmatchcase(prefix, p)), None)
        if rule:
            return rule
    return None


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _unsafe_dunder(name: str) -> bool:
    return _is_dunder(name) and name not in _SAFE_DUNDERS


def _introspective(attr: str) -> bool:
    return _unsafe_dunder(attr) or attr in _FRAME_ATTRS


def _alias_pairs(node: ast.AST) -> Iterator[tuple[ast.Name, ast.expr]]:
    """(name, value) for each plain binding a statement makes, unpacking equal-length tuples."""
    if isinstance(node, ast.Assign):
        targets, value = node.targets, node.value
    elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
        targets, value = [node.target], node.value
    else:
        return
    for target in targets:
        yield from _zip_targets(target, value)


def _zip_targets(target: ast.expr, value: ast.expr) -> Iterator[tuple[ast.Name, ast.expr]]:
    if isinstance(target, ast.Name):
        yield target, value
    elif (
        isinstance(target, (ast.Tuple, ast.List))
        and isinstance(value, (ast.Tuple, ast.List))
        and len(target.elts) == len(value.elts)
    ):
        for t, v in zip(target.elts, value.elts, strict=True):
            yield from _zip_targets(t, v)


class _Checker(ast.NodeVisitor):
    """One pass over a parsed module after its names are bound; collects hits."""

    def __init__(self, rel: str, roots: frozenset[str]) -> None:
        self.max_level = rel.count("/") + 1  # deepest relative import that stays inside the bundle
        self.roots = roots
        self.names: dict[str, frozenset[str]] = {}  # name -> qualified names it may hold
        self.modules: set[str] = set()  # names bound by `import` statements: certainly modules
        self.saturated: set[str] = set()  # names that hit _MAX_BINDINGS
        self.anchored: set[int] = set()  # ids of nodes where naming a module/getattr is fine
        self.hits: list[Hit] = []
        self.classes: set[str] = set()  # classes the bundle defines
        self.methods: set[int] = set()  # ids of functions defined directly in a bundle class body
        self.owned: list[set[str]] = []  # per scope: names holding objects the bundle made (self, instances)

    def run(self, tree: ast.Module) -> None:
        pairs: list[tuple[ast.Name, ast.expr]] = []
        for node in ast.walk(tree):
            pairs.extend(_alias_pairs(node))
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for _, bound, qname in self._imported(node):
                    if bound is not None:
                        self._bind(node, bound, frozenset({qname}))
                        if isinstance(node, ast.Import):
                            self.modules.add(bound)
        self._settle_aliases(pairs)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                self.classes.add(node.name)
                self.methods.update(id(f) for f in node.body if isinstance(f, ast.FunctionDef) and not any(
                    isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod") for d in f.decorator_list))
        self.owned.append(self._instances(tree.body))
        self.visit(tree)

    def _instances(self, body: list[ast.stmt]) -> set[str]:
        """Names bound in ``body`` to a call of a bundle class: objects the bundle made."""
        names: set[str] = set()
        for stmt in body:
            for node in ast.walk(stmt):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                    func = node.value.func
                    if isinstance(func, ast.Name) and func.id in self.classes:
                        names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        return names

    def _owns(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Name) and any(node.id in scope for scope in self.owned)

    def _defines(self, node: ast.AST, name: str | None, what: str) -> None:
        if name and _is_dunder(name) and name not in _DEFINABLE_DUNDERS:
            self._hit(node, "dunder-definition", f"{what} {name}")

    def visit(self, node: ast.AST) -> None:
        comment = getattr(node, "type_comment", None)
        if isinstance(comment, str):
            self._type_comment(node, comment)
        super().visit(node)

    def _type_comment(self, node: ast.AST, comment: str) -> None:
        """A type comment is checked as the code it names (a function's: its argument and return types)."""
        mode = "func_type" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else "eval"
        try:
            parsed = ast.parse(comment, mode=mode)
        except (SyntaxError, ValueError):
            return  # Python never evaluates it, and it names nothing that parses
        if isinstance(parsed, ast.FunctionType):
            exprs = [*parsed.argtypes, parsed.returns]
        elif isinstance(parsed, ast.Expression):
            exprs = [parsed.body]
        else:
            return
        for expr in exprs:
            ast.increment_lineno(expr, getattr(node, "lineno", 1) - 1)
            self.visit(expr)
            self._string_annotation(expr)

    def _hit(self, node: ast.AST, rule: str, message: str) -> None:
        self.hits.append((getattr(node, "lineno", 0), rule, message))

    def _bind(self, node: ast.AST, name: str, qnames: frozenset[str]) -> bool:
        """Add what ``name`` may hold; True if that grew. Too many objects fails closed."""
        old = self.names.get(name, frozenset())
        if qnames <= old or name in self.saturated:
            return False
        if len(old | qnames) > _MAX_BINDINGS:
            self.saturated.add(name)
            self._hit(node, "alias-dangerous", f"{name} holds over {_MAX_BINDINGS} objects; cannot analyse")
            return False
        self.names[name] = old | qnames
        return True

    def _settle_aliases(self, pairs: list[tuple[ast.Name, ast.expr]]) -> None:
        """Bind assigned names to what their values resolve to, until nothing grows."""
        pairs = [(t, v) for t, v in pairs if isinstance(v, (ast.Name, ast.Attribute, ast.Call))]
        for _ in range(_MAX_ALIAS_PASSES):
            changed = [t for t, v in pairs if self._bind(t, t.id, self._resolve(v))]
            if not changed:
                return
        self._hit(changed[0], "alias-dangerous", f"aliases of {changed[0].id} do not settle; cannot analyse")

    def _imported(self, node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, str | None, str]]:
        """(subject, bound name or None for `*`, qualified name bound) for each imported name."""
        if isinstance(node, ast.Import):
            for alias in node.names:
                subject = self._absolute(alias.name)
                if alias.asname:
                    yield subject, alias.asname, subject
                else:
                    top = alias.name.split(".")[0]
                    yield subject, top, self._absolute(top)
            return
        module = node.module or ""
        base = f"{LOCAL}.{module}".rstrip(".") if node.level else self._absolute(module)
        for alias in node.names:
            if alias.name == "*":
                yield base, None, base
            else:
                yield f"{base}.{alias.name}", alias.asname or alias.name, f"{base}.{alias.name}"

    def _absolute(self, module: str) -> str:
        return f"{LOCAL}.{module}" if module.split(".")[0] in self.roots else module

    def _resolve(self, node: ast.expr) -> frozenset[str]:
        """Qualified names an expression may evaluate to, where the symbol table knows."""
        if isinstance(node, ast.Name):
            # A rebinding anywhere never hides a dangerous builtin: scopes are not modelled.
            builtin = frozenset({f"builtins.{node.id}"}) if node.id in _BUILTINS else frozenset()
            return self.names.get(node.id, frozenset()) | builtin
        if isinstance(node, ast.Attribute):
            return frozenset(f"{q}.{node.attr}" for q in self._resolve(node.value))
        if isinstance(node, ast.Call) and (attr := self._literal_getattr(node)) is not None:
            return frozenset(f"{q}.{attr}" for q in self._resolve(node.args[0]))
        return frozenset()

    def _literal_getattr(self, node: ast.Call) -> str | None:
        """The attribute name of ``getattr(x, "name"[, default])``; None for any other call."""
        args = node.args
        if (
            len(args) in (2, 3)
            and not isinstance(args[0], ast.Starred)
            and isinstance(args[1], ast.Constant)
            and isinstance(args[1].value, str)
            and "builtins.getattr" in self._resolve(node.func)
        ):
            return args[1].value
        return None

    def _use(self, node: ast.expr, qnames: frozenset[str]) -> bool:
        """Report each forbidden qualified name an expression evaluates to; True if any."""
        verdicts = sorted(v for v in map(classify, qnames) if v)
        if verdicts:
            shown = ast.unparse(node)
            for rule, why in verdicts:
                self._hit(node, rule, why if shown == why else f"{shown} -> {why}")
        return bool(verdicts)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.ImportFrom) and node.level > self.max_level:
            self._hit(node, "forbidden-import", f"relative import of level {node.level} leaves the bundle")
        for subject, bound, _ in self._imported(node):
            verdict = classify(subject)
            if verdict:
                self._hit(node, verdict[0], f"import of {verdict[1]}")
            elif subject.split(".")[0] not in _IMPORTABLE:
                self._hit(node, "forbidden-import", f"import of {subject}: not on the allow-list")
            if bound is None and not subject.startswith(LOCAL):
                self._hit(node, "star-import", f"from {subject} import *")
        for alias in node.names:
            self._defines(node, alias.asname, "import alias")

    visit_ImportFrom = visit_Import

    def visit_Name(self, node: ast.Name) -> None:
        reported = isinstance(node.ctx, ast.Load) and self._use(node, self._resolve(node))
        if not isinstance(node.ctx, ast.Load):
            self._defines(node, node.id, "name")
        elif not reported and _unsafe_dunder(node.id):
            self._hit(node, "dunder-escape", f"name {node.id}")
        if isinstance(node.ctx, ast.Load) and id(node) not in self.anchored:
            if node.id in self.modules:
                self._hit(node, "module-escape", f"module {node.id} used as a plain value")
            if self._resolve(node) & _REFLECTIVE:
                self._hit(node, "nonliteral-getattr", f"{node.id} used as a plain value")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.anchored.add(id(node.value))
        if isinstance(node.ctx, ast.Load):
            if self._use(node, self._resolve(node)):
                return
        elif self._resolve(node.value):
            self._hit(node, "module-patch", f"assignment to {ast.unparse(node)}")
        elif not self._owns(node.value):
            self._hit(node, "attribute-assignment", f"assignment to {ast.unparse(node)}")
        if not isinstance(node.ctx, ast.Load) and _is_dunder(node.attr):
            self._defines(node, node.attr, "attribute")
        elif _introspective(node.attr):
            self._hit(node, "dunder-escape", f"attribute {node.attr}")
        elif node.attr in _UNTRACKED_ATTRS and not self._resolve(node.value):
            self._hit(node, _UNTRACKED_ATTRS[node.attr], f"attribute .{node.attr} of an untracked object")
        self.visit(node.value)

    def visit_Call(self, node: ast.Call) -> None:
        self.anchored.add(id(node.func))
        for qname in sorted(self._resolve(node.func) & _REFLECTIVE):
            self._reflective(node, qname.removeprefix("builtins."))
        self._use(node, self._resolve(node))
        self.generic_visit(node)

    def _reflective(self, node: ast.Call, fname: str) -> None:
        """getattr/setattr/delattr: the name must be a literal, not a dunder; no module targets."""
        args = node.args
        if args:
            self.anchored.add(id(args[0]))
        name = args[1] if len(args) > 1 and not isinstance(args[0], ast.Starred) else None
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            self._hit(node, "nonliteral-getattr", f"{fname}() with a computed attribute name")
        elif _introspective(name.value):
            self._hit(node, "dunder-escape", f"{fname}(..., {name.value!r})")
        if fname != "getattr" and args and self._resolve(args[0]):
            self._hit(node, "module-patch", f"{fname}() on {ast.unparse(args[0])}")
        elif fname != "getattr" and args and not self._owns(args[0]):
            self._hit(node, "attribute-assignment", f"{fname}() on {ast.unparse(args[0])}")

    def visit_Assign(self, node: ast.Assign | ast.AnnAssign | ast.NamedExpr) -> None:
        for target, value in _alias_pairs(node):
            self.anchored.add(id(value))
            for qname in sorted(self._resolve(value)):
                if classify(qname) or qname in _REFLECTIVE:
                    self._hit(target, "alias-dangerous", f"{target.id} = {qname}")
        if isinstance(node, ast.AnnAssign):
            self._string_annotation(node.annotation)
        self.generic_visit(node)

    visit_AnnAssign = visit_NamedExpr = visit_Assign

    def visit_arg(self, node: ast.arg) -> None:
        self._defines(node, node.arg, "argument")
        self._string_annotation(node.annotation)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._defines(node, node.name, "function")
        self._string_annotation(node.returns)
        owned = self._instances(node.body)
        positional = [*node.args.posonlyargs, *node.args.args]
        if id(node) in self.methods and positional:
            owned.add(positional[0].arg)  # self: an instance of the bundle's own class
        self.owned.append(owned)
        self.generic_visit(node)
        self.owned.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._defines(node, node.name, "class")
        self.generic_visit(node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        self._defines(node, node.name, "exception name")
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global | ast.Nonlocal) -> None:
        for name in node.names:
            self._defines(node, name, "name")

    visit_Nonlocal = visit_Global

    def visit_Constant(self, node: ast.Constant) -> None:
        """A string that str.format or format_map would read as walking attributes."""
        if isinstance(node.value, str):
            for attr in _format_walks(node.value):
                self._hit(node, "dunder-escape", f"format string reads .{attr}")

    def _string_annotation(self, annotation: ast.expr | None) -> None:
        """String annotations are code: typing.get_type_hints (and singledispatch) evaluate them."""
        for sub in ast.walk(annotation) if annotation is not None else ():
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                try:
                    expr = ast.parse(sub.value.strip(), mode="eval").body
                except (SyntaxError, ValueError):
                    continue
                ast.increment_lineno(expr, sub.lineno - 1)
                self.visit(expr)
                self._string_annotation(expr)
