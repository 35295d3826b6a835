"""Signed ledger checkpoints: a head the verifier already knows, so a rewritten history shows.

The hash chain proves a ledger is internally consistent, not that it is the ledger that was
written: whoever can write the file can cut off its tail, or rewrite it and recompute every hash.
A checkpoint is the chain head (ledger id, record number, record hash) signed with an Ed25519 key
in a DSSE envelope of its own payload type. A verifier that holds the public key and a checkpoint
checks that the ledger still holds that record with that hash: the prefix up to it is then
exactly what was signed (each hash covers its predecessor), so a rewrite or truncation of it fails.

Checkpoints live outside the ledger file (by default beside it, ``LEDGER.checkpoint.json``;
``--out``/``--checkpoint`` to keep one elsewhere). A checkpoint inside the file would be replaced
with it; one outside can be copied where the ledger's writers cannot reach (a release, a
repository, another host). A forger who can write both can still delete the checkpoint (a
verifier holding a key then fails: it requires one) or roll it back to an older one (only the
records up to that older head are then protected). Records after the newest checkpoint are
protected by the chain alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from cacheon.canonical import canonical_json
from cacheon.errors import UsageError
from cacheon.evidence import dsse
from cacheon.evidence.boundary import Malformed, decode_json, read_bounded, replace_file
from cacheon.evidence.chain import Head
from cacheon.evidence.view import VerifiedLedger
from cacheon.printable import escape_controls

PAYLOAD_TYPE = "application/vnd.cacheon.ledger-checkpoint.v1+json"
SCHEMA = "cacheon.ledger-checkpoint.v1"
MAX_BYTES = 64 * 1024  # a checkpoint is a few hundred bytes; anything near this is not one
_HEAD = re.compile(r"(\d{1,18}):(sha256:[0-9a-f]{64})")


class Checkpoint(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    schema: str
    ledger: str
    seq: int
    head: str
    signed_at: str


@dataclass(frozen=True)
class Vouched:
    """A checkpoint whose signature a trusted key made."""

    checkpoint: Checkpoint
    signers: tuple[str, ...]


def default_path(ledger_path: Path) -> Path:
    return ledger_path.with_name(ledger_path.name + ".checkpoint.json")


def sign(view: VerifiedLedger, key: Ed25519PrivateKey) -> dsse.Envelope:
    payload = Checkpoint(
        SCHEMA,
        view.header.ledger_id,
        view.head.seq,
        view.head.hash,
        datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    return dsse.add_signature(dsse.seal(PAYLOAD_TYPE, canonical_json(msgspec.to_builtins(payload))), key)


def write(path: Path, envelope: dsse.Envelope) -> None:
    replace_file(path, envelope.to_bytes())


def read(path: Path) -> tuple[dsse.Envelope, Checkpoint]:
    """The envelope and its (unverified) payload; :class:`Malformed` for anything else."""
    envelope = decode_json(read_bounded(path, MAX_BYTES), dsse.Envelope, path.name, canonical=True)
    if envelope.payload_type != PAYLOAD_TYPE:
        raise Malformed(f"{path.name} has payload type {envelope.payload_type[:80]!r}, not a ledger checkpoint")
    payload = decode_json(envelope.body(), Checkpoint, f"{path.name} payload", canonical=True)
    if payload.schema != SCHEMA:
        raise Malformed(f"{path.name} has schema {payload.schema[:80]!r}, expected {SCHEMA!r}")
    return envelope, payload


def vouch(path: Path, trusted: list[Ed25519PublicKey]) -> Vouched:
    """The checkpoint at ``path``, provided a trusted key signed it."""
    envelope, payload = read(path)
    checks = dsse.check_signatures(envelope, trusted)
    signers = dsse.trusted_signers(checks)
    if not signers:
        seen = ", ".join(f"{c.keyid[:16]}… ({'valid' if c.valid else 'invalid'})" for c in checks) or "none"
        raise Malformed(f"{path.name} is not signed by a trusted key (signatures: {seen})")
    return Vouched(payload, tuple(sorted(signers)))


def contradiction(view: VerifiedLedger, ledger_id: str | None, expected: Head) -> str | None:
    """Why the ledger does not hold ``expected`` (a checkpoint's or a remembered head), or None."""
    if ledger_id is not None and ledger_id != view.header.ledger_id:
        return (
            f"the checkpoint is for ledger {escape_controls(ledger_id[:80])}, this file is ledger "
            f"{escape_controls(view.header.ledger_id[:80])}: the ledger file was replaced"
        )
    if expected.seq > view.head.seq:
        return (
            f"the ledger ends at record #{view.head.seq}, but #{expected.seq} was vouched for: "
            "records were cut off the end (truncated) or the file was replaced"
        )
    actual = view.header.genesis() if expected.seq == 0 else view.record(expected.seq).hash
    if actual != expected.hash:
        return (
            f"record #{expected.seq} hashes to {actual[:19]}…, but {expected.hash[:19]}… was vouched for: "
            "the history up to it was rewritten (every hash recomputed)"
        )
    return None


def parse_head(text: str) -> Head:
    """``SEQ:sha256:HEX`` as printed by ``evidence verify`` (a head remembered from an earlier check)."""
    match = _HEAD.fullmatch(text.strip())
    if match is None:
        raise UsageError(f"--expect-head {text[:80]!r} is not SEQ:sha256:<64 hex> (as `evidence verify` prints it)")
    return Head(int(match[1]), match[2])
