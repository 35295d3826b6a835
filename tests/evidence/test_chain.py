"""A ledger that shows tampering: every forgery a writer of the file can make, and what catches it.

Each tamper test carries its own negative control: with the chain check switched off
(``unchecked``) the same tampered file reads back without complaint, so the detection shown is
the chain's doing and nothing else's. What the chain alone cannot catch (a cut-off tail, a
consistently re-hashed rewrite) is asserted as such, then caught with a checkpoint.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from cacheon.canonical import canonical_json
from cacheon.evidence import chain, checkpoint
from cacheon.evidence.classes import COMPAT_SUBJECT, EvidenceClass, Outcome, contract_subject
from cacheon.evidence.ledger import Entry, Ledger, LedgerTampered, open_verified_ledger
from cacheon.evidence.promotion import validated_contracts
from cacheon.runtime.identity import Identity

from ._forge import open_raw, rehash
from .conftest import add, make_identity

Cli = Callable[..., tuple]
C = EvidenceClass


@pytest.fixture
def unchecked(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Negative control: switch off every check the walk makes."""

    def disable() -> None:
        monkeypatch.setattr(chain, "_link_problem", lambda row, head: None)
        monkeypatch.setattr(chain, "_content_problem", lambda row, facts, identities: None)

    return disable


@pytest.fixture
def four(ledger_path: Path, here: Identity) -> Path:
    """#1 compat pass, #2 a component FAIL, #3 a complete-engine pass, #4 another component pass."""
    with Ledger.open(ledger_path) as ledger:
        add(ledger, here, C.STATIC_CANARY, COMPAT_SUBJECT, Outcome.PASS)
        add(ledger, here, C.COMPONENT, "bundle:sha256:broken", Outcome.FAIL, control="broken", confinement="bubblewrap")
        add(ledger, make_identity("0.5.13.post1", gpus=1), C.COMPLETE_ENGINE, contract_subject("c1"), Outcome.PASS)
        add(ledger, here, C.COMPONENT, "bundle:sha256:faithful", Outcome.PASS)
    return ledger_path


@pytest.fixture
def signer(tmp_path: Path, run_cli: Cli) -> tuple[Path, str]:
    code, _, err = run_cli("release", "keygen", tmp_path / "keys" / "ledger")
    assert code == 0, err
    return tmp_path / "keys" / "ledger.key", (tmp_path / "keys" / "ledger.pub").read_text().strip()


def _outcome_of_2(path: Path) -> str:
    return open_verified_ledger(path).record(2).outcome


def _refused_everywhere(run_cli: Cli, path: Path, reason: str) -> None:
    """Every reader refuses with exit 2 and one line naming the broken record; nothing is printed."""
    code, out, _ = run_cli("evidence", "verify")
    assert code == 2 and reason in out, out
    for argv in (("evidence", "list"), ("evidence", "list", "--json"), ("evidence", "show", "1"), ("pin", "status")):
        code, out, err = run_cli(*argv)
        assert code == 2, (argv, out, err)
        assert out == "" and len(err.strip().splitlines()) == 1 and reason in err and "tampered" in err, err
    with pytest.raises(LedgerTampered, match=reason):
        validated_contracts(open_verified_ledger(path), {"c1": {"0.5.13.post1"}})


