"""Ed25519 keys for release attestations and ledger checkpoints; EC P-256 keys for bundle signatures.

Release keys are stored as hex of the raw 32 bytes: the public half is meant to be given to ``--key``
(as the hex itself or the ``.pub`` file; a consumer must get it from somewhere other than the
release directory). A signature's key id is the public key's hex, so a verifier can name who signed.

Bundle keys are PEM (PKCS#8 private, SubjectPublicKeyInfo public) on NIST P-256: the one curve
family the OpenSSF model-signing format's key method verifies, so that its own tool reads them
too; their key id is the format's, the sha256 of the public PEM. Either private half is written
0600 with O_EXCL, never over an existing file, and refused when others can read it.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)

from cacheon.errors import UsageError
from cacheon.evidence.boundary import Malformed, open_regular
from cacheon.printable import escape_controls

_HEX32 = re.compile(r"[0-9a-f]{64}")


def keygen(prefix: Path) -> tuple[Path, Path]:
    """Write ``PREFIX.key`` (0600) and ``PREFIX.pub``; never overwrite either."""
    key = Ed25519PrivateKey.generate()
    private_path, public_path = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    _refuse_existing(private_path, public_path)
    raw = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    _write_new(private_path, raw.hex() + "\n", 0o600)
    _write_new(public_path, public_hex(key.public_key()) + "\n", 0o644)
    return private_path, public_path


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read private key {path}: {exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(f"private key {path} is accessible by others (mode {stat.S_IMODE(mode):o}); chmod 600 it")
    if not _HEX32.fullmatch(text):
        raise UsageError(f"{path} is not a Cacheon Ed25519 private key (64 hex characters)")
    return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(text))


def parse_public_key(text: str) -> Ed25519PublicKey:
    """A public key given as 64 hex characters, or as the path of a ``.pub`` file holding them."""
    value = text.strip().lower()
    if not _HEX32.fullmatch(value):
        path = Path(text)
        if not path.is_file():
            raise UsageError(
                f"public key {text[:80]!r} is neither 64 hex characters nor a .pub file from `release keygen`"
            )
        try:
            value = path.read_text(encoding="ascii").strip().lower()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read public key {path}: {exc}") from None
        if not _HEX32.fullmatch(value):
            raise UsageError(f"{path} is not a Cacheon Ed25519 public key (64 hex characters)")
    return Ed25519PublicKey.from_public_bytes(bytes.fromhex(value))


def public_hex(key: Ed25519PublicKey) -> str:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


MAX_PEM_BYTES = 16 * 1024  # a P-256 PEM is about 250 bytes


def bundle_keygen(prefix: Path) -> tuple[Path, Path]:
    """Write ``PREFIX.pem`` (the P-256 private key, 0600) and ``PREFIX.pub.pem``; never overwrite either."""
    key = ec.generate_private_key(ec.SECP256R1())
    private_path, public_path = Path(f"{prefix}.pem"), Path(f"{prefix}.pub.pem")
    _refuse_existing(private_path, public_path)
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    _write_new(private_path, pem.decode("ascii"), 0o600)
    _write_new(public_path, public_pem(key.public_key()).decode("ascii"), 0o644)
    return private_path, public_path


def load_bundle_private_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """The P-256 private key in the PEM file ``path``, which must be a regular file only its owner can read."""
    raw, mode = _read_pem(path, "private key")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(f"private key {_shown(path)} is accessible by others (mode {stat.S_IMODE(mode):o}); "
                         "chmod 600 it")
    try:
        key = load_pem_private_key(raw, password=None)
    except (ValueError, TypeError) as exc:  # TypeError: an encrypted key and no password
        raise UsageError(f"{_shown(path)} is not an unencrypted PEM private key ({_first(exc)})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise UsageError(f"{_shown(path)} is not an EC P-256 key (make one with `cacheon bundle keygen`)")
    return key


def load_bundle_public_key(path: Path) -> ec.EllipticCurvePublicKey:
    """The P-256 public key in the PEM file ``path`` (SubjectPublicKeyInfo, as `bundle keygen` writes it)."""
    raw, _ = _read_pem(path, "public key")
    try:
        key = load_pem_public_key(raw)
    except ValueError as exc:
        raise UsageError(f"{_shown(path)} is not a PEM public key ({_first(exc)})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise UsageError(f"{_shown(path)} is not an EC P-256 public key (make one with `cacheon bundle keygen`)")
    return key


def public_pem(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)


def bundle_key_id(key: ec.EllipticCurvePublicKey) -> str:
    """The model-signing format's key hint: sha256 of the public key's PEM, in hex."""
    return hashlib.sha256(public_pem(key)).hexdigest()


def _read_pem(path: Path, what: str) -> tuple[bytes, int]:
    """The bytes and mode of a key file: a regular file (never a FIFO, directory or link), bounded."""
    try:
        fd = open_regular(path)
    except Malformed as exc:
        raise UsageError(f"{what}: {exc}") from None
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        raw = fh.read(MAX_PEM_BYTES + 1)
    if len(raw) > MAX_PEM_BYTES:
        raise UsageError(f"{what} {_shown(path)} is over {MAX_PEM_BYTES} bytes; not a PEM key")
    return raw, mode


def _shown(path: Path) -> str:
    return escape_controls(str(path))


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return escape_controls(text.splitlines()[0]) if text else type(exc).__name__


def _refuse_existing(*paths: Path) -> None:
    for path in paths:
        if path.exists() or path.is_symlink():
            raise UsageError(f"{path} exists; refusing to overwrite a key")


def _write_new(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        os.fchmod(fh.fileno(), mode)  # exactly this mode, whatever the umask
        fh.write(text)
