"""DSSE envelopes (Dead Simple Signing Envelope, v1) with Ed25519 signatures.

A signature covers the pre-authentication encoding ``PAE(type, body) = "DSSEv1" SP LEN(type) SP
type SP LEN(body) SP body`` (LEN: the byte length in ASCII decimal), never the body alone: a
signature made for one payload type can never be replayed as another (a ledger checkpoint as a
release, say), and no byte of the body can be shifted into the type. One envelope may carry
several signatures, one per key (two under one key id are refused, as securesystemslib refuses
them); only trusted keys count.
The key id is the signer's public key in hex: a hint for messages, never trusted by itself.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from cacheon.canonical import canonical_json
from cacheon.evidence import keys
from cacheon.evidence.boundary import Malformed

MAX_SIGNATURES = 64  # more than any real signing ceremony; bounds the work of a hostile envelope


class Signature(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    keyid: str
    sig: str


class Envelope(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename={"payload_type": "payloadType"}):
    payload: str
    payload_type: str
    signatures: list[Signature]

    def body(self) -> bytes:
        try:
            return base64.b64decode(self.payload, validate=True)
        except (binascii.Error, ValueError):
            raise Malformed("envelope payload is not standard base64") from None

    def to_bytes(self) -> bytes:
        return canonical_json(msgspec.to_builtins(self))


@dataclass(frozen=True)
class SignatureCheck:
    """One signature as the verifier saw it."""

    keyid: str
    trusted: bool  # the key id names a key the verifier trusts
    valid: bool  # it verifies under the key its key id names


def pae(payload_type: str, body: bytes) -> bytes:
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(body), body)


def seal(payload_type: str, body: bytes) -> Envelope:
    """An envelope with no signature yet."""
    return Envelope(base64.b64encode(body).decode("ascii"), payload_type, [])


def add_signature(envelope: Envelope, key: Ed25519PrivateKey) -> Envelope:
    """The envelope with one more signature; a key that already signed is refused."""
    keyid = keys.public_hex(key.public_key())
    if any(s.keyid == keyid and _valid(envelope, s, key.public_key()) for s in envelope.signatures):
        raise ValueError(f"already signed by key {keyid}")
    sig = key.sign(pae(envelope.payload_type, envelope.body()))
    added = Signature(keyid, base64.b64encode(sig).decode("ascii"))
    return Envelope(envelope.payload, envelope.payload_type, [*envelope.signatures, added])


def check_signatures(envelope: Envelope, trusted: Iterable[Ed25519PublicKey]) -> list[SignatureCheck]:
    """Each signature checked under the key its key id names (trusted or not)."""
    if len(envelope.signatures) > MAX_SIGNATURES:
        raise Malformed(f"envelope has {len(envelope.signatures)} signatures, over the limit of {MAX_SIGNATURES}")
    named = [s.keyid.lower() for s in envelope.signatures]
    if len(set(named)) != len(named):  # as securesystemslib refuses it: one signature per key
        raise Malformed("envelope carries two signatures under one key id (a key signs once)")
    trusted_ids = {keys.public_hex(k) for k in trusted}
    checks = []
    for signature in envelope.signatures:
        claimed = _claimed_key(signature.keyid)
        if claimed is None:
            checks.append(SignatureCheck(signature.keyid[:80], trusted=False, valid=False))
            continue
        keyid = keys.public_hex(claimed)
        checks.append(SignatureCheck(keyid, keyid in trusted_ids, _valid(envelope, signature, claimed)))
    return checks


def trusted_signers(checks: Iterable[SignatureCheck]) -> set[str]:
    """Distinct trusted keys with a valid signature: the count a threshold is compared with."""
    return {c.keyid for c in checks if c.trusted and c.valid}


def _claimed_key(keyid: str) -> Ed25519PublicKey | None:
    try:
        raw = bytes.fromhex(keyid)
    except ValueError:
        return None
    return Ed25519PublicKey.from_public_bytes(raw) if len(raw) == 32 else None


def _valid(envelope: Envelope, signature: Signature, key: Ed25519PublicKey) -> bool:
    try:
        raw = base64.b64decode(signature.sig, validate=True)
        key.verify(raw, pae(envelope.payload_type, envelope.body()))
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True
