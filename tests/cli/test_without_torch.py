"""The CLI in an interpreter where torch cannot be imported (the wheel does not install it).

``scripts/check_wheel.sh`` checks the same in a fresh venv built from the wheel; this is the fast
check the suite runs: one child process, torch blocked before anything of Cacheon is imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Each argv through cacheon.cli.main in one process; the exit code and stderr of each, as JSON.
_CHILD = """
import contextlib, io, json, sys
sys.modules["torch"] = None  # `import torch` raises ModuleNotFoundError, as in a venv without it
from cacheon.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


def _run(tmp_path: Path, *argvs: list[str]) -> list[tuple[int, str]]:
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(argvs)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}, check=True)
    return [(code, err) for code, err in json.loads(done.stdout)]


@pytest.mark.slow
def test_slots_new_scan_package_work_and_verify_says_what_to_install(tmp_path: Path) -> None:
    ran = _run(tmp_path, ["--help"], ["slots", "--help"], ["slots"], ["new", "--help"],
               ["new", "activation.silu_and_mul", "starter"], ["scan", "--help"], ["scan", "starter"],
               ["package", "--help"], ["package", "starter", "--out", "starter.tar.gz"], ["verify", "starter"],
               ["verify", "--help"])
    for argv, (code, err) in zip(["--help", "slots --help", "slots", "new --help", "new", "scan --help", "scan",
                                  "package --help", "package"], ran, strict=False):
        assert code == 0, (argv, err)
    for code, err in ran[-2:]:
        assert code == 1
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith("cacheon verify: error: torch is not installed; `cacheon verify` needs it: "
                              "pip install torch==2.13.0"), err
    assert (tmp_path / "starter.tar.gz").is_file()
