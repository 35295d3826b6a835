"""Signatures others can verify: the release attestation and the ledger checkpoint checked by the
ecosystem's own verifiers (securesystemslib's DSSE, in-toto's envelope, the in-toto attestation
Statement v1 schema, RFC 8785 by the ``rfc8785`` library), on one shared set of good and tampered
fixtures: ``cacheon release verify`` accepts exactly what they accept and refuses what they refuse."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from cacheon.canonical import canonical_json
from cacheon.evidence import checkpoint, dsse, keys, release
from cacheon.evidence.descriptor import RELEASE_DOMAIN
from cacheon.evidence.ledger import open_verified_ledger

from ._releases import _envelope, _keygen, _statement

securesystemslib_dsse = pytest.importorskip("securesystemslib.dsse")
signer_module = pytest.importorskip("securesystemslib.signer")
in_toto_metadata = pytest.importorskip("in_toto.models.metadata")
statement_pb2 = pytest.importorskip("in_toto_attestation.v1.statement_pb2")
json_format = pytest.importorskip("google.protobuf.json_format")

Cli = Callable[..., tuple]


def _sslib_key(keyid: str) -> Any:
    """Our key id is the Ed25519 public key in hex: securesystemslib's key with that id and value."""
    return signer_module.SSlibKey(keyid, "ed25519", "ed25519", {"public": keyid})


def _sslib_accepts(envelope: dict[str, Any], trusted: list[str], threshold: int) -> bool:
    from securesystemslib.exceptions import FormatError, VerificationError

    try:
        parsed = securesystemslib_dsse.Envelope.from_dict(json.loads(json.dumps(envelope)))
        parsed.verify([_sslib_key(k) for k in trusted], threshold)
    except (VerificationError, ValueError, FormatError):
        return False
    return parsed.payload_type == release.PAYLOAD_TYPE  # a consumer of their library checks the type it expects


def _in_toto_accepts(envelope: dict[str, Any], trusted: list[str], threshold: int) -> bool:
    """in-toto's own envelope (its ``verify_signature`` per key), counted to the threshold."""
    from in_toto.exceptions import SignatureVerificationError

    try:
        parsed = in_toto_metadata.Envelope.from_dict(json.loads(json.dumps(envelope)))
    except ValueError:
        return False
    passed = 0
    for keyid in trusted:
        try:
            parsed.verify_signature({"keyid": keyid, "keytype": "ed25519", "scheme": "ed25519",
                                     "keyval": {"public": keyid}})
            passed += 1
        except SignatureVerificationError:
            continue
    return passed >= threshold and parsed.payload_type == release.PAYLOAD_TYPE


def _write(release_dir: Path, envelope: dict[str, Any]) -> None:
    (release_dir / release.ENVELOPE).write_bytes(canonical_json(envelope))


def _signature(body: bytes, payload_type: str, key_path: Path) -> dict[str, str]:
    signed_once = dsse.add_signature(dsse.seal(payload_type, body), keys.load_private_key(key_path))
    return {"keyid": signed_once.signatures[0].keyid, "sig": signed_once.signatures[0].sig}


@pytest.fixture
def cases(signed: Path, tmp_path: Path, keypair: tuple, run_cli: Cli) -> dict[str, tuple[Path, list[str], int]]:
    """The shared fixtures: name -> (release dir, trusted key ids, threshold)."""
    second_key, second = _keygen(tmp_path, run_cli, "second")
    stranger_key, _ = _keygen(tmp_path, run_cli, "stranger")
    good = _envelope(signed)
    body = base64.b64decode(good["payload"])
    ours = keypair[1]
    edited = json.loads(body)
    edited["predicate"]["model"]["id"] = "someone/else"
    variants: dict[str, tuple[dict[str, Any], list[str], int]] = {
        "good": (good, [ours], 1),
        "good, two signers": (
            {**good, "signatures": [*good["signatures"], _signature(body, release.PAYLOAD_TYPE, second_key)]},
            [ours, second], 2,
        ),
        "one of two required signers": (good, [ours, second], 2),
        "payload edited after signing": (
            {**good, "payload": base64.b64encode(canonical_json(edited)).decode()}, [ours], 1,
        ),
        "signature bytes flipped": (
            {**good, "signatures": [{**good["signatures"][0], "sig": base64.b64encode(b"\x01" * 64).decode()}]},
            [ours], 1,
        ),
        "signed by a stranger only": (
            {**good, "signatures": [_signature(body, release.PAYLOAD_TYPE, stranger_key)]}, [ours], 1,
        ),
        "stranger's signature under our key id": (
            {**good, "signatures": [{**_signature(body, release.PAYLOAD_TYPE, stranger_key), "keyid": ours}]},
            [ours], 1,
        ),
        "signed as another payload type": (
            {**good, "signatures": [_signature(body, checkpoint.PAYLOAD_TYPE, keypair[0])]}, [ours], 1,
        ),
        "payload type relabelled": ({**good, "payloadType": "application/json"}, [ours], 1),
        "one key's signature twice": ({**good, "signatures": good["signatures"] * 2}, [ours, second], 2),
        "no signatures": ({**good, "signatures": []}, [ours], 1),
    }
    out = {}
    for index, (name, (envelope, trusted, threshold)) in enumerate(variants.items()):
        target = tmp_path / "interop" / str(index)
        shutil.copytree(signed, target)
        _write(target, envelope)
        out[name] = (target, trusted, threshold)
    return out


