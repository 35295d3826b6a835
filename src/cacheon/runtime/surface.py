"""One upstream symbol Cacheon relies on, and the static check that it is still there with the parameter
names Cacheon uses. Shared by the SGLang seam table and the chain-SDK table so both canaries judge a
moved symbol or a renamed parameter the same way."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["ok", "FAIL", "SKIP"]


@dataclass(frozen=True)
class Surface:
    """``module:chokepoint`` must resolve and its signature must accept every name in ``params``.

    ``chokepoint`` is a dotted path inside the module (``"RMSNorm.forward_native"``, ``"ServerArgs"``);
    a class's signature is its constructor's (for a dataclass, its fields). ``requires`` names an optional
    top-level package: when it is absent the row is SKIP, never a pass and never a failure.
    """

    name: str
    module: str
    chokepoint: str
    params: tuple[str, ...] = ()
    requires: str | None = None

    @property
    def target(self) -> str:
        return f"{self.module}:{self.chokepoint}"


@dataclass(frozen=True)
class Row:
    """The outcome for one surface (or the version row)."""

    name: str
    status: Status
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


def resolve(surface: Surface) -> Any:
    """Import the module and walk the chokepoint path; raises ImportError/AttributeError as upstream does."""
    obj: Any = importlib.import_module(surface.module)
    for part in surface.chokepoint.split("."):
        obj = getattr(obj, part)
    return obj


def check_surface(surface: Surface) -> Row:
    """SKIP when the optional package is absent, FAIL with the reason when anything Cacheon uses moved."""
    if surface.requires and importlib.util.find_spec(surface.requires) is None:
        return Row(surface.name, "SKIP", f"requires {surface.requires} (not installed)")
    try:
        obj = resolve(surface)
    except ImportError as exc:
        return Row(surface.name, "FAIL", f"cannot import {surface.module}: {type(exc).__name__}: {exc}")
    except AttributeError:
        return Row(surface.name, "FAIL", f"{surface.target} is gone (no such symbol)")
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError) as exc:
        return Row(surface.name, "FAIL", f"{surface.target} has no inspectable signature: {exc}")
    missing = [p for p in surface.params if p not in signature.parameters]
    if missing:
        have = ", ".join(signature.parameters) or "(none)"
        return Row(surface.name, "FAIL", f"{surface.target} lacks parameter(s) {', '.join(missing)}; has {have}")
    return Row(surface.name, "ok", f"{surface.target}({', '.join(surface.params)})")
