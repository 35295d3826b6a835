"""Runtime identity: the exact environment a result depends on, and one digest over it.

Evidence is only ever valid for the identity that produced it, so the identity must change
whenever anything a result depends on changes: package *versions* (not names), the CUDA build
of torch, the GPUs, the base image, and any import stand-in (a stand-in makes a host a different
runtime, never a copy of the engine image). Versions come from ``importlib.metadata``; only torch
is imported, because the CUDA facts are not in its metadata.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import platform
import re
from dataclasses import dataclass
from typing import Any

from cacheon.canonical import digest

IDENTITY_DOMAIN = "cacheon.runtime-identity.v1"
FACTS_SCHEMA = 1
STANDIN_LABEL = "cacheon.standin"
IMAGE_DIGEST_ENV = "CACHEON_IMAGE_DIGEST"
REVISION_ENV = "CACHEON_SGLANG_REVISION"

# Fact name -> distribution names to try, in order (flashinfer was renamed on PyPI).
PACKAGES: dict[str, tuple[str, ...]] = {
    "sglang": ("sglang",),
    "torch": ("torch",),
    "triton": ("triton", "pytorch-triton"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "sgl-kernel": ("sgl-kernel", "sglang-kernel"),  # renamed on PyPI; the pin depends on sglang-kernel
}

_REVISION = re.compile(r"[0-9a-f]{40}")
_IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Identity:
    """Captured facts and the digest that names them."""

    facts: dict[str, Any]
    digest: str

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "facts": self.facts}

    @property
    def sglang_version(self) -> str | None:
        version = self.facts.get("packages", {}).get("sglang")
        return None if version is None else str(version)

    @property
    def gpu_count(self) -> int:
        return int(self.facts.get("gpu", {}).get("count") or 0)


def identity_digest(facts: dict[str, Any]) -> str:
    """The digest of a facts dict (canonical JSON under :data:`IDENTITY_DOMAIN`)."""
    return digest(IDENTITY_DOMAIN, facts)


def identity_from_facts(facts: dict[str, Any]) -> Identity:
    """Rebuild an identity from stored facts (the digest is recomputed, never trusted)."""
    return Identity(facts=facts, digest=identity_digest(facts))


def runtime_identity() -> Identity:
    """The identity of this process's runtime."""
    return identity_from_facts(capture_environment())


def capture_environment() -> dict[str, Any]:
    """Everything a result depends on, as canonical-JSON-safe facts (no floats)."""
    packages = {name: _version(dists) for name, dists in PACKAGES.items()}
    return {
        "schema": FACTS_SCHEMA,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation().lower(),
        "platform": f"{platform.system().lower()}-{platform.machine().lower()}",
        "packages": packages,
        "sglang_revision": _sglang_revision() if packages["sglang"] else None,
        **_torch_facts(packages["torch"] is not None),
        "image_digest": _image_digest(),
        "standins": _standins(),
    }


def _version(dists: tuple[str, ...]) -> str | None:
    for name in dists:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _sglang_revision() -> str | None:
    """The upstream commit: from an explicit env override, else from a VCS install's PEP 610 record."""
    override = os.environ.get(REVISION_ENV, "").strip().lower()
    if override:
        return override if _REVISION.fullmatch(override) else f"invalid:{override}"
    try:
        raw = metadata.distribution("sglang").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not raw:
        return None
    try:
        commit = json.loads(raw).get("vcs_info", {}).get("commit_id", "")
    except (ValueError, AttributeError):
        return None
    return commit if _REVISION.fullmatch(commit or "") else None


def _torch_facts(installed: bool) -> dict[str, Any]:
    if not installed:
        return {"torch_cuda": None, "gpu": {"count": 0, "devices": []}}
    import torch  # the one heavy import: CUDA facts are only known to torch itself

    devices = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(index)
            devices.append({"name": torch.cuda.get_device_name(index), "capability": f"{major}.{minor}"})
    return {"torch_cuda": torch.version.cuda, "gpu": {"count": len(devices), "devices": devices}}


def _image_digest() -> str | None:
    """The base image digest; a malformed value is kept (marked) so it still changes the identity."""
    value = os.environ.get(IMAGE_DIGEST_ENV, "").strip()
    if not value:
        return None
    value = value.rsplit("@", 1)[-1]
    return value if _IMAGE_DIGEST.fullmatch(value) else f"invalid:{value}"


def _standins() -> list[dict[str, str]]:
    """Distributions installed as stand-ins (local version label ``+cacheon.standin``)."""
    found = set()
    for dist in metadata.distributions():
        version = dist.version or ""
        local = version.partition("+")[2]
        if local == STANDIN_LABEL or local.startswith(STANDIN_LABEL + "."):
            found.add((dist.metadata["Name"] or "", version))
    return [{"name": name, "version": version} for name, version in sorted(found)]


def summary(facts: dict[str, Any]) -> str:
    """One line a person can read: what makes this identity what it is."""
    packages = facts.get("packages", {})
    gpu = facts.get("gpu", {})
    gpus = ", ".join(sorted({f"{d['name']} (sm {d['capability']})" for d in gpu.get("devices", [])}))
    parts = [
        f"sglang {packages.get('sglang') or '(none)'}",
        f"torch {packages.get('torch') or '(none)'} (CUDA {facts.get('torch_cuda') or 'none'})",
        f"{gpu.get('count', 0)}x {gpus}" if gpu.get("count") else "no GPU",
    ]
    if facts.get("standins"):
        parts.append("stand-ins: " + ", ".join(s["name"] for s in facts["standins"]))
    return ", ".join(parts)


def describe(identity: Identity) -> list[str]:
    """Every fact, one per line, for ``cacheon identity``."""
    facts = identity.facts
    rows = [("identity", identity.digest)]
    rows.append(("python", f"{facts['python']} ({facts['python_implementation']}, {facts['platform']})"))
    rows += [(name, version or "(not installed)") for name, version in facts["packages"].items()]
    rows.append(("revision", facts["sglang_revision"] or "(unknown)"))
    rows.append(("CUDA", facts["torch_cuda"] or "none (torch has no CUDA build)"))
    devices = facts["gpu"]["devices"]
    rows += [(f"gpu {i}", f"{d['name']} (capability {d['capability']})") for i, d in enumerate(devices)] or [
        ("gpu", "no CUDA device")
    ]
    rows.append(("image", facts["image_digest"] or f"(unknown; set {IMAGE_DIGEST_ENV})"))
    standins = ", ".join(f"{s['name']}=={s['version']}" for s in facts["standins"])
    rows.append(("stand-ins", standins or "none"))
    return [f"{label:<11} {value}" for label, value in rows]
