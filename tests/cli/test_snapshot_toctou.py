"""Admission and execution are the same bytes: a bundle rewritten after ``verify`` admitted it still
runs (and is recorded as) what was admitted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cacheon.bundle.admission import admit
from cacheon.commands import verify as verify_command
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.slow  # a candidate child

KERNEL = "kernels/silu_and_mul.py"
#: what an attacker writes once the scan has passed: wrong, and unscanned
SWAPPED = "def silu_and_mul(x, out):\n    out.zero_()\n"


def test_a_source_swapped_after_admission_never_runs(cli_main, tmp_path, monkeypatch):
    root = tmp_path / "bundle"
    shutil.copytree(EXAMPLES / "silu-torch", root)
    admitted = admit(root).digest
    real = verify_command.chosen_ops

    def swap_then_plan(*args, **kwargs):  # called after admit(), before any child starts
        (root / KERNEL).write_text(SWAPPED)
        return real(*args, **kwargs)

    monkeypatch.setattr(verify_command, "chosen_ops", swap_then_plan)
    ran = cli_main("verify", root, "--json", "--dtype", "float32", "--seed", "1", "--stability-calls", "0",
                   "--confinement", "none")
    assert (root / KERNEL).read_text() == SWAPPED  # the swap happened
    report = json.loads(ran.out)
    assert ran.code == 0, ran.out
    assert report["verdict"] == "NUMERICAL_PASS" and report["bundle_digest"] == admitted  # what ran is what is named
    assert admit(root).digest != admitted
