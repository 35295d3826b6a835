"""Starter bundles: for any registered slot, a manifest and a plain torch kernel that pass ``scan`` and
``verify``, so a kernel author's first step is a green run.

A slot's starter is one file, ``kernels/<slot>.py`` (dots as underscores); the manifest is derived from
the slot (entry, source path, prepare step). ``examples/bundles/*-torch`` are these starters as
``cacheon new`` writes them: the kernel text lives here, once.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from cacheon.bundle.manifest import MANIFEST_NAME
from cacheon.contract.catalog import ABI_VERSION, SLOTS, get_slot
from cacheon.contract.spec import SlotSpec
from cacheon.errors import UsageError

KERNELS = resources.files(__name__) / "kernels"


def kernel_file(slot: SlotSpec) -> str:
    """Where the slot's starter kernel lives in this package."""
    return slot.name.replace(".", "_") + ".py"


@dataclass(frozen=True)
class Starter:
    slot: SlotSpec
    kernel: str  # the kernel file's text

    @property
    def source(self) -> str:
        """The kernel's path inside the bundle."""
        return f"kernels/{self.slot.entry}.py"

    @property
    def description(self) -> str:
        """The first line of the kernel's docstring."""
        doc = ast.get_docstring(ast.parse(self.kernel)) or f"Starter for {self.slot.name} in plain torch."
        return doc.splitlines()[0]

    def manifest(self, bundle_id: str) -> str:
        """The manifest's TOML text (JSON string quoting is valid TOML basic-string quoting)."""
        lines = [
            f"bundle_id = {json.dumps(bundle_id)}",
            f"abi_version = {json.dumps(ABI_VERSION)}",
            f"description = {json.dumps(self.description, ensure_ascii=False)}",
            "",
            "[[ops]]",
            f"slot = {json.dumps(self.slot.name)}",
            f"source = {json.dumps(self.source)}",
            f"entry = {json.dumps(self.slot.entry)}",
        ]
        if self.slot.prepare_inputs:
            lines.append('prepare = "prepare"')
        return "\n".join(lines) + "\n"

    def files(self, bundle_id: str) -> dict[str, str]:
        """Relative path -> text of every file of the starter bundle."""
        return {MANIFEST_NAME: self.manifest(bundle_id), self.source: self.kernel}


def starter(slot_name: str) -> Starter:
    """The starter of a registered slot; a slot without one is named, with where to add it."""
    slot = get_slot(slot_name)
    kernel = KERNELS / kernel_file(slot)
    if not kernel.is_file():
        raise UsageError(
            f"slot {slot.name} has no starter kernel yet: add src/cacheon/starters/kernels/{kernel_file(slot)} "
            f"(a plain torch {slot.signature()} that passes `cacheon verify`)"
        )
    return Starter(slot, kernel.read_text(encoding="utf-8"))


def missing() -> list[str]:
    """Registered slots without a starter kernel."""
    return sorted(name for name, slot in SLOTS.items() if not (KERNELS / kernel_file(slot)).is_file())


def write(start: Starter, directory: Path, bundle_id: str) -> list[Path]:
    """Write the starter's files under ``directory`` (which exists); returns the paths written."""
    written = []
    for relative, text in start.files(bundle_id).items():
        path = directory / relative
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
