"""Ed25519 keys for release attestations and ledger checkpoints.

Keys are stored as hex of the raw 32 bytes: the public half is meant to be given to ``--key``
(as the hex itself or the ``.pub`` file; a consumer must get it from somewhere other than the
release directory). The private half is written 0600 with O_EXCL, and refused when others can
read it. A signature's key id is the public key's hex, so a verifier can name who signed.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from cacheon.errors import UsageError

_HEX32 = re.compile(r"[0-9a-f]{64}")


def keygen(prefix: Path) -> tuple[Path, Path]:
    """Write ``PREFIX.key`` (0600) and ``PREFIX.pub``; never overwrite either."""
    key = Ed25519PrivateKey.generate()
    private_path, public_path = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    for path in (private_path, public_path):
        if path.exists():
            raise UsageError(f"{path} exists; refusing to overwrite a key")
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


def _write_new(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        os.fchmod(fh.fileno(), mode)  # exactly this mode, whatever the umask
        fh.write(text)
