"""Gateway contract promotion: only a complete-engine pass under a covered identity validates."""

from __future__ import annotations

from pathlib import Path

from cacheon.evidence.classes import EvidenceClass, Outcome, contract_subject
from cacheon.evidence.ledger import Ledger
from cacheon.evidence.promotion import promotion, validated_contracts

from .conftest import add, make_identity

COVERAGE = {"kv-events.v1": {"0.5.13.post1", "0.5.19"}, "kv-events.v2": {"0.5.20"}}


def test_only_complete_engine_passes_under_a_covered_identity_validate(ledger_path: Path) -> None:
    v1_host, v2_host = make_identity("0.5.13.post1", gpus=1), make_identity("0.5.20", gpus=1)
    with Ledger.open(ledger_path) as ledger:
        add(
            ledger,
            v2_host,
            EvidenceClass.COMPONENT,
            contract_subject("kv-events.v2"),
            Outcome.PASS,
            via="simulator",
        )
        add(ledger, v2_host, EvidenceClass.STATIC_CANARY, contract_subject("kv-events.v2"), Outcome.PASS)
        add(ledger, v2_host, EvidenceClass.COMPLETE_ENGINE, contract_subject("kv-events.v1"), Outcome.PASS)
        assert validated_contracts(ledger.verified(), COVERAGE) == set()  # v1 passed, but on a version it does not cover
        add(ledger, v1_host, EvidenceClass.COMPLETE_ENGINE, contract_subject("kv-events.v1"), Outcome.NOT_RUN)
        assert validated_contracts(ledger.verified(), COVERAGE) == set()
        add(ledger, v1_host, EvidenceClass.COMPLETE_ENGINE, contract_subject("kv-events.v1"), Outcome.PASS)
        assert promotion(ledger.verified(), COVERAGE) == {"kv-events.v1": "validated", "kv-events.v2": "candidate"}
        add(ledger, v1_host, EvidenceClass.COMPLETE_ENGINE, contract_subject("kv-events.v1"), Outcome.FAIL)
        assert validated_contracts(ledger.verified(), COVERAGE) == set()  # a later failure withdraws it


def test_kv_contracts_reads_promotion_from_the_ledger(ledger_path: Path) -> None:
    """The gateway's registry as the CLI shows it: validated only after a real-engine pass."""
    import json
    import subprocess
    import sys

    def listed() -> dict[str, str]:
        done = subprocess.run(
            [sys.executable, "-m", "cacheon", "kv", "contracts", "--json", "--ledger", str(ledger_path)],
            capture_output=True, text=True, timeout=120, check=True,
        )
        return {c["id"]: c["promotion"] for c in json.loads(done.stdout)["contracts"]}

    pin_host = make_identity("0.5.13.post1", gpus=1)
    with Ledger.open(ledger_path) as ledger:
        add(ledger, pin_host, EvidenceClass.COMPONENT, contract_subject("sglang-kv-rank-v1"), Outcome.PASS)
    assert listed()["sglang-kv-rank-v1"] == "candidate"  # fixtures and simulators never promote
    with Ledger.open(ledger_path) as ledger:
        add(ledger, pin_host, EvidenceClass.COMPLETE_ENGINE, contract_subject("sglang-kv-rank-v1"), Outcome.PASS)
    promotions = listed()
    assert promotions["sglang-kv-rank-v1"] == "validated"
    assert set(promotions.values()) == {"validated", "candidate"}
