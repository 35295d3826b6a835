"""Runtime identity: real metadata discovery (distributions written to a temp dir on sys.path)."""

from __future__ import annotations

import copy
import importlib.metadata as metadata
import json
from pathlib import Path

import pytest

from cacheon.canonical import canonical_json
from cacheon.runtime import identity as ident


def _install_dist(site: Path, name: str, version: str, direct_url: dict | None = None) -> None:
    """Write a minimal, real ``.dist-info`` that importlib.metadata discovers."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def test_capture_is_canonical_and_stable() -> None:
    first, second = ident.runtime_identity(), ident.runtime_identity()
    canonical_json(first.facts)  # raises on floats or non-string keys
    assert first == second
    assert first.digest.startswith("sha256:") and len(first.digest) == 71


def test_versions_come_from_installed_distributions() -> None:
    import torch

    facts = ident.capture_environment()
    assert facts["packages"]["torch"] == metadata.version("torch")
    assert facts["packages"]["triton"] == metadata.version("triton")
    assert facts["torch_cuda"] == torch.version.cuda
    assert facts["gpu"]["count"] == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert facts["gpu"]["count"] == len(facts["gpu"]["devices"])


def test_same_names_different_torch_is_a_different_identity() -> None:
    facts = ident.capture_environment()
    other = copy.deepcopy(facts)
    other["packages"]["torch"] = "0.0.1-not-this-torch"
    assert ident.identity_digest(facts) != ident.identity_digest(other)
    assert ident.identity_from_facts(facts).digest == ident.identity_digest(facts)


def test_image_digest_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    good = "sha256:" + "ab" * 32
    monkeypatch.setenv(ident.IMAGE_DIGEST_ENV, f"lmsysorg/sglang@{good}")
    with_image = ident.runtime_identity()
    assert with_image.facts["image_digest"] == good
    monkeypatch.setenv(ident.IMAGE_DIGEST_ENV, "latest")
    assert ident.capture_environment()["image_digest"] == "invalid:latest"
    monkeypatch.delenv(ident.IMAGE_DIGEST_ENV)
    assert ident.runtime_identity().digest != with_image.digest


def test_standins_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = ident.runtime_identity()
    _install_dist(tmp_path, "torchvision", "0.28.0+cacheon.standin")
    _install_dist(tmp_path, "notastandin", "1.0+cacheon.standinx")
    monkeypatch.syspath_prepend(str(tmp_path))
    after = ident.runtime_identity()
    assert {"name": "torchvision", "version": "0.28.0+cacheon.standin"} in after.facts["standins"]
    assert all(s["name"] != "notastandin" for s in after.facts["standins"])
    assert after.digest != before.digest


def test_sglang_revision_from_vcs_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    _install_dist(
        tmp_path,
        "sglang",
        "9.9.9",
        {"url": "https://example.invalid/sglang.git", "vcs_info": {"vcs": "git", "commit_id": commit}},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(ident.REVISION_ENV, raising=False)
    facts = ident.capture_environment()
    assert facts["packages"]["sglang"] == "9.9.9"
    assert facts["sglang_revision"] == commit
    monkeypatch.setenv(ident.REVISION_ENV, "F" * 40)
    assert ident.capture_environment()["sglang_revision"] == "f" * 40
