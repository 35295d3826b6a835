"""Engine releases: build -> sign -> verify with real Ed25519, and tampering with every field and file."""

from __future__ import annotations

import copy
import json
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cacheon.canonical import canonical_json
from cacheon.evidence import release
from cacheon.evidence.ledger import Ledger
from cacheon.runtime.identity import identity_from_facts

from .conftest import make_identity

IMAGE_DIGEST = "sha256:" + "1f" * 32
REVISION = "0123456789abcdef0123456789abcdef01234567"
MODEL_REVISION = "fedcba9876543210fedcba9876543210fedcba98"


def _spec(tmp: Path, **override: str) -> Path:
    """A release.toml with two artifacts and an identity captured 'inside the image'."""
    facts = copy.deepcopy(make_identity("0.5.13.post1", gpus=2).facts)
    facts.update(image_digest=IMAGE_DIGEST, sglang_revision=REVISION, standins=[])
    facts.update(json.loads(override.pop("facts", "{}")))
    (tmp / "identity.json").write_text(json.dumps(identity_from_facts(facts).to_json()))
    (tmp / "bundles").mkdir(exist_ok=True)
    (tmp / "bundles" / "rmsnorm.tar.gz").write_bytes(bytes(range(256)) * 64)
    (tmp / "notes.txt").write_text("qualified on 2x H200\n")
    fields = {
        "name": '"demo-engine"',
        "sglang_version": '"0.5.13.post1"',
        "upstream_revision": f'"{REVISION}"',
        "base_image": f'"registry.example/sglang@{IMAGE_DIGEST}"',
        "runtime_identity": '"identity.json"',
        **override,
    }
    top = "".join(f"{k} = {v}\n" for k, v in fields.items() if not k.startswith("serve_"))
    serve = {
        "tensor_parallel_size": "2",
        "engine_args": '["--mem-fraction-static", "0.85"]',
        "env_allowlist": '["HF_TOKEN"]',
        **{k.removeprefix("serve_"): v for k, v in fields.items() if k.startswith("serve_")},
    }
    text = (
        top
        + f'[model]\nid = "Qwen/Qwen2.5-0.5B-Instruct"\nrevision = "{MODEL_REVISION}"\n'
        + "[serve]\n"
        + "".join(f"{k} = {v}\n" for k, v in serve.items())
        + '[[artifacts]]\npath = "bundles/rmsnorm.tar.gz"\n'
        + 'media_type = "application/vnd.cacheon.bundle.v1+tar+gzip"\n'
        + '[[artifacts]]\npath = "notes.txt"\nmedia_type = "text/plain"\n'
    )
    spec = tmp / "release.toml"
    spec.write_text(text)
    return spec


@pytest.fixture
def keypair(tmp_path: Path, run_cli: Callable[..., tuple]) -> tuple[Path, str]:
    code, _, err = run_cli("release", "keygen", tmp_path / "keys" / "signer")
    assert code == 0, err
    return tmp_path / "keys" / "signer.key", (tmp_path / "keys" / "signer.pub").read_text().strip()


@pytest.fixture
def signed(tmp_path: Path, run_cli: Callable[..., tuple], keypair: tuple[Path, str]) -> Path:
    out = tmp_path / "rel"
    code, _, err = run_cli("release", "build", "--spec", _spec(tmp_path), "--out", out)
    assert code == 0, err
    code, _, err = run_cli("release", "sign", out, "--key", keypair[0])
    assert code == 0, err
    return out


def _tampered_copy(signed: Path, tmp_path: Path, name: str) -> Path:
    target = tmp_path / "tampered" / name
    shutil.copytree(signed, target)
    return target


def test_keygen_modes_and_no_overwrite(tmp_path: Path, run_cli: Callable[..., tuple], keypair: tuple) -> None:
    private, public = keypair
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(private.with_suffix(".pub").stat().st_mode) == 0o644
    assert len(public) == 64
    code, _, err = run_cli("release", "keygen", tmp_path / "keys" / "signer")
    assert code == 1 and "refusing to overwrite" in err


def test_build_sign_verify(signed: Path, keypair: tuple[Path, str], run_cli: Callable[..., tuple]) -> None:
    assert sorted(p.relative_to(signed).as_posix() for p in signed.rglob("*")) == [
        "artifacts",
        "artifacts/notes.txt",
        "artifacts/rmsnorm.tar.gz",
        "descriptor.json",
        "signature.json",
    ]
    descriptor = json.loads((signed / "descriptor.json").read_bytes())
    assert (signed / "descriptor.json").read_bytes() == canonical_json(descriptor)
    assert [a["name"] for a in descriptor["artifacts"]] == ["notes.txt", "rmsnorm.tar.gz"]
    assert descriptor["artifacts"][1]["size"] == 256 * 64
    code, out, err = run_cli("release", "verify", signed, "--public-key", keypair[1])
    assert code == 0, out + err
    assert out.startswith("OK release sha256:")


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
    descriptor = json.loads((signed / "descriptor.json").read_bytes())
    paths = list(_leaves(descriptor))
    assert len(paths) > 25  # every release field, identity fact and artifact attribute
    for index, path in enumerate(paths):
        target = _tampered_copy(signed, tmp_path, str(index))
        edited = copy.deepcopy(descriptor)
        node = edited
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = _changed(node[path[-1]])
        (target / "descriptor.json").write_bytes(canonical_json(edited))
        result = release.verify(target, keypair[1])
        assert not result.ok, path
        assert any("descriptor changed after signing" in p for p in result.problems), (path, result.problems)


