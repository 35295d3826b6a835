"""The state of record: for every runtime identity in a verified ledger, what is proven and what is not.

One view for people (the documentation site's *State of record* page, ``cacheon evidence state``)
built from the same reads the gates use: the current claim per (class, subject) under each exact
identity, and each pin-bump gate's answer for that identity. Nothing crosses identities, and
``not_run`` / ``blocked`` are shown as what they are, never as passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cacheon.evidence.chain import Record
from cacheon.evidence.gates import IdentityStatus, evaluate
from cacheon.evidence.standing import standing
from cacheon.evidence.view import VerifiedLedger
from cacheon.runtime.identity import Identity, summary


@dataclass(frozen=True)
class IdentityState:
    identity: Identity
    claims: tuple[Record, ...]  # the current record of every claim, by class then subject
    gates: IdentityStatus

    def to_json(self) -> dict[str, Any]:
        return {
            "identity": self.identity.digest,
            "summary": summary(self.identity.facts),
            "claims": [r.to_json() for r in self.claims],
            "gates": [g.to_json() for g in self.gates.results],
            "all_gates_met": self.gates.all_met,
        }


@dataclass(frozen=True)
class StateOfRecord:
    ledger: VerifiedLedger
    identities: tuple[IdentityState, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "ledger": str(self.ledger.path),
            "head": self.ledger.head.to_json(),
            "identities": [i.to_json() for i in self.identities],
        }

    def to_markdown(self) -> str:
        head = self.ledger.head
        lines = [
            f"Read from `{self.ledger.path.name}`: {head.seq} record(s), chain head `{head.hash[:16]}…` "
            f"(verified before this page was written).",
            "",
        ]
        if not self.identities:
            return "\n".join([*lines, "The ledger holds no records yet: nothing is proven.", ""])
        for state in self.identities:
            lines += _identity_markdown(state)
        return "\n".join(lines)


def state_of_record(ledger: VerifiedLedger) -> StateOfRecord:
    """Every identity that has a record, in order of first use."""
    states = []
    for identity in ledger.identities():
        claims = standing(ledger, identity.digest).current
        states.append(
            IdentityState(identity, tuple(claims[k] for k in sorted(claims)), evaluate(ledger, identity))
        )
    return StateOfRecord(ledger, tuple(states))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _named(record: Record) -> str:
    """The bundle's own id beside its digest, when the record names one (verify records do)."""
    name = record.details.get("bundle_id")
    return f" ({_cell(name)})" if isinstance(name, str) else ""


def _identity_markdown(state: IdentityState) -> list[str]:
    lines = [
        f"## Identity `{state.identity.digest[:23]}…`",
        "",
        _cell(summary(state.identity.facts)),
        "",
        "| class | subject | outcome | record | recorded |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.evidence_class} | `{_cell(r.subject)}`{_named(r)} | **{r.outcome}** | #{r.id} | {r.recorded_at[:19]}Z |"
        for r in state.claims
    ]
    lines += ["", "Pin-bump gates for this identity:", "", "| gate | status | why | how to record it |",
              "|---|---|---|---|"]
    for result in state.gates.results:
        gate, verdict = result.gate, result.verdict
        how = gate.how.replace("VERSION", state.identity.sglang_version or "VERSION")
        lines.append(f"| {gate.number}. {_cell(gate.title)} | **{verdict.status}** | {_cell(verdict.reason)} | "
                     f"`{_cell(how)}` |")
    return [*lines, ""]