def test_an_intact_ledger_verifies(run_cli: Cli, four: Path) -> None:
    code, out, _ = run_cli("evidence", "verify", "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["records"] == 4 and report["head"]["seq"] == 4
    assert report["origin"] == {"kind": "new"} and report["broken"] is None
    assert report["limits"] and "cannot be told from an honest ledger" in report["limits"][0]
    records = open_verified_ledger(four).records()
    assert [r.prev_hash for r in records[1:]] == [r.hash for r in records[:-1]]


def test_a_fail_edited_into_a_pass(run_cli: Cli, four: Path, unchecked: Callable[[], None]) -> None:
    conn = open_raw(four)
    conn.execute("UPDATE records SET outcome = 'pass' WHERE id = 2")  # the triggers are gone
    _refused_everywhere(run_cli, four, "record #2 does not match its hash")
    with pytest.raises(LedgerTampered), Ledger.open(four) as ledger:  # nobody extends a tampered ledger
        add(ledger, make_identity("x"), C.COMPONENT, "bundle:x", Outcome.PASS)
    unchecked()
    assert _outcome_of_2(four) == "pass"  # without the chain check the fail reads back as a pass


def test_an_edit_with_its_own_hash_recomputed(run_cli: Cli, four: Path, unchecked: Callable[[], None]) -> None:
    conn = open_raw(four)
    conn.execute("UPDATE records SET outcome = 'pass' WHERE id = 2")
    rehash(conn, start=2, links=False)  # #2's hash fits its content again; #3 still names the old #2
    _refused_everywhere(run_cli, four, "record #3 does not link to record #2")
    unchecked()
    assert _outcome_of_2(four) == "pass"


def test_a_deleted_middle_record(run_cli: Cli, four: Path, unchecked: Callable[[], None]) -> None:
    open_raw(four).execute("DELETE FROM records WHERE id = 2")
    _refused_everywhere(run_cli, four, "record #2 is missing")
    unchecked()
    assert [r.id for r in open_verified_ledger(four).records()] == [1, 3, 4]


def test_reordered_records(run_cli: Cli, four: Path, unchecked: Callable[[], None]) -> None:
    conn = open_raw(four)
    for statement in (
        "UPDATE records SET id = 99 WHERE id = 2",
        "UPDATE records SET id = 2 WHERE id = 3",
        "UPDATE records SET id = 3 WHERE id = 99",
    ):
        conn.execute(statement)
    _refused_everywhere(run_cli, four, "record #2 does not match its hash")
    rehash(conn, start=2, links=False)  # each moved record re-hashed under its new place, links kept
    _refused_everywhere(run_cli, four, "record #2 does not link to record #1")
    unchecked()
    assert open_verified_ledger(four).record(2).evidence_class == "complete_engine"


def test_edited_identity_facts(run_cli: Cli, four: Path, here: Identity, unchecked: Callable[[], None]) -> None:
    facts = {**here.facts, "packages": {**here.facts["packages"], "torch": "9.9.9"}}
    conn = open_raw(four)
    conn.execute("UPDATE identities SET facts = ? WHERE digest = ?", (json.dumps(facts), here.digest))
    _refused_everywhere(run_cli, four, "record #1: the facts of identity")
    unchecked()
    assert open_verified_ledger(four).records()[0].identity_digest == here.digest


def test_an_edited_header(run_cli: Cli, four: Path, unchecked: Callable[[], None]) -> None:
    open_raw(four).execute("UPDATE ledger_header SET ledger_id = ledger_id || 'x'")
    _refused_everywhere(run_cli, four, "record #1 does not link to the ledger's genesis")
    open_raw(four).execute("DELETE FROM ledger_header")
    _refused_everywhere(run_cli, four, "the ledger header is missing")
    unchecked()
    with pytest.raises(LedgerTampered):  # a missing header is not a link the control can switch off
        open_verified_ledger(four)


def test_a_cut_off_tail_shows_only_against_a_known_head(
    run_cli: Cli, four: Path, signer: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run_cli("evidence", "checkpoint", "--key", signer[0], "--json")
    assert code == 0, err
    signed = json.loads(out)
    assert signed["head"]["seq"] == 4 and Path(signed["checkpoint"]) == checkpoint.default_path(four)
    _, head_line = run_cli("evidence", "verify")[1].splitlines()[:2]
    remembered = head_line.split()[1]
    open_raw(four).execute("DELETE FROM records WHERE id = 4")

    code, out, _ = run_cli("evidence", "verify")
    assert code == 0 and "3 records, every link holds" in out  # the chain alone cannot see it
    code, out, _ = run_cli("evidence", "verify", "--checkpoint-key", signer[1])
    assert code == 2 and "ends at record #3, but #4 was vouched for" in out, out
    code, out, _ = run_cli("evidence", "verify", "--expect-head", remembered)
    assert code == 2 and "truncated" in out, out
    monkeypatch.setattr(checkpoint, "contradiction", lambda view, ledger_id, expected: None)
    assert run_cli("evidence", "verify", "--checkpoint-key", signer[1])[0] == 0  # negative control


def test_a_consistently_rehashed_forgery_shows_only_with_a_checkpoint(
    run_cli: Cli, four: Path, signer: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run_cli("evidence", "checkpoint", "--key", signer[0])[0] == 0
    conn = open_raw(four)
    conn.execute("UPDATE records SET outcome = 'pass' WHERE id = 2")
    rehash(conn, start=2)  # every hash and link after the edit recomputed, the header kept
    conn.close()
    with Ledger.open(four, create=False) as ledger:
        assert ledger.verified().record(2).outcome == "pass"  # a valid chain: the chain alone is fooled
    with pytest.raises(LedgerTampered, match="the history up to it was rewritten"):
        _outcome_of_2(four)  # every reader checks the checkpoint beside the ledger, trusted key or not
    code, out, _ = run_cli("evidence", "verify")
    assert code == 0 and "cannot be told from an honest ledger" in out
    code, out, _ = run_cli("evidence", "verify", "--checkpoint-key", signer[1])
    assert code == 2 and "record #4 hashes to" in out and "rewritten" in out, out
    code, out, err = run_cli("evidence", "checkpoint", "--key", signer[0])  # no laundering by re-signing
    assert code == 2 and "refusing to replace checkpoint" in err, out + err
    monkeypatch.setattr(checkpoint, "contradiction", lambda view, ledger_id, expected: None)
    assert run_cli("evidence", "verify", "--checkpoint-key", signer[1])[0] == 0  # negative control


def test_a_whole_file_replaced_by_another_ledger(
    run_cli: Cli, four: Path, here: Identity, signer: tuple[Path, str]
) -> None:
    assert run_cli("evidence", "checkpoint", "--key", signer[0])[0] == 0
    four.unlink()
    with Ledger.open(four) as forged:  # a fresh, perfectly chained ledger with the story the forger wants
        for _ in range(4):
            add(forged, here, C.COMPONENT, "bundle:sha256:broken", Outcome.PASS, control="broken", confinement="bubblewrap")
    assert run_cli("evidence", "verify")[0] == 0
    code, out, _ = run_cli("evidence", "verify", "--checkpoint-key", signer[1])
    assert code == 2 and "the ledger file was replaced" in out, out


def test_the_checkpoint_itself_cannot_be_dropped_forged_or_swapped(
    run_cli: Cli, four: Path, tmp_path: Path, signer: tuple[Path, str]
) -> None:
    assert run_cli("evidence", "checkpoint", "--key", signer[0])[0] == 0
    path = checkpoint.default_path(four)
    code, out, _ = run_cli("evidence", "verify", "--checkpoint-key", signer[1])
    assert code == 0 and "checkpoint #4" in out and "held" in out

    run_cli("release", "keygen", tmp_path / "keys" / "stranger")
    stranger = (tmp_path / "keys" / "stranger.pub").read_text().strip()
    code, out, _ = run_cli("evidence", "verify", "--checkpoint-key", stranger)
    assert code == 2 and "not signed by a trusted key" in out

    envelope = json.loads(path.read_bytes())
    payload = json.loads(base64.b64decode(envelope["payload"]))
    payload["seq"] = 2  # "vouch" for less, keeping the signature
    envelope["payload"] = base64.b64encode(canonical_json(payload)).decode()
    path.write_bytes(canonical_json(envelope))
    code, out, _ = run_cli("evidence", "verify", "--checkpoint-key", signer[1])
    assert code == 2 and "(invalid)" in out, out

    path.unlink()  # the forger drops it: a verifier holding a key requires one
    code, out, _ = run_cli("evidence", "verify", "--checkpoint-key", signer[1])
    assert code == 2 and "missing" in out and "requires a checkpoint" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[" * 5000 + b"]" * 5000, "Expected `object`, got `array`"),  # typed from the first byte
        (b'{"payload":"\xff"}', "not JSON"),
        (b"x" * (checkpoint.MAX_BYTES + 1), "over the 65536-byte limit"),
        (b'{"payload":"","payload":"","payloadType":"x","signatures":[]}', "duplicate key"),
        (b'{"payload":1,"payloadType":"x","signatures":[]}', "Expected `str`, got `int`"),
        (b"[]", "Expected `object`, got `array`"),
    ],
)
def test_hostile_checkpoint_files_are_one_line_failures(
    run_cli: Cli, four: Path, signer: tuple[Path, str], content: bytes, message: str
) -> None:
    path = checkpoint.default_path(four)
    path.write_bytes(content)
    code, out, err = run_cli("evidence", "verify", "--checkpoint-key", signer[1])
    assert code == 2 and message in out and "Traceback" not in out + err, out + err
    assert len([line for line in out.splitlines() if line.startswith("FAIL")]) == 1


def test_usage_errors(run_cli: Cli, four: Path, signer: tuple[Path, str]) -> None:
    for argv, message in [
        (("evidence", "verify", "--checkpoint", four), "only checked against a key you trust"),
        (("evidence", "verify", "--expect-head", "4:abc"), "is not SEQ:sha256:<64 hex>"),
        (("evidence", "verify", "--checkpoint-key", "nope"), "neither 64 hex characters nor a .pub file"),
    ]:
        code, _, err = run_cli(*argv)
        assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err


def test_an_empty_ledger_checkpoints_its_genesis(run_cli: Cli, ledger_path: Path, signer: tuple[Path, str]) -> None:
    Ledger.open(ledger_path).close()
    code, out, _ = run_cli("evidence", "checkpoint", "--key", signer[0], "--json")
    assert code == 0 and json.loads(out)["head"]["seq"] == 0
    assert run_cli("evidence", "verify", "--checkpoint-key", signer[1])[0] == 0
    with Ledger.open(ledger_path) as ledger:
        ledger.append(Entry(C.COMPONENT, "bundle:x", make_identity("a"), Outcome.PASS))
    code, out, _ = run_cli("evidence", "verify", "--checkpoint-key", signer[1])
    assert code == 0 and "records #1..#1 are after the vouched head" in out


def _v1_ledger(path: Path, records: int) -> None:
    """A ledger as cacheon wrote it before the chain (schema v1): the v1 schema and v1 rows."""
    from cacheon.evidence import ledger as module

    conn = sqlite3.connect(path, isolation_level=None)
    module._create_v1(conn)
    identity = make_identity("0.5.13.post1")
    conn.execute("INSERT INTO identities VALUES (?, ?, ?)", (identity.digest, json.dumps(identity.facts), "t"))
    for i in range(records):
        conn.execute(
            "INSERT INTO records(evidence_class, subject, identity_digest, outcome, details, recorded_at) "
            "VALUES ('component', ?, ?, 'fail', '{}', '2026-01-01T00:00:00.000000Z')",
            (f"bundle:{i}", identity.digest),
        )
    conn.execute(f"PRAGMA application_id = {module.APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 1")
    conn.close()


def test_an_unchained_ledger_is_refused_until_migrated(run_cli: Cli, ledger_path: Path) -> None:
    _v1_ledger(ledger_path, 3)
    code, _, err = run_cli("evidence", "list")
    assert code == 1 and "without a hash chain: run `cacheon evidence migrate --ledger" in err
    assert len(err.strip().splitlines()) == 1
    code, out, err = run_cli("evidence", "migrate", "--json")
    assert code == 0, err
    assert json.loads(out)["origin"] == {"kind": "migrated", "from_schema": 1, "records": 3}
    code, out, _ = run_cli("evidence", "verify")
    assert code == 0 and "migrated from an unchained ledger with 3 records" in out
    assert [r.outcome for r in open_verified_ledger(ledger_path).records()] == ["fail"] * 3
    open_raw(ledger_path).execute("UPDATE records SET outcome = 'pass' WHERE id = 1")
    assert run_cli("evidence", "verify")[0] == 2  # from the migration on, the chain shows any change


def test_migration_refuses_a_v1_ledger_with_a_deleted_record(run_cli: Cli, ledger_path: Path) -> None:
    _v1_ledger(ledger_path, 3)
    conn = sqlite3.connect(ledger_path, isolation_level=None)
    conn.execute("DROP TRIGGER records_no_delete")
    conn.execute("DELETE FROM records WHERE id = 2")
    conn.close()
    code, _, err = run_cli("evidence", "migrate")
    assert code == 1 and "record #2 is missing from this unchained ledger" in err
    assert sqlite3.connect(ledger_path).execute("PRAGMA user_version").fetchone()[0] == 1  # rolled back
