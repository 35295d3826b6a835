"""Admission: manifest + digest + static scan of one snapshot, the gate before any candidate code is imported.

The snapshot admitted is the one thing later steps may use: ``verify`` runs and records it, serving
arms it. Nothing here (or after) reads the bundle's path again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cacheon.bundle.manifest import MANIFEST_NAME, Manifest, ManifestError, load_manifest
from cacheon.bundle.scan import ScanReport, scan_bundle
from cacheon.bundle.snapshot import Snapshot, read_snapshot


@dataclass(frozen=True)
class Admission:
    snapshot: Snapshot
    manifest: Manifest
    scan: ScanReport

    @property
    def digest(self) -> str | None:
        """The snapshot's digest; None when it refused an entry (a link, a special file, ...)."""
        return self.snapshot.digest

    @property
    def admitted(self) -> bool:
        return self.scan.clean and self.snapshot.digest is not None

    def require_usable_manifest(self, root: Path) -> None:
        """An entry the manifest names but its source lacks is a manifest error (exit 1), not a verdict."""
        errors = self.scan.manifest_errors()
        if errors:
            raise ManifestError(f"{Path(root) / MANIFEST_NAME}: {errors[0].message}")


def admit(bundle: Path | Snapshot) -> Admission:
    """Read the bundle once (a path; or take the snapshot given), load its manifest from those
    bytes (malformed → UsageError), scan and digest them."""
    snapshot = bundle if isinstance(bundle, Snapshot) else read_snapshot(bundle)
    manifest = load_manifest(snapshot)
    entries: dict[str, set[str]] = {}
    for op in manifest.ops:
        entries.setdefault(op.source, set()).update(n for n in (op.entry, op.prepare) if n)
    return Admission(snapshot, manifest, scan_bundle(snapshot, manifest.declared_files(), entries))
