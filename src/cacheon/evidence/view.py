"""A verified ledger: the records of one intact hash chain, read in the snapshot that was checked.

Everything that answers a question from the ledger (``evidence list``, ``pin status``, gates,
promotion, standing) takes a :class:`VerifiedLedger`, and the only way to get one is to walk the
chain and find it intact. There is no unverified read path to forget to guard: what is read is
exactly what was verified, because it is the same rows, held in memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from cacheon.errors import UsageError
from cacheon.evidence.chain import ChainCheck, Head, Header, Record
from cacheon.evidence.classes import EvidenceClass
from cacheon.runtime.identity import Identity

CHECKPOINT_KEY_ENV = "CACHEON_CHECKPOINT_KEY"  # trusted checkpoint signers: 64 hex or .pub paths, comma-separated


class Guarantee(StrEnum):
    """What a read was checked against (:mod:`cacheon.evidence.assurance` decides which)."""

    CHAIN = "chain"
    UNTRUSTED_CHECKPOINT = "untrusted_checkpoint"
    CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class Assurance:
    guarantee: Guarantee
    head: int  # the ledger's last record
    vouched: int | None = None  # the checkpoint's record
    signers: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"guarantee": self.guarantee.value, "head": self.head, "checkpoint_seq": self.vouched,
                "signers": list(self.signers), "summary": self.describe()}

    def describe(self) -> str:
        if self.guarantee is Guarantee.CHAIN:
            return ("hash chain only (no checkpoint): a cut-off tail or a file re-chained from the start "
                    "would read as intact")
        who = ", ".join(s[:16] + "…" for s in self.signers)
        trust = "a trusted key" if self.guarantee is Guarantee.CHECKPOINT else (
            f"a key not named trusted ({who}; set ${CHECKPOINT_KEY_ENV} to trust it)")
        vouched = self.vouched or 0
        after = f"; records #{vouched + 1}..#{self.head} by the chain alone" if vouched < self.head else ""
        return f"chain + checkpoint #{vouched} signed by {trust}{after}"


@dataclass(frozen=True)
class VerifiedLedger:
    path: Path
    header: Header
    head: Head
    _records: tuple[Record, ...]
    _identities: Mapping[str, Identity]  # in order of first use by a record
    assurance: Assurance | None = None  # set by every reader's open (open_verified_ledger)

    @classmethod
    def from_check(cls, path: Path, check: ChainCheck) -> VerifiedLedger:
        if not check.ok or check.header is None or check.head is None or check.identities is None:
            raise ValueError("a VerifiedLedger is made from an intact chain only")
        return cls(path, check.header, check.head, check.records, dict(check.identities))

    def guarantee(self) -> dict[str, Any]:
        """What this read was checked against, for the reader's output (every reader's open assesses it)."""
        return (self.assurance or Assurance(Guarantee.CHAIN, self.head.seq)).to_json()

    def records(
        self,
        *,
        identity: str | None = None,
        evidence_class: EvidenceClass | None = None,
        subject: str | None = None,
    ) -> list[Record]:
        """Records in append order, optionally filtered; superseded ones included (marked)."""
        return [
            r
            for r in self._records
            if (identity is None or r.identity_digest == identity)
            and (evidence_class is None or r.evidence_class == evidence_class.value)
            and (subject is None or r.subject == subject)
        ]

    def record(self, record_id: int) -> Record:
        if 1 <= record_id <= len(self._records):
            return self._records[record_id - 1]  # the chain guarantees ids 1..n in order
        raise UsageError(f"no record {record_id} in {self.path}")

    def identity(self, digest: str) -> Identity:
        try:
            return self._identities[digest]
        except KeyError:
            raise UsageError(f"no identity {digest} in {self.path}") from None

    def identities(self) -> list[Identity]:
        return list(self._identities.values())

    def resolve_identity(self, text: str) -> str:
        """A full digest as given, or the one recorded identity that starts with ``text``."""
        wanted = text if text.startswith("sha256:") else "sha256:" + text
        if len(wanted) == 71:
            return wanted
        matches = [digest for digest in self._identities if digest.startswith(wanted)]
        if len(matches) != 1:
            problem = "no recorded identity" if not matches else f"{len(matches)} identities"
            raise UsageError(f"{problem} in {self.path} match {text!r}; give more of the digest")
        return matches[0]
