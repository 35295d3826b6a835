"""Contribution bundles signed in the OpenSSF model-signing format, so anyone verifies them with its own tool.

The format (a Sigstore bundle holding a DSSE-signed in-toto statement that lists every file's
sha256) and its signer and verifier are the ``model-signing`` package's, used through its public
API; nothing here re-implements them. What Cacheon adds is which bytes are signed and checked:
exactly the bundle's snapshot (read once; never a second read of the user's directory). The
snapshot is written into a private temporary directory and the library signs or verifies that.

Cacheon's check is the library's, made stricter in two documented ways. Every file must be
covered: no path is skipped (the library's default skips ``.git``, ``.github``, ``.gitignore``
and ``.gitattributes``, and honours paths a signer chose to skip; a bundle holding one is refused
at signing, and one the verified statement does not list fails verification), and only the
``files`` method with sha256 matches. And a bundle is read only as its snapshot reads it (one
link per file, bounded sizes, printable names). The signature file is read once, bounded, and
must be a regular file (the library's own reader hangs on a FIFO).
"""

from __future__ import annotations

import base64
import binascii
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from cacheon.bundle.snapshot import Snapshot, materialise
from cacheon.errors import UsageError
from cacheon.evidence import keys
from cacheon.evidence.boundary import Malformed, decode_json, read_bounded
from cacheon.printable import escape_controls

MAX_SIGNATURE_BYTES = 4 << 20  # 512 files' digests, base64 inside JSON, fit in well under 1 MiB
#: what the library's hashing skips by default at a bundle's top level
SKIPPED_BY_FORMAT = frozenset({".git", ".github", ".gitignore", ".gitattributes"})
INSTALL_HINT = "bundle signatures need the model-signing package: pip install 'cacheon[signing]'"
_PROBLEM_CHARS = 400  # the library's mismatch reports quote every digest; one line is enough


class _Resource(msgspec.Struct):
    name: str


class _Predicate(msgspec.Struct):
    resources: list[_Resource]


class _Statement(msgspec.Struct):
    predicate: _Predicate


class _Envelope(msgspec.Struct):
    payload: str


class _SignatureFile(msgspec.Struct, rename="camel"):
    dsse_envelope: _Envelope


@dataclass(frozen=True)
class Verdict:
    """One signature check: ``problem`` is None when the signature covers exactly these bytes."""

    key_id: str
    files: int
    bundle_digest: str | None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "key_id": self.key_id, "files": self.files, "bundle_digest": self.bundle_digest,
                "problem": self.problem, "format": "model-signing"}


def _library() -> Any:
    """The ``model_signing`` package (the ``signing`` extra); a clear one-line error when it is missing."""
    try:
        import model_signing.hashing
        import model_signing.signing
        import model_signing.verifying
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    return model_signing


def _hashing(library: Any) -> Any:
    """One file per resource, sha256, no links, nothing skipped: the same for signing and verifying."""
    return (library.hashing.Config()
            .set_ignored_paths(paths=[], ignore_git_paths=False)
            .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False))


@dataclass(frozen=True)
class Signed:
    data: bytes  # the signature file's bytes
    key_id: str


def sign(snapshot: Snapshot, name: str, private_key: Path) -> Signed:
    """The model-signing signature of ``snapshot``'s bytes by the P-256 key in ``private_key``.

    ``name`` is the statement's subject name (informative in the format; the bundle id). The
    signature is checked against the key's public half before it is returned."""
    library = _library()
    key = keys.load_bundle_private_key(private_key)
    snapshot.require_digest()  # refuses links, special files, ...
    skipped = sorted(rel for rel in snapshot.files if rel.split("/", 1)[0] in SKIPPED_BY_FORMAT)
    if skipped:
        raise UsageError(f"{escape_controls(snapshot.root)}: {escape_controls(skipped[0])} is skipped by "
                         "model-signing's default verifier, so its signature would not cover it; remove or rename it")
    with tempfile.TemporaryDirectory(prefix="cacheon-sign-") as tmp:
        root, signature = Path(tmp) / name, Path(tmp) / "signature.json"
        materialise(snapshot, tuple(snapshot.files), root)
        config = library.signing.Config().set_hashing_config(_hashing(library))
        config.use_elliptic_key_signer(private_key=private_key).sign(root, signature)
        data = signature.read_bytes()
        problem = _check(library, root, signature, keys.public_pem(key.public_key()))
    if problem is not None:  # the file the library read was not the key checked above (replaced meanwhile)
        raise UsageError(f"private key {escape_controls(str(private_key))} changed while signing; nothing written")
    return Signed(data, keys.bundle_key_id(key.public_key()))


def verify(snapshot: Snapshot, signature: Path, public_key: Path) -> Verdict:
    """Whether ``signature`` (a model-signing signature file) is ``public_key``'s over exactly ``snapshot``'s files.

    An unusable key or a missing library is a UsageError; everything about the signature or the
    bytes is a failed verdict."""
    library = _library()
    key = keys.load_bundle_public_key(public_key)
    verdict = Verdict(keys.bundle_key_id(key), len(snapshot.files), snapshot.digest)
    if snapshot.refused:
        rel, rule, message = snapshot.refused[0]
        return _failed(verdict, f"{rel} is refused ({rule}: {message}); a signature covers regular files only")
    try:
        data = read_bounded(signature, MAX_SIGNATURE_BYTES)
    except Malformed as exc:
        return _failed(verdict, f"signature: {exc}")
    with tempfile.TemporaryDirectory(prefix="cacheon-verify-") as tmp:
        root, copy = Path(tmp) / "bundle", Path(tmp) / "signature.json"
        materialise(snapshot, tuple(snapshot.files), root)
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        problem = _check(library, root, copy, keys.public_pem(key))
    if problem is None:
        problem = _uncovered(data, snapshot)
    return verdict if problem is None else _failed(verdict, problem)


def _uncovered(data: bytes, snapshot: Snapshot) -> str | None:
    """The first file of ``snapshot`` the (verified) statement does not list: a signer may have told the
    format to skip paths (its CLI skips ``.git*`` by default), and the library then ignores them."""
    try:
        envelope = decode_json(data, _SignatureFile, "signature", canonical=False).dsse_envelope
        statement = decode_json(base64.b64decode(envelope.payload, validate=True), _Statement, "statement",
                                canonical=False)
    except (Malformed, binascii.Error) as exc:  # the library accepted it, so this is not expected
        return f"signature: {escape_controls(str(exc))}"
    signed = {resource.name for resource in statement.predicate.resources}
    missing = sorted(set(snapshot.files) - signed)
    if missing:
        return f"{escape_controls(missing[0])} is not covered by the signature (its signer skipped it)"
    return None


def _check(library: Any, root: Path, signature: Path, public_pem: bytes) -> str | None:
    """The library's verdict on ``root`` against ``signature`` under the public key ``public_pem``: None
    when it verifies, else its reason in one line."""
    key_file = signature.with_name("key.pub.pem")
    key_file.write_bytes(public_pem)
    config = library.verifying.Config().set_hashing_config(_hashing(library))
    try:
        config.use_elliptic_key_verifier(public_key=key_file).verify(root, signature)
    except Exception as exc:  # any failure of the format's verifier (JSON, protobuf, base64, ECDSA, digests) refuses
        return _one_line(exc)
    return None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if len(text) > _PROBLEM_CHARS:
        text = text[:_PROBLEM_CHARS] + "…"
    return escape_controls(text)


def _failed(verdict: Verdict, problem: str) -> Verdict:
    return Verdict(verdict.key_id, verdict.files, verdict.bundle_digest, problem)
