"""Engine releases: build -> sign -> verify as DSSE-enveloped in-toto statements with real Ed25519,
and tampering with every field and file."""

from __future__ import annotations

import base64
import json
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cacheon.canonical import canonical_json
from cacheon.evidence import keys, release
from cacheon.evidence.ledger import Ledger

from ._releases import (
    _edit_envelope,
    _edit_statement,
    _edit_statement_unsigned,
    _envelope,
    _keygen,
    _resign,
    _spec,
    _statement,
    _statement_with,
    _tampered_copy,
)


def test_keygen_modes_and_no_overwrite(tmp_path: Path, run_cli: Callable[..., tuple], keypair: tuple) -> None:
    private, public = keypair
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(private.with_suffix(".pub").stat().st_mode) == 0o644
    assert len(public) == 64
    code, _, err = run_cli("release", "keygen", tmp_path / "keys" / "signer")
    assert code == 1 and "refusing to overwrite" in err


def test_build_sign_verify(
    signed: Path, tmp_path: Path, keypair: tuple[Path, str], run_cli: Callable[..., tuple]
) -> None:
    assert sorted(p.relative_to(signed).as_posix() for p in signed.rglob("*")) == [
        "artifacts",
        "artifacts/notes.txt",
        "artifacts/rmsnorm.tar.gz",
        "artifacts/sbom.cdx.json",
        "release.dsse.json",
    ]
    raw = (signed / release.ENVELOPE).read_bytes()
    envelope = json.loads(raw)
    assert raw == canonical_json(envelope) and envelope["payloadType"] == "application/vnd.in-toto+json"
    statement = _statement(signed)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == release.PREDICATE_TYPE
    descriptor = statement["predicate"]
    assert descriptor["schema"] == "cacheon.engine-release.v2" and descriptor["sbom"] == "sbom.cdx.json"
    assert [a["name"] for a in descriptor["artifacts"]] == ["notes.txt", "rmsnorm.tar.gz", "sbom.cdx.json"]
    assert descriptor["artifacts"][1]["size"] == 256 * 64
    import hashlib

    assert statement["subject"] == [
        {"name": f"artifacts/{n}", "digest": {"sha256": hashlib.sha256((signed / "artifacts" / n).read_bytes()).hexdigest()}}
        for n in ("notes.txt", "rmsnorm.tar.gz", "sbom.cdx.json")
    ]
    [signature] = envelope["signatures"]
    assert signature["keyid"] == keypair[1]
    code, out, err = run_cli("release", "verify", signed, "--public-key", keypair[1])
    assert code == 0, out + err
    assert out.startswith("OK release sha256:") and "1 trusted signer (threshold 1)" in out
    code, out, _ = run_cli("release", "verify", signed, "--key", keypair[0].with_suffix(".pub"), "--json")
    report = json.loads(out)
    assert code == 0 and report["trusted_signers"] == [keypair[1]] and report["format"] == "attestation"


def test_the_signature_covers_the_pre_authentication_encoding(signed: Path, keypair: tuple[Path, str]) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from cacheon.evidence import dsse

    # The DSSE spec's own example: PAE("http://example.com/HelloWorld", "hello world").
    assert dsse.pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    envelope = _envelope(signed)
    body = base64.b64decode(envelope["payload"])
    sig = base64.b64decode(envelope["signatures"][0]["sig"])
    public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(keypair[1]))
    public.verify(sig, dsse.pae(release.PAYLOAD_TYPE, body))  # raises if the signature is over anything else


def test_a_signature_cannot_be_replayed_under_another_payload_type(
    signed: Path, tmp_path: Path, keypair: tuple[Path, str]
) -> None:
    """The same key signs ledger checkpoints; a signature made for that type never verifies as a release."""
    from cacheon.evidence import checkpoint, dsse

    target = _tampered_copy(signed, tmp_path, "replayed")
    body = base64.b64decode(_envelope(signed)["payload"])
    other = dsse.add_signature(dsse.seal(checkpoint.PAYLOAD_TYPE, body), keys.load_private_key(keypair[0]))
    _edit_envelope(target, lambda e: {**e, "signatures": [msgspec_builtins(s) for s in other.signatures]})
    problems = release.verify(target, [keys.parse_public_key(keypair[1])]).problems
    assert any("trusted, but the signature does not verify" in p for p in problems), problems


