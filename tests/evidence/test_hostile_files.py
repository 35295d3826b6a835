"""Issue 23: what an attacker of a release directory or a ledger file puts where a file belongs, and the
content that crashed a reader. Each test names its negative control (the guard it depends on)."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from cacheon.canonical import canonical_json
from cacheon.evidence import boundary, chain, checkpoint, dsse, keys, release, sbom
from cacheon.evidence.classes import COMPAT_SUBJECT, EvidenceClass, Outcome
from cacheon.evidence.ledger import Ledger
from cacheon.runtime.identity import Identity, identity_digest

from ._forge import open_raw, rehash
from ._releases import _edit_envelope, _resign, _statement, _tampered_copy
from .conftest import add

Cli = Callable[..., tuple]
pytestmark = pytest.mark.timeout(30)  # a FIFO that is opened blocking hangs: fail fast instead


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dir(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "payload").write_text("anything")


# -- not a regular file ---------------------------------------------------------------------------

REPLACED = {
    "artifact is a FIFO": (lambda d: _fifo(d / "artifacts" / "notes.txt"), "notes.txt is a FIFO"),
    "artifact is a directory": (lambda d: _dir(d / "artifacts" / "notes.txt"), "notes.txt is a directory"),
    "SBOM is a FIFO": (lambda d: _fifo(d / "artifacts" / sbom.FILE_NAME), "sbom.cdx.json is a FIFO"),
    "envelope is a FIFO": (lambda d: _fifo(d / release.ENVELOPE), "release.dsse.json is a FIFO"),
}


@pytest.mark.parametrize("name", list(REPLACED))
def test_what_is_not_a_regular_file_fails_verify_and_sign(
    name: str, signed: Path, tmp_path: Path, keypair: tuple, run_cli: Cli
) -> None:
    """Control: with ``check_tree``/``check_artifact`` testing existence only (the old code), the FIFO and
    directory artifacts verified (exit 0) and the FIFO envelope hung the open."""
    replace, reason = REPLACED[name]
    target = _tampered_copy(signed, tmp_path, name.replace(" ", "-"))
    replace(target)
    code, out, err = run_cli("release", "verify", target, "--key", keypair[1])
    assert code == 2 and "Traceback" not in out + err, out + err
    assert any(reason in line for line in out.splitlines()), out
    code, out, err = run_cli("release", "sign", target, "--key", keypair[0])
    assert code != 0 and "refusing to sign" in err and reason in err, out + err


def test_the_listing_names_the_kind_of_each_intruder(signed: Path, tmp_path: Path, keypair: tuple) -> None:
    target = _tampered_copy(signed, tmp_path, "intruders")
    _fifo(target / "artifacts" / "notes.txt")
    problems = release.verify(target, [keys.parse_public_key(keypair[1])]).problems
    assert "artifacts/notes.txt is not a regular file (releases hold plain files only)" in problems, problems


def test_a_fifo_checkpoint_or_ledger_never_hangs(run_cli: Cli, ledger_path: Path, here: Identity, tmp_path: Path) -> None:
    """Control: ``read_bounded`` opened before its regular-file check, and the ledger header was read
    with a plain open: both blocked forever on a FIFO with no writer."""
    with Ledger.open(ledger_path) as ledger:
        add(ledger, here, EvidenceClass.STATIC_CANARY, COMPAT_SUBJECT, Outcome.PASS)
    os.mkfifo(checkpoint.default_path(ledger_path))
    code, out, err = run_cli("evidence", "verify", "--checkpoint-key", "ab" * 32)
    assert code == 2 and "is a FIFO, not a regular file" in out and "Traceback" not in err, out + err
    code, out, err = run_cli("evidence", "list")
    assert code == 2 and "is a FIFO" in err and len(err.strip().splitlines()) == 1, out + err
    fifo_ledger = tmp_path / "fifo.sqlite3"
    os.mkfifo(fifo_ledger)
    for argv in (("evidence", "list"), ("evidence", "verify"), ("pin", "status")):
        code, out, err = run_cli(*argv, "--ledger", fifo_ledger)
        assert code != 0 and "is a FIFO, not a regular file" in err, (argv, out, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_ledger_behind_a_link_reads_and_a_link_to_a_fifo_is_refused(
    run_cli: Cli, ledger_path: Path, here: Identity, tmp_path: Path
) -> None:
    with Ledger.open(ledger_path) as ledger:
        add(ledger, here, EvidenceClass.STATIC_CANARY, COMPAT_SUBJECT, Outcome.PASS)
    (tmp_path / "linked.sqlite3").symlink_to(ledger_path)
    assert run_cli("evidence", "list", "--ledger", tmp_path / "linked.sqlite3")[0] == 0
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "to-fifo.sqlite3").symlink_to(tmp_path / "fifo")
    code, _, err = run_cli("evidence", "list", "--ledger", tmp_path / "to-fifo.sqlite3")
    assert code != 0 and "is a FIFO, not a regular file" in err, err


def test_open_regular_refuses_every_other_kind_before_reading(tmp_path: Path) -> None:
    import socket

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock"))
        for name, kind in (("fifo", "a FIFO"), ("dir", "a directory"), ("link", "a symlink"), ("sock", "a socket")):
            with pytest.raises(boundary.Malformed, match=kind):
                boundary.read_bounded(tmp_path / name, 10)
    with pytest.raises(boundary.Malformed, match="is a device"):
        boundary.read_bounded(Path("/dev/zero"), 10)  # endless bytes: refused, never read
    assert boundary.read_bounded(tmp_path / "file", 10) == b"x"


# -- parse before trust -----------------------------------------------------------------------------


def test_an_unsigned_statement_is_never_parsed(
    signed: Path, tmp_path: Path, keypair: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong-typed ``standins`` (it crashed the descriptor validator) and an SBOM the size of the bound,
    under a statement no trusted key signed: only the signatures are read. Control: with the statement
    and SBOM parsed before the threshold (the old order), ``sbom.read`` runs and the statement is parsed."""
    target = _tampered_copy(signed, tmp_path, "unsigned")
    statement = _statement(target)
    statement["predicate"]["runtime_identity"]["facts"]["standins"] = 7
    payload = base64.b64encode(canonical_json(statement)).decode()
    _edit_envelope(target, lambda e: {**e, "payload": payload})
    parsed: list[str] = []
    real_read, real_problems = sbom.read, release.problems
    monkeypatch.setattr(sbom, "read", lambda path: parsed.append("sbom") or real_read(path))
    monkeypatch.setattr(release, "problems", lambda d: parsed.append("predicate") or real_problems(d))
    result = release.verify(target, [keys.parse_public_key(keypair[1])])
    assert not result.ok and parsed == [], (parsed, result.problems)
    assert result.problems[-1].startswith("the statement was not read"), result.problems


