"""``cacheon compat`` / ``chain-compat`` when the upstream package cannot be imported: said plainly,
exit 2, and the JSON record claims no coverage. (Green and negative controls against the real SGLang
are tests/sglang/test_canary_real.py; against the real SDK, test_chain_compat_real.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cacheon.runtime.chain import CHAIN_SURFACES
from cacheon.runtime.seams import SEAMS
from tests.runtime.sglang_tier import REPO, python_env

pytestmark = pytest.mark.slow  # the CLI


def _cli(tmp_path, package: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text(f"raise ImportError('cacheon test: no {package} here')\n")
    return subprocess.run(
        [sys.executable, "-m", "cacheon", *args],
        cwd=REPO,
        env=python_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(("command", "package"), [("compat", "sglang"), ("chain-compat", "bittensor")])
def test_not_importable_says_so_plainly_and_exits_2(tmp_path, command, package):
    done = _cli(tmp_path, package, command)
    assert done.returncode == 2, done.stderr
    lines = done.stdout.splitlines()
    version_row = next(line.split() for line in lines if line.split()[:1] == ["version"])
    assert (
        " ".join(version_row)
        == f"version FAIL {package} cannot be imported: ImportError: cacheon test: no {package} here"
    )
    assert lines[-1] == f"FAIL: {package} cannot be imported; no surface was checked"


def test_compat_json_records_every_seam_as_unchecked_and_the_environment(tmp_path):
    done = _cli(tmp_path, "sglang", "compat", "--json")
    assert done.returncode == 2
    document = json.loads(done.stdout)
    canary = document["canary"]
    assert canary["ok"] is False and canary["version"] is None
    assert [r["name"] for r in canary["rows"]] == [s.name for s in SEAMS]
    assert {r["status"] for r in canary["rows"]} == {"SKIP"}
    environment = document["environment"]
    assert {"python", "packages", "torch_cuda", "image_digest", "standins"} <= set(environment)


def test_chain_compat_json_lists_the_validator_surface(tmp_path):
    document = json.loads(_cli(tmp_path, "bittensor", "chain-compat", "--json").stdout)
    assert [r["name"] for r in document["canary"]["rows"]] == [s.name for s in CHAIN_SURFACES]
    assert set(document["environment"]["packages"]) == {"bittensor", "bittensor-wallet", "async-substrate-interface"}
