"""What a read of the ledger was checked against, said with every answer read from it.

The chain alone proves a ledger consistent, not that it is the ledger that was written (a cut-off
tail or a file re-chained from the genesis reads as intact). So every reader (``evidence
list|show|state``, ``pin status|plan``, the gates, ``kv contracts``) checks the chain against the
newest checkpoint whenever one exists beside the ledger, and reports which guarantee it got:

- ``chain``: no checkpoint exists; the hash chain alone.
- ``checkpoint``: the ledger still holds the head a checkpoint signed by a key you trust
  (``$CACHEON_CHECKPOINT_KEY``) vouches for.
- ``untrusted_checkpoint``: it holds the head of a checkpoint whose signature verifies, but by a
  key you did not name: a careless forgery shows, one that also re-signed the checkpoint would not.

A checkpoint that is unreadable, unsigned, or that the ledger contradicts fails the read (exit 2),
as does a trusted key named with no checkpoint to check.
"""

from __future__ import annotations

import os

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from cacheon.evidence import checkpoint, dsse, keys
from cacheon.evidence.boundary import Malformed
from cacheon.evidence.chain import Head
from cacheon.evidence.view import CHECKPOINT_KEY_ENV, Assurance, Guarantee, VerifiedLedger
from cacheon.printable import escape_controls

__all__ = ["CHECKPOINT_KEY_ENV", "Assurance", "Contradicted", "Guarantee", "assess", "trusted_keys"]


class Contradicted(Exception):
    """The checkpoint fails the ledger, or cannot be checked; ``str(exc)`` is one line."""


def assess(view: VerifiedLedger) -> Assurance:
    """Check ``view`` against the checkpoint beside it, if there is one."""
    trusted = trusted_keys()
    path = checkpoint.default_path(view.path)
    shown = escape_controls(str(path))
    if not os.path.lexists(path):
        if trusted:
            raise Contradicted(f"${CHECKPOINT_KEY_ENV} names a trusted checkpoint signer, but there is no "
                               f"checkpoint at {shown} (deleted?)")
        return Assurance(Guarantee.CHAIN, view.head.seq)
    try:
        envelope, payload = checkpoint.read(path)
        checks = dsse.check_signatures(envelope, trusted)
    except Malformed as exc:
        raise Contradicted(f"checkpoint {shown}: {exc}") from None
    signers = dsse.trusted_signers(checks)
    if trusted and not signers:
        raise Contradicted(f"checkpoint {shown} is not signed by a key in ${CHECKPOINT_KEY_ENV}")
    valid = sorted({c.keyid for c in checks if c.valid})
    if not valid:
        raise Contradicted(f"checkpoint {shown} carries no signature that verifies (forged or altered)")
    problem = checkpoint.contradiction(view, payload.ledger, Head(payload.seq, payload.head))
    if problem:
        raise Contradicted(f"checkpoint {shown}: {problem}")
    if signers:
        return Assurance(Guarantee.CHECKPOINT, view.head.seq, payload.seq, tuple(sorted(signers)))
    return Assurance(Guarantee.UNTRUSTED_CHECKPOINT, view.head.seq, payload.seq, tuple(valid))


def trusted_keys() -> list[Ed25519PublicKey]:
    """The checkpoint signers named in ``$CACHEON_CHECKPOINT_KEY`` (none when it is unset)."""
    text = os.environ.get(CHECKPOINT_KEY_ENV, "")
    return [keys.parse_public_key(item.strip()) for item in text.split(",") if item.strip()]