def msgspec_builtins(value: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(value)


def _leaves(value: Any, path: tuple = ()) -> Iterator[tuple]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    else:
        yield path


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value[:-1] + ("0" if value[-1:] != "0" else "1")
    return ["tampered"] if value == [] else "tampered"


def test_every_descriptor_field_is_covered_by_the_signature(
    signed: Path, tmp_path: Path, keypair: tuple
) -> None:
    descriptor = _statement(signed)["predicate"]
    paths = list(_leaves(descriptor))
    assert len(paths) > 25  # every release field, identity fact and artifact attribute
    trusted = [keys.parse_public_key(keypair[1])]
    for index, path in enumerate(paths):
        target = _tampered_copy(signed, tmp_path, str(index))

        def edit(statement: dict[str, Any], path: tuple = path) -> None:
            node = statement["predicate"]
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = _changed(node[path[-1]])

        _edit_statement_unsigned(target, edit)
        result = release.verify(target, trusted)
        assert not result.ok, path
        assert any("the signature does not verify" in p for p in result.problems), (path, result.problems)
        assert result.problems[-1].startswith("the statement was not read"), result.problems


def test_added_field_is_refused(signed: Path, tmp_path: Path, keypair: tuple) -> None:
    target = _tampered_copy(signed, tmp_path, "extra-field")
    _edit_statement(target, lambda s: s["predicate"]["serve"].update(extra_env={"LD_PRELOAD": "/evil.so"}))
    problems = release.verify(target, [keys.parse_public_key(keypair[1])]).problems
    assert "predicate: serve has unknown field 'extra_env'" in problems


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _swap_subject(statement: dict[str, Any]) -> None:
    statement["subject"][0]["digest"]["sha256"] = "0" * 64


TAMPERS: dict[str, tuple[Callable[[Path], None], str]] = {
    "artifact byte": (
        lambda d: _flip_byte(d / "artifacts" / "rmsnorm.tar.gz"),
        "artifact rmsnorm.tar.gz: sha256:",
    ),
    "artifact truncated": (
        lambda d: (d / "artifacts" / "notes.txt").write_text("short"),
        "artifact notes.txt: 5 bytes, the descriptor says 21",
    ),
    "artifact missing": (lambda d: (d / "artifacts" / "notes.txt").unlink(), "missing artifacts/notes.txt"),
    "extra artifact": (
        lambda d: (d / "artifacts" / "evil.so").write_bytes(b"\x7fELF"),
        "extra file artifacts/evil.so",
    ),
    "extra top-level file": (lambda d: (d / "README").write_text("hi"), "extra file README"),
    "symlinked artifact": (
        lambda d: (
            (d / "artifacts" / "notes.txt").unlink(),
            (d / "artifacts" / "notes.txt").symlink_to("/etc/hostname"),
        ),
        "artifacts/notes.txt is a symlink",
    ),
    "sbom replaced": (
        lambda d: (d / "artifacts" / "sbom.cdx.json").write_bytes(b'{"bomFormat":"CycloneDX","specVersion":"1.6"}'),
        "artifact sbom.cdx.json:",
    ),
    "envelope whitespace": (
        lambda d: (d / release.ENVELOPE).write_bytes((d / release.ENVELOPE).read_bytes() + b"\n"),
        "release.dsse.json is not in canonical form",
    ),
    "envelope missing": (lambda d: (d / release.ENVELOPE).unlink(), "missing release.dsse.json"),
    "signatures removed": (
        lambda d: _edit_envelope(d, lambda e: {**e, "signatures": []}),
        "the release is not signed",
    ),
    "signature bytes": (
        lambda d: _edit_envelope(
            d, lambda e: {**e, "signatures": [{**e["signatures"][0], "sig": base64.b64encode(b"\x00" * 64).decode()}]}
        ),
        "trusted, but the signature does not verify",
    ),
    "payload type": (
        lambda d: _edit_envelope(d, lambda e: {**e, "payloadType": "application/json"}),
        "payload type 'application/json', expected 'application/vnd.in-toto+json'",
    ),
    "subject digest": (
        lambda d: _edit_statement(d, _swap_subject),
        "the statement's subjects are not the descriptor's artifacts",
    ),
    "statement type": (
        lambda d: _edit_statement(d, lambda s: s.update(_type="https://in-toto.io/Statement/v0.1")),
        "statement _type 'https://in-toto.io/Statement/v0.1'",
    ),
}


@pytest.mark.parametrize("name", list(TAMPERS))
def test_tampering_fails_with_the_precise_reason(
    name: str, signed: Path, tmp_path: Path, keypair: tuple, run_cli: Callable[..., tuple]
) -> None:
    tamper, reason = TAMPERS[name]
    target = _tampered_copy(signed, tmp_path, name.replace(" ", "-"))
    tamper(target)
    code, out, err = run_cli("release", "verify", target, "--public-key", keypair[1])
    assert code == 2, out + err
    assert reason in out, out
    assert "Traceback" not in err


def test_wrong_key_and_swapped_signature(
    tmp_path: Path, signed: Path, keypair: tuple, run_cli: Callable[..., tuple]
) -> None:
    _, other_public = _keygen(tmp_path, run_cli, "other")
    code, out, _ = run_cli("release", "verify", signed, "--key", other_public)
    assert code == 2 and f"key {keypair[1][:16]}… valid, not a trusted key" in out, out

    second = tmp_path / "second"  # another genuine release by the same signer
    spec_dir = tmp_path / "spec2"
    spec_dir.mkdir()
    run_cli("release", "build", "--spec", _spec(spec_dir, name='"other-engine"'), "--out", second)
    run_cli("release", "sign", second, "--key", keypair[0])
    target = _tampered_copy(signed, tmp_path, "swapped")
    _edit_envelope(target, lambda e: {**e, "signatures": _envelope(second)["signatures"]})
    code, out, _ = run_cli("release", "verify", target, "--key", keypair[1])
    assert code == 2 and "or the signature was altered or copied from another release" in out


def test_threshold_counts_distinct_trusted_keys(
    signed: Path, tmp_path: Path, keypair: tuple[Path, str], run_cli: Callable[..., tuple]
) -> None:
    second_key, second = _keygen(tmp_path, run_cli, "second")
    stranger_key, stranger = _keygen(tmp_path, run_cli, "stranger")
    code, out, err = run_cli("release", "verify", signed, "--key", keypair[1], "--key", second, "--threshold", "2")
    assert code == 2 and "threshold not met: 1 of 2 required trusted keys signed" in out, out + err

    run_cli("release", "sign", signed, "--key", stranger_key)  # an unknown signer is ignored, not counted
    code, out, _ = run_cli("release", "verify", signed, "--key", keypair[1], "--key", second, "--threshold", "2")
    assert code == 2 and "1 of 2" in out and "valid, not a trusted key" in out

    copied = _tampered_copy(signed, tmp_path, "same-key-twice")  # one key's signature twice is refused
    _edit_envelope(copied, lambda e: {**e, "signatures": [e["signatures"][0], e["signatures"][0]]})
    code, out, _ = run_cli("release", "verify", copied, "--key", keypair[1], "--key", second, "--threshold", "2")
    assert code == 2 and "two signatures under one key id" in out

    code, out, err = run_cli("release", "sign", signed, "--key", second_key, "--json")
    assert code == 0, err
    assert json.loads(out)["signed_by"] == [second]
    code, out, _ = run_cli(
        "release", "verify", signed, "--key", keypair[1], "--key", second, "--key", stranger, "--threshold", "2"
    )
    assert code == 0 and "3 trusted signers (threshold 2)" in out, out
    code, out, _ = run_cli("release", "verify", signed, "--key", keypair[1], "--key", second, "--threshold", "2", "--json")
    assert json.loads(out)["trusted_signers"] == sorted([keypair[1], second])

    # --threshold 0 is refused by the parser (tests/cli/test_hostile_input.py)
    code, _, err = run_cli("release", "verify", signed, "--key", keypair[1], "--key", keypair[1], "--threshold", "2")
    assert code == 1 and "needs at least 2 distinct trusted keys; 1 given" in err, err


def test_verify_record_is_a_signature_check_not_a_serving_check(
    signed: Path, keypair: tuple, run_cli: Callable[..., tuple], ledger_path: Path
) -> None:
    code, out, err = run_cli("release", "verify", signed, "--public-key", keypair[1], "--record", "--json")
    assert code == 0, err
    digest = json.loads(out)["digest"]
    with Ledger.open(ledger_path) as ledger:
        [record] = ledger.verified().records()
    assert (record.evidence_class, record.subject, record.outcome) == (
        "release_signature",
        f"release:{digest}",
        "pass",
    )
    assert record.details["trusted_signers"] == [keypair[1]] and record.details["format"] == "attestation"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"serve_engine_args": '["--tp-size", "4"]'}, "--tp-size would override serve.tensor_parallel_size"),
        ({"serve_engine_args": '["--model-path=/other"]'}, "--model-path would override model"),
        ({"serve_env_allowlist": '["LD_PRELOAD"]'}, "LD_PRELOAD would override the image's libraries"),
        (
            {"serve_env_allowlist": '["CACHEON_IMAGE_DIGEST"]'},
            "would override the runtime identity and ledger",
        ),
        ({"serve_env_allowlist": '["NOT-A-NAME"]'}, "is not an environment variable name"),
        ({"serve_tensor_parallel_size": "0"}, "tensor_parallel_size must be an integer >= 1"),
        ({"base_image": '"lmsysorg/sglang:latest"'}, "must be pinned by digest"),
        ({"upstream_revision": '"abc123"'}, "upstream_revision must be a 40-hex commit"),
        (
            {"sglang_version": '"0.5.14"'},
            "runtime identity runs sglang 0.5.13.post1, the release pins 0.5.14",
        ),
        ({"facts": json.dumps({"image_digest": None})}, "runtime identity was captured in image None"),
        (
            {"facts": json.dumps({"standins": [{"name": "torchvision", "version": "0+cacheon.standin"}]})},
            "stand-ins",
        ),
        ({"unexpected": '"x"'}, "unknown field 'unexpected'"),
        ({"sbom": None}, "missing 'sbom' (capture one inside the image: `cacheon release sbom"),
        ({"sbom": '"notes.txt"'}, "SBOM sbom.cdx.json is not JSON"),
        (
            {"facts": json.dumps({"packages": {"sglang": "0.5.13.post1", "torch": "2.1.0"}})},
            "the SBOM lists torch",
        ),
    ],
)
def test_build_refuses_what_a_release_must_not_pin(
    tmp_path: Path, run_cli: Callable[..., tuple], override: dict, message: str
) -> None:
    code, out, err = run_cli(
        "release", "build", "--spec", _spec(tmp_path, **override), "--out", tmp_path / "rel"
    )
    assert code == 1, out
    assert message in err and "Traceback" not in err, err
    assert not (tmp_path / "rel").exists()
    assert not list(tmp_path.glob(".cacheon-release-*"))