def test_wrong_typed_facts_under_a_trusted_signature_are_a_problem_not_a_crash(
    signed: Path, tmp_path: Path, keypair: tuple, run_cli: Cli
) -> None:
    """Control: without the typed facts check, ``standins = 7`` raised TypeError in the validator."""
    for value in (7, "abc", [1, 2], [{"name": 5}]):
        target = _tampered_copy(signed, tmp_path, f"standins-{len(str(value))}-{type(value).__name__}")
        statement = _statement(target)
        statement["predicate"]["runtime_identity"]["facts"]["standins"] = value
        _resign(target, canonical_json(statement))
        code, out, err = run_cli("release", "verify", target, "--key", keypair[1])
        assert code == 2 and "Traceback" not in out + err and "runtime_identity.facts" in out, out + err


# -- hostile ledger content --------------------------------------------------------------------------


def _rebuilt_without_strict(path: Path) -> sqlite3.Connection:
    """The records table as a forger rebuilds it: same columns, no STRICT, no CHECK."""
    conn = open_raw(path)
    conn.execute("ALTER TABLE records RENAME TO old_records")
    conn.execute(
        "CREATE TABLE records (id INTEGER PRIMARY KEY, evidence_class, subject, identity_digest, outcome, "
        "details, recorded_at, supersedes, prev_hash, record_hash)"
    )
    conn.execute("INSERT INTO records SELECT * FROM old_records")
    conn.execute("DROP TABLE old_records")
    return conn


