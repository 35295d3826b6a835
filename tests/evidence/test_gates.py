"""Pin-bump gates: satisfied only by evidence under the candidate's exact identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from cacheon.errors import UsageError
from cacheon.evidence.classes import (
    CHAIN_COMPAT_SUBJECT,
    COMPAT_SUBJECT,
    EvidenceClass,
    Outcome,
    contract_subject,
    pin_step_subject,
)
from cacheon.evidence.gates import GATES, evaluate, record_step
from cacheon.evidence.ledger import Ledger
from cacheon.runtime.identity import Identity

from .conftest import add, make_identity

OLD, NEW = "0.5.13.post1", "0.5.14"
C = EvidenceClass
PASS, FAIL = Outcome.PASS, Outcome.FAIL


def _full_evidence(ledger: Ledger, identity: Identity, version: str) -> None:
    """Everything the procedure asks for, recorded under ``identity``."""
    for step in ("freeze", "arena-recalibration", "identities", "migration"):
        add(ledger, identity, C.PROCEDURE, pin_step_subject(step, version), PASS)
    add(ledger, identity, C.STATIC_CANARY, COMPAT_SUBJECT, PASS)
    add(ledger, identity, C.STATIC_CANARY, CHAIN_COMPAT_SUBJECT, PASS)
    add(ledger, identity, C.COMPONENT, "bundle:sha256:broken", FAIL, control="broken", confinement="bubblewrap")
    add(ledger, identity, C.COMPONENT, "bundle:sha256:faithful", PASS, control="faithful", confinement="bubblewrap")
    add(ledger, identity, C.COMPLETE_ENGINE, contract_subject("kv-events"), PASS)


def _statuses(ledger: Ledger, identity: Identity) -> dict[str, str]:
    return {r.gate.key: r.verdict.status for r in evaluate(ledger.verified(), identity).results}


def test_all_gates_met_only_for_the_identity_that_earned_them(ledger_path: Path) -> None:
    old, new = make_identity(OLD, gpus=8), make_identity(NEW, gpus=8)
    with Ledger.open(ledger_path) as ledger:
        _full_evidence(ledger, old, NEW)  # evidence under the old pin, even labelled with the new version
        assert set(_statuses(ledger, new).values()) == {"missing"}
        _full_evidence(ledger, new, NEW)
        status = evaluate(ledger.verified(), new)
    assert status.all_met
    assert [r.gate.number for r in status.results] == list(range(1, 9))
    assert status.other_pins == {OLD: 9}


def test_same_version_different_torch_earns_nothing(ledger_path: Path) -> None:
    new, new_other_torch = make_identity(NEW, gpus=8), make_identity(NEW, gpus=8, torch="2.99.0")
    with Ledger.open(ledger_path) as ledger:
        _full_evidence(ledger, new_other_torch, NEW)
        assert set(_statuses(ledger, new).values()) == {"missing"}


def test_gpu_gates_stay_missing_without_a_gpu(ledger_path: Path) -> None:
    cpu = make_identity(NEW, gpus=0)
    with Ledger.open(ledger_path) as ledger:
        _full_evidence(ledger, cpu, NEW)
        result = {r.gate.key: r.verdict for r in evaluate(ledger.verified(), cpu).results}
    assert result["gpu-qualification"].status == "missing"
    assert result["arena-recalibration"].status == "missing"
    assert "no GPU" in result["gpu-qualification"].reason
    assert {
        k: v.status for k, v in result.items() if k not in {"gpu-qualification", "arena-recalibration"}
    } == {g.key: "met" for g in GATES if not g.needs_gpu}


@pytest.mark.parametrize(
    ("records", "status", "reason"),
    [
        ([("broken", FAIL)], "missing", "no faithful bundle passing"),
        ([("faithful", PASS)], "missing", "no broken bundle failing"),
        ([("broken", FAIL), ("faithful", PASS)], "met", "1 broken failed, 1 faithful passed"),
        ([("broken", PASS), ("faithful", PASS)], "failed", "a broken bundle passed"),
        ([("broken", FAIL), ("faithful", FAIL)], "failed", "a faithful bundle failed"),
    ],
)
def test_negative_controls(ledger_path: Path, records: list, status: str, reason: str) -> None:
    identity = make_identity(NEW)
    with Ledger.open(ledger_path) as ledger:
        add(ledger, identity, C.COMPONENT, "bundle:sha256:uncontrolled", FAIL)  # not a control: ignored
        for index, (control, outcome) in enumerate(records):
            add(ledger, identity, C.COMPONENT, f"bundle:sha256:{index}", outcome, control=control, confinement="bubblewrap")
        verdict = {r.gate.key: r.verdict for r in evaluate(ledger.verified(), identity).results}["negative-controls"]
    assert (verdict.status, verdict.reason.split(":")[0]) == (status, reason)


@pytest.mark.parametrize("confinement", [{"confinement": "none"}, {}])
def test_only_confined_controls_count(ledger_path: Path, confinement: dict) -> None:
    """`--confinement none`, or a record from before verify had a sandbox: an unconfined run."""
    identity = make_identity(NEW)
    with Ledger.open(ledger_path) as ledger:
        add(ledger, identity, C.COMPONENT, "bundle:sha256:b", FAIL, control="broken", confinement="bubblewrap")
        add(ledger, identity, C.COMPONENT, "bundle:sha256:f", PASS, control="faithful", **confinement)
        assert _statuses(ledger, identity)["negative-controls"] == "missing"


@pytest.mark.parametrize(
    ("outcomes", "status"),
    [
        ((PASS,), "met"),
        ((FAIL,), "failed"),
        ((Outcome.NOT_RUN,), "missing"),
        ((PASS, Outcome.BLOCKED), "missing"),
    ],
)
def test_latest_canary_record_decides(ledger_path: Path, outcomes: tuple, status: str) -> None:
    identity = make_identity(NEW)
    with Ledger.open(ledger_path) as ledger:
        for outcome in outcomes:
            add(ledger, identity, C.STATIC_CANARY, COMPAT_SUBJECT, outcome)
        assert _statuses(ledger, identity)["static-canary"] == status


def test_corrected_failure_no_longer_blocks(ledger_path: Path) -> None:
    identity = make_identity(NEW)
    with Ledger.open(ledger_path) as ledger:
        bad = add(ledger, identity, C.STATIC_CANARY, COMPAT_SUBJECT, FAIL)
        assert _statuses(ledger, identity)["static-canary"] == "failed"
        ledger.correct(bad, PASS, "the canary was run against the wrong interpreter")
        assert _statuses(ledger, identity)["static-canary"] == "met"


def test_steps_bind_only_on_the_candidate_host(ledger_path: Path) -> None:
    old, cpu_new, gpu_new = make_identity(OLD, gpus=8), make_identity(NEW), make_identity(NEW, gpus=8)
    with Ledger.open(ledger_path) as ledger:
        add(ledger, old, C.STATIC_CANARY, COMPAT_SUBJECT, PASS)
        with pytest.raises(UsageError, match=f"runs sglang {OLD}, not {NEW}"):
            record_step(ledger, old, "freeze", NEW)
        with pytest.raises(UsageError, match="needs a GPU host"):
            record_step(ledger, cpu_new, "arena-recalibration", NEW)
        with pytest.raises(UsageError, match="unknown pin step"):
            record_step(ledger, gpu_new, "skip-the-tests", NEW)
        record_step(ledger, gpu_new, "arena-recalibration", NEW, note="arena run 42")
        migration_id = record_step(ledger, gpu_new, "migration", NEW)
        migration = ledger.verified().record(migration_id)
    assert migration.details["prior_pins"] == {OLD: 1}
    assert migration.subject == pin_step_subject("migration", NEW)