def test_no_in_place_edit(
    signed: Path, tmp_path: Path, keypair: tuple, run_cli: Callable[..., tuple]
) -> None:
    code, _, err = run_cli("release", "sign", signed, "--key", keypair[0])
    assert code == 1 and "already signed by key" in err
    code, _, err = run_cli("release", "build", "--spec", tmp_path / "release.toml", "--out", signed)
    assert code == 1 and "never edited in place" in err
    unsigned = _tampered_copy(signed, tmp_path, "unsigned")
    _flip_byte(unsigned / "artifacts" / "notes.txt")
    code, _, err = run_cli("release", "sign", unsigned, "--key", keypair[0])
    assert code == 1 and "refusing to sign" in err


def test_bad_keys_are_usage_errors(signed: Path, keypair: tuple, run_cli: Callable[..., tuple]) -> None:
    code, _, err = run_cli("release", "verify", signed, "--public-key", "not-hex")
    assert code == 1 and "64 hex characters" in err
    keypair[0].chmod(0o644)
    code, _, err = run_cli("release", "sign", signed, "--key", keypair[0])
    assert code == 1 and "accessible by others" in err


def _sparse(path: Path, size: int) -> None:
    with path.open("wb") as fh:
        fh.truncate(size)


HOSTILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "deep nesting": (
        lambda d: _resign(d, _statement_with(b'{"a":' * 100_000 + b"1" + b"}" * 100_000)),
        "statement is nested too deeply",
    ),
    "nesting the decoder accepts": (  # deep enough to overflow any recursive reader after the decode
        lambda d: _resign(d, _statement_with(b'{"a":' * 900 + b"1" + b"}" * 900)),
        "statement is nested more than 64 levels deep",
    ),
    "huge file": (lambda d: _sparse(d / release.ENVELOPE, 5 << 30), "over the 4194304-byte limit"),
    "non-UTF-8": (
        lambda d: (d / release.ENVELOPE).write_bytes(b'{"payload":"\xff\xfe","payloadType":"x","signatures":[]}'),
        "release.dsse.json is not JSON: Invalid UTF-8",
    ),
    "wrong type": (
        lambda d: _edit_envelope(d, lambda e: {**e, "signatures": {"keyid": 1}}),
        "release.dsse.json: Expected `array`, got `object` - at `$.signatures`",
    ),
    "duplicate key": (
        lambda d: (d / release.ENVELOPE).write_bytes(
            (d / release.ENVELOPE).read_bytes().replace(b'{"payload":', b'{"payload":"e30=","payload":', 1)
        ),
        "duplicate key",
    ),
    "not base64": (lambda d: _edit_envelope(d, lambda e: {**e, "payload": "%%%"}), "not standard base64"),
    "payload not canonical": (
        lambda d: _resign(d, _statement_with(b"{}").replace(b",", b", ")),
        "statement is not in canonical form",
    ),
    "payload wrong type": (
        lambda d: _resign(d, canonical_json({"_type": 1})),
        "statement: Expected `str`, got `int` - at `$._type`",
    ),
    "float in payload": (
        lambda d: _resign(d, _statement_with(b'{"x":1.5}')),
        "statement is not canonical JSON: floats are not canonical",
    ),
    "a directory instead": (
        lambda d: ((d / release.ENVELOPE).unlink(), (d / release.ENVELOPE).mkdir()),
        "release.dsse.json is a directory, not a regular file",
    ),
    "too many signatures": (
        lambda d: _edit_envelope(d, lambda e: {**e, "signatures": e["signatures"] * 65}),
        "65 signatures, over the limit of 64",
    ),
    "huge sbom": (
        lambda d: _sparse(d / "artifacts" / "sbom.cdx.json", 1 << 40),
        "artifact sbom.cdx.json: 1099511627776 bytes",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_inputs_are_one_line_failures(
    name: str, signed: Path, tmp_path: Path, keypair: tuple, run_cli: Callable[..., tuple]
) -> None:
    hostile, reason = HOSTILE[name]
    target = _tampered_copy(signed, tmp_path, name.replace(" ", "-"))
    hostile(target)
    code, out, err = run_cli("release", "verify", target, "--key", keypair[1])
    assert code == 2 and "Traceback" not in out + err, out + err
    lines = [line for line in out.splitlines() if reason in line]
    assert len(lines) == 1 and len(lines[0]) < 400, out


def _legacy_release(signed: Path, tmp_path: Path, key_path: Path) -> Path:
    """A release as cacheon wrote it before attestations: a v1 descriptor and one detached signature."""
    from cacheon.evidence import legacy
    from cacheon.evidence.descriptor import release_digest

    target = tmp_path / "legacy"
    shutil.copytree(signed, target)
    descriptor = _statement(signed)["predicate"]
    descriptor["schema"] = "cacheon.engine-release.v1"
    del descriptor["sbom"]
    descriptor["artifacts"] = [a for a in descriptor["artifacts"] if a["name"] != "sbom.cdx.json"]
    (target / "artifacts" / "sbom.cdx.json").unlink()
    (target / release.ENVELOPE).unlink()
    (target / "descriptor.json").write_bytes(canonical_json(descriptor))
    key = keys.load_private_key(key_path)
    digest = release_digest(descriptor)
    signature = {
        "algorithm": "ed25519",
        "descriptor_digest": digest,
        "public_key": keys.public_hex(key.public_key()),
        "signature": key.sign(legacy.SIGNATURE_CONTEXT + digest.encode()).hex(),
    }
    (target / "signature.json").write_bytes(canonical_json(signature))
    return target


def test_legacy_releases_verify_only_on_request(
    signed: Path, tmp_path: Path, keypair: tuple[Path, str], run_cli: Callable[..., tuple]
) -> None:
    old = _legacy_release(signed, tmp_path, keypair[0])
    code, _, err = run_cli("release", "verify", old, "--key", keypair[1])
    assert code == 1 and "is a legacy release" in err and "--legacy" in err and "re-sign" in err
    assert len(err.strip().splitlines()) == 1
    code, out, err = run_cli("release", "verify", old, "--key", keypair[1], "--legacy")
    assert code == 0 and "(legacy format)" in out, out + err
    _, other = _keygen(tmp_path, run_cli, "other")
    code, out, _ = run_cli("release", "verify", old, "--key", other, "--legacy")
    assert code == 2 and f"wrong key: signed by {keypair[1]}, supplied {other}" in out
    _flip_byte(old / "artifacts" / "notes.txt")
    code, out, _ = run_cli("release", "verify", old, "--key", keypair[1], "--legacy")
    assert code == 2 and "artifact notes.txt: sha256:" in out
    code, _, err = run_cli("release", "verify", old, "--key", keypair[1], "--key", other, "--legacy")
    assert code == 1 and "exactly one --key" in err


def test_sbom_is_valid_cyclonedx_and_names_this_environment(tmp_path: Path, run_cli: Callable[..., tuple]) -> None:
    import importlib.metadata

    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    out = tmp_path / "sbom.cdx.json"
    code, printed, err = run_cli("release", "sbom", "--out", out, "--json")
    assert code == 0, err
    text = out.read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None  # the official 1.6 schema
    document = json.loads(text)
    assert document["bomFormat"] == "CycloneDX" and document["specVersion"] == "1.6"
    versions = {c["name"]: c["version"] for c in document["components"]}
    assert versions["msgspec"] == importlib.metadata.version("msgspec")
    assert json.loads(printed)["components"] == len(document["components"])
    broken = dict(document, components=[{"type": "library", "version": "1"}])
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(broken)) is not None  # control
    code, _, err = run_cli("release", "sbom", "--out", out)
    assert code == 1 and "refusing to overwrite" in err


def test_build_json(tmp_path: Path, run_cli: Callable[..., tuple]) -> None:
    code, out, err = run_cli("release", "build", "--spec", _spec(tmp_path), "--out", tmp_path / "rel", "--json")
    assert code == 0, err
    built = json.loads(out)
    assert built["digest"].startswith("sha256:") and built["signatures"] == 0
    assert built["subjects"] == ["artifacts/notes.txt", "artifacts/rmsnorm.tar.gz", "artifacts/sbom.cdx.json"]
