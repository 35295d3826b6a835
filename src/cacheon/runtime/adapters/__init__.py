"""Version-specific glue between slot entries and SGLang's layer classes, one module per supported pin.

Each pin module exposes ``PIN``, ``ARMERS`` (seam name -> armer for every armable row of
:data:`cacheon.runtime.seams.SEAMS`) and ``arm_group_gate`` (where every rank's agreement runs).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from cacheon.errors import CacheonError

_BY_PIN = {"0.5.13.post1": "cacheon.runtime.adapters.sglang_0_5_13_post1"}


class NoAdapter(CacheonError):
    exit_code = 2


def adapter_for(version: str) -> ModuleType:
    """The glue for an exact SGLang version; any other version has none (adapters never guess)."""
    try:
        return importlib.import_module(_BY_PIN[version])
    except KeyError:
        raise NoAdapter(f"no seam adapter for sglang {version} (adapters exist for: {', '.join(_BY_PIN)})") from None
