"""The torch and triton a kernel may name: an allow-list of modules, and every path a name resolves to.

Inside ``torch`` and ``triton`` only the modules a kernel needs are allowed (tensor ops, the
functional API, the math submodules, ``torch.cuda``'s stream queries, Triton and ``triton.language``,
and the collective calls of ``torch.distributed`` on the group the harness hands in). A name is
resolved statically against the installed packages (``inspect.getattr_static``: nothing is called
or imported on the bundle's behalf), so each name has two paths: the one written, normalised
through module aliases (``F.torch.load`` is ``torch.load``), and the one its object is defined at
(``torch.load`` is ``torch.serialization.load``). The family patterns of the AST policy are matched
against both; the allow-list against the written one.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from functools import cache, lru_cache
from types import ModuleType

ROOTS = ("torch", "triton")

#: module -> members allowed (None: every public member that is not itself a submodule)
ALLOWED: dict[str, frozenset[str] | None] = {
    "torch": None,
    "torch.nn": frozenset({"functional"}),
    "torch.nn.functional": None,
    "torch.linalg": None,
    "torch.special": None,
    "torch.fft": None,
    "torch.cuda": None,
    "torch.cuda.nvtx": None,
    # the collective calls on the group the harness hands in; nothing that makes or ends a group
    "torch.distributed": frozenset({
        "all_gather", "all_gather_into_tensor", "all_reduce", "all_to_all", "all_to_all_single", "barrier",
        "batch_isend_irecv", "broadcast", "get_rank", "get_world_size", "irecv", "isend", "P2POp", "recv",
        "reduce", "reduce_scatter", "reduce_scatter_tensor", "ReduceOp", "send",
    }),
    "triton": None,
    "triton.language": None,
}  # fmt: skip
#: modules whose every submodule is allowed too
RECURSIVE = ("triton.language",)
#: the family a refused member of a module reaches when no family pattern names it
REFUSED_MEMBER_RULE = {"torch.distributed": "net-import"}
FALLBACK_RULE = "forbidden-submodule"


@dataclass(frozen=True)
class Resolution:
    written: str  # the name as written, module aliases replaced by the module's own name
    defined: tuple[str, ...]  # where the objects along the way are defined (``module.qualname...``)
    escape: str | None  # a non-torch/triton module reached through a torch/triton one


def _allowed_module(name: str) -> bool:
    return name in ALLOWED or any(name.startswith(r + ".") for r in RECURSIVE)


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


@cache
def _import_root(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _submodule(module: ModuleType, part: str) -> ModuleType | str | None:
    """``module.part`` as a submodule: the module if imported, its name if only findable."""
    name = f"{module.__name__}.{part}"
    if name in sys.modules:
        return sys.modules[name]
    if getattr(module, "__path__", None) is None:
        return None
    try:
        return name if importlib.util.find_spec(name) is not None else None
    except (ImportError, ValueError):
        return None


def _defined_at(obj: object) -> str | None:
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(name, str):
        name = getattr(obj, "__name__", None)
    if isinstance(module, str) and isinstance(name, str):
        return f"{module}.{name}"
    return None


@lru_cache(maxsize=8192)
def resolve(qname: str) -> Resolution | None:
    """Both paths of a name rooted at torch or triton; None for any other name, or when the
    package is not importable here (then only the written name is judged)."""
    parts = qname.split(".")
    if parts[0] not in ROOTS:
        return None
    root = _import_root(parts[0])
    if root is None:
        return None
    written, defined = parts[0], list[str]()
    current: object = root
    for i, part in enumerate(parts[1:], start=1):
        rest = ".".join(parts[i:])
        if _is_dunder(part) or current is None:
            return Resolution(f"{written}.{rest}", tuple(defined), None)
        if isinstance(current, ModuleType):
            sub = _submodule(current, part)
            if isinstance(sub, str):  # a submodule not imported here: the rest stays as written
                return Resolution(f"{sub}.{'.'.join(parts[i + 1:])}".rstrip("."), tuple(defined), None)
            if sub is not None:
                current, written = sub, sub.__name__
                continue
        value = inspect.getattr_static(current, part, None)
        if isinstance(value, ModuleType):
            if value.__name__.split(".")[0] not in ROOTS:
                return Resolution(f"{written}.{rest}", tuple(defined), value.__name__)
            current, written = value, value.__name__
            continue
        written = f"{written}.{part}"
        where = _defined_at(value) if value is not None else None
        if where is not None and not defined:
            defined.append(where + "".join(f".{p}" for p in parts[i + 1:]))
        current = value
    return Resolution(written, tuple(defined), None)


def refused_member(written: str) -> tuple[str, str] | None:
    """(module, member) when ``written`` leaves the allow-list: a submodule not on it, or a member
    a restricted module does not allow. Private and dunder members are the AST policy's concern."""
    parts = written.split(".")
    prefix = next((k for k in range(len(parts), 0, -1) if _allowed_module(".".join(parts[:k]))), 0)
    if prefix == 0 or prefix == len(parts):
        return None
    module, member = ".".join(parts[:prefix]), parts[prefix]
    if member.startswith("_"):
        return None
    allowed = ALLOWED.get(module)
    if allowed is not None:
        return None if member in allowed else (module, member)
    root = _import_root(parts[0])
    loaded = sys.modules.get(module) if root is not None else None
    if loaded is not None and _submodule(loaded, member) is not None:
        return module, member
    return None
