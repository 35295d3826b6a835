"""Admission: manifest + digest + static scan, the gate before any candidate code is imported."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cacheon.bundle.digest import bundle_digest
from cacheon.bundle.manifest import Manifest, load_manifest
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


def admit(bundle_dir: Path) -> Admission:
    """Load the manifest (malformed → UsageError), scan, and digest an admissible tree."""
    manifest = load_manifest(bundle_dir)
    report = scan_bundle(Path(bundle_dir), manifest.declared_files())
    try:
        digest: str | None = bundle_digest(bundle_dir)
    except UsageError:
        digest = None  # the scan reports the symlink as a finding
    return Admission(manifest, digest, report)
