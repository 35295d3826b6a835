"""The release's Python environment as a CycloneDX 1.6 JSON SBOM, and the checks a release makes of one.

Written with ``cyclonedx-python-lib`` (the CycloneDX project's own model and serializer) from
``importlib.metadata``: one ``library`` component per installed distribution, with its
``pkg:pypi`` purl. It is captured inside the engine image, like the runtime identity, and a
release refuses an SBOM that disagrees with that identity on any package the identity pins:
an SBOM of some other environment is not this release's.
"""

from __future__ import annotations

import importlib.metadata as metadata
import platform
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from cacheon import __version__
from cacheon.evidence.boundary import Malformed, decode_json, read_bounded
from cacheon.runtime.identity import PACKAGES

MEDIA_TYPE = "application/vnd.cyclonedx+json"
FILE_NAME = "sbom.cdx.json"
MAX_BYTES = 32 * 1024 * 1024  # a large environment's SBOM is well under 1 MiB


class _Component(msgspec.Struct, frozen=True):
    name: str
    version: str | None = None
    type: str = "library"


class _Bom(msgspec.Struct, frozen=True, rename={"bom_format": "bomFormat", "spec_version": "specVersion"}):
    """The fields Cacheon reads; the rest of the document is CycloneDX's and is left alone."""

    bom_format: str
    spec_version: str
    components: list[_Component] = []


def environment_sbom() -> bytes:
    """The CycloneDX JSON of this interpreter's installed distributions."""
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.tool import ToolRepository
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    environment = Component(type=ComponentType.PLATFORM, name="python-environment", version=platform.python_version())
    tool = Component(type=ComponentType.APPLICATION, name="cacheon", version=__version__)
    bom = Bom(metadata=BomMetaData(component=environment, tools=ToolRepository(components=[tool])))
    seen: set[str] = set()
    for dist in sorted(metadata.distributions(), key=lambda d: _normalize(d.metadata["Name"] or "")):
        name = dist.metadata["Name"]
        if not name or _normalize(name) in seen:
            continue  # the first on sys.path wins, as it does for imports
        seen.add(_normalize(name))
        bom.components.add(
            Component(
                type=ComponentType.LIBRARY,
                name=name,
                version=dist.version,
                purl=PackageURL(type="pypi", name=name, version=dist.version),
                bom_ref=f"pkg:pypi/{_normalize(name)}@{dist.version}",
            )
        )
    bom.register_dependency(environment, bom.components)  # the environment holds every distribution
    return JsonV1Dot6(bom).output_as_string(indent=2).encode("utf-8")


def read(path: Path) -> dict[str, str | None]:
    """Distribution name (normalized) -> version, from a bounded, typed read of an SBOM file."""
    bom = decode_json(read_bounded(path, MAX_BYTES), _Bom, f"SBOM {path.name}", canonical=False)
    if bom.bom_format != "CycloneDX":
        raise Malformed(f"SBOM {path.name}: bomFormat is {bom.bom_format[:40]!r}, not 'CycloneDX'")
    if not re.fullmatch(r"1\.[4-9]", bom.spec_version):
        raise Malformed(f"SBOM {path.name}: CycloneDX specVersion {bom.spec_version[:20]!r} (1.4 or later expected)")
    return {_normalize(c.name): c.version for c in bom.components if c.type == "library"}


def identity_mismatches(packages: Mapping[str, str | None], facts: Mapping[str, Any]) -> list[str]:
    """Where the SBOM disagrees with the runtime identity's pinned package versions."""
    found = []
    pinned = facts.get("packages")
    for fact, dists in PACKAGES.items():
        version = pinned.get(fact) if isinstance(pinned, dict) else None
        if version is None:
            continue
        listed = {d: packages[_normalize(d)] for d in dists if _normalize(d) in packages}
        if version not in listed.values():
            have = ", ".join(f"{d} {v}" for d, v in listed.items()) or "nothing"
            found.append(f"the SBOM lists {have} for {fact}; the runtime identity has {fact} {version}")
    return found


def _normalize(name: str) -> str:
    """PEP 503 name normalization (``Foo_Bar`` and ``foo-bar`` are one distribution)."""
    return re.sub(r"[-_.]+", "-", name).lower()
