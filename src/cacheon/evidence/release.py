"""Engine releases as signed attestations: build from a spec, sign (once per key), verify every byte.

A release directory holds exactly ``release.dsse.json`` and ``artifacts/<name>`` for each
artifact. The envelope's payload is an in-toto Statement v1 whose subjects are the artifacts'
sha256 digests (the CycloneDX SBOM of the image's Python environment among them) and whose
predicate is the Engine release descriptor. Each signer adds one Ed25519 signature over the
DSSE pre-authentication encoding. Verification trusts nothing in the directory: the envelope is
read bounded, canonical and typed; the statement must agree with its predicate; every artifact
is re-hashed; the SBOM must agree with the runtime identity; any unlisted file fails; and the
signatures must come from at least ``threshold`` distinct keys the consumer supplies.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from cacheon.canonical import canonical_json
from cacheon.errors import UsageError
from cacheon.evidence import dsse, keys, sbom
from cacheon.evidence.boundary import Malformed, decode_json, is_regular, read_bounded, replace_file, sha256_regular
from cacheon.evidence.descriptor import RELEASE_DOMAIN, is_artifact_name, problems, release_digest
from cacheon.printable import escape_controls
from cacheon.runtime.identity import identity_from_facts

ENVELOPE = "release.dsse.json"
ARTIFACTS = "artifacts"
LEGACY_FILES = ("descriptor.json", "signature.json")
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PREDICATE_TYPE = "https://cacheon.dev/attestation/engine-release/v2"
MAX_ENVELOPE_BYTES = 4 * 1024 * 1024  # a descriptor with a full identity is a few KiB
_SPEC_KEYS = {"name", "sglang_version", "upstream_revision", "base_image", "runtime_identity", "model", "serve", "sbom"}


class Subject(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    digest: dict[str, str]


class Statement(
    msgspec.Struct,
    frozen=True,
    forbid_unknown_fields=True,
    rename={"type": "_type", "predicate_type": "predicateType"},
):
    type: str
    subject: list[Subject]
    predicate_type: str
    predicate: dict[str, Any]  # the descriptor; :func:`descriptor.problems` is its one validator


@dataclass
class Verification:
    release_dir: Path
    format: str = "attestation"
    release_digest: str | None = None
    statement_digest: str | None = None
    threshold: int = 1
    signatures: list[dsse.SignatureCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def signers(self) -> list[str]:
        return sorted(dsse.trusted_signers(self.signatures))

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "release": str(self.release_dir),
            "format": self.format,
            "digest": self.release_digest,
            "statement_digest": self.statement_digest,
            "threshold": self.threshold,
            "trusted_signers": self.signers,
            "signatures": [{"keyid": s.keyid, "trusted": s.trusted, "valid": s.valid} for s in self.signatures],
            "ok": self.ok,
            "problems": self.problems,
        }


@dataclass(frozen=True)
class Built:
    release_dir: Path
    digest: str
    statement_digest: str
    subjects: list[str]


# -- build -------------------------------------------------------------------------------------


def build(spec_path: Path, out: Path) -> Built:
    """Copy the artifacts and the SBOM into a new ``out`` and write the unsigned envelope."""
    spec = _load_spec(spec_path)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} exists and is not empty: a release is never edited in place; build a new one")
    base = spec_path.parent
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".cacheon-release-", dir=out.parent))  # same filesystem: rename
    try:
        (staging / ARTIFACTS).mkdir()
        entries = [
            *spec.get("artifacts", []),
            {"path": spec["sbom"], "media_type": sbom.MEDIA_TYPE, "name": sbom.FILE_NAME},
        ]
        artifacts = [_copy_artifact(base, entry, staging / ARTIFACTS) for entry in entries]
        descriptor = {
            "schema": RELEASE_DOMAIN,
            "name": spec["name"],
            "sglang": {"version": spec["sglang_version"], "upstream_revision": spec["upstream_revision"]},
            "base_image": spec["base_image"],
            "runtime_identity": _load_identity(base / str(spec["runtime_identity"])),
            "model": spec["model"],
            "serve": {"engine_args": [], "env_allowlist": [], **spec["serve"]},
            "artifacts": sorted(artifacts, key=lambda a: str(a["name"])),
            "sbom": sbom.FILE_NAME,
        }
        found = problems(descriptor) or _sbom_problems(staging, descriptor)
        if found:
            raise UsageError(f"{spec_path}: " + "; ".join(found))
        statement = _statement(descriptor)
        (staging / ENVELOPE).write_bytes(dsse.seal(PAYLOAD_TYPE, statement).to_bytes())
        if out.exists():
            out.rmdir()  # empty, checked above
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    subjects = [f"{ARTIFACTS}/{a['name']}" for a in descriptor["artifacts"]]
    return Built(out, release_digest(descriptor), _sha256(statement), subjects)


def _statement(descriptor: dict[str, Any]) -> bytes:
    return canonical_json(
        {
            "_type": STATEMENT_TYPE,
            "subject": _subjects(descriptor["artifacts"]),
            "predicateType": PREDICATE_TYPE,
            "predicate": descriptor,
        }
    )


def _subjects(artifacts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"name": f"{ARTIFACTS}/{a['name']}", "digest": {"sha256": str(a["sha256"]).removeprefix("sha256:")}}
        for a in artifacts
    ]


def _load_spec(path: Path) -> dict[str, Any]:
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read release spec {path}: {exc}") from None
    missing = sorted(_SPEC_KEYS - spec.keys())
    unknown = sorted(spec.keys() - _SPEC_KEYS - {"artifacts"})
    if missing or unknown:
        hint = (
            " (capture one inside the image: `cacheon release sbom --out sbom.cdx.json`)" if "sbom" in missing else ""
        )
        raise UsageError(
            f"{path}: "
            + "; ".join([f"missing {k!r}" for k in missing] + [f"unknown field {k!r}" for k in unknown])
            + hint
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
        raise UsageError(f"cannot read runtime identity {path} (from `cacheon identity --json`): {exc}") from None
    if captured.get("digest") != identity.digest:
        raise UsageError(f"{path}: digest {captured.get('digest')} does not match its facts ({identity.digest})")
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
    return {"name": name, "media_type": entry["media_type"], "sha256": "sha256:" + sha.hexdigest(), "size": size}


# -- sign --------------------------------------------------------------------------------------


def sign(release_dir: Path, key_path: Path) -> Verification:
    """Add this key's signature; refuses a release whose content does not verify, or a second signature
    by the same key. Other signers' signatures are kept as they are."""
    key = keys.load_private_key(key_path)
    check = verify_content(release_dir)
    if not check.ok or check.envelope is None:
        shown = "; ".join(escape_controls(p) for p in check.result.problems)  # values from the release
        raise UsageError(f"refusing to sign {escape_controls(str(release_dir))}: {shown}")
    try:
        signed = dsse.add_signature(check.envelope, key)
    except ValueError as exc:
        raise UsageError(f"{release_dir} is {exc}: a key signs a release once") from None
    replace_file(release_dir / ENVELOPE, signed.to_bytes())
    return verify(release_dir, [key.public_key()], threshold=1)