EXPECTED_ACCEPTED = {"good", "good, two signers"}


def test_cacheon_agrees_with_securesystemslib_and_in_toto(cases: dict[str, tuple[Path, list[str], int]]) -> None:
    """Control: before one-signature-per-key, an envelope with one key's signature twice parsed in ours
    and was refused by both of theirs (``Multiple signatures found for keyid``)."""
    verdicts = {}
    for name, (target, trusted, threshold) in cases.items():
        envelope = json.loads((target / release.ENVELOPE).read_bytes())
        ours = release.verify(target, [keys.parse_public_key(k) for k in trusted], threshold=threshold).ok
        verdicts[name] = (ours, _sslib_accepts(envelope, trusted, threshold), _in_toto_accepts(envelope, trusted, threshold))
    assert {name for name, v in verdicts.items() if v[1]} == EXPECTED_ACCEPTED, verdicts
    disagreements = {name: v for name, v in verdicts.items() if len(set(v)) != 1}
    assert not disagreements, disagreements


def test_a_release_signed_with_securesystemslib_verifies_in_cacheon(
    signed: Path, tmp_path: Path, keypair: tuple
) -> None:
    """Their signer, our verifier: the PAE and the envelope are the standard ones, not a private variant."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = keys.load_private_key(keypair[0])
    assert isinstance(private, Ed25519PrivateKey)
    their_signer = signer_module.CryptoSigner(private, _sslib_key(keypair[1]))
    body = base64.b64decode(_envelope(signed)["payload"])
    envelope = securesystemslib_dsse.Envelope(body, release.PAYLOAD_TYPE, {})
    envelope.sign(their_signer)
    target = tmp_path / "theirs"
    shutil.copytree(signed, target)
    _write(target, envelope.to_dict())
    assert release.verify(target, [keys.parse_public_key(keypair[1])]).ok


def test_the_statement_is_an_in_toto_statement_v1(signed: Path) -> None:
    """Parsed and validated by the in-toto attestation framework's own Statement v1 schema."""
    from in_toto_attestation.v1.statement import Statement

    body = base64.b64decode(_envelope(signed)["payload"])
    proto = json_format.Parse(body, statement_pb2.Statement())
    Statement.copy_from_pb(proto).validate()
    assert [s.name for s in proto.subject] == [s["name"] for s in _statement(signed)["subject"]]


def test_every_digest_over_json_is_rfc8785(signed: Path) -> None:
    """The envelope, the statement and the release digest recomputed with the ``rfc8785`` library alone."""
    raw = (signed / release.ENVELOPE).read_bytes()
    assert raw == rfc8785.dumps(json.loads(raw))
    body = base64.b64decode(json.loads(raw)["payload"])
    assert body == rfc8785.dumps(json.loads(body))
    predicate = json.loads(body)["predicate"]
    expected = "sha256:" + hashlib.sha256(RELEASE_DOMAIN.encode() + b"\x00" + rfc8785.dumps(predicate)).hexdigest()
    code = release.verify(signed, [keys.parse_public_key(_envelope(signed)["signatures"][0]["keyid"])])
    assert code.release_digest == expected


def test_a_checkpoint_verifies_with_securesystemslib(run_cli: Cli, tmp_path: Path, ledger_path: Path) -> None:
    from cacheon.evidence.ledger import Ledger

    Ledger.open(ledger_path).close()
    key_path, public = keys.keygen(tmp_path / "keys" / "cp")
    assert run_cli("evidence", "checkpoint", "--key", key_path)[0] == 0
    raw = checkpoint.default_path(ledger_path).read_bytes()
    parsed = securesystemslib_dsse.Envelope.from_dict(json.loads(raw))
    keyid = public.read_text().strip()
    assert list(parsed.verify([_sslib_key(keyid)], 1)) == [keyid]
    assert parsed.payload_type == checkpoint.PAYLOAD_TYPE
    assert open_verified_ledger(ledger_path).guarantee()["guarantee"] == "untrusted_checkpoint"
