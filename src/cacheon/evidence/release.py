"""Engine release directories: build from a spec, sign once, verify every byte.

A release directory holds exactly ``descriptor.json`` (canonical JSON), ``signature.json`` once
signed, and ``artifacts/<name>`` for each artifact the descriptor lists. Verification trusts
nothing in the directory: the descriptor digest is recomputed, the signature is checked against
a key the consumer supplies, every artifact is re-hashed, and any file the descriptor does not
name is a failure. There is no in-place edit: a changed release is a new release.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cacheon.canonical import canonical_json
from cacheon.errors import UsageError
from cacheon.evidence import keys
from cacheon.evidence.descriptor import RELEASE_DOMAIN, is_artifact_name, problems, release_digest
from cacheon.runtime.identity import identity_from_facts

DESCRIPTOR = "descriptor.json"
SIGNATURE = "signature.json"
ARTIFACTS = "artifacts"
_SPEC_KEYS = {
    "name",
    "sglang_version",
    "upstream_revision",
    "base_image",
    "runtime_identity",
    "model",
    "serve",
}
_SIGNATURE_KEYS = {"algorithm", "descriptor_digest", "public_key", "signature"}


@dataclass
class Verification:
    release_dir: Path
    release_digest: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "release": str(self.release_dir),
            "digest": self.release_digest,
            "ok": self.ok,
            "problems": self.problems,
        }


# -- build -------------------------------------------------------------------------------------


def build(spec_path: Path, out: Path) -> str:
    """Copy the artifacts into a new ``out`` and write the descriptor; returns the release digest."""
    spec = _load_spec(spec_path)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(
            f"{out} exists and is not empty: a release is never edited in place; build a new one"
        )
    base = spec_path.parent
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".cacheon-release-", dir=out.parent))  # same filesystem: rename
    try:
        (staging / ARTIFACTS).mkdir()
        artifacts = [_copy_artifact(base, entry, staging / ARTIFACTS) for entry in spec.get("artifacts", [])]
        descriptor = {
            "schema": RELEASE_DOMAIN,
            "name": spec["name"],
            "sglang": {"version": spec["sglang_version"], "upstream_revision": spec["upstream_revision"]},
            "base_image": spec["base_image"],
            "runtime_identity": _load_identity(base / str(spec["runtime_identity"])),
            "model": spec["model"],
            "serve": {"engine_args": [], "env_allowlist": [], **spec["serve"]},
            "artifacts": sorted(artifacts, key=lambda a: str(a["name"])),
        }
        found = problems(descriptor)
        if found:
            raise UsageError(f"{spec_path}: " + "; ".join(found))
        (staging / DESCRIPTOR).write_bytes(canonical_json(descriptor))
        if out.exists():
            out.rmdir()  # empty, checked above
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return release_digest(descriptor)


def _load_spec(path: Path) -> dict[str, Any]:
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read release spec {path}: {exc}") from None
    missing = sorted(_SPEC_KEYS - spec.keys())
    unknown = sorted(spec.keys() - _SPEC_KEYS - {"artifacts"})
    if missing or unknown:
        raise UsageError(
            f"{path}: "
            + "; ".join([f"missing {k!r}" for k in missing] + [f"unknown field {k!r}" for k in unknown])
        )
    if not isinstance(spec["serve"], dict) or not isinstance(spec.get("artifacts", []), list):
        raise UsageError(f"{path}: [serve] must be a table and [[artifacts]] an array of tables")
    return spec


def _load_identity(path: Path) -> dict[str, Any]:
    """The output of ``cacheon identity --json`` captured inside the image; its digest is recomputed."""
    try:
        captured = json.loads(path.read_text(encoding="utf-8"))
        identity = identity_from_facts(captured["facts"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"cannot read runtime identity {path} (from `cacheon identity --json`): {exc}"
        ) from None
    if captured.get("digest") != identity.digest:
        raise UsageError(
            f"{path}: digest {captured.get('digest')} does not match its facts ({identity.digest})"
        )
    return identity.to_json()


def _copy_artifact(base: Path, entry: Any, into: Path) -> dict[str, Any]:
    """Copy one artifact, hashing the bytes written (what is hashed is what ships)."""
    if (
        not isinstance(entry, dict)
        or not {"path", "media_type"} <= entry.keys()
        or entry.keys() - {"path", "media_type", "name"}
    ):
        raise UsageError(f"artifact entry {entry!r} needs path and media_type (and optionally name)")
    source = base / str(entry["path"])
    name = str(entry.get("name", source.name))
    if "/" in name or name in {"", ".", ".."}:
        raise UsageError(f"artifact name {name!r} must be a plain file name")
    target = into / name
    if target.exists():
        raise UsageError(f"two artifacts are named {name!r}")
    sha, size = hashlib.sha256(), 0
    try:
        with source.open("rb") as src, target.open("xb") as dst:
            while chunk := src.read(1 << 20):
                sha.update(chunk)
                dst.write(chunk)
                size += len(chunk)
    except OSError as exc:
        raise UsageError(f"cannot copy artifact {source}: {exc}") from None
    return {
        "name": name,
        "media_type": entry["media_type"],
        "sha256": "sha256:" + sha.hexdigest(),
        "size": size,
    }


# -- sign --------------------------------------------------------------------------------------


def sign(release_dir: Path, key_path: Path) -> str:
    """Sign a release once; refuses a release that does not verify on content or is already signed."""
    if (release_dir / SIGNATURE).exists():
        raise UsageError(
            f"{release_dir} is already signed: upgrading means a new release, not a new signature"
        )
    check = verify_content(release_dir, signed=False)
    if not check.ok or check.release_digest is None:
        raise UsageError(f"refusing to sign {release_dir}: " + "; ".join(check.problems))
    key = keys.load_private_key(key_path)
    signature = {
        "algorithm": "ed25519",
        "descriptor_digest": check.release_digest,
        "public_key": keys.public_hex(key.public_key()),
        "signature": keys.sign_digest(key, check.release_digest),
    }
    with (release_dir / SIGNATURE).open("xb") as fh:
        fh.write(canonical_json(signature))
    return check.release_digest


# -- verify ------------------------------------------------------------------------------------


def verify(release_dir: Path, public_key_hex: str) -> Verification:
    """Descriptor, signature (against the supplied key) and every artifact byte."""
    public_key = keys.parse_public_key(public_key_hex)
    result = verify_content(release_dir, signed=True)
    if result.release_digest is None:
        return result
    signature = _read_canonical(release_dir / SIGNATURE, result, "the release is not signed")
    if signature is None:
        return result
    if not isinstance(signature, dict) or signature.keys() != _SIGNATURE_KEYS:
        result.problems.append(f"{SIGNATURE} must have exactly the fields {sorted(_SIGNATURE_KEYS)}")
    elif signature["algorithm"] != "ed25519":
        result.problems.append(f"{SIGNATURE}: unsupported algorithm {signature['algorithm']!r}")
    elif signature["descriptor_digest"] != result.release_digest:
        result.problems.append(
            f"{SIGNATURE} covers descriptor {signature['descriptor_digest']}, but {DESCRIPTOR} hashes to "
            f"{result.release_digest} (descriptor changed after signing, or another release's signature)"
        )
    elif not keys.signature_valid(public_key, result.release_digest, str(signature["signature"])):
        supplied = keys.public_hex(public_key)
        if signature["public_key"] != supplied:
            result.problems.append(f"wrong key: signed by {signature['public_key']}, supplied {supplied}")
        else:
            result.problems.append(
                "signature does not verify under the supplied key (altered or swapped signature)"
            )
    return result


def verify_content(release_dir: Path, *, signed: bool) -> Verification:
    """Everything but the signature: the descriptor, the artifact bytes, and no unlisted file."""
    if not release_dir.is_dir():
        raise UsageError(f"{release_dir} is not a release directory")
    result = Verification(release_dir)
    descriptor = _read_canonical(release_dir / DESCRIPTOR, result, "not a release")
    if descriptor is None:
        return result
    try:
        result.release_digest = release_digest(descriptor)
    except TypeError as exc:
        result.problems.append(f"{DESCRIPTOR} is not canonical: {exc}")
        return result
    result.problems += [f"{DESCRIPTOR}: {p}" for p in problems(descriptor)]
    listed = _listed_artifacts(descriptor)
    _check_tree(release_dir, listed, signed, result)
    for name, artifact in sorted(listed.items()):
        _check_artifact(release_dir / ARTIFACTS / name, artifact, result)
    return result


def _listed_artifacts(descriptor: Any) -> dict[str, dict[str, Any]]:
    """Artifacts to check even when other fields are invalid; unsafe names are never opened."""
    artifacts = descriptor.get("artifacts") if isinstance(descriptor, dict) else None
    if not isinstance(artifacts, list):
        return {}
    return {a["name"]: a for a in artifacts if isinstance(a, dict) and is_artifact_name(a.get("name"))}


def _read_canonical(path: Path, result: Verification, if_missing: str) -> Any:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        result.problems.append(f"missing {path.name} ({if_missing})")
        return None
    try:
        value = json.loads(raw)
        canonical = canonical_json(value)
    except (ValueError, TypeError) as exc:
        result.problems.append(f"{path.name} is not canonical JSON: {exc}")
        return None
    if raw != canonical:
        result.problems.append(f"{path.name} bytes are not its canonical form (the file was edited)")
    return value


def _check_tree(release_dir: Path, listed: dict[str, Any], signed: bool, result: Verification) -> None:
    """No symlinks, no unlisted files or directories, nothing missing."""
    expected = {DESCRIPTOR, ARTIFACTS, *(f"{ARTIFACTS}/{name}" for name in listed)}
    if signed:
        expected.add(SIGNATURE)
    for root, dirs, files in os.walk(release_dir):
        for entry in sorted(dirs + files):
            path = Path(root) / entry
            rel = path.relative_to(release_dir).as_posix()
            if path.is_symlink():
                result.problems.append(f"{rel} is a symlink (releases hold plain files only)")
            elif rel not in expected:
                result.problems.append(
                    f"extra {'directory' if path.is_dir() else 'file'} {rel} not in the descriptor"
                )
    for rel in sorted(expected - {SIGNATURE}):
        if not (release_dir / rel).exists():
            result.problems.append(f"missing {rel}")


def _check_artifact(path: Path, artifact: dict[str, Any], result: Verification) -> None:
    if not path.is_file() or path.is_symlink():
        return  # reported by _check_tree
    sha, size = hashlib.sha256(), 0
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            sha.update(chunk)
            size += len(chunk)
    name = artifact["name"]
    if size != artifact.get("size"):
        result.problems.append(f"artifact {name}: {size} bytes, the descriptor says {artifact.get('size')}")
    if "sha256:" + sha.hexdigest() != artifact.get("sha256"):
        result.problems.append(
            f"artifact {name}: sha256:{sha.hexdigest()}, the descriptor says {artifact.get('sha256')}"
        )
