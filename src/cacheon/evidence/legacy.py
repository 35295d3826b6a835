"""Verifying releases in the format before attestations (``--legacy``): one detached signature.

A legacy release is ``descriptor.json`` (a v1 descriptor, canonical JSON), ``signature.json``
(``algorithm``, ``descriptor_digest``, ``public_key``, ``signature``: Ed25519 over
``cacheon.engine-release.signature.v1\\0`` + the descriptor digest) and ``artifacts/``. It stays
verifiable so that releases already published keep their meaning, but only on request: it has
one signer, no SBOM and no payload-type binding, and nothing new is ever written in it.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from cacheon.errors import UsageError
from cacheon.evidence import keys
from cacheon.evidence.boundary import Malformed, decode_json, read_bounded
from cacheon.evidence.descriptor import LEGACY_DOMAIN, problems, release_digest
from cacheon.evidence.dsse import SignatureCheck
from cacheon.evidence.release import MAX_ENVELOPE_BYTES, Verification, check_artifact, check_tree, listed_artifacts

DESCRIPTOR = "descriptor.json"
SIGNATURE = "signature.json"
SIGNATURE_CONTEXT = b"cacheon.engine-release.signature.v1\x00"


class LegacySignature(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    algorithm: str
    descriptor_digest: str
    public_key: str
    signature: str


def verify(release_dir: Path, public_key: Ed25519PublicKey) -> Verification:
    """The descriptor, every artifact byte, and the one signature under the supplied key."""
    if not release_dir.is_dir():
        raise UsageError(f"{release_dir} is not a release directory")
    result = Verification(release_dir, format="legacy")
    try:
        descriptor = decode_json(
            read_bounded(release_dir / DESCRIPTOR, MAX_ENVELOPE_BYTES), dict, DESCRIPTOR, canonical=True
        )
        signature = decode_json(
            read_bounded(release_dir / SIGNATURE, MAX_ENVELOPE_BYTES), LegacySignature, SIGNATURE, canonical=True
        )
    except Malformed as exc:
        result.problems.append(str(exc))
        return result
    result.problems += [f"{DESCRIPTOR}: {p}" for p in problems(descriptor, LEGACY_DOMAIN)]
    listed = listed_artifacts(descriptor)
    check_tree(release_dir, {DESCRIPTOR, SIGNATURE}, listed, result)
    for name, artifact in sorted(listed.items()):
        check_artifact(release_dir / "artifacts" / name, artifact, result)
    if result.problems:
        return result
    result.release_digest = release_digest(descriptor)
    supplied = keys.public_hex(public_key)
    valid = signature.algorithm == "ed25519" and _valid(public_key, result.release_digest, signature.signature)
    result.signatures = [SignatureCheck(signature.public_key[:80], signature.public_key == supplied, valid)]
    if signature.descriptor_digest != result.release_digest:
        result.problems.append(
            f"{SIGNATURE} covers descriptor {signature.descriptor_digest[:80]}, but {DESCRIPTOR} hashes to "
            f"{result.release_digest} (descriptor changed after signing, or another release's signature)"
        )
    elif not valid:
        if signature.public_key != supplied:
            result.problems.append(f"wrong key: signed by {signature.public_key[:80]}, supplied {supplied}")
        else:
            result.problems.append("signature does not verify under the supplied key (altered or swapped signature)")
    return result


def _valid(key: Ed25519PublicKey, descriptor_digest: str, signature_hex: str) -> bool:
    try:
        key.verify(bytes.fromhex(signature_hex), SIGNATURE_CONTEXT + descriptor_digest.encode("ascii"))
    except (InvalidSignature, ValueError):
        return False
    return True
