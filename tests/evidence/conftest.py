"""Shared fixtures: a ledger on disk per test, synthetic identities, and the real CLI entry point."""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cacheon
from cacheon import cli
from cacheon.evidence.classes import EvidenceClass, Outcome
from cacheon.evidence.ledger import Entry, Ledger
from cacheon.runtime.identity import Identity, identity_from_facts, runtime_identity

SRC = str(Path(cacheon.__file__).resolve().parents[1])


@pytest.fixture(autouse=True)
def _isolated_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Never touch the user's data dir: every test gets its own default ledger path."""
    path = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv("CACHEON_LEDGER", str(path))
    return path


@pytest.fixture
def ledger_path(_isolated_ledger: Path) -> Path:
    return _isolated_ledger


@pytest.fixture(scope="session")
def here() -> Identity:
    return runtime_identity()


@functools.cache
def _host_facts() -> dict[str, Any]:
    return runtime_identity().facts


def make_identity(sglang: str, *, gpus: int = 0, torch: str | None = None) -> Identity:
    """A synthetic identity derived from this host's facts with the given differences."""
    facts = copy.deepcopy(_host_facts())
    facts["packages"]["sglang"] = sglang
    if torch:
        facts["packages"]["torch"] = torch
    facts["gpu"] = {"count": gpus, "devices": [{"name": "NVIDIA H200", "capability": "9.0"}] * gpus}
    return identity_from_facts(facts)


def add(
    ledger: Ledger,
    identity: Identity,
    cls: EvidenceClass,
    subject: str,
    outcome: Outcome,
    **details: Any,
) -> int:
    return ledger.append(Entry(cls, subject, identity, outcome, details))


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple]:
    """Run ``cacheon ARGS`` in-process through the real parser and error handling."""

    def run(*argv: str) -> tuple[int, str, str]:
        code = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture
def keypair(tmp_path: Path, run_cli: Callable[..., tuple]) -> tuple[Path, str]:
    """The release signer's key pair (``tmp_path/keys/signer.key``) and its key id."""
    from ._releases import _keygen

    return _keygen(tmp_path, run_cli, "signer")


@pytest.fixture
def signed(tmp_path: Path, run_cli: Callable[..., tuple], keypair: tuple[Path, str]) -> Path:
    """A release built from the shared spec and signed once by ``keypair``."""
    from ._releases import _spec

    out = tmp_path / "rel"
    code, _, err = run_cli("release", "build", "--spec", _spec(tmp_path), "--out", out)
    assert code == 0, err
    code, _, err = run_cli("release", "sign", out, "--key", keypair[0])
    assert code == 0, err
    return out
