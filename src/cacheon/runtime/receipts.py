"""Receipts: proof that an armed adapter actually routed a call through the bundle.

A faithful bundle produces stock output, so output alone cannot show the adapter fired; the receipt
can. Counts live in memory; with a receipt directory the receipt is also written as JSON on the first
call the bundle serves (and again on disarm), so server processes (every TP rank) leave evidence.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Receipt:
    seam: str
    slot: str
    bundle_id: str
    bundle_digest: str
    directory: Path | None = None
    pid: int = field(default_factory=os.getpid)
    fired: int = 0  # calls the bundle served
    passthrough: int = 0  # calls outside the slot contract, handed to the stock implementation

    def fire(self) -> None:
        self.fired += 1
        if self.fired == 1:
            self.write()

    def pass_through(self) -> None:
        self.passthrough += 1

    @property
    def path(self) -> Path | None:
        return None if self.directory is None else self.directory / f"{self.seam}.{self.pid}.json"

    def to_json(self) -> dict[str, Any]:
        return {
            "seam": self.seam,
            "slot": self.slot,
            "bundle_id": self.bundle_id,
            "bundle_digest": self.bundle_digest,
            "pid": self.pid,
            "fired": self.fired,
            "passthrough": self.passthrough,
        }

    def write(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), sort_keys=True), encoding="utf-8")
        tmp.replace(self.path)


def read_receipts(directory: Path) -> list[dict[str, Any]]:
    """Every receipt written under ``directory`` (from any process), sorted by seam then pid."""
    found = [json.loads(p.read_text(encoding="utf-8")) for p in Path(directory).glob("*.json")]
    return sorted(found, key=lambda r: (r["seam"], r["pid"]))
