"""Admission and execution are the same bytes: a bundle rewritten after ``verify`` admitted it still
runs (and is recorded as) what was admitted."""

from __future__ import annotations

import json
import shutil

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


def test_a_symlinked_directory_is_refused_and_nothing_of_the_host_is_reported(cli_main, tmp_path):
    root = tmp_path / "bundle"
    shutil.copytree(EXAMPLES / "silu-torch", root)
    host = tmp_path / "host"
    host.mkdir()
    (host / "notes.md").write_text("host secret\n")
    (root / "docs").symlink_to(host, target_is_directory=True)
    ran = cli_main("verify", root, "--json", "--confinement", "none")
    report = json.loads(ran.out)
    assert ran.code == 2 and report["executed"] is False and report["bundle_digest"] is None
    assert [(f["file"], f["rule"]) for f in report["scan"]["findings"]] == [("docs", "symlink")]
    assert "host secret" not in ran.out + ran.err


def test_a_symlinked_root_is_one_line_and_exit_1(cli_main, tmp_path):
    (tmp_path / "link").symlink_to(EXAMPLES / "silu-torch", target_is_directory=True)
    for command in ("scan", "verify"):
        ran = cli_main(command, tmp_path / "link")
        assert ran.code == 1 and "is a symlink; name the bundle directory itself" in ran.err
        assert "Traceback" not in ran.err
