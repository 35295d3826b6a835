"""The ledger on disk: append-only, corrections, exact-identity answers, and bad files."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from cacheon.evidence.classes import EvidenceClass, Outcome
from cacheon.evidence.ledger import APPLICATION_ID, SCHEMA_VERSION, Entry, Ledger, LedgerError, open_ledger
from cacheon.evidence.standing import standing
from cacheon.runtime.identity import identity_from_facts

from .conftest import add, make_identity

PASS, FAIL, NOT_RUN = Outcome.PASS, Outcome.FAIL, Outcome.NOT_RUN
COMPONENT = EvidenceClass.COMPONENT


def test_round_trip_binds_identity_and_details(ledger_path: Path) -> None:
    identity = make_identity("0.5.13.post1")
    with Ledger.open(ledger_path) as ledger:
        rid = add(ledger, identity, COMPONENT, "bundle:sha256:aa", FAIL, max_abs_error=0.5, verdict="FAIL")
    with Ledger.open(ledger_path, create=False) as ledger:
        record = ledger.verified().record(rid)
        assert (record.evidence_class, record.subject, record.outcome) == (
            "component",
            "bundle:sha256:aa",
            "fail",
        )
        assert record.details == {"max_abs_error": 0.5, "verdict": "FAIL"}
        assert record.identity_digest == identity.digest
        assert ledger.verified().identity(identity.digest) == identity
        assert record.recorded_at.endswith("Z")
    raw = sqlite3.connect(ledger_path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE records SET outcome = 'pass'",
        "DELETE FROM records",
        "UPDATE identities SET facts = '{}'",
        "DELETE FROM identities",
    ],
)
def test_the_database_itself_refuses_edits(ledger_path: Path, statement: str) -> None:
    with Ledger.open(ledger_path) as ledger:
        add(ledger, make_identity("a"), COMPONENT, "bundle:x", FAIL)
    raw = sqlite3.connect(ledger_path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        raw.execute(statement)


def test_correction_supersedes_and_keeps_the_claim(ledger_path: Path) -> None:
    identity = make_identity("a")
    with Ledger.open(ledger_path) as ledger:
        old = add(ledger, identity, COMPONENT, "bundle:x", PASS)
        new = ledger.correct(old, FAIL, "reference was wrong")
        assert ledger.verified().record(old).superseded_by == new
        assert ledger.verified().record(new).supersedes == old
        assert ledger.verified().record(new).outcome == "fail"
        current = standing(ledger.verified(), identity.digest).current
        assert current[("component", "bundle:x")].id == new
        with pytest.raises(LedgerError, match="already superseded"):
            ledger.correct(old, PASS, "again")
        relabel = Entry(EvidenceClass.COMPLETE_ENGINE, "bundle:x", identity, PASS, supersedes=new)
        with pytest.raises(LedgerError, match="must keep class, subject and identity"):
            ledger.append(relabel)
        elsewhere = Entry(COMPONENT, "bundle:x", make_identity("b"), PASS, supersedes=new)
        with pytest.raises(LedgerError, match="must keep class, subject and identity"):
            ledger.append(elsewhere)
        assert len(ledger.verified().records()) == 2


def test_answers_are_for_the_exact_identity_only(ledger_path: Path) -> None:
    mine, other_torch = make_identity("0.5.14"), make_identity("0.5.14", torch="2.99.0")
    assert mine.digest != other_torch.digest
    with Ledger.open(ledger_path) as ledger:
        add(ledger, other_torch, COMPONENT, "bundle:x", PASS)
        add(ledger, mine, COMPONENT, "bundle:y", NOT_RUN)
        add(ledger, mine, COMPONENT, "bundle:z", PASS)
        add(ledger, mine, COMPONENT, "bundle:z", FAIL)  # the latest record of a claim stands
        state = standing(ledger.verified(), mine.digest)
    assert state.counts() == {"pass": 0, "fail": 1, "blocked": 0, "not_run": 1}
    assert [r.subject for r in state.other_identity] == ["bundle:x"]
    assert ("component", "bundle:x") not in state.current


def test_batch_is_atomic_on_error(ledger_path: Path) -> None:
    identity = make_identity("a")
    with Ledger.open(ledger_path) as ledger:
        with pytest.raises(RuntimeError), ledger.batch() as append:
            append(Entry(COMPONENT, "bundle:1", identity, PASS))
            raise RuntimeError("writer failed mid-batch")
        assert ledger.verified().records() == []


def test_a_digest_that_does_not_match_its_facts_is_refused(ledger_path: Path) -> None:
    real = identity_from_facts({"schema": 1, "packages": {"sglang": "a"}})
    forged = type(real)(facts={"schema": 1, "packages": {"sglang": "b"}}, digest=real.digest)
    with Ledger.open(ledger_path) as ledger, pytest.raises(LedgerError, match="does not match its facts"):
        ledger.append(Entry(COMPONENT, "bundle:x", forged, PASS))


def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello, I am not a ledger\n" * 10)
    with pytest.raises(LedgerError, match="not an SQLite database"):
        Ledger.open(path)


def test_foreign_sqlite_database(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE users(name TEXT)")
    raw.commit()
    raw.close()
    with pytest.raises(LedgerError, match="SQLite database but not a Cacheon ledger"):
        Ledger.open(path)
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA application_id = 1234")
    raw.close()
    with pytest.raises(LedgerError, match="application_id 0x4d2"):
        Ledger.open(path)


def test_newer_schema_is_refused(ledger_path: Path) -> None:
    Ledger.open(ledger_path).close()
    raw = sqlite3.connect(ledger_path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(LedgerError, match="newer than this cacheon supports"):
        Ledger.open(ledger_path)


def test_corrupted_pages_give_a_clear_error(ledger_path: Path) -> None:
    identity = make_identity("a")
    with Ledger.open(ledger_path) as ledger, ledger.batch() as append:
        for i in range(300):
            append(Entry(COMPONENT, f"bundle:{i}", identity, PASS, {"padding": "x" * 200}))
    assert not ledger_path.with_name(ledger_path.name + "-wal").exists()  # checkpointed on close
    data = bytearray(ledger_path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[page:] = b"\xa5" * (len(data) - page)  # keep the header page, garble every other page
    ledger_path.write_bytes(bytes(data))
    with pytest.raises(LedgerError, match="is corrupted"), Ledger.open(ledger_path) as ledger:
        ledger.verified().records()


def test_named_ledger_must_exist_to_be_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "typo.sqlite3"
    with pytest.raises(LedgerError, match="no ledger at"):
        open_ledger(str(missing), for_write=False)
    monkeypatch.setenv("CACHEON_LEDGER", str(missing))
    with pytest.raises(LedgerError, match="no ledger at"):
        open_ledger(None, for_write=False)
    open_ledger(None, for_write=True).close()
    assert missing.exists()