# -- verify ------------------------------------------------------------------------------------


@dataclass
class _Content:
    result: Verification
    envelope: dsse.Envelope | None = None

    @property
    def ok(self) -> bool:
        return self.result.ok


def verify(release_dir: Path, trusted: Sequence[Ed25519PublicKey], *, threshold: int = 1) -> Verification:
    """At least ``threshold`` distinct trusted signers first, then the content (statement, artifacts, SBOM,
    tree): nothing a signature does not vouch for is parsed, so an unsigned statement costs one bounded
    read of the envelope however large or hostile what it names."""
    distinct = {keys.public_hex(k) for k in trusted}
    if threshold < 1:
        raise UsageError("--threshold must be at least 1")
    if threshold > len(distinct):
        raise UsageError(
            f"--threshold {threshold} needs at least {threshold} distinct trusted keys; {len(distinct)} given"
        )
    _refuse_legacy(release_dir)
    result = Verification(release_dir, threshold=threshold)
    try:
        envelope = _read_envelope(release_dir / ENVELOPE)
        result.signatures = dsse.check_signatures(envelope, trusted)
    except Malformed as exc:
        result.problems.append(str(exc))
        return result
    if not result.signatures:
        result.problems.append(f"the release is not signed (no signature in {ENVELOPE})")
    elif len(result.signers) < threshold:
        seen = "; ".join(_describe(s) for s in result.signatures)
        result.problems.append(
            f"threshold not met: {len(result.signers)} of {threshold} required trusted keys signed ({seen})"
        )
    if result.problems:
        result.problems.append("the statement was not read: nothing a trusted signature does not vouch for is parsed")
        return result
    _check_content(release_dir, envelope, result)
    return result


def _describe(check: dsse.SignatureCheck) -> str:
    who = f"key {check.keyid[:16]}…"
    if check.valid and not check.trusted:
        return f"{who} valid, not a trusted key"
    if check.trusted and not check.valid:
        return (
            f"{who} trusted, but the signature does not verify (the statement changed after signing, "
            "or the signature was altered or copied from another release)"
        )
    if check.trusted:
        return f"{who} trusted and valid"
    return f"{who} invalid and not trusted"


def verify_content(release_dir: Path) -> _Content:
    """Everything but the signatures (what a signer checks before adding one)."""
    _refuse_legacy(release_dir)
    result = Verification(release_dir)
    try:
        envelope = _read_envelope(release_dir / ENVELOPE)
    except Malformed as exc:
        result.problems.append(str(exc))
        check_tree(release_dir, {ENVELOPE}, {}, result)
        return _Content(result)
    _check_content(release_dir, envelope, result)
    return _Content(result, envelope)


def _refuse_legacy(release_dir: Path) -> None:
    if not release_dir.is_dir():
        raise UsageError(f"{escape_controls(str(release_dir))} is not a release directory")
    if not (release_dir / ENVELOPE).exists() and all((release_dir / f).exists() for f in LEGACY_FILES):
        raise UsageError(
            f"{escape_controls(str(release_dir))} is a legacy release (descriptor.json + signature.json, no "
            "attestation): verify it with `release verify --legacy --key PUB`, or rebuild and re-sign it as an "
            "attestation (`cacheon release build --spec … --out NEW` then `cacheon release sign NEW --key …`)"
        )


