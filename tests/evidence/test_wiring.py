"""The producing commands write evidence through ``--record``: a real ``cacheon verify`` run per control."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import child_env

pytestmark = pytest.mark.slow  # the CLI writing the ledger

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "bundles"


def _cacheon(ledger: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**child_env(), "CACHEON_LEDGER": str(ledger)}
    command = [sys.executable, "-m", "cacheon", *argv]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_verify_records_negative_controls(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    for bundle, control, code in (("rmsnorm-broken-no-norm", "broken", 2), ("rmsnorm-torch", "faithful", 0)):
        done = _cacheon(ledger, "verify", str(EXAMPLES / bundle), "--dtype", "float32", "--record", "--control", control)
        assert done.returncode == code, done.stdout + done.stderr
        assert "recorded #" in done.stderr
    status = _cacheon(ledger, "pin", "status", "--json")
    [identity] = json.loads(status.stdout)["identities"]
    gates = {g["key"]: g for g in identity["gates"]}
    assert gates["negative-controls"]["status"] == "met", gates["negative-controls"]
    assert gates["negative-controls"]["records"] == [1, 2]
