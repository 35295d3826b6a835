"""Gateway contract promotion, read from the ledger.

A wire contract is ``validated`` only when the real engine (``complete_engine``) passed it under
an identity whose SGLang version the contract covers; fixture, simulator and component passes
leave it a ``candidate``. A later failure under the same identity withdraws the promotion.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Literal

from cacheon.evidence.chain import Record
from cacheon.evidence.classes import EvidenceClass, Outcome, contract_subject
from cacheon.evidence.standing import current_claims
from cacheon.evidence.view import VerifiedLedger

Promotion = Literal["validated", "candidate"]


def validated_contracts(ledger: VerifiedLedger, covered_versions: Mapping[str, Collection[str]]) -> set[str]:
    """The validated contract ids; ``covered_versions``: contract id -> SGLang versions it covers."""
    version_of = {identity.digest: identity.sglang_version for identity in ledger.identities()}
    by_identity: dict[str, list[Record]] = {}
    for record in ledger.records(evidence_class=EvidenceClass.COMPLETE_ENGINE):
        by_identity.setdefault(record.identity_digest, []).append(record)
    validated: set[str] = set()
    for digest, records in by_identity.items():
        current = current_claims(records)
        for contract_id, versions in covered_versions.items():
            claim = current.get((EvidenceClass.COMPLETE_ENGINE.value, contract_subject(contract_id)))
            if claim and claim.outcome == Outcome.PASS and version_of[digest] in versions:
                validated.add(contract_id)
    return validated


def promotion(ledger: VerifiedLedger, covered_versions: Mapping[str, Collection[str]]) -> dict[str, Promotion]:
    """``validated`` or ``candidate`` for every contract id given."""
    validated = validated_contracts(ledger, covered_versions)
    return {cid: "validated" if cid in validated else "candidate" for cid in covered_versions}
