"""Evidence classes, outcomes and subjects: the vocabulary of the ledger.

A class says *what kind of check* produced a result, and classes are never relabelled: a
simulator pass is not a complete-engine pass, and a release signature check is not a serving
check. ``release_signature`` and ``procedure`` exist so that those results are recorded as what
they are instead of borrowing a stronger class.
"""

from __future__ import annotations

from enum import StrEnum

from cacheon.errors import UsageError


class EvidenceClass(StrEnum):
    STATIC_CANARY = "static_canary"  # compat / chain-compat against the installed SGLang
    COMPONENT = "component"  # verify, graph replay, collectives: one slot in isolation
    COMPLETE_ENGINE = "complete_engine"  # the real engine serving a real model on the target hardware
    RELEASE_SERVE = "release_serve"  # a serving check of a verified Engine release
    RELEASE_SIGNATURE = "release_signature"  # descriptor, signature and artifact hashes only
    PROCEDURE = "procedure"  # a pin-bump step a maintainer carried out under this identity
    # A real SGLang server on CPU (tiny random model, named stand-ins) booted unarmed, with a faithful
    # and with a broken bundle: the seam fired in the scheduler process and changed exactly what it
    # should. Proves activation in a live server, never GPU numerics or complete-engine qualification.
    CPU_SERVING_ACTIVATION = "cpu_serving_activation"


class Outcome(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    BLOCKED = "blocked"  # the check could not run to a verdict (infrastructure, missing input)
    NOT_RUN = "not_run"  # never counts as a pass


def parse_class(text: str) -> EvidenceClass:
    try:
        return EvidenceClass(text)
    except ValueError:
        choices = ", ".join(c.value for c in EvidenceClass)
        raise UsageError(f"unknown evidence class {text!r} (choose from {choices})") from None


def parse_outcome(text: str) -> Outcome:
    try:
        return Outcome(text)
    except ValueError:
        choices = ", ".join(o.value for o in Outcome)
        raise UsageError(f"unknown outcome {text!r} (choose from {choices})") from None


def outcome_from_exit(code: int) -> Outcome:
    """Map the CLI's exit convention: 0 checked and passed, 2 checked and failed, else no verdict."""
    return {0: Outcome.PASS, 2: Outcome.FAIL}.get(code, Outcome.BLOCKED)


# Subjects are "<kind>:<name>" strings so that one ledger can hold every kind without ambiguity.
COMPAT_SUBJECT = "canary:compat"
CHAIN_COMPAT_SUBJECT = "canary:chain-compat"


def bundle_subject(bundle_digest: str) -> str:
    return f"bundle:{bundle_digest}"


def contract_subject(contract_id: str) -> str:
    return f"contract:{contract_id}"


def release_subject(release_digest: str) -> str:
    return f"release:{release_digest}"


def seam_subject(seam: str) -> str:
    return f"seam:{seam}"


def pin_step_subject(step: str, version: str) -> str:
    return f"pin:{step}:{version}"
