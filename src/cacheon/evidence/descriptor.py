"""The Engine release descriptor: what a release pins, and the one validator for it.

Build and verify both run :func:`problems`, so a descriptor that could not have been built
cannot verify either. Schema v2 (the predicate of a release attestation) adds ``sbom``: the name
of the artifact holding the CycloneDX SBOM of the image's Python environment. Schema v1 is the
descriptor of a legacy release (``release verify --legacy``). The serve spec may not override
anything the descriptor pins: the model (path, revision, config), the tensor-parallel size, or
the Python/loader environment and Cacheon's own identity variables.
"""

from __future__ import annotations

import re
from typing import Any

from cacheon.canonical import digest
from cacheon.evidence.boundary import Malformed, convert
from cacheon.evidence.facts import Facts
from cacheon.evidence.sbom import MEDIA_TYPE as SBOM_MEDIA_TYPE
from cacheon.runtime.identity import identity_digest

RELEASE_DOMAIN = "cacheon.engine-release.v2"
LEGACY_DOMAIN = "cacheon.engine-release.v1"

# Engine flags that would override a pinned field, and the field they would override.
PINNED_ARGS = {
    "--model-path": "model",
    "--model": "model",
    "--tokenizer-path": "model",
    "--revision": "model.revision",
    "--json-model-override-args": "model",
    "--tp-size": "serve.tensor_parallel_size",
    "--tp": "serve.tensor_parallel_size",
    "--tensor-parallel-size": "serve.tensor_parallel_size",
}
# Environment variables that would override what the image and identity pin.
PINNED_ENV = {
    "PATH": "the image's executables",
    "PYTHONPATH": "the image's Python packages",
    "PYTHONHOME": "the image's Python packages",
    "PYTHONSTARTUP": "the image's Python packages",
    "PYTHONUSERBASE": "the image's Python packages",
    "LD_PRELOAD": "the image's libraries",
    "LD_LIBRARY_PATH": "the image's libraries",
}
PINNED_ENV_PREFIXES = {"CACHEON_": "the runtime identity and ledger"}

