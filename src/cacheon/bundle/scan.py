"""Static admission of a bundle directory: the tree policy, then the AST policy on every ``.py``.

Defense in depth, not trust: nothing from the bundle is imported or run here, and a clean scan
admits a bundle only to the isolated child process, which stays the real guard. Findings name
``file:line`` and a stable rule id so a report can be diffed, filtered and documented.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cacheon.bundle import ast_policy, tree_policy
from cacheon.bundle.snapshot import Snapshot, read_snapshot

ENTRY_RULE = "missing-entry"
#: every rule id the scan can report, with what it catches
RULES: dict[str, str] = {
    **tree_policy.RULES,
    **ast_policy.RULES,
    ENTRY_RULE: "a manifest entry or prepare that names no top-level function of its source (a manifest error)",
}


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

    def manifest_errors(self) -> list[Finding]:
        """Findings that make the manifest itself unusable (exit 1, not a verdict)."""
        return [f for f in self.findings if f.rule == ENTRY_RULE]

    def to_json(self) -> dict[str, Any]:
        return {
            "clean": self.clean,
            "files_scanned": self.files_scanned,
            "findings": [asdict(f) for f in self.findings],
        }


def scan_bundle(
    bundle: Path | Snapshot, declared: Iterable[str], entries: Mapping[str, Iterable[str]] | None = None
) -> ScanReport:
    """Scan a bundle snapshot (a path is read into one first); ``declared`` are the manifest's
    relative POSIX paths (``manifest.toml``, every op source, every include), ``entries`` the
    function names the manifest expects at the top level of each source. Raises
    :class:`UsageError` when a path is not a readable bundle directory."""
    snapshot = bundle if isinstance(bundle, Snapshot) else read_snapshot(bundle)
    declared = tuple(declared)
    tree = tree_policy.scan_tree(snapshot, declared)
    found = {Finding(rel, 0, rule, message) for rel, rule, message in tree.hits}
    roots = ast_policy.local_roots(declared)
    for rel, data in tree.sources:
        found.update(Finding(rel, *hit) for hit in ast_policy.check_source(data, rel, roots))
        functions = ast_policy.top_level_functions(data)
        for name in sorted((entries or {}).get(rel, ())):
            if functions is not None and name not in functions:
                found.add(Finding(rel, 0, ENTRY_RULE, f"the manifest names {name!r}, which is not a top-level "
                                  f"function of {rel}"))
    return ScanReport(tuple(sorted(found)), tree.files)
