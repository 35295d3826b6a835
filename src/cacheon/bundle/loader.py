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


def load_entry(bundle_dir: Path, op: OpEntry) -> Callable[..., Any]:
    """Import ``op.source`` under a private module name and return ``op.entry``.

    The bundle root goes on ``sys.path`` so a source may import the bundle's declared helper modules.
    """
    root = Path(bundle_dir).resolve()
    path = root / op.source
    tag = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    name = f"cacheon_bundle_{tag}_{path.stem}"
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    entry = getattr(module, op.entry, None)
    if not callable(entry):
        raise UsageError(f"{op.source}: has no callable {op.entry!r} (the manifest's entry for {op.slot})")
    return entry