def _check_content(release_dir: Path, envelope: dsse.Envelope, result: Verification) -> None:
    try:
        statement = _read_statement(envelope)
    except Malformed as exc:
        result.problems.append(str(exc))
        check_tree(release_dir, {ENVELOPE}, {}, result)
        return
    result.statement_digest = _sha256(envelope.body())
    descriptor = statement.predicate
    result.problems += [f"predicate: {p}" for p in problems(descriptor)]
    listed = listed_artifacts(descriptor)
    if not result.problems:
        result.release_digest = release_digest(descriptor)
        wanted = _subjects(descriptor["artifacts"])
        if msgspec.to_builtins(statement.subject) != wanted:
            result.problems.append("the statement's subjects are not the descriptor's artifacts (name and sha256 each)")
    check_tree(release_dir, {ENVELOPE}, listed, result)
    for name, artifact in sorted(listed.items()):
        check_artifact(release_dir / ARTIFACTS / name, artifact, result)
    if not result.problems:
        result.problems += _sbom_problems(release_dir, descriptor)


def _read_envelope(path: Path) -> dsse.Envelope:
    envelope = decode_json(read_bounded(path, MAX_ENVELOPE_BYTES), dsse.Envelope, path.name, canonical=True)
    if envelope.payload_type != PAYLOAD_TYPE:
        raise Malformed(f"{path.name}: payload type {envelope.payload_type[:80]!r}, expected {PAYLOAD_TYPE!r}")
    return envelope


def _read_statement(envelope: dsse.Envelope) -> Statement:
    statement = decode_json(envelope.body(), Statement, "statement", canonical=True)
    if statement.type != STATEMENT_TYPE:
        raise Malformed(f"statement _type {statement.type[:80]!r}, expected {STATEMENT_TYPE!r}")
    if statement.predicate_type != PREDICATE_TYPE:
        raise Malformed(f"statement predicateType {statement.predicate_type[:80]!r}, expected {PREDICATE_TYPE!r}")
    return statement


def _sbom_problems(release_dir: Path, descriptor: dict[str, Any]) -> list[str]:
    """The SBOM must be CycloneDX and agree with the runtime identity on every pinned package."""
    try:
        packages = sbom.read(release_dir / ARTIFACTS / str(descriptor["sbom"]))
    except Malformed as exc:
        return [str(exc)]
    return sbom.identity_mismatches(packages, descriptor["runtime_identity"]["facts"])


def listed_artifacts(descriptor: Any) -> dict[str, dict[str, Any]]:
    """Artifacts to check even when other fields are invalid; unsafe names are never opened."""
    artifacts = descriptor.get("artifacts") if isinstance(descriptor, dict) else None
    if not isinstance(artifacts, list):
        return {}
    return {a["name"]: a for a in artifacts if isinstance(a, dict) and is_artifact_name(a.get("name"))}


def check_tree(release_dir: Path, expected_files: set[str], listed: dict[str, Any], result: Verification) -> None:
    """The listing is exactly the expected set: ``artifacts`` a real directory, every other entry a
    regular file (no symlink, directory, FIFO, socket or device in place of one), none missing, none extra."""
    expected = {*expected_files, ARTIFACTS, *(f"{ARTIFACTS}/{name}" for name in listed)}
    for root, dirs, files in os.walk(release_dir):
        for entry in sorted(dirs + files):
            path = Path(root) / entry
            rel = path.relative_to(release_dir).as_posix()
            shown = escape_controls(rel)
            if path.is_symlink():
                result.problems.append(f"{shown} is a symlink (releases hold plain files only)")
            elif rel not in expected:
                kind = "directory" if path.is_dir() else "file"
                result.problems.append(f"extra {kind} {shown} not in the descriptor")
            elif rel == ARTIFACTS:
                if not path.is_dir():
                    result.problems.append(f"{ARTIFACTS} is not a directory")
            elif not is_regular(path):
                result.problems.append(f"{shown} is not a regular file (releases hold plain files only)")
    for rel in sorted(expected - expected_files):
        if not os.path.lexists(release_dir / rel):
            result.problems.append(f"missing {escape_controls(rel)}")


def check_artifact(path: Path, artifact: dict[str, Any], result: Verification) -> None:
    """Size first (a file of the wrong size is never read), then every byte, through the one
    non-blocking regular-file open (a FIFO or directory here is refused, never read)."""
    name = artifact["name"]
    size = artifact.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return  # reported by the descriptor's validator
    try:
        actual = sha256_regular(path, size)
    except Malformed as exc:
        result.problems.append(f"artifact {exc}")
        return
    if actual != artifact.get("sha256"):
        shown = escape_controls(str(artifact.get("sha256"))[:80])
        result.problems.append(f"artifact {name}: {actual}, the descriptor says {shown}")


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
