"""A static canary: import the installed package, compare its version with the pin, check each surface.

No model, no GPU, no network. A green canary proves the symbols and parameter names Cacheon's adapters
use exist in the installed code at the pinned version; it does not prove they behave (that is the
activation tier) nor anything about a GPU image (stand-ins are recorded with the environment).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cacheon.runtime.surface import Row, Surface, check_surface

EXIT_OK = 0
EXIT_FAILED = 2


@dataclass(frozen=True)
class CanaryReport:
    package: str
    pin: str
    version: str | None  # what the imported package reports; None when it cannot be imported
    import_error: str | None
    rows: tuple[Row, ...]

    @property
    def version_row(self) -> Row:
        if self.import_error is not None:
            return Row("version", "FAIL", f"{self.package} cannot be imported: {self.import_error}")
        if self.version != self.pin:
            return Row("version", "FAIL", f"{self.version} DIFFERS from pin {self.pin}")
        return Row("version", "ok", f"{self.version} is the pin")

    @property
    def failed(self) -> tuple[Row, ...]:
        return tuple(r for r in (self.version_row, *self.rows) if r.status == "FAIL")

    @property
    def exit_code(self) -> int:
        return EXIT_OK if not self.failed else EXIT_FAILED

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.rows) for s in ("ok", "FAIL", "SKIP")}

    def verdict(self) -> str:
        """The final line: what was proven, in one sentence."""
        c = self.counts()
        tally = f"{c['ok']} ok, {c['FAIL']} FAIL, {c['SKIP']} SKIP"
        if self.import_error is not None:
            return f"FAIL: {self.package} cannot be imported; no surface was checked"
        if self.version != self.pin:
            return f"FAIL: {self.package} {self.version} DIFFERS from pin {self.pin} ({tally})"
        if self.failed:
            return f"FAIL: {self.package} {self.version} is the pin but {c['FAIL']} surface(s) failed ({tally})"
        return f"ok: {self.package} {self.version} is the pin ({tally})"

    def lines(self) -> list[str]:
        rows = (self.version_row, *self.rows)
        width = max(len(r.name) for r in rows)
        head = f"{self.package} {self.version or '(not importable)'} (pin {self.pin})"
        return [head, *(f"  {r.name:<{width}}  {r.status:<4}  {r.detail}" for r in rows), self.verdict()]

    def to_json(self) -> dict[str, Any]:
        return {
            "package": self.package,
            "pin": self.pin,
            "version": self.version,
            "import_error": self.import_error,
            "ok": self.exit_code == EXIT_OK,
            "version_row": self.version_row.to_json(),
            "rows": [r.to_json() for r in self.rows],
            "counts": self.counts(),
            "verdict": self.verdict(),
        }


def run_canary(package: str, pin: str, surfaces: Sequence[Surface]) -> CanaryReport:
    """Import ``package`` (its own ``__version__`` is the reported version), then check every surface.

    When the package cannot be imported every surface is reported SKIP: coverage is never claimed.
    """
    try:
        module = importlib.import_module(package)
    except Exception as exc:  # any import-time failure means "not importable", said plainly
        reason = f"{type(exc).__name__}: {exc}"
        rows = tuple(Row(s.name, "SKIP", f"not checked: {package} is not importable") for s in surfaces)
        return CanaryReport(package, pin, None, reason, rows)
    version = str(getattr(module, "__version__", None))
    return CanaryReport(package, pin, version, None, tuple(check_surface(s) for s in surfaces))
