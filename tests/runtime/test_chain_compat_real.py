"""``cacheon chain-compat`` against the REAL Bittensor SDK at its pin, installed apart from the engine
venv by scripts/install_chain_pin.sh (``$CACHEON_CHAIN_TARGET``, default .chain/bittensor).

Skips when the SDK is not there, unless CACHEON_REQUIRE_BITTENSOR=1: then it fails loudly.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cacheon.runtime.chain import CHAIN_SURFACES
from cacheon.runtime.pin import BITTENSOR_PIN
from tests.runtime.sglang_tier import REPO, finish, python_env, start_python

pytestmark = pytest.mark.slow  # the Bittensor SDK in a child process

TARGET = Path(os.environ.get("CACHEON_CHAIN_TARGET", REPO / ".chain" / "bittensor"))
CHAIN_COMPAT = "from cacheon.cli import main; raise SystemExit(main(['chain-compat', '--json']))"
MUTATIONS = {
    "pin": "",
    "param_renamed": (
        "import bittensor.core.subtensor as m\n"
        "def set_weights(self, wallet, netuid, uids, weights, version=0): pass\n"
        "m.Subtensor.set_weights = set_weights\n"
    ),
    "version_differs": "import bittensor; bittensor.__version__ = '11.3.0'\n",
}


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[int, dict]]:
    if not (TARGET / "bittensor").is_dir():
        reason = f"the Bittensor SDK is not installed in {TARGET} (scripts/install_chain_pin.sh)"
        if os.environ.get("CACHEON_REQUIRE_BITTENSOR") == "1":
            pytest.fail(f"CACHEON_REQUIRE_BITTENSOR=1 but {reason}", pytrace=False)
        pytest.skip(reason + "; set CACHEON_REQUIRE_BITTENSOR=1 to fail instead")
    env = python_env(TARGET)
    procs = {name: start_python(code + CHAIN_COMPAT, env) for name, code in MUTATIONS.items()}
    results: dict[str, tuple[int, dict]] = {}
    for name, proc in procs.items():
        done: subprocess.CompletedProcess[str] = finish(proc)
        assert done.stdout.strip(), done.stderr[-3000:]
        results[name] = (done.returncode, json.loads(done.stdout))
    return results


def test_green_at_the_pin(runs):
    code, document = runs["pin"]
    assert code == 0, document["canary"]
    assert document["canary"]["version"] == BITTENSOR_PIN
    assert [r["status"] for r in document["canary"]["rows"]] == ["ok"] * len(CHAIN_SURFACES)
    assert document["environment"]["packages"]["bittensor"] == BITTENSOR_PIN


def test_renamed_parameter_fails_its_row(runs):
    code, document = runs["param_renamed"]
    assert code == 2
    failed = {r["name"]: r["detail"] for r in document["canary"]["rows"] if r["status"] == "FAIL"}
    assert list(failed) == ["subtensor.set_weights"]
    assert (
        "lacks parameter(s) version_key, wait_for_inclusion, wait_for_finalization" in failed["subtensor.set_weights"]
    )


def test_other_sdk_version_differs(runs):
    code, document = runs["version_differs"]
    assert code == 2
    assert document["canary"]["version_row"]["detail"] == f"11.3.0 DIFFERS from pin {BITTENSOR_PIN}"


def test_the_sdk_is_found_where_the_installer_put_it_or_the_error_says_what_to_set(tmp_path):
    """After `make setup` nothing needs to be on PYTHONPATH: `.chain/bittensor` of the checkout (or
    $CACHEON_CHAIN_TARGET) is found; where there is none, one line says what to set."""
    if not (TARGET / "bittensor").is_dir():
        pytest.skip(f"the Bittensor SDK is not installed in {TARGET}")  # the module's fixture fails under REQUIRE
    env = {k: v for k, v in python_env().items() if k != "CACHEON_CHAIN_TARGET"}
    found = finish(start_python(CHAIN_COMPAT, {**env, "CACHEON_CHAIN_TARGET": str(TARGET)}))
    assert found.returncode == 0, found.stderr[-3000:]
    assert json.loads(found.stdout)["canary"]["version"] == BITTENSOR_PIN
    assert f"chain-compat: the Bittensor SDK from {TARGET}" in found.stderr
    missing = finish(start_python(CHAIN_COMPAT, {**env, "CACHEON_CHAIN_TARGET": str(tmp_path / "none")}))
    assert missing.returncode == 2
    assert "bittensor is not importable and not in" in missing.stderr and "set CACHEON_CHAIN_TARGET" in missing.stderr
