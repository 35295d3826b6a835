"""Admission: manifest + digest + static scan, the gate before any candidate code is imported."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cacheon.bundle.digest import bundle_digest
from cacheon.bundle.manifest import MANIFEST_NAME, Manifest, ManifestError, load_manifest
from cacheon.bundle.scan import ScanReport, scan_bundle
from cacheon.errors import UsageError


@dataclass(frozen=True)
class Admission:
    manifest: Manifest
    digest: str | None  # None when the tree holds a symlink (a link has no portable digest)
    scan: ScanReport

    @property
    def admitted(self) -> bool:
        return self.scan.clean

    def require_usable_manifest(self, root: Path) -> None:
        """An entry the manifest names but its source lacks is a manifest error (exit 1), not a verdict."""
        errors = self.scan.manifest_errors()
        if errors:
            raise ManifestError(f"{Path(root) / MANIFEST_NAME}: {errors[0].message}")


def admit(bundle_dir: Path) -> Admission:
    """Load the manifest (malformed → UsageError), scan, and digest an admissible tree."""
    manifest = load_manifest(bundle_dir)
    entries: dict[str, set[str]] = {}
    for op in manifest.ops:
        entries.setdefault(op.source, set()).update(n for n in (op.entry, op.prepare) if n)
    report = scan_bundle(Path(bundle_dir), manifest.declared_files(), entries)
    try:
        digest: str | None = bundle_digest(bundle_dir)
    except UsageError:
        digest = None  # the scan reports the symlink as a finding
    return Admission(manifest, digest, report)
