"""``cacheon identity | evidence | pin | preflight`` through the real parser, on a real ledger file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from cacheon.evidence.classes import COMPAT_SUBJECT, EvidenceClass, Outcome
from cacheon.evidence.ledger import Ledger
from cacheon.runtime.identity import Identity

from .conftest import add, make_identity

pytestmark = pytest.mark.slow  # the CLI

Cli = Callable[..., tuple]


def test_identity(run_cli: Cli, here: Identity) -> None:
    code, out, _ = run_cli("identity", "--json")
    assert code == 0 and json.loads(out) == here.to_json()
    code, out, _ = run_cli("identity")
    assert code == 0 and here.digest in out and "torch" in out


def test_evidence_list_counts_this_identity_only(run_cli: Cli, here: Identity, ledger_path: Path) -> None:
    other = make_identity("0.0.1")
    with Ledger.open(ledger_path) as ledger:
        add(ledger, here, EvidenceClass.STATIC_CANARY, COMPAT_SUBJECT, Outcome.PASS)
        add(ledger, here, EvidenceClass.COMPONENT, "bundle:sha256:aa", Outcome.NOT_RUN)
        add(ledger, other, EvidenceClass.COMPONENT, "bundle:sha256:bb", Outcome.PASS)
    code, out, _ = run_cli("evidence", "list", "--json")
    report = json.loads(out)
    assert code == 0 and report["identity"] == here.digest and report["this_host"]
    assert [r["subject"] for r in report["records"]] == [COMPAT_SUBJECT, "bundle:sha256:aa"]
    assert report["current"] == {"pass": 1, "fail": 0, "blocked": 0, "not_run": 1}
    assert report["other_identity_records"] == 1 and "other_identity" not in report

    code, out, _ = run_cli("evidence", "list", "--all")
    assert "bundle:sha256:bb" in out and "[other identity" in out and "never counted" in out
    code, out, _ = run_cli(
        "evidence", "list", "--identity", other.digest[7:20], "--class", "component", "--json"
    )
    report = json.loads(out)
    assert report["identity"] == other.digest and not report["this_host"]
    assert report["current"]["pass"] == 1 and report["other_identity_records"] == 1


def test_evidence_show_and_correct(run_cli: Cli, here: Identity, ledger_path: Path) -> None:
    with Ledger.open(ledger_path) as ledger:
        rid = add(ledger, here, EvidenceClass.STATIC_CANARY, COMPAT_SUBJECT, Outcome.PASS, note="first")
    code, out, _ = run_cli(
        "evidence", "correct", str(rid), "--outcome", "fail", "--reason", "wrong interpreter"
    )
    assert code == 0 and f"superseding #{rid}" in out
    code, out, _ = run_cli("evidence", "show", str(rid), "--json")
    shown = json.loads(out)
    assert shown["superseded_by"] == rid + 1 and shown["identity_facts"] == here.facts
    code, out, _ = run_cli("evidence", "list", "--json")
    assert json.loads(out)["current"]["pass"] == 0


def test_user_mistakes_are_one_line_errors(run_cli: Cli, tmp_path: Path, ledger_path: Path) -> None:
    Ledger.open(ledger_path).close()
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"\x00garbage" * 100)
    for argv, message in [
        (("evidence", "list", "--class", "vibes"), "unknown evidence class 'vibes'"),
        (("evidence", "show", "999"), "no record 999"),
        (("evidence", "list", "--ledger", tmp_path / "missing.db"), "no ledger at"),
        (("evidence", "list", "--ledger", bad), "not an SQLite database"),
        (("evidence", "correct", "1", "--outcome", "maybe", "--reason", "x"), "unknown outcome 'maybe'"),
        (("pin", "freeze", "--to", "9.9.9"), "not 9.9.9"),
    ]:
        code, _, err = run_cli(*argv)
        assert code == 1, argv
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_pin_walkthrough(run_cli: Cli, here: Identity, ledger_path: Path) -> None:
    version = here.sglang_version
    old = make_identity("0.0.1-old-pin")
    with Ledger.open(ledger_path) as ledger:
        add(ledger, old, EvidenceClass.STATIC_CANARY, COMPAT_SUBJECT, Outcome.PASS)
    code, out, _ = run_cli("pin", "plan", "--to", version)
    assert code == 0 and out.count("run: ") == 8 and "start with `cacheon pin freeze" in out

    code, out, _ = run_cli("pin", "freeze", "--to", version, "--note", "candidate image")
    assert code == 0 and here.digest in out
    with Ledger.open(ledger_path) as ledger:
        add(ledger, here, EvidenceClass.STATIC_CANARY, COMPAT_SUBJECT, Outcome.PASS)
    code, out, _ = run_cli("pin", "status", "--target", version, "--json")
    assert code == 2  # not every gate is met
    [status] = json.loads(out)["identities"]
    gates = {g["key"]: g["status"] for g in status["gates"]}
    assert gates["freeze"] == gates["static-canary"] == "met"
    assert gates["contract-tests"] == gates["gpu-qualification"] == "missing"
    assert status["other_pins"] == {"0.0.1-old-pin": 1}
    code, out, _ = run_cli("pin", "status")
    assert "1 met" in out and "2 met" in out and "0.0.1-old-pin: 1 records" in out
    code, out, _ = run_cli("pin", "status", "--target", "7.7.7")
    assert code == 2 and "no identity with sglang 7.7.7" in out


def test_preflight_answers_three_questions(run_cli: Cli, here: Identity) -> None:
    code, out, _ = run_cli("preflight", "--json", "--compat-timeout", "120")
    report = json.loads(out)
    assert report["identity"]["digest"] == here.digest
    assert report["device"]["ready"] == bool(here.gpu_count)
    if not here.gpu_count:
        assert report["device"]["reason"].startswith("no CUDA device")
    assert report["static_compatibility"]["outcome"] in {"pass", "fail", "blocked"}
    assert report["behavioural"]["proven"] is False
    assert any("--device cuda" in c for c in report["behavioural"]["run"])
    assert code == (0 if report["ready"] else 2)