_TOP_V1 = {"schema", "name", "sglang", "base_image", "runtime_identity", "model", "serve", "artifacts"}
_TOP = {LEGACY_DOMAIN: _TOP_V1, RELEASE_DOMAIN: _TOP_V1 | {"sbom"}}
_SHAPE = {
    "sglang": {"version", "upstream_revision"},
    "runtime_identity": {"digest", "facts"},
    "model": {"id", "revision"},
    "serve": {"tensor_parallel_size", "engine_args", "env_allowlist"},
    "artifact": {"name", "media_type", "sha256", "size"},
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_REVISION = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")
_IMAGE = re.compile(r"[^@\s]+@(sha256:[0-9a-f]{64})")
_MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_artifact_name(name: Any) -> bool:
    """A plain file name: no separators, no dot-dot, so it can never address a path outside ``artifacts/``."""
    return isinstance(name, str) and bool(_NAME.fullmatch(name))


def release_digest(descriptor: dict[str, Any]) -> str:
    """``sha256`` over the descriptor under its own schema string (v1 and v2 never share a digest)."""
    return digest(str(descriptor.get("schema")), descriptor)


def problems(d: Any, schema: str = RELEASE_DOMAIN) -> list[str]:
    """Every way ``d`` is not a valid descriptor of ``schema`` (empty when it is)."""
    if not isinstance(d, dict):
        return ["descriptor is not a JSON object"]
    if d.get("schema") != schema:
        return [f"schema is {str(d.get('schema'))[:80]!r}, expected {schema!r}"]
    found = _shape(d, _TOP[schema])
    if found:
        return found  # field checks below assume the shape
    found += _release_fields(d)
    found += _identity_fields(d)
    found += _serve_fields(d["serve"])
    found += _artifact_fields(d["artifacts"])
    if "sbom" in d:
        found += _sbom_field(d["sbom"], d["artifacts"])
    return found


def _sbom_field(name: Any, artifacts: list[dict[str, Any]]) -> list[str]:
    listed = next((a for a in artifacts if a["name"] == name), None)
    if listed is None:
        return [f"sbom {str(name)[:80]!r} does not name an artifact"]
    if listed["media_type"] != SBOM_MEDIA_TYPE:
        return [f"sbom artifact {name!r} has media type {listed['media_type']!r}, not {SBOM_MEDIA_TYPE}"]
    return []


def _shape(d: dict[str, Any], top: set[str]) -> list[str]:
    found = _keys(d, top, "descriptor")
    if found:
        return found
    for section in ("sglang", "runtime_identity", "model", "serve"):
        if isinstance(d[section], dict):
            found += _keys(d[section], _SHAPE[section], section)
        else:
            found.append(f"{section} must be an object")
    if not isinstance(d["artifacts"], list):
        return [*found, "artifacts must be a list"]
    for index, artifact in enumerate(d["artifacts"]):
        if isinstance(artifact, dict):
            found += _keys(artifact, _SHAPE["artifact"], f"artifacts[{index}]")
        else:
            found.append(f"artifacts[{index}] must be an object")
    return found


def _keys(d: dict[str, Any], expected: set[str], where: str) -> list[str]:
    missing, extra = sorted(expected - d.keys()), sorted(d.keys() - expected)
    return [f"{where} lacks {k!r}" for k in missing] + [f"{where} has unknown field {k!r}" for k in extra]


def _release_fields(d: dict[str, Any]) -> list[str]:
    found = []
    if not isinstance(d["name"], str) or not _NAME.fullmatch(d["name"]):
        found.append(f"name {d['name']!r} must be letters, digits, '.', '_' or '-'")
    if not isinstance(d["sglang"]["version"], str) or not d["sglang"]["version"]:
        found.append("sglang.version must be a non-empty string")
    if not isinstance(d["sglang"]["upstream_revision"], str) or not _REVISION.fullmatch(
        d["sglang"]["upstream_revision"]
    ):
        found.append("sglang.upstream_revision must be a 40-hex commit")
    if not isinstance(d["base_image"], str) or not _IMAGE.fullmatch(d["base_image"]):
        found.append(f"base_image {d['base_image']!r} must be pinned by digest (NAME@sha256:<64 hex>)")
    if not isinstance(d["model"]["id"], str) or not d["model"]["id"]:
        found.append("model.id must be a non-empty string")
    if not isinstance(d["model"]["revision"], str) or not _REVISION.fullmatch(d["model"]["revision"]):
        found.append("model.revision must be a 40-hex commit")
    return found


def _identity_fields(d: dict[str, Any]) -> list[str]:
    """The runtime identity must be the image's own and agree with what the descriptor pins."""
    ident, found = d["runtime_identity"], []
    facts = ident["facts"]
    try:
        convert(facts, Facts, "runtime_identity.facts")
    except Malformed as exc:
        return [f"{exc}: not a captured identity (use `cacheon identity --json`)"]
    if "packages" not in facts:
        return ["runtime_identity.facts lacks 'packages': not a captured identity (use `cacheon identity --json`)"]
    try:
        recomputed = identity_digest(facts)
    except TypeError as exc:
        return [f"runtime_identity.facts is not canonical: {exc}"]
    if ident["digest"] != recomputed:
        found.append(f"runtime_identity.digest {ident['digest']} does not match its facts ({recomputed})")
    if facts["packages"].get("sglang") != d["sglang"]["version"]:
        found.append(
            f"runtime identity runs sglang {facts['packages'].get('sglang')}, the release pins {d['sglang']['version']}"
        )
    revision = facts.get("sglang_revision")
    if revision is not None and revision != d["sglang"]["upstream_revision"]:
        found.append(
            f"runtime identity has upstream revision {revision}, the release pins {d['sglang']['upstream_revision']}"
        )
    image = _IMAGE.fullmatch(d["base_image"]) if isinstance(d["base_image"], str) else None
    if image and facts.get("image_digest") != image.group(1):
        found.append(
            f"runtime identity was captured in image {facts.get('image_digest')}, not the base image "
            f"{image.group(1)} (capture it inside the image with CACHEON_IMAGE_DIGEST set)"
        )
    if facts.get("standins"):
        names = ", ".join(str(s.get("name")) for s in facts["standins"] if isinstance(s, dict))
        found.append(f"runtime identity has import stand-ins ({names}): not an engine image")
    return found


def _serve_fields(serve: dict[str, Any]) -> list[str]:
    found = []
    tp = serve["tensor_parallel_size"]
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        found.append("serve.tensor_parallel_size must be an integer >= 1")
    args = serve["engine_args"]
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        found.append("serve.engine_args must be a list of strings")
    else:
        for arg in args:
            flag = arg.split("=", 1)[0]
            if flag in PINNED_ARGS:
                found.append(f"serve.engine_args: {flag} would override {PINNED_ARGS[flag]}, which the release pins")
    names = serve["env_allowlist"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return [*found, "serve.env_allowlist must be a list of strings"]
    if len(set(names)) != len(names):
        found.append("serve.env_allowlist has duplicates")
    for name in names:
        pinned = PINNED_ENV.get(name) or next(
            (what for prefix, what in PINNED_ENV_PREFIXES.items() if name.startswith(prefix)), None
        )
        if not _ENV_NAME.fullmatch(name):
            found.append(f"serve.env_allowlist: {name!r} is not an environment variable name")
        elif pinned:
            found.append(f"serve.env_allowlist: {name} would override {pinned}, which the release pins")
    return found


def _artifact_fields(artifacts: list[dict[str, Any]]) -> list[str]:
    found = []
    names = [a["name"] for a in artifacts]
    if len(set(map(str, names))) != len(names):
        found.append("artifacts have duplicate names")
    if names != sorted(names, key=str):
        found.append("artifacts are not sorted by name")
    for a in artifacts:
        label = f"artifact {a['name']!r}"
        if not is_artifact_name(a["name"]):
            found.append(f"{label}: name must be letters, digits, '.', '_' or '-' (no paths)")
        if not isinstance(a["media_type"], str) or not _MEDIA_TYPE.fullmatch(a["media_type"]):
            found.append(f"{label}: media_type {a['media_type']!r} is not TYPE/SUBTYPE")
        if not isinstance(a["sha256"], str) or not _SHA256.fullmatch(a["sha256"]):
            found.append(f"{label}: sha256 must be sha256:<64 hex>")
        if not isinstance(a["size"], int) or isinstance(a["size"], bool) or a["size"] < 0:
            found.append(f"{label}: size must be a non-negative integer")
    return found
