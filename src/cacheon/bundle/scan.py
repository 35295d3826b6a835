"""Static admission of a bundle directory: the tree policy, then the AST policy on every ``.py``.

Defense in depth, not trust: nothing from the bundle is imported or run here, and a clean scan
admits a bundle only to the isolated child process, which stays the real guard. Findings name
``file:line`` and a stable rule id so a report can be diffed, filtered and documented.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cacheon.bundle import ast_policy, tree_policy
from cacheon.errors import UsageError

#: every rule id the scan can report, with what it catches
RULES: dict[str, str] = {**tree_policy.RULES, **ast_policy.RULES}


@dataclass(frozen=True, order=True)
class Finding:
    """One violation; ``line`` is 0 for findings about a file rather than a line of it."""

    file: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: [{self.rule}] {self.message}"


@dataclass(frozen=True)
class ScanReport:
    """Findings sorted by (file, line, rule, message), so two scans of one bundle compare equal."""

    findings: tuple[Finding, ...]
    files_scanned: int

    @property
    def clean(self) -> bool:
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "files_scanned": self.files_scanned,
            "findings": [asdict(f) for f in self.findings],
        }


def scan_bundle(root: Path, declared: Iterable[str]) -> ScanReport:
    """Scan the bundle at ``root``; ``declared`` are the manifest's relative POSIX paths
    (``manifest.toml``, every op source, every include). Raises :class:`UsageError` when
    ``root`` is not a readable directory."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"{root} is not a bundle directory")
    declared = tuple(declared)
    tree = tree_policy.scan_tree(root, declared)
    found = {Finding(rel, 0, rule, message) for rel, rule, message in tree.hits}
    roots = ast_policy.local_roots(declared)
    for rel, data in tree.sources:
        found.update(Finding(rel, *hit) for hit in ast_policy.check_source(data, rel, roots))
    return ScanReport(tuple(sorted(found)), tree.files)
