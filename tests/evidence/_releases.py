"""Release fixtures shared by the release, hostile-file and interop tests: a spec with two artifacts, an
identity and an SBOM captured 'inside the image', the signer's key, and the envelope edits tampering uses."""

from __future__ import annotations

import base64
import copy
import functools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cacheon.canonical import canonical_json
from cacheon.evidence import keys, release, sbom
from cacheon.runtime.identity import identity_from_facts

from .conftest import make_identity

IMAGE_DIGEST = "sha256:" + "1f" * 32
REVISION = "0123456789abcdef0123456789abcdef01234567"
MODEL_REVISION = "fedcba9876543210fedcba9876543210fedcba98"


@functools.cache
def _environment_sbom() -> bytes:
    return sbom.environment_sbom()


def _spec(tmp: Path, **override: str | None) -> Path:
    """A release.toml with two artifacts, an identity and an SBOM captured 'inside the image'."""
    facts = copy.deepcopy(make_identity("0.5.13.post1", gpus=2).facts)
    facts.update(image_digest=IMAGE_DIGEST, sglang_revision=REVISION, standins=[])
    facts.update(json.loads(override.pop("facts", None) or "{}"))
    (tmp / "identity.json").write_text(json.dumps(identity_from_facts(facts).to_json()))
    (tmp / "bundles").mkdir(exist_ok=True)
    (tmp / "bundles" / "rmsnorm.tar.gz").write_bytes(bytes(range(256)) * 64)
    (tmp / "notes.txt").write_text("qualified on 2x H200\n")
    (tmp / "sbom.cdx.json").write_bytes(_environment_sbom())
    fields = {
        "name": '"demo-engine"',
        "sglang_version": '"0.5.13.post1"',
        "upstream_revision": f'"{REVISION}"',
        "base_image": f'"registry.example/sglang@{IMAGE_DIGEST}"',
        "runtime_identity": '"identity.json"',
        "sbom": '"sbom.cdx.json"',
        **override,
    }
    top = "".join(f"{k} = {v}\n" for k, v in fields.items() if not k.startswith("serve_") and v is not None)
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


def _keygen(tmp_path: Path, run_cli: Callable[..., tuple], name: str) -> tuple[Path, str]:
    code, out, err = run_cli("release", "keygen", tmp_path / "keys" / name, "--json")
    assert code == 0, err
    made = json.loads(out)
    assert made["key_id"] == (tmp_path / "keys" / f"{name}.pub").read_text().strip()
    return Path(made["private_key"]), made["key_id"]


def _tampered_copy(signed: Path, tmp_path: Path, name: str) -> Path:
    target = tmp_path / "tampered" / name
    shutil.copytree(signed, target)
    return target


def _envelope(release_dir: Path) -> dict[str, Any]:
    return json.loads((release_dir / release.ENVELOPE).read_bytes())


def _statement(release_dir: Path) -> dict[str, Any]:
    return json.loads(base64.b64decode(_envelope(release_dir)["payload"]))


def _edit_envelope(release_dir: Path, edit: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    (release_dir / release.ENVELOPE).write_bytes(canonical_json(edit(_envelope(release_dir))))


def _edit_statement(release_dir: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Edit the statement and have the trusted signer sign it again: the content checks must catch what a
    signature does not (an unsigned edit is refused before the statement is parsed at all)."""
    statement = _statement(release_dir)
    edit(statement)
    _resign(release_dir, canonical_json(statement))


def _edit_statement_unsigned(release_dir: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Edit the statement and keep the old signatures (which then no longer verify)."""
    statement = _statement(release_dir)
    edit(statement)
    payload = base64.b64encode(canonical_json(statement)).decode()
    _edit_envelope(release_dir, lambda e: {**e, "payload": payload})


def _statement_with(predicate: bytes) -> bytes:
    """A statement of the right shape around ``predicate`` (raw JSON text, which may be hostile)."""
    return (
        b'{"_type":"https://in-toto.io/Statement/v1","predicate":' + predicate
        + b',"predicateType":"' + release.PREDICATE_TYPE.encode() + b'","subject":[]}'
    )


def _resign(release_dir: Path, body: bytes) -> None:
    """``body`` as the payload, signed by the trusted signer only (its key is the ``signed`` fixture's, kept
    at ``tmp_path/keys/signer.key``; tampered copies live in ``tmp_path/tampered/NAME``)."""
    from cacheon.evidence import dsse

    key = keys.load_private_key(release_dir.parent.parent / "keys" / "signer.key")
    envelope = dsse.add_signature(dsse.seal(release.PAYLOAD_TYPE, body), key)
    (release_dir / release.ENVELOPE).write_bytes(envelope.to_bytes())