def test_added_field_is_refused(signed: Path, tmp_path: Path, keypair: tuple) -> None:
    target = _tampered_copy(signed, tmp_path, "extra-field")
    descriptor = json.loads((target / "descriptor.json").read_bytes())
    descriptor["serve"]["extra_env"] = {"LD_PRELOAD": "/evil.so"}
    (target / "descriptor.json").write_bytes(canonical_json(descriptor))
    problems = release.verify(target, keypair[1]).problems
    assert "descriptor.json: serve has unknown field 'extra_env'" in problems


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


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
    "descriptor whitespace": (
        lambda d: (d / "descriptor.json").write_bytes((d / "descriptor.json").read_bytes() + b"\n"),
        "descriptor.json bytes are not its canonical form",
    ),
    "descriptor missing": (lambda d: (d / "descriptor.json").unlink(), "missing descriptor.json"),
    "signature missing": (
        lambda d: (d / "signature.json").unlink(),
        "missing signature.json (the release is not signed)",
    ),
    "signature bytes": (
        lambda d: _edit_signature(d, lambda s: {**s, "signature": _changed(s["signature"])}),
        "signature does not verify under the supplied key",
    ),
    "signed digest edited": (
        lambda d: _edit_signature(d, lambda s: {**s, "descriptor_digest": _changed(s["descriptor_digest"])}),
        "descriptor changed after signing",
    ),
    "signature whitespace": (
        lambda d: (d / "signature.json").write_bytes(b" " + (d / "signature.json").read_bytes()),
        "signature.json bytes are not its canonical form",
    ),
}


def _edit_signature(release_dir: Path, edit: Callable[[dict], dict]) -> None:
    signature = json.loads((release_dir / "signature.json").read_bytes())
    (release_dir / "signature.json").write_bytes(canonical_json(edit(signature)))


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
    run_cli("release", "keygen", tmp_path / "keys" / "other")
    other_public = (tmp_path / "keys" / "other.pub").read_text().strip()
    code, out, _ = run_cli("release", "verify", signed, "--public-key", other_public)
    assert code == 2 and f"wrong key: signed by {keypair[1]}, supplied {other_public}" in out

    second = tmp_path / "second"  # another genuine release by the same signer
    spec_dir = tmp_path / "spec2"
    spec_dir.mkdir()
    run_cli("release", "build", "--spec", _spec(spec_dir, name='"other-engine"'), "--out", second)
    run_cli("release", "sign", second, "--key", keypair[0])
    target = _tampered_copy(signed, tmp_path, "swapped")
    shutil.copy(second / "signature.json", target / "signature.json")
    code, out, _ = run_cli("release", "verify", target, "--public-key", keypair[1])
    assert code == 2 and "or another release's signature" in out


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
    ],
)
def test_build_refuses_what_a_release_must_not_pin(
    tmp_path: Path, run_cli: Callable[..., tuple], override: dict, message: str
) -> None:
    code, out, err = run_cli(
        "release", "build", "--spec", _spec(tmp_path, **override), "--out", tmp_path / "rel"
    )
    assert code == 1, out
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "rel").exists()
    assert not list(tmp_path.glob(".cacheon-release-*"))


def test_no_in_place_edit(
    signed: Path, tmp_path: Path, keypair: tuple, run_cli: Callable[..., tuple]
) -> None:
    code, _, err = run_cli("release", "sign", signed, "--key", keypair[0])
    assert code == 1 and "already signed" in err
    code, _, err = run_cli("release", "build", "--spec", tmp_path / "release.toml", "--out", signed)
    assert code == 1 and "never edited in place" in err
    unsigned = _tampered_copy(signed, tmp_path, "unsigned")
    (unsigned / "signature.json").unlink()
    _flip_byte(unsigned / "artifacts" / "notes.txt")
    code, _, err = run_cli("release", "sign", unsigned, "--key", keypair[0])
    assert code == 1 and "refusing to sign" in err


def test_bad_keys_are_usage_errors(signed: Path, keypair: tuple, run_cli: Callable[..., tuple]) -> None:
    code, _, err = run_cli("release", "verify", signed, "--public-key", "not-hex")
    assert code == 1 and "64 hex characters" in err
    keypair[0].chmod(0o644)
    unsigned = signed.with_name("unsigned")
    shutil.copytree(signed, unsigned)
    (unsigned / "signature.json").unlink()
    code, _, err = run_cli("release", "sign", unsigned, "--key", keypair[0])
    assert code == 1 and "accessible by others" in err
