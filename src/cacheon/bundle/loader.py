"""Importing a bundle's entry function. Only ever called after ``scan`` admitted the bundle, and by
the verifier only inside its isolated child process."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cacheon.bundle.manifest import OpEntry
from cacheon.errors import UsageError


def _refuse_shadowing(root: Path) -> None:
    """A bundle module named like an installed one (``numpy.py``) would silently lose to, or
    replace, the host's module depending on import order; refuse the ambiguity outright."""
    for child in sorted(root.iterdir()):
        name = child.stem if child.suffix == ".py" else child.name
        if not (child.suffix == ".py" or (child / "__init__.py").is_file()):
            continue
        spec = importlib.util.find_spec(name) if name not in sys.modules else sys.modules[name].__spec__
        origin = getattr(spec, "origin", None) if spec is not None else None
        if spec is not None and not (origin and Path(origin).resolve().is_relative_to(root)):
            raise UsageError(f"bundle module {child.name!r} shadows the installed module {name!r}; rename it")


def load_entry(bundle_dir: Path, op: OpEntry, name: str | None = None) -> Callable[..., Any]:
    """Import ``op.source`` under a private module name and return its function ``name``
    (default: the op's entry; or its ``prepare``).

    The bundle root goes on ``sys.path`` so a source may import the bundle's declared helper modules.
    """
    root = Path(bundle_dir).resolve()
    _refuse_shadowing(root)
    path = root / op.source
    tag = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    module_name = f"cacheon_bundle_{tag}_{path.stem}"
    module = sys.modules.get(module_name)
    if module is None:
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise UsageError(f"{path}: cannot be imported as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    name = name or op.entry
    function = getattr(module, name, None)
    if not callable(function):
        raise UsageError(f"{op.source}: has no callable {name!r} (named by the manifest for {op.slot})")
    return function