@pytest.fixture
def two(ledger_path: Path, here: Identity) -> Path:
    with Ledger.open(ledger_path) as ledger:
        add(ledger, here, EvidenceClass.STATIC_CANARY, COMPAT_SUBJECT, Outcome.PASS)
        add(ledger, here, EvidenceClass.COMPONENT, "bundle:sha256:x", Outcome.FAIL)
    return ledger_path


def _every_reader_refuses(run_cli: Cli, reason: str) -> None:
    code, out, err = run_cli("evidence", "verify")
    assert code == 2 and reason in out and "Traceback" not in err, out + err
    for argv in (("evidence", "list"), ("evidence", "show", "1"), ("evidence", "state"), ("pin", "status"),
                 ("kv", "contracts")):
        code, out, err = run_cli(*argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and reason in err, (argv, out, err)


def test_a_blob_in_a_record_column(run_cli: Cli, two: Path) -> None:
    """Control: rows were built with ``Row(*row)``, so a BLOB reached the hash and raised TypeError."""
    conn = _rebuilt_without_strict(two)
    conn.execute("UPDATE records SET details = CAST('{}' AS BLOB) WHERE id = 2")
    conn.close()
    _every_reader_refuses(run_cli, "record #2 has a column of the wrong type")


@pytest.mark.parametrize(
    ("details", "reason"),
    [
        ('{"a":' * 5000 + "1" + "}" * 5000, "record #2 details do not decode"),  # RecursionError before
        ('{"a":' * 200 + "1" + "}" * 200, "nested more than 64 levels deep"),  # decodes; readers would recurse
        ("[1,2]", "record #2 details do not decode"),  # not an object: `show` indexed it
    ],
)
def test_hostile_details_rechained(run_cli: Cli, two: Path, details: str, reason: str) -> None:
    conn = open_raw(two)
    conn.execute("UPDATE records SET details = ? WHERE id = 2", (details,))
    rehash(conn, start=2)  # a consistent forgery: every hash recomputed
    conn.close()
    _every_reader_refuses(run_cli, reason)


@pytest.mark.parametrize(
    "facts",
    [
        {"packages": "sglang", "gpu": {"count": 1, "devices": 5}},
        {"packages": {"sglang": "0.5"}, "gpu": {"count": 1, "devices": [{"name": 1}]}},
        {"packages": {"sglang": "0.5"}, "standins": "x"},
        {"packages": {"sglang": "0.5"}, "x": json.loads("[" * 70 + "]" * 70)},  # deeper than any reader needs
    ],
)
def test_rechained_forgery_with_hostile_facts(run_cli: Cli, two: Path, facts: dict) -> None:
    """The forger adds an identity with facts of another shape, hashes it right, and re-chains the records
    onto it. Control: without the typed facts in the walk, `show`, `state`, `pin status` and
    `kv contracts` raised TypeError/AttributeError on these."""
    forged = identity_digest(facts)
    conn = open_raw(two)
    conn.execute("INSERT INTO identities VALUES (?, ?, '2026-01-01T00:00:00Z')", (forged, json.dumps(facts)))
    conn.execute("UPDATE records SET identity_digest = ?", (forged,))
    rehash(conn)
    conn.close()
    _every_reader_refuses(run_cli, "not a captured identity")


# -- control characters --------------------------------------------------------------------------------

PAINT = "\r\x1b[2K\x1b[1A\u202eOK release sha256:" + "0" * 64


def test_an_unsigned_forgery_cannot_repaint_the_report(signed: Path, tmp_path: Path, keypair: tuple, run_cli: Cli) -> None:
    """Control: key ids and values reached the terminal raw, so `\\r` and ESC[2K erased the FAIL line."""
    target = _tampered_copy(signed, tmp_path, "paint")
    _edit_envelope(target, lambda e: {**e, "signatures": [{"keyid": PAINT, "sig": "AAAA"}]})
    code, out, err = run_cli("release", "verify", target, "--key", keypair[1])
    assert code == 2 and out.startswith("FAIL release"), out
    assert not any(ch in out + err for ch in "\r\x1b\u202e"), repr(out + err)
    assert "\\x1b[2K" in out  # shown, visibly


def test_a_checkpoint_cannot_repaint_evidence_verify(run_cli: Cli, two: Path, tmp_path: Path) -> None:
    """A checkpoint for another ledger id full of escapes, signed by the trusted key (a careless signer)."""
    key_path, _ = keys.keygen(tmp_path / "keys" / "cp")
    key = keys.load_private_key(key_path)
    body = canonical_json({"head": "sha256:" + "0" * 64, "ledger": PAINT, "schema": checkpoint.SCHEMA,
                           "seq": 1, "signed_at": "2026-01-01T00:00:00Z"})
    checkpoint.write(checkpoint.default_path(two), dsse.add_signature(dsse.seal(checkpoint.PAYLOAD_TYPE, body), key))
    for argv in (("evidence", "verify", "--checkpoint-key", keys.public_hex(key.public_key())), ("evidence", "list")):
        code, out, err = run_cli(*argv)
        assert code == 2 and "the ledger file was replaced" in out + err, (argv, out, err)
        assert not any(ch in out + err for ch in "\r\x1b\u202e"), repr(out + err)


def test_chain_walk_escapes_the_ledger_id_it_reports(two: Path) -> None:
    conn = open_raw(two)
    conn.execute("UPDATE ledger_header SET ledger_id = ?", (PAINT,))
    conn.close()
    with Ledger.open(two, create=False) as ledger:
        report = ledger.check().to_json()
    assert "\x1b" not in report["ledger_id"] and report["ok"] is False
    assert chain.decode_header((PAINT, "t", "{}")).ledger_id == PAINT  # kept exact for the hash


def test_refusals_on_stderr_are_escaped_too(signed: Path, tmp_path: Path, keypair: tuple, run_cli: Cli, two: Path) -> None:
    """The one-line errors the CLI prints on stderr quote stored values as well: a release's version in
    `refusing to sign`, a record's identity digest in `tampered`. Control: both reached stderr raw."""
    from ._releases import _edit_statement_unsigned

    target = _tampered_copy(signed, tmp_path, "paint-sign")
    _edit_statement_unsigned(target, lambda s: s["predicate"]["sglang"].update(version=PAINT))
    code, out, err = run_cli("release", "sign", target, "--key", keypair[0])
    assert code == 1 and "refusing to sign" in err and "\\x1b" in err, err
    assert not any(ch in out + err for ch in "\r\x1b\u202e"), repr(err)
    conn = open_raw(two)
    conn.execute("UPDATE records SET identity_digest = ? WHERE id = 2", (PAINT,))
    rehash(conn, start=2)
    conn.close()
    code, out, err = run_cli("evidence", "list")
    assert code == 2 and "which the ledger lacks" in err, err
    assert not any(ch in out + err for ch in "\r\x1b\u202e"), repr(err)


def test_every_reader_says_which_guarantee_it_got(
    run_cli: Cli, two: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No checkpoint: chain only. A checkpoint: checked, trusted only when its key is named. A named key
    with the checkpoint deleted: refused. Control: readers took a chain-verified ledger and said nothing."""
    code, out, _ = run_cli("evidence", "list", "--json")
    assert code == 0 and json.loads(out)["guarantee"]["guarantee"] == "chain"
    key_path, public = keys.keygen(tmp_path / "keys" / "cp")
    assert run_cli("evidence", "checkpoint", "--key", key_path)[0] == 0
    for argv in (("evidence", "list", "--json"), ("evidence", "show", "1", "--json"), ("evidence", "state", "--json"),
                 ("pin", "status", "--json"), ("kv", "contracts", "--json")):
        code, out, err = run_cli(*argv)
        assert json.loads(out)["guarantee"]["guarantee"] == "untrusted_checkpoint", (argv, out, err)
    monkeypatch.setenv("CACHEON_CHECKPOINT_KEY", str(public))
    code, out, _ = run_cli("evidence", "list")
    assert code == 0 and "checked   chain + checkpoint #2 signed by a trusted key" in out, out
    code, out, _ = run_cli("pin", "status")
    assert "ledger checked: chain + checkpoint #2 signed by a trusted key" in out, out
    checkpoint.default_path(two).unlink()
    code, out, err = run_cli("evidence", "list")
    assert code == 2 and "no checkpoint at" in err and len(err.strip().splitlines()) == 1, out + err
