"""Pin-bump gates: the reviewed procedure, each step satisfied only by evidence under one exact identity.

A pin bump creates a new identity; nothing recorded under the old pin can satisfy a gate of the
new one. Each gate reads the current claims of the candidate identity and answers met / missing /
failed with the records behind the answer. Gates that need a GPU stay missing for an identity
that has none, whatever was recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from cacheon.errors import UsageError
from cacheon.evidence.chain import Record
from cacheon.evidence.classes import (
    CHAIN_COMPAT_SUBJECT,
    COMPAT_SUBJECT,
    EvidenceClass,
    Outcome,
    pin_step_subject,
)
from cacheon.evidence.ledger import Entry, Ledger
from cacheon.evidence.standing import Standing, standing
from cacheon.evidence.view import VerifiedLedger
from cacheon.runtime.identity import Identity

Status = Literal["met", "missing", "failed"]
#: the confinement a negative control must have been verified under (``cacheon.verify.plan.Confinement``)
CONFINED = "bubblewrap"


@dataclass(frozen=True)
class Verdict:
    status: Status
    reason: str
    records: tuple[Record, ...] = ()


@dataclass(frozen=True)
class Gate:
    number: int
    key: str
    title: str
    how: str  # the command that records this gate's evidence
    needs_gpu: bool
    judge: Callable[[Standing, str], Verdict]


@dataclass(frozen=True)
class GateResult:
    gate: Gate
    verdict: Verdict

    def to_json(self) -> dict[str, Any]:
        return {
            "gate": self.gate.number,
            "key": self.gate.key,
            "title": self.gate.title,
            "status": self.verdict.status,
            "reason": self.verdict.reason,
            "records": [r.id for r in self.verdict.records],
            "how": self.gate.how,
            "needs_gpu": self.gate.needs_gpu,
        }


@dataclass(frozen=True)
class IdentityStatus:
    identity: Identity
    results: list[GateResult]
    other_pins: dict[str, int] = field(default_factory=dict)  # sglang version -> record count

    @property
    def all_met(self) -> bool:
        return all(r.verdict.status == "met" for r in self.results)


def _single(
    evidence_class: EvidenceClass, subject_of: Callable[[str], str]
) -> Callable[[Standing, str], Verdict]:
    """A gate met by the current record of one claim passing."""

    def judge(state: Standing, version: str) -> Verdict:
        subject = subject_of(version)
        record = state.current.get((evidence_class.value, subject))
        if record is None:
            return Verdict("missing", f"no {evidence_class.value} record for {subject}")
        if record.outcome == Outcome.PASS:
            return Verdict("met", f"{subject} passed", (record,))
        if record.outcome == Outcome.FAIL:
            return Verdict("failed", f"{subject} failed", (record,))
        return Verdict("missing", f"latest {subject} record is {record.outcome} (not a pass)", (record,))

    return judge


def _negative_controls(state: Standing, version: str) -> Verdict:
    """A broken bundle must fail and a faithful one must pass, both under this identity."""
    # Only confined runs count: ``verify --confinement none`` is marked so, and a record without the
    # field was made before verify had a sandbox (an ordinary child process), so it is unconfined too.
    controls = [
        r for r in state.of_class(EvidenceClass.COMPONENT)
        if r.details.get("control") and r.details.get("confinement") == CONFINED
    ]
    missed = [r for r in controls if r.details["control"] == "broken" and r.outcome == Outcome.PASS]
    rejected = [r for r in controls if r.details["control"] == "faithful" and r.outcome == Outcome.FAIL]
    if missed or rejected:
        bad = missed + rejected
        what = "a broken bundle passed" if missed else "a faithful bundle failed"
        return Verdict("failed", f"{what}: {', '.join(r.subject for r in bad)}", tuple(bad))
    caught = [r for r in controls if r.details["control"] == "broken" and r.outcome == Outcome.FAIL]
    passed = [r for r in controls if r.details["control"] == "faithful" and r.outcome == Outcome.PASS]
    if caught and passed:
        return Verdict(
            "met", f"{len(caught)} broken failed, {len(passed)} faithful passed", tuple(caught + passed)
        )
    lacking = [
        name
        for name, got in (("broken bundle failing", caught), ("faithful bundle passing", passed))
        if not got
    ]
    return Verdict("missing", "no " + " and no ".join(lacking), tuple(caught + passed))


def _engine_qualification(state: Standing, version: str) -> Verdict:
    records = state.of_class(EvidenceClass.COMPLETE_ENGINE)
    failed = [r for r in records if r.outcome == Outcome.FAIL]
    if failed:
        return Verdict(
            "failed", "complete-engine failures: " + ", ".join(r.subject for r in failed), tuple(failed)
        )
    passed = [r for r in records if r.outcome == Outcome.PASS]
    if passed:
        return Verdict("met", f"{len(passed)} complete-engine passes", tuple(passed))
    return Verdict("missing", "no complete_engine pass (live GPU tier with a real model)")


def _step(step: str) -> Callable[[str], str]:
    return lambda version: pin_step_subject(step, version)


GATES: tuple[Gate, ...] = (
    Gate(
        1,
        "freeze",
        "freeze the candidate (identity captured)",
        "cacheon pin freeze --to VERSION",
        False,
        _single(EvidenceClass.PROCEDURE, _step("freeze")),
    ),
    Gate(
        2,
        "static-canary",
        "static canary green",
        "cacheon compat --record",
        False,
        _single(EvidenceClass.STATIC_CANARY, lambda v: COMPAT_SUBJECT),
    ),
    Gate(
        3,
        "contract-tests",
        "contract tests green",
        "cacheon chain-compat --record",
        False,
        _single(EvidenceClass.STATIC_CANARY, lambda v: CHAIN_COMPAT_SUBJECT),
    ),
    Gate(
        4,
        "negative-controls",
        "negative controls (a broken bundle fails, a faithful one passes)",
        "cacheon verify BUNDLE --record --control broken|faithful",
        False,
        _negative_controls,
    ),
    Gate(
        5,
        "gpu-qualification",
        "GPU/model qualification",
        "live GPU tier recording complete_engine evidence",
        True,
        _engine_qualification,
    ),
    Gate(
        6,
        "arena-recalibration",
        "arena recalibration",
        "cacheon pin step arena-recalibration --to VERSION",
        True,
        _single(EvidenceClass.PROCEDURE, _step("arena-recalibration")),
    ),
    Gate(
        7,
        "identities",
        "new identities created",
        "cacheon pin step identities --to VERSION",
        False,
        _single(EvidenceClass.PROCEDURE, _step("identities")),
    ),
    Gate(
        8,
        "migration",
        "migration published (prior results marked with their original pin)",
        "cacheon pin step migration --to VERSION",
        False,
        _single(EvidenceClass.PROCEDURE, _step("migration")),
    ),
)
GATE_BY_KEY = {g.key: g for g in GATES}
# Gates met by a maintainer recording the step under the candidate identity (``pin freeze`` / ``pin step``).
STEP_KEYS = ("freeze", "arena-recalibration", "identities", "migration")


def evaluate(ledger: VerifiedLedger, identity: Identity) -> IdentityStatus:
    """Every gate for ``identity`` at its own SGLang version; other pins are counted apart."""
    state = standing(ledger, identity.digest)
    version = identity.sglang_version or "none"
    results: list[GateResult] = []
    for gate in GATES:
        if gate.needs_gpu and not identity.gpu_count:
            verdict = Verdict("missing", "needs a GPU host; this identity has no GPU")
        else:
            verdict = gate.judge(state, version)
        results.append(GateResult(gate, verdict))
    return IdentityStatus(identity, results, other_pins(ledger, exclude=version))


def other_pins(ledger: VerifiedLedger, *, exclude: str) -> dict[str, int]:
    """Record counts per SGLang version other than ``exclude``: they stay with their original pin."""
    version_of = {i.digest: i.sglang_version or "none" for i in ledger.identities()}
    counts: dict[str, int] = {}
    for record in ledger.records():
        version = version_of[record.identity_digest]
        if version != exclude:
            counts[version] = counts.get(version, 0) + 1
    return dict(sorted(counts.items()))


def candidates(ledger: VerifiedLedger, version: str) -> list[Identity]:
    """Identities in the ledger whose SGLang version is exactly ``version``."""
    return [i for i in ledger.identities() if i.sglang_version == version]


def record_step(ledger: Ledger, identity: Identity, step: str, version: str, note: str = "") -> int:
    """Record a maintainer's pin-bump step, only on a host that *is* the candidate identity."""
    if step not in STEP_KEYS:
        raise UsageError(f"unknown pin step {step!r} (choose from {', '.join(STEP_KEYS)})")
    installed = identity.sglang_version
    if installed != version:
        raise UsageError(
            f"this host runs sglang {installed or '(none)'}, not {version}: record {step} "
            "on the candidate host so it binds to the candidate identity"
        )
    if GATE_BY_KEY[step].needs_gpu and not identity.gpu_count:
        raise UsageError(f"{step} needs a GPU host; this identity has no GPU")
    details: dict[str, Any] = {"note": note}
    if step == "migration":
        details["prior_pins"] = other_pins(ledger.verified(), exclude=version)
    entry = Entry(EvidenceClass.PROCEDURE, pin_step_subject(step, version), identity, Outcome.PASS, details)
    return ledger.append(entry)
