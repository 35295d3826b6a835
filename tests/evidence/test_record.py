"""``--record`` as the producing commands use it: the outcome follows the exit code, identity is captured."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from cacheon.errors import UsageError
from cacheon.evidence.classes import COMPAT_SUBJECT, EvidenceClass
from cacheon.evidence.ledger import Ledger
from cacheon.evidence.record import add_record_arguments, record_from_cli
from cacheon.runtime.identity import Identity


def _args(*argv: str, control: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_record_arguments(parser, control=control)
    return parser.parse_args(argv)


@pytest.mark.parametrize(("exit_code", "outcome"), [(0, "pass"), (2, "fail"), (1, "blocked")])
def test_outcome_follows_the_exit_convention(
    tmp_path: Path, here: Identity, exit_code: int, outcome: str
) -> None:
    path = tmp_path / "named.sqlite3"
    rid = record_from_cli(
        _args("--record", "--ledger", str(path)),
        evidence_class=EvidenceClass.STATIC_CANARY,
        subject=COMPAT_SUBJECT,
        exit_code=exit_code,
        details={"max_error": float("nan"), "path": Path("/x"), "ok": [1, 2.5]},
    )
    with Ledger.open(path) as ledger:
        record = ledger.verified().record(rid)
    assert record.outcome == outcome
    assert record.identity_digest == here.digest
    assert record.details == {"max_error": "nan", "path": "/x", "ok": [1, 2.5], "exit_code": exit_code}


def test_control_is_recorded_and_default_ledger_used(ledger_path: Path) -> None:
    record_from_cli(
        _args("--record", "--control", "broken", control=True),
        evidence_class=EvidenceClass.COMPONENT,
        subject="bundle:sha256:ab",
        exit_code=2,
        details={},
    )
    with Ledger.open(ledger_path) as ledger:
        [record] = ledger.verified().records()
    assert record.details["control"] == "broken"


def test_nothing_recorded_without_record(ledger_path: Path) -> None:
    kwargs = {"evidence_class": EvidenceClass.COMPONENT, "subject": "bundle:x", "exit_code": 0, "details": {}}
    assert record_from_cli(_args(), **kwargs) is None
    assert not ledger_path.exists()
    with pytest.raises(UsageError, match="only apply with --record"):
        record_from_cli(_args("--ledger", str(ledger_path)), **kwargs)
    with pytest.raises(UsageError, match="only apply with --record"):
        record_from_cli(_args("--control", "faithful", control=True), **kwargs)
