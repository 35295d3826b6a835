"""What is proven for one exact identity.

A claim is one (class, subject) pair; its standing is the latest record for it that nothing
supersedes, under that identity only. It is read from a :class:`VerifiedLedger`, so a tampered
ledger never has a standing. Records of every other identity are kept apart so that a
caller can show them as "other identity" and never count them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from cacheon.evidence.chain import Record
from cacheon.evidence.classes import EvidenceClass, Outcome
from cacheon.evidence.view import VerifiedLedger

Claim = tuple[str, str]  # (evidence class, subject)


@dataclass(frozen=True)
class Standing:
    identity: str
    current: dict[Claim, Record]  # the effective record per claim under ``identity``
    history: list[Record]  # every record under ``identity``, superseded ones included
    other_identity: list[Record]  # shown, never counted

    def counts(self) -> dict[str, int]:
        """Current claims per outcome; ``not_run`` is its own bucket, never a pass."""
        tally = Counter(record.outcome for record in self.current.values())
        return {outcome.value: tally.get(outcome.value, 0) for outcome in Outcome}

    def of_class(self, evidence_class: EvidenceClass) -> list[Record]:
        return [r for (cls, _), r in sorted(self.current.items()) if cls == evidence_class.value]


def standing(ledger: VerifiedLedger, identity: str, evidence_class: EvidenceClass | None = None) -> Standing:
    mine: list[Record] = []
    others: list[Record] = []
    for record in ledger.records(evidence_class=evidence_class):
        (mine if record.identity_digest == identity else others).append(record)
    return Standing(identity=identity, current=current_claims(mine), history=mine, other_identity=others)


def current_claims(records: list[Record]) -> dict[Claim, Record]:
    """Latest non-superseded record per claim (records come in append order)."""
    current: dict[Claim, Record] = {}
    for record in records:
        if record.superseded_by is None:
            current[(record.evidence_class, record.subject)] = record
    return current
