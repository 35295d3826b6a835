"""The state of record: each identity's current claims and gates, from a verified ledger only."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from cacheon.evidence.classes import COMPAT_SUBJECT, EvidenceClass, Outcome
from cacheon.evidence.ledger import Ledger, open_verified_ledger
from cacheon.evidence.state import state_of_record

from ._forge import open_raw
from .conftest import add, make_identity

C = EvidenceClass


def _two_identities(path: Path) -> tuple[str, str]:
    cpu, gpu = make_identity("0.5.13.post1"), make_identity("0.5.13.post1", gpus=8)
    with Ledger.open(path) as ledger:
        add(ledger, cpu, C.STATIC_CANARY, COMPAT_SUBJECT, Outcome.PASS)
        add(ledger, cpu, C.COMPONENT, "bundle:sha256:aa", Outcome.FAIL, bundle_id="silu-broken")
        first = add(ledger, gpu, C.COMPONENT, "bundle:sha256:bb", Outcome.FAIL, bundle_id="silu-fast")
        ledger.correct(first, Outcome.NOT_RUN, "the GPU run never started")
    return cpu.digest, gpu.digest


def test_claims_stay_with_their_identity_and_not_run_is_not_a_pass(ledger_path):
    cpu, gpu = _two_identities(ledger_path)
    state = state_of_record(open_verified_ledger(ledger_path))
    claims = {s.identity.digest: {(r.subject, r.outcome) for r in s.claims} for s in state.identities}
    assert claims == {
        cpu: {(COMPAT_SUBJECT, "pass"), ("bundle:sha256:aa", "fail")},
        gpu: {("bundle:sha256:bb", "not_run")},  # the correction is current; the superseded fail is not
    }
    page = state.to_markdown()
    assert "4 record(s)" in page and page.count("## Identity") == 2
    assert "`bundle:sha256:bb` | **not_run**" in page
    assert "| 2. static canary green | **met**" in page  # the CPU identity's canary
    assert page.count("**met**") == 1  # nothing of the CPU identity satisfies the GPU one's gates


def test_cli_prints_the_page_and_json(ledger_path, run_cli):
    _two_identities(ledger_path)
    code, out, _ = run_cli("evidence", "state")
    assert code == 0 and out.startswith("Read from `ledger.sqlite3`: 4 record(s)")
    code, out, _ = run_cli("evidence", "state", "--json")
    assert code == 0 and [len(i["claims"]) for i in json.loads(out)["identities"]] == [2, 1]


def test_a_tampered_ledger_has_no_state(ledger_path, run_cli):
    _two_identities(ledger_path)
    open_raw(ledger_path).execute("UPDATE records SET outcome = 'pass' WHERE id = 2")
    code, out, err = run_cli("evidence", "state")
    assert code == 2 and out == "" and "tampered" in err


def test_the_docs_page_is_generated_from_the_verified_ledger(ledger_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("reference", Path(__file__).parents[2] / "docs/hooks/reference.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    _two_identities(ledger_path)
    monkeypatch.setattr(hook, "RECORDS", ledger_path)
    page = hook.on_page_markdown("# S\n\n<!-- generated: state-of-record -->\n")
    assert "(silu-broken) | **fail**" in page and "<!-- generated" not in page
    open_raw(ledger_path).execute("UPDATE records SET outcome = 'pass' WHERE id = 2")
    try:
        hook.on_page_markdown("<!-- generated: state-of-record -->")
    except Exception as exc:  # the build fails rather than show a tampered record
        assert "tampered" in str(exc)
    else:
        raise AssertionError("a tampered ledger of record was rendered")
